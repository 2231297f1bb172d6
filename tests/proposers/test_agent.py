"""The claude proposer against a real HTTP Messages API stub, with the real `anthropic` client.

The controller's part (creating and judging the trial) is played here by writing the store the
way the controller does; tests/proposers/test_agent_run.py runs the real controller.
"""

import json
import threading
from dataclasses import replace

import pytest
from agent_env import SLOW_LINE, agent_config, make_ctx, make_engine_repo
from messages_api import API_KEY, MessagesAPI, error, text, tool_use, turn

from orchestrator.agent import AgentAPIError, AgentConfigError
from orchestrator.loop.controller import BudgetExhausted
from orchestrator.proposers import get_proposer
from orchestrator.proposers.agent import AgentProposer
from orchestrator.store import Store


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    repo = make_engine_repo(tmp_path)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    ctx, kb = make_ctx(tmp_path, store, repo)
    _record(store, ctx, 0, {"tpot_ms": 8.0}, None, "kept", 1.0, proposer="baseline")
    return ctx, kb, store


def _record(store, ctx, number, knobs, commit, status, score, proposer="claude", error_text=None, rationale="r"):
    """What the controller writes for a finished trial."""
    t = store.create_trial(ctx.run_id, number, commit=commit or ctx.base_commit, knobs=knobs, rationale=rationale,
                           proposer=proposer)
    store.finish_trial(t.id, status, score=score, objective={"decode:tpot_ms_p50": 8.0 / (score or 1.0)}, error=error_text)
    if status == "kept" and number:
        store.set_best_trial(ctx.run_id, t.id)
    return store.get_trial(t.id)


def _proposer(api, ctx, kb, **cfg):
    p = AgentProposer(agent_config(api.base_url, **cfg))
    p.bind(ctx, kb)
    return p


def _last_tool_results(body):
    return {b["tool_use_id"]: b for b in body["messages"][-1]["content"] if b.get("type") == "tool_result"}


