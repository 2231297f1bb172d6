"""One scenario measured in several passes, joined into the result a single run would have given.

Multi-fidelity screening (`orchestrator.trial.fidelity`) measures a scenario's first requests in a short
pass, judges the candidate, and only for a promising one measures the rest (`Scenario.part`: the
same seeded prompts and arrival schedule, continuing where the short pass stopped, no second
warm-up). `join` puts the passes back together: the whole scenario's records in index order, the
metrics over all of them (`compute_metrics` with `passes`: durations and rates summed over the
passes, never the time between them), and `meta["passes"]` saying which requests each pass measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gates.api import ApiMode

from .metrics import compute_metrics, failures
from .results import ScenarioResult
from .scenarios import Scenario

__all__ = ["join", "rest_of"]


def rest_of(scenario: Scenario, done: int) -> Scenario:
    """The part of `scenario` after its first `done` requests: no warm-up (the first pass had it)."""
    done = min(max(done, 0), scenario.num_requests)
    return scenario.model_copy(update={"part": (done, scenario.num_requests), "warmup_requests": 0})


def join(scenario: Scenario, parts: Sequence[ScenarioResult], *, labels: Sequence[str] = (),
         capabilities: dict[str, Any] | None = None) -> ScenarioResult:
    """The result of `scenario` (whole) from the results of its `parts`, in order, which together
    measured each of its requests once, all from one draw of prompts (`Scenario.prompt_seed`, which the
    joined result's scenario keeps); `labels` name the passes in `meta["passes"]`."""
    parts = [p for p in parts if p.requests or p.scenario.measured_requests]
    if not parts:
        raise ValueError("nothing to join")
    seen = sorted(r.index for p in parts for r in p.requests)
    if seen != list(range(scenario.num_requests)):
        raise ValueError(f"the passes measured requests {seen}, not each of {scenario.name}'s {scenario.num_requests} once")
    first = parts[0]
    drawn = {p.scenario.prompt_seed for p in parts}
    if len(drawn) > 1:
        raise ValueError(f"the passes of {scenario.name} drew their prompts from seeds {sorted(drawn, key=str)}, not one")
    scenario = scenario.model_copy(update={"prompt_seed": first.scenario.prompt_seed})  # whose prompts they were
    mode = ApiMode.of(capabilities)
    chat = first.meta.get("api") == "chat"
    records = [r for p in parts for r in p.requests]
    lags = [x for p in parts for x in p.meta.get("loop_lag_ms", ())]
    metrics = compute_metrics(
        records, bench_start_ns=0, bench_end_ns=0, target_rate=scenario.rate, slo_ttft_ms=scenario.slo_ttft_ms,
        slo_tpot_ms=scenario.slo_tpot_ms, slo_e2e_ms=scenario.slo_e2e_ms, loop_lag_ms=lags,
        intended_prompt_check=bool(first.meta.get("tokenizer")) and not chat and mode.prompt_ids, mode=mode,
        passes=[(len(p.requests), float(p.metrics.get("duration_s", 0.0))) for p in parts])
    names = (list(labels) + [f"pass {i + 1}" for i in range(len(labels), len(parts))])[:len(parts)]
    meta = {k: v for k, v in first.meta.items() if k not in ("part", "loop_lag_ms")}
    meta["passes"] = [{"pass": name, "requests": list(p.scenario.part or (0, p.scenario.num_requests)),
                       "origin_ns": p.meta.get("origin_ns"), "date": p.meta.get("date"),
                       "duration_s": p.metrics.get("duration_s")} for name, p in zip(names, parts, strict=True)]
    return ScenarioResult(scenario=scenario, metrics=metrics, requests=records, failures=failures(records), meta=meta)
