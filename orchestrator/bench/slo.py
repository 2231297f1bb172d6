"""An SLO goal's measurement: the rate search of `bench.rate` driven by the goal's limits.

Used by the trial (one server, every step through the trial's site) and by
``python -m orchestrator.bench --slo "maximize throughput with p90 TTFT under 300 ms"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from orchestrator.config.goal import SloGoal

from .rate import RatePolicy, RateSearch, at_rate, find_rate
from .results import ScenarioResult
from .scenarios import Scenario

__all__ = ["slo_measure"]


def slo_measure(slo: SloGoal, scenario: Scenario, bench_one: Callable[[Scenario], ScenarioResult],
                policy: RatePolicy = RatePolicy(), on_step: Callable[[Any], None] = lambda st: None,
                near: float | None = None) -> ScenarioResult:
    """An SLO goal's measurement: the highest request rate meeting its limits (or, for a goal that
    minimizes a latency, one step at the load its throughput limit sets), as one `ScenarioResult`
    whose metrics carry `slo_rate` and `slo_goodput`. No passing rate: `meta["slo_error"]` says why.
    `near`: a rate this server already reached; the search brackets around it (`find_rate`)."""
    base = scenario.model_copy(update=slo.goodput_slos)  # per-request limits: the goodput count
    if scenario.rate:  # the scenario's rate (scaled with bench.scale) is where the search starts
        policy = replace(policy, start_rate=scenario.rate)
    if slo.floor_tok_s is not None:
        st = at_rate(bench_one, base, slo.floor_tok_s / max(1, scenario.output_tokens), slo.latency_limits, policy)
        on_step(st)
        search = RateSearch(rate=st.rate if st.passed else 0.0, steps=[st], best=st if st.passed else None,
                            client_bound=not st.trusted)
    else:
        search = find_rate(bench_one, base, slo.latency_limits, policy, on_step=on_step, near=near)
    res = search.result()
    if res is None:  # the last step stands for the measurement; its numbers are stored, not scored
        last = search.steps[-1].result
        res = ScenarioResult(scenario=last.scenario, metrics=dict(last.metrics) | search.metrics(),
                             requests=last.requests, failures=last.failures,
                             meta=last.meta | {"slo_error": f"{slo.describe()}: {search.error}"} | search.meta())
    return res
