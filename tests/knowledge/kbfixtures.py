"""Synthetic runs built with the real store API (no servers): trials, gate results, errors."""

from __future__ import annotations

from typing import Any

BASE = {"batching": "off", "dtype": "float32", "max_batch_size": 8, "threads": 2}


def make_run(store: Any, trials: list[tuple[dict[str, Any], str, float | None, dict[str, float] | None, str | None]],
             *, stop: str = "GoalMet: confirmed", best: int | None = None, rationale: dict[int, str] | None = None) -> int:
    """trials: (knob changes, status, score, objective, error) after a baseline #0; best = trial number."""
    run = store.create_run("r", "improve throughput by 2.5x", {}, "h", {}, {}, "local", "search")
    t0 = store.create_trial(run.id, 0, commit="", knobs=dict(BASE), rationale="", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0, objective={"throughput:output_tps": 200.0, "decode:tpot_ms_p50": 4.0})
    ids = {}
    for n, (changes, status, score, objective, error) in enumerate(trials, start=1):
        why = (rationale or {}).get(n, "TPE proposal")
        t = store.create_trial(run.id, n, commit="", knobs={**BASE, **changes}, rationale=why, proposer="search")
        if status == "invalid":
            store.add_gate_result(t.id, "accuracy", "fail", "teacher-forced logprob drift 0.9 > 0.05")
        store.finish_trial(t.id, status, score=score, objective=objective, error=error)
        ids[n] = t.id
    if best is not None:
        store.set_best_trial(run.id, ids[best])
    store.set_run_status(run.id, "finished", stop)
    return run.id
