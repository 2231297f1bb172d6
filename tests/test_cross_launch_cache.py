"""A response cache kept across launches wins nothing: the bench asks every measurement fresh prompts, and the
integrity gate's cross-launch probe sends a request an earlier launch answered beside a fresh one.

The servers are the bench's fake streaming server with a cache in a file that outlives its process:
`--response-cache` (the cheat: a request an earlier launch answered comes back token by token at a fast but
ordinary pace, under a fresh response id; a repeat within one launch takes its first time again) and
`--prefix-cache` (honest: the prefill of a prefix any launch computed is skipped, every token decoded).
"""

from __future__ import annotations

import json
import random
import socket
from contextlib import contextmanager

import fakeserver
import pytest
from fake_target import write_fake_target

from gates import integrity
from orchestrator.bench import Scenario, run_scenario_sync
from orchestrator.bench.loadgen import build_payload
from orchestrator.bench.prompts import PromptFactory, load_tokenizer
from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.runs import start_run
from orchestrator.store import Store
from orchestrator.trial.gating import seen_requests

DECODE = Scenario(name="decode", prompt_tokens=32, output_tokens=32, num_requests=4, warmup_requests=1, seed=2)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def launch(*args: str):
    """One launch of the fake server (its own process); its cache file outlives it."""
    with fakeserver.launched(_port(), "--tpot-ms", "5", *args) as url:
        yield url


def _probe(url: str, seen: list[dict], tok) -> tuple[str | None, dict]:
    record: dict = {}
    try:
        note = integrity._check_cross_launch(url, seen, random.Random(0), tok, 0.35, 30.0, record)
    except integrity._Failed as e:
        return f"fail: {e}", record
    return note, record


@pytest.mark.parametrize("cache, caught", [("--response-cache", True), ("--prefix-cache", False)],
                         ids=["response-cache", "honest-prefix-cache"])
def test_the_cross_launch_probe_rejects_a_replay_and_passes_an_honest_prefix_cache(tmp_path, cache, caught):
    tok_dir = fakeserver.make_tokenizer(tmp_path / "tok")
    tok = load_tokenizer(str(tok_dir))
    kept = tmp_path / "cache.txt"
    args = (cache, str(kept), "--prefill-ms", "2")  # 32 prompt tokens: 64 ms of prefill, 155 ms of decode
    body = build_payload("completions", "fake", PromptFactory(DECODE.model_copy(update={"prompt_seed": 5}), tok).make(0))
    with launch(*args) as url:  # the first launch answers the request (a measured request of its bench)
        res = run_scenario_sync(url, "fake", DECODE.model_copy(update={"prompt_seed": 5}), tokenizer=tok)
        assert res.ok
        first, _ = _probe(url, [], tok)
        assert first.startswith("skipped")  # a run's first launch has nothing to send again
    with launch(*args) as url:  # a new launch of the same run
        note, record = _probe(url, [{"body": body, "trial": 1}], tok)
    if caught:
        assert note.startswith("fail: requests earlier launches answered came back in at most"), note
        assert "cache kept across launches" in note and "#1's in" in note
        assert record["attempt1"]["time_ratio"] < 0.35 and record["attempt2"]["time_ratio"] < 0.35
    else:  # the prefill of the old prompt was skipped, its tokens decoded: well inside the ratio
        assert note.startswith("requests the launches of trials #1 answered, sent again"), note
        assert record["time_ratio"] > 0.35 and "attempt2" not in record