def test_edit_then_run_trial_returns_a_commit_and_the_outcome_answers_it(env):
    ctx, kb, store = env
    edit = tool_use("edit_file", path="fakeserver.py", old=SLOW_LINE, new="self.tpot_s = tpot_ms / 2000.0")
    trial = tool_use("run_trial", knobs={}, rationale="decode two tokens per step", prediction="TPOT halves",
                     expected_score=2.0)
    seen = {}

    def finish(body):
        seen["outcome"] = _last_tool_results(body)
        return turn(tool_use("finish", summary="halved TPOT"))

    with MessagesAPI([turn(text("Reading."), tool_use("read_file", path="fakeserver.py")), turn(edit),
                      turn(trial, tool_use("list_files")), finish]) as api:
        p = _proposer(api, ctx, kb)
        c = p.propose(store.list_trials(ctx.run_id), ctx.target)
        assert c.commit and c.commit != ctx.base_commit and c.proposer == "claude"
        assert c.knobs == {"tpot_ms": 8.0} and c.rationale == "decode two tokens per step" and "2x" in c.prediction
        commit = p.wt.repo.commit(c.commit)
        assert list(commit.stats.files) == ["fakeserver.py"] and commit.message.strip() == c.rationale
        assert "2000.0" in commit.tree["fakeserver.py"].data_stream.read().decode()
        _record(store, ctx, 1, c.knobs, c.commit, "kept", 1.95)
        assert p.propose(store.list_trials(ctx.run_id), ctx.target) is None, "finish ends the proposals"
        assert api.errors == []
        first = api.requests[0]
        assert first["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert first["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        last = api.requests[-1]["messages"][-1]["content"][-1]
        assert last["cache_control"] == {"type": "ephemeral"}, "the conversation so far is a cache prefix"
        assert "beat the baseline by 50%" in first["system"][0]["text"] and "batching-decode" in first["system"][0]["text"]
    results = seen["outcome"]
    assert results[trial["id"]].get("is_error") is None and "kept" in results[trial["id"]]["content"]
    assert "1.950x" in results[trial["id"]]["content"] and "HIT" in results[trial["id"]]["content"]
    assert results[next(k for k in results if k != trial["id"])]["is_error"], "a call after run_trial is not run"
    pred = store.events(ctx.run_id, kind="agent.prediction")
    assert [e.data["hit"] for e in pred] == [True]
    usage = store.events(ctx.run_id, kind="agent.usage")
    assert [e.data["calls"] for e in usage] == [3, 1]
    assert sum(e.data["output_tokens"] for e in usage) == 4 * 150
    assert usage[-1].data["total_cost_usd"] == pytest.approx(4 * (1200 * 3 + 0.1 * 3000 * 3 + 150 * 15) / 1e6)
    assert [e.message for e in store.events(ctx.run_id, kind="agent.finish")] == ["halved TPOT"]


def test_a_failing_tool_does_not_end_the_loop(env):
    ctx, kb, store = env
    with MessagesAPI([
        turn(tool_use("read_file", path="../../etc/passwd")),
        turn(tool_use("edit_file", path="fakeserver.py", old="nope", new="x"), tool_use("no_such_tool")),
        turn(tool_use("run_trial", knobs={"tpot_ms": 3.0}, rationale="r", prediction="p")),
        turn(tool_use("run_trial", knobs={"tpot_ms": 4.0}, rationale="smaller per-token delay", prediction="tpot 2x")),
    ]) as api:
        c = _proposer(api, ctx, kb).propose(store.list_trials(ctx.run_id), ctx.target)
        assert c.knobs == {"tpot_ms": 4.0} and c.commit is None, "no code change: the base commit"
        errs = [b for r in api.requests[1:] for b in r["messages"][-1]["content"] if b.get("is_error")]
        assert len(errs) == 4 and "refused" in errs[0]["content"] and "not one of" in errs[3]["content"]
        assert api.errors == []


def test_overloaded_and_server_errors_are_retried_with_backoff(env):
    ctx, kb, store = env
    script = [error(529, "overloaded_error", {"retry-after": "0.05"}), error(500, "api_error"),
              error(429, "rate_limit_error", {"retry-after-ms": "10"}),
              turn(tool_use("run_trial", knobs={"tpot_ms": 6.0}, rationale="r", prediction="p"))]
    with MessagesAPI(script) as api:
        c = _proposer(api, ctx, kb).propose(store.list_trials(ctx.run_id), ctx.target)
        assert c.knobs == {"tpot_ms": 6.0} and len(api.requests) == 4
    assert store.events(ctx.run_id, kind="agent.usage")[0].data["retries"] == 3


def test_an_api_that_stays_down_stops_the_run_with_a_clear_error(env):
    ctx, kb, store = env
    with MessagesAPI([error(529, "overloaded_error", {"retry-after": "0.01"})] * 4) as api:
        with pytest.raises(AgentAPIError, match="unavailable after 4 attempts.*infergoal resume"):
            _proposer(api, ctx, kb).propose(store.list_trials(ctx.run_id), ctx.target)
    run = store.get_run(ctx.run_id)
    assert run.status == "stopped" and "unavailable" in run.stop_reason


def test_bad_key_and_unknown_model_are_clear_errors(env, monkeypatch):
    ctx, kb, store = env
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-wrong")
    with MessagesAPI([]) as api:
        with pytest.raises(AgentAPIError, match="refused the key"):
            _proposer(api, ctx, kb).propose(store.list_trials(ctx.run_id), ctx.target)
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    with MessagesAPI([error(404, "not_found_error")]) as api:
        with pytest.raises(AgentAPIError, match="does not know model 'claude-nope'"):
            _proposer(api, ctx, kb, model="claude-nope").propose(store.list_trials(ctx.run_id), ctx.target)
    assert "sk-wrong" not in json.dumps([e.message for e in store.events(ctx.run_id)])


def test_no_key_is_a_clear_error_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    for spec in ("claude", "hybrid"):
        with pytest.raises(AgentConfigError, match="needs an Anthropic API key: set ANTHROPIC_API_KEY"):
            get_proposer(spec)
    key = tmp_path / "key"
    key.write_text(API_KEY + "\n")
    from orchestrator.agent.client import read_api_key
    from orchestrator.agent.config import AgentConfig

    assert read_api_key(AgentConfig(api_key_file=str(key))) == API_KEY


def test_resume_continues_the_persisted_conversation(env):
    ctx, kb, store = env
    trial = tool_use("run_trial", knobs={"tpot_ms": 6.0}, rationale="r1", prediction="p")

    def check(body):
        assert trial["id"] in _last_tool_results(body), "the resumed proposer answers the pending run_trial"
        return turn(tool_use("finish", summary="done"))

    with MessagesAPI([turn(tool_use("edit_file", path="fakeserver.py", old=SLOW_LINE, new=SLOW_LINE + "  # x")), turn(trial)]) as api:
        c = _proposer(api, ctx, kb).propose(store.list_trials(ctx.run_id), ctx.target)
    # the process dies here; the controller had created and run trial #1 (resume re-runs it)
    _record(store, ctx, 1, c.knobs, c.commit, "discarded", 1.2)
    with MessagesAPI([check]) as api:
        p = _proposer(api, ctx, kb)
        assert p.wt.repo.head.commit.hexsha == c.commit, "the same worktree and branch"
        assert p.propose(store.list_trials(ctx.run_id), ctx.target) is None
        assert api.errors == [] and len(api.requests[0]["messages"]) == 5


def test_a_resume_before_the_trial_was_created_offers_the_same_candidate(env):
    ctx, kb, store = env
    with MessagesAPI([turn(tool_use("run_trial", knobs={"tpot_ms": 6.0}, rationale="r1", prediction="p"))]) as api:
        c1 = _proposer(api, ctx, kb).propose(store.list_trials(ctx.run_id), ctx.target)
    with MessagesAPI([]) as api:
        c2 = _proposer(api, ctx, kb).propose(store.list_trials(ctx.run_id), ctx.target)
        assert c2 == c1 and api.requests == []


def test_spend_limit_stops_the_run(env):
    ctx, kb, store = env
    with MessagesAPI([turn(tool_use("list_files")), turn(tool_use("list_files"))]) as api:
        with pytest.raises(BudgetExhausted, match=r"the agent spent \$0.0\d; the limit is \$0.01"):
            _proposer(api, ctx, kb, max_cost_usd=0.01).propose(store.list_trials(ctx.run_id), ctx.target)
        assert len(api.requests) == 2


def test_the_goals_dollar_budget_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    store = Store("sqlite://")
    ctx, kb = make_ctx(tmp_path, store, make_engine_repo(tmp_path), goal="beat the baseline by 50% on TPOT within $0.01")
    assert ctx.goal.budget.cost_usd == 0.01
    with MessagesAPI([turn(tool_use("list_files")), turn(tool_use("list_files"))]) as api:
        with pytest.raises(BudgetExhausted, match=r"the limit is \$0.01 \(the goal's budget\)"):
            _proposer(api, ctx, kb).propose(store.list_trials(ctx.run_id), ctx.target)
        assert len(api.requests) == 2


def test_steering_reaches_the_agent_and_old_turns_are_compacted(env):
    ctx, kb, store = env
    big = {"input_tokens": 150_000, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    seen = {}

    def after(body):
        seen["body"] = body
        return turn(tool_use("finish", summary="ok"))

    with MessagesAPI([turn(tool_use("list_files")), turn(tool_use("run_trial", knobs={"tpot_ms": 6.0}, rationale="try 6 ms",
                                                                  prediction="p"), usage=big), after]) as api:
        p = _proposer(api, ctx, kb)
        c = p.propose(store.list_trials(ctx.run_id), ctx.target)
        _record(store, ctx, 1, c.knobs, c.commit, "kept", 1.3, rationale=c.rationale)
        store.add_event(ctx.run_id, "steer", "leave the dtype alone")
        p.propose(store.list_trials(ctx.run_id), ctx.target)
        assert api.errors == []
    msgs = seen["body"]["messages"]
    assert len(msgs) == 3 and "compacted" in msgs[0]["content"] and "try 6 ms" in msgs[0]["content"]
    assert "leave the dtype alone" in msgs[-1]["content"][-1]["content"]
    assert [e.kind for e in store.events(ctx.run_id, kind="agent.compact")] == ["agent.compact"]


def test_a_trial_needing_approval_waits_for_the_person(env):
    ctx, kb, store = env
    seen = {}

    def after(body):
        seen["outcome"] = _last_tool_results(body)
        return turn(tool_use("finish", summary="ok"))

    with MessagesAPI([turn(tool_use("run_trial", knobs={"tpot_ms": 6.0}, rationale="r", prediction="p")), after]) as api:
        p = _proposer(api, ctx, kb, approval_wait_s=5.0)
        c = p.propose(store.list_trials(ctx.run_id), ctx.target)
        t = _record(store, ctx, 1, c.knobs, c.commit, "needs_approval", 1.4)
        threading.Timer(0.5, lambda: store.set_trial_status(t.id, "rejected")).start()
        p.propose(store.list_trials(ctx.run_id), ctx.target)
    assert "**rejected**" in next(iter(seen["outcome"].values()))["content"]


def test_tool_calls_cut_by_a_kill_are_run_on_resume(env):
    ctx, kb, store = env
    first = tool_use("list_files")

    def killed(name, args):
        raise KeyboardInterrupt  # the process dies after the reply was saved, before its tools ran

    with MessagesAPI([turn(first), turn(tool_use("run_trial", knobs={}, rationale="r", prediction="p"))]) as api:
        p = _proposer(api, ctx, kb)
        p.tools.call = killed
        with pytest.raises(KeyboardInterrupt):
            p.propose(store.list_trials(ctx.run_id), ctx.target)
        assert p.conv.unanswered_tool_uses() == [first]
        c = _proposer(api, ctx, kb).propose(store.list_trials(ctx.run_id), ctx.target)
        assert c is not None and api.errors == []
        assert "fakeserver.py" in _last_tool_results(api.requests[-1])[first["id"]]["content"]


def test_a_source_outside_git_is_a_clear_error(env, tmp_path):
    ctx, kb, store = env
    with MessagesAPI([]) as api:
        p = AgentProposer(agent_config(api.base_url))
        with pytest.raises(AgentConfigError, match="not in a git repository.*git init"):
            p.bind(replace(ctx, base_commit=None), kb)
