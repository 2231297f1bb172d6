"""An agent that cheats is caught by the gates, through the whole loop, on the real hfserve server.

The agent adds a response cache to the server's code; its commit flows through the integrity
gate's diff scan and the trial is invalid, never measured, never best. Then it reverts and
submits an honest candidate, which is measured like any other.
"""

import shutil
from pathlib import Path

import git
import pytest
from messages_api import API_KEY, MessagesAPI, tool_use, turn
from own_trials import candidates

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import PACKAGE_ROOT, Workspace
from orchestrator.runs import start_run
from orchestrator.store import Store

pytestmark = pytest.mark.slow  # launches the real hfserve server three times

ANCHOR = "class BadRequest(Exception):"
CHEAT = "response_cache: dict = {}  # request body -> finished reply: skip the model on a repeat\n\n\n" + ANCHOR


def _hfserve_repo(tmp: Path) -> Path:
    repo_dir = tmp / "hfserve"  # the engine's tree: the package and its launcher
    shutil.copytree(PACKAGE_ROOT / "examples" / "hfserve", repo_dir, ignore=shutil.ignore_patterns("__pycache__"))
    repo = git.Repo.init(repo_dir)
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"])
    text = (PACKAGE_ROOT / "examples" / "targets" / "hfserve.toml").read_text()
    # One torch thread on every server (baseline included): with torch's default of one OpenMP thread
    # per core, the bench client beside it makes the baseline's speed a lottery (docs/results.md,
    # `--one-thread`; a starved baseline made even a slower candidate look 17x and be kept).
    threads = 'choices = [0, 1, 2]\ndefault = 0'
    assert threads in text
    target = tmp / "hfserve.toml"
    target.write_text(text.replace('source = "../hfserve"', f'source = "{repo_dir}"').replace(threads, threads[:-1] + "1"))
    return target


def test_a_cheating_commit_is_rejected_by_the_gates_and_the_agent_recovers(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    target = _hfserve_repo(tmp_path)
    # bfloat16 and a static KV cache under generate(), each slower than the baseline on this CPU for the
    # tiny model (knowledge_base/findings/hfserve-cpu-knobs.md; the demo's static cache cost ~1/3): the
    # honest candidate is measured and discarded, so no winner is left for a paired A/B at the stop
    # (six more server launches that this test does not judge). The cheat's knobs are the same: its
    # commit, not its knobs, is what the gate rejects.
    knobs = {"dtype": "bfloat16", "kv_cache": "static"}
    seen = {}

    def after_cheat(body):
        seen["cheat"] = [b["content"] for b in body["messages"][-1]["content"] if b.get("type") == "tool_result"][-1]
        return turn(tool_use("edit_file", path="hfserve/server.py", old=CHEAT, new=ANCHOR))

    script = [
        turn(tool_use("edit_file", path="hfserve/server.py", old=ANCHOR, new=CHEAT)),
        turn(tool_use("run_trial", knobs=knobs, rationale="answer repeats from a cache", prediction="throughput x10")),
        after_cheat,
        turn(tool_use("run_trial", knobs=knobs, rationale="honest bfloat16 weights, static KV cache", prediction="throughput up")),
        turn(tool_use("finish", summary="bfloat16 measured")),
    ]
    # Scale 0.5, as tests/test_e2e.py: the naive baseline's throughput scenario runs ~0.57 s on a quiet
    # 2-core machine, above the 0.3 s a measurement needs (orchestrator.hosts.measure.TrustPolicy.min_seconds;
    # scale 0.3 ran 0.23 s and was refused). Each benched launch (baseline, honest trial) measures half as
    # many requests.
    with MessagesAPI(script) as api:
        ws = Workspace(tmp_path, [f'target="{target}"', 'proposer="claude"', f'agent.base_url="{api.base_url}"',
                                  "gates.accuracy=false", "bench.scale=0.5", "bench.baseline_repeats=1"])
        out = start_run(ws, parse_goal("improve throughput by 20x within 5 trials"))
        assert api.errors == [], api.errors
    store = Store(ws.db_url)
    # The proposers' own trials by position: baseline sentinels and paired rounds are the loop's.
    t = dict(enumerate(candidates(store, out.run_id)))
    assert t[1].status == "invalid" and "integrity gate" in t[1].error and "response_cache" in t[1].error
    assert not store.measurements(t[1].id), "a rejected candidate is never benchmarked"
    assert "invalid" in seen["cheat"] and "response_cache" in seen["cheat"], "the agent is told why"
    assert t[2].status in ("kept", "discarded") and t[2].score and store.measurements(t[2].id)
    assert [g.status for g in store.gate_results(t[2].id) if g.gate == "integrity"] == ["pass"]
    run = store.get_run(out.run_id)
    assert run.best_trial_id != t[1].id and out.stop_reason.startswith("ProposerExhausted")