def test_a_cross_launch_cache_wins_on_fixed_prompts_and_nothing_on_fresh_ones(tmp_path):
    # Fixed prompts: every launch after the first asks what the first answered (the cache's win).
    tok = str(fakeserver.make_tokenizer(tmp_path / "tok"))
    durations = {}
    for name, drawn in (("fixed", (None, None)), ("fresh", (11, 12))):
        kept = tmp_path / f"{name}.txt"
        for n, seed in enumerate(drawn):
            with launch("--response-cache", str(kept)) as url:
                res = run_scenario_sync(url, "fake", DECODE.model_copy(update={"prompt_seed": seed}), tokenizer=tok)
                durations[name, n] = res.metrics["tpot_ms_mean"]
    assert durations["fixed", 1] < durations["fixed", 0] / 3  # replayed at the fast pace
    assert durations["fresh", 1] > durations["fresh", 0] / 1.5  # computed again: nothing to replay


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("prompts", ["fixed", "fresh"])
def test_a_goal_run_with_a_cross_launch_cache_meets_no_goal_the_honest_server_cannot(tmp_path, monkeypatch, tiny_model, prompts):
    """A cache kept across launches, through the whole loop: trial #1 turns it on (cold), #2 and #3 keep it on
    with other knobs. Honest, 8 -> 6 ms a token is 1.33x at best: a 2x goal is out of reach; replayed at 1.5 ms
    a token (fast, not a burst), ~4x. With the prompts fixed across measurements the cache replays #1's
    answers and the paired rounds replay each other's: a paired ratio past the goal (GoalMet, where the
    shared host's stalls leave every round alone). With fresh prompts it replays nothing and meets nothing."""
    if prompts == "fixed":  # every measurement asks the same draw: the old behaviour, for the attack to work on
        import orchestrator.trial.paired
        import orchestrator.trial.run

        monkeypatch.setattr(orchestrator.trial.run, "fresh_seed", lambda: 1)
        monkeypatch.setattr(orchestrator.trial.paired, "fresh_seed", lambda: 1)
    kept = tmp_path / "responses.txt"
    target = write_fake_target(
        tmp_path / "fake.toml", choices=(8.0, 6.0, 7.0),
        extra_launch=f'{{% if cache == "on" %}} --response-cache {kept} --replay-tpot-ms 1.5 {{% endif %}}',
        extra_knobs='[knobs.cache]\ntype = "categorical"\nchoices = ["off", "on"]\ndefault = "off"')
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([{"cache": "on", "tpot_ms": 8.0}, {"cache": "on", "tpot_ms": 6.0}, {"cache": "on", "tpot_ms": 7.0}]))
    ws = Workspace(tmp_path, [f'target="{target}"', f'proposer="scripted:{steps}"', "gates.accuracy=false",
                              "gates.integrity=false", "bench.scale=0.5", "bench.timeout_s=10"])
    out = start_run(ws, parse_goal("improve throughput by 2x within 4 trials"))
    store = Store(ws.db_url)
    # The proposer's trials and any retry of one (a busy host's); sentinels and paired rounds are the loop's.
    scored = [t for t in store.list_trials(out.run_id) if t.proposer in ("scripted", "retry") and t.score is not None]
    paired = [e.data for e in store.events(out.run_id, kind="paired")]
    # Each measured launch kept one of its requests, as the bench sent it, for the later launches' probe.
    kept_bodies = {e.trial_id: e.data["body"] for e in store.events(out.run_id, kind="integrity.seen")}
    assert scored and {t.id for t in scored} <= set(kept_bodies)
    body = kept_bodies[scored[0].id]
    assert body["stream"] and body["ignore_eos"] and body["max_tokens"] == 16 and len(body["prompt"]) == 64
    if prompts == "fixed":
        assert max(t.score for t in scored) > 2 and max(p["score"] for p in paired) > 2, (out.stop_reason, paired)
    else:
        assert not out.stop_reason.startswith("GoalMet"), out.stop_reason
        assert all(0.5 < t.score < 2 for t in scored), [(t.number, t.score) for t in scored]
        assert not any(p.get("met") for p in paired)


def test_the_probe_sends_the_requests_of_launches_most_like_this_one(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    run = store.create_run("r", "g", {}, "h", {}, {}, "fake", "search")
    rows = [store.create_trial(run.id, n, commit=c, knobs=k, rationale="", proposer="search") for n, c, k in (
        (0, "", {"cache": "off", "tpot_ms": 8.0}), (1, "", {"cache": "on", "tpot_ms": 8.0}),
        (2, "", {"cache": "off", "tpot_ms": 6.0}), (3, "abc", {"cache": "on", "tpot_ms": 6.0}),
        (4, "", {"cache": "on", "tpot_ms": 6.0}))]
    for t in rows[:4]:
        store.add_event(run.id, "integrity.seen", "kept", data={"trial": t.number, "body": {"prompt": [t.number], "logprobs": 0}},
                        trial_id=t.id)
    seen = seen_requests(store, run.id, rows[4], n=2)
    # #4 is knobs {cache on, 6 ms} at the base commit: #1 and #2 share its commit and one knob each, the newest first;
    # #3 has both knobs but another commit; its own request is never sent back to it.
    assert [s["trial"] for s in seen] == [2, 1] and seen[0]["body"] == {"prompt": [2], "logprobs": 0}
    assert [s["trial"] for s in seen_requests(store, run.id, rows[3], n=4)] == [2, 1, 0]
    # Sent as the bench would send it to this launch's engine: without the fields it refuses; no ids to a text-only one.
    assert seen_requests(store, run.id, rows[4], n=1, capabilities={"token_ids": False})[0]["body"] == {"prompt": [2]}
    assert seen_requests(store, run.id, rows[4], capabilities={"prompt_ids": False}) == []
