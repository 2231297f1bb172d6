"""benchmarks/gpu/check_overlap.py runs (CPU smoke, tiny model): both schedules, same tokens, its JSON."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def test_check_overlap_smoke(tiny_model: Path, tmp_path: Path) -> None:
    import check_overlap

    out = tmp_path / "ovl.json"
    check_overlap.main([str(tiny_model), "--device", "cpu", "--n", "4", "--prompt", "8", "--out-tokens", "6",
                        "--reps", "1", "--stream-us", "0", "--logprobs", "0", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["tokens_equal"] and [r["overlap"] for r in res["runs"]] == [False, True]
    assert all(r["steps"] == 5 for r in res["runs"])  # 6 tokens: the prefill's and 5 decode steps at batch 4


def test_step_log_gives_the_served_step_gaps(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """HFSERVE_STEP_LOG: the engine logs each decode step's batch and time, one burst per `end`;
    step_gaps.py reads them back. The harness's max_tokens 6, 1, 9, 4: one ends at its prefill token, then
    3 steps at batch 3, 2 at batch 2, 3 at batch 1 (8 decode steps: the 9-token request's)."""
    import step_gaps
    from test_fastengine import _engine_outputs

    log = tmp_path / "steps.log"
    monkeypatch.setenv("HFSERVE_STEP_LOG", str(log))
    prompts = [[5, 6, 7, 8]] * 4
    _engine_outputs(tiny_model, prompts, [], max_batch_size=4, prefill_pack=64)
    # The worker writes the burst's lines after its last step, maybe after the handlers got their last token
    # (the timeline first, then the step log: a CI run once read the timeline between the two).
    deadline = time.monotonic() + 10
    tl_path = Path(f"{log}.timeline")
    while not (log.exists() and "end" in log.read_text() and tl_path.exists() and "end" in tl_path.read_text()) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    [burst] = step_gaps.bursts(log.read_text())
    s = step_gaps.summary(burst)
    assert [r[0] for r in burst] == [3, 3, 3, 2, 2, 1, 1, 1]
    assert (s["batch"], s["steps"], s["steps_at_batch"]) == (3, 8, 3) and s["gap_ms_p50"] > 0
    assert 0 < s["engine_cpu_ms_p50"] and "busy_ms_p50" not in s  # CPU: no graphs, no device times
    # FILE.timeline, flushed with the same burst: the packed passes that took all 4 prompts, each before the
    # first decode step (device ms -1: no GPU); no arrivals, as the harness queues its burst without submit().
    [tl] = step_gaps.timelines(Path(f"{log}.timeline").read_text())
    t = step_gaps.timeline(burst, tl)
    assert t["jobs"] == 0 and sum(p["prompts"] for p in t["passes"]) == 4
    assert sum(p["tokens"] for p in t["passes"]) == 16 and all(p["device_ms"] == -1 for p in t["passes"])
    assert all(0 <= p["start_ms"] and p["start_ms"] + p["wall_ms"] <= t["first_step_ms"] for p in t["passes"])
    assert t["first_step_ms"] < t["last_step_ms"]


def test_gc_passes_go_into_the_timeline(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """HFSERVE_STEP_LOG: a garbage-collector pass of >= 1 ms (here a full one over 300k cyclic objects) is a
    ``G generation start ms`` line of the timeline; step_gaps.py reads it as ``gc_ms``. The hook holds the engine
    weakly, and an engine gone has its hook taken out of gc.callbacks by the next one's start."""
    import gc
    import weakref
    from collections import deque

    import step_gaps
    from hfserve.fast import profiling, scheduler

    eng = scheduler.FastEngine.__new__(scheduler.FastEngine)  # only the parts the hook uses
    eng._timeline, eng._gc_t0 = deque(), 0.0
    hook = profiling._gc_hook(eng)
    gc.callbacks.append(hook)
    try:
        junk = [[i] for i in range(300_000)]
        for x in junk:
            x.append(x)  # cycles: a full pass has to trace them
        gc.collect()
        del junk
        gc.collect()
    finally:
        gc.callbacks.remove(hook)
    lines = [ln for ln in eng._timeline if ln.startswith("G 2 ")]
    assert lines and all(float(ln.split()[3]) >= 1.0 for ln in lines), list(eng._timeline)
    [tl] = step_gaps.timelines("\n".join(["P 1 8 0.0 0.001 -1", *lines, "end"]))
    t = step_gaps.timeline([(1, 0.002, 0.0)], tl)
    assert t["gc_ms"] and t["gc_ms"][0][0] == 2 and t["gc_ms"][0][2] >= 1.0
    ref = weakref.ref(eng)
    gc.callbacks.append(hook)
    del eng
    assert ref() is None
    other = scheduler.FastEngine.__new__(scheduler.FastEngine)
    other._timeline, other._gc_t0 = deque(), 0.0
    h2 = profiling._gc_hook(other)
    assert hook not in gc.callbacks and h2 not in gc.callbacks  # the dead one pruned; the new one not yet added
    gc.callbacks.append(h2)
    gc.callbacks.remove(h2)


def test_step_gaps_reads_device_times() -> None:
    """With CUDA graphs the log has each step's device busy and idle ms: a device waiting 2.7 ms per 8.6 ms
    step reads as such (the served C's question: is the step the device's or the host's?)."""
    import step_gaps

    lines = [f"64 {1 + 0.0086 * i:.6f} {0.5 + 0.0004 * i:.6f} 5.9 {2.7 if i else 0.0}" for i in range(5)]
    [b] = step_gaps.bursts("\n".join(["1 0.5 0.4 4.5 0.0", *lines, "end"]))
    s = step_gaps.summary(b)
    assert (s["batch"], s["steps_at_batch"], s["gap_ms_p50"], s["engine_cpu_ms_p50"]) == (64, 5, 8.6, 0.4)
    assert (s["busy_ms_p50"], s["idle_ms_p50"]) == (5.9, 2.7)
    # The timeline beside it: 3 arrivals over 30 ms, one pass of 2 prompts at 10 ms, one of 1 after the first step.
    [tl] = step_gaps.timelines("J 0.480\nJ 0.490\nP 2 1024 0.490 0.520 29.5\nJ 0.510\nP 1 512 0.5045 0.52 14.0\nend\n")
    stale = {"jobs": [0.2, *tl["jobs"]], "passes": [(1, 8, 0.2, 0.21, 1.0), *tl["passes"]]}  # a scoring job before
    t = step_gaps.timeline(b, tl)
    assert (t["jobs"], t["last_job_ms"], t["prefill_wall_ms"], t["first_step_ms"]) == (3, 30.0, 45.5, 20.0)
    assert t["passes"][0] == {"prompts": 2, "tokens": 1024, "start_ms": 10.0, "wall_ms": 30.0, "device_ms": 29.5}
    # --client: ib_baseline.py's request clock (client start 0.470 on the same clock) beside it; a scenario whose
    # run holds no burst (a second one, later) is left out.
    clock = {"origin_s": 0.47, "sent_ms": [0.5, 1.0, 2.0], "first_ms": [52.0, 60.0, None], "last_ms": [80.0, 75.0, None]}
    late = {**clock, "origin_s": 9.0}
    [j] = step_gaps.client_bursts([b], [stale], {"c": {"clock": clock}, "c2": {"clock": late}, "x": {"skipped": "deadline"}})
    assert j["scenario"] == "c" and j["sent_ms"] == [0.5, 2.0] and j["arrived_ms"] == [10.0, 40.0]
    assert (j["first_step_ms"], j["top_batch"], j["top_first_step_ms"]) == (30.0, 64, 530.0)
    assert len(j["passes"]) == 2 and j["passes"][1]["start_ms"] == 34.5 and j["first_token_ms"] == [52.0, 60.0, 60.0] and j["last_token_ms"] == 80.0


def test_profile_env_writes_the_served_steps_kernel_table(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """HFSERVE_PROFILE: the engine profiles PROFILE_STEPS decode steps of a batch >= 32 and writes the table
    (a burst of 32 through check_overlap.py, 5 decode steps each way), and one large packed prefill."""
    import check_overlap
    from hfserve.fast import profiling

    out = tmp_path / "prof.txt"
    monkeypatch.setenv("HFSERVE_PROFILE", str(out))
    monkeypatch.setattr(profiling, "PROFILE_SKIP", 2)
    monkeypatch.setattr(profiling, "PROFILE_STEPS", 3)
    monkeypatch.setattr(profiling, "PROFILE_PREFILL_TOKENS", 100)
    check_overlap.main([str(tiny_model), "--device", "cpu", "--n", "32", "--prompt", "4", "--out-tokens", "6",
                        "--reps", "1", "--stream-us", "0"])
    text = out.read_text()
    assert text.startswith("3 decode steps from the 2-th") and "Self CPU" in text
    # ... and the first packed prefill pass of >= 100 tokens (the burst's 32 x 4 = 128) into FILE.prefill
    pre = Path(f"{out}.prefill").read_text()
    assert pre.startswith("packed prefill of 128 tokens (32 prompts)") and "Self CPU" in pre


def test_an_unwritable_step_log_is_refused_at_start_up(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """HFSERVE_STEP_LOG / HFSERVE_PROFILE in a folder that does not exist: one line at start-up, not a dead worker."""
    from hfserve.fast import FastEngine

    for var in ("HFSERVE_STEP_LOG", "HFSERVE_PROFILE"):
        with monkeypatch.context() as m:
            m.setenv(var, str(tmp_path / "nope" / "x.log"))
            with pytest.raises(SystemExit, match=f"{var}=.*cannot be written"):
                FastEngine(str(tiny_model), dtype="float32", device="cpu", cuda_graphs=False)


def test_prefill_attn_bench_smoke(tmp_path: Path) -> None:
    """benchmarks/gpu/prefill_attn_bench.py on the CPU (tiny sizes): every way computes today's output."""
    import prefill_attn_bench

    out = tmp_path / "pattn.json"
    prefill_attn_bench.main(["--device", "cpu", "--prompts", "3", "--len", "16", "--heads", "4", "--kv-heads", "2",
                             "--head-dim", "8", "--capacity", "40", "--reps", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["way"] for r in rows] == ["per_prompt_mask", "per_prompt_causal", "batched_views", "batched_contig"]
    assert all(r["max_err"] < 1e-5 for r in rows)
