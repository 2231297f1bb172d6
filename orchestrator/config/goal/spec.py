"""The goal's model: one frozen, hashable `GoalSpec` of objectives, constraints, a budget and SLO limits.

What a goal means once read: which bench scenario and metrics key each objective reads (`METRICS`),
its target given the baseline, whether a value meets it, and the `digest` that names the goal in
the run row. Reading a goal from text or TOML is `orchestrator.config.goal.parse`'s.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "METRICS",
    "SLO_METRICS",
    "SLO_SCENARIO",
    "STATS",
    "Budget",
    "Constraint",
    "GoalSpec",
    "MetricInfo",
    "Objective",
    "SloGoal",
    "SloLimit",
]


class MetricInfo(BaseModel):
    """How a user-facing metric name maps onto a bench scenario and result key."""

    model_config = ConfigDict(frozen=True)
    scenario: str
    key_prefix: str
    """Key in `ScenarioResult.metrics` without the statistic, e.g. `ttft_ms_`."""
    direction: Literal["minimize", "maximize"]
    unit: str
    has_stats: bool = True
    """False for scalar metrics such as throughput (no p50/p90 variants)."""


# User-facing metric names. TTFT is judged on the prefill-heavy scenario (InferenceBench A),
# TPOT/ITL/E2E on the decode-heavy one (B), throughput under concurrent load (C).
METRICS: dict[str, MetricInfo] = {
    "ttft": MetricInfo(scenario="prefill", key_prefix="ttft_ms_", direction="minimize", unit="ms"),
    "tpot": MetricInfo(scenario="decode", key_prefix="tpot_ms_", direction="minimize", unit="ms"),
    "itl": MetricInfo(scenario="decode", key_prefix="itl_ms_", direction="minimize", unit="ms"),
    "e2e": MetricInfo(scenario="decode", key_prefix="e2e_ms_", direction="minimize", unit="ms"),
    "throughput": MetricInfo(
        scenario="throughput", key_prefix="output_throughput", direction="maximize", unit="tok/s", has_stats=False
    ),
    # Per GPU: the host's output tok/s over the GPUs the trial's server took (`targets.parallel.gpus_needed`),
    # so a knob set spending 4 GPUs for 3x the tokens scores below one GPU's.
    "throughput_per_gpu": MetricInfo(
        scenario="throughput", key_prefix="output_throughput_per_gpu", direction="maximize", unit="tok/s",
        has_stats=False
    ),
}
# What an SLO goal maximizes, measured by the request-rate search (`orchestrator.bench.rate`) in
# the `slo` scenario: the highest request rate meeting every limit, or the goodput at it. Not in
# METRICS: they mean nothing without the goal's limits, so the plain forms do not accept them.
SLO_SCENARIO = "slo"
SLO_METRICS: dict[str, MetricInfo] = {
    "rate": MetricInfo(scenario=SLO_SCENARIO, key_prefix="slo_rate", direction="maximize", unit="req/s", has_stats=False),
    "goodput": MetricInfo(scenario=SLO_SCENARIO, key_prefix="slo_goodput", direction="maximize", unit="req/s",
                          has_stats=False),
}
STATS = ("mean", "median", "p50", "p90", "p95", "p99")
class Objective(BaseModel):
    """One measurable target."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    metric: str
    """User-facing metric name, a key of `METRICS` (e.g. `ttft`)."""
    stat: str = "p50"
    """Statistic over requests: mean, median, p50, p90, p95, p99 (ignored for throughput)."""
    kind: Literal["relative", "absolute", "best"] = "relative"
    """`relative`: improve on the baseline by `value` (0.2 = 20%); `absolute`: reach `value` in `unit`;
    `best`: as far as the budget allows (an SLO goal's "maximize"/"minimize": never met, only scored)."""
    value: float = 1.0
    """Relative improvement as a fraction, or the absolute threshold (unused for `best`)."""
    at_load: bool = False
    """Measured in the SLO scenario, at the load the goal's limits set, not in the metric's own scenario."""

    @model_validator(mode="after")
    def _check(self) -> Objective:
        if self.metric not in METRICS and self.metric not in SLO_METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; known: {', '.join(METRICS)}")
        if self.stat not in STATS:
            raise ValueError(f"unknown statistic {self.stat!r}; known: {', '.join(STATS)}")
        if not self.info.has_stats and "stat" in self.model_fields_set and self.stat != "p50":
            raise ValueError(f"{self.metric} is a single number per measurement; drop stat = {self.stat!r}")
        if self.value <= 0:
            raise ValueError("an objective's value must be positive")
        if self.kind == "relative" and self.info.direction == "minimize" and self.value >= 1:
            raise ValueError(f"cannot cut {self.metric} by {self.value:.0%}: a relative cut must be below 100%")
        return self

    @property
    def info(self) -> MetricInfo:
        return METRICS.get(self.metric) or SLO_METRICS[self.metric]

    @property
    def scenario(self) -> str:
        return SLO_SCENARIO if self.at_load else self.info.scenario

    @property
    def key(self) -> str:
        """The `ScenarioResult.metrics` key this objective reads."""
        info = self.info
        return info.key_prefix if not info.has_stats else f"{info.key_prefix}{'p50' if self.stat == 'median' else self.stat}"

    def target_for(self, baseline_value: float) -> float:
        """The value a candidate must reach, given the baseline's value."""
        if self.kind == "absolute":
            return self.value
        if self.kind == "best":  # no target: nothing reaches it
            return 0.0 if self.info.direction == "minimize" else math.inf
        if self.info.direction == "minimize":
            return baseline_value * (1 - self.value)
        return baseline_value * (1 + self.value)

    def met(self, value: float, baseline_value: float) -> bool:
        if self.kind == "best":
            return False
        target = self.target_for(baseline_value)
        return value <= target if self.info.direction == "minimize" else value >= target

    def speedup(self, value: float, baseline_value: float) -> float:
        """>1 means better than the baseline, whichever the direction."""
        if value <= 0 or baseline_value <= 0:
            return 1.0
        return baseline_value / value if self.info.direction == "minimize" else value / baseline_value

    def describe(self) -> str:
        name = self.metric.upper() if self.info.has_stats else self.metric
        stat = f"{self.stat} " if self.info.has_stats else ""
        if self.kind == "relative":
            return f"{stat}{name} {self.value:.0%} better than baseline"
        if self.kind == "best":
            what = {"rate": "request rate", "goodput": "goodput"}.get(self.metric, f"{stat}{name}")
            where = " under the SLO" if self.metric in SLO_METRICS or self.at_load else ""
            return f"{'highest' if self.info.direction == 'maximize' else 'lowest'} {what}{where}"
        op = "<=" if self.info.direction == "minimize" else ">="
        return f"{stat}{name} {op} {self.value:g} {self.info.unit}"


class Constraint(BaseModel):
    """A condition every kept candidate must satisfy (the goal's quality bar). A rule between a
    target's knobs is another thing: `orchestrator.targets.KnobRule`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["accuracy"] = "accuracy"
    mode: Literal["no_loss", "gated"] = "no_loss"
    """`no_loss`: measurable drift needs a person's approval; `gated`: the gate's hard limits only."""


class Budget(BaseModel):
    """When to stop even if the goal is not met."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    wall_s: float | None = Field(None, gt=0)
    """Wall-clock seconds of trial time (summed over resumes)."""
    trials: int | None = Field(None, ge=1)
    """Maximum number of trials, the baseline included."""
    tokens: int | None = Field(None, ge=1)
    """Maximum LLM tokens an agent proposer may spend."""
    cost_usd: float | None = Field(None, gt=0)
    """Maximum dollars an agent proposer may spend ("within $20")."""
    stall_trials: int = Field(8, ge=1)
    """Stop after this many consecutive trials without a new best."""


class SloLimit(BaseModel):
    """One limit of an SLO goal: a latency percentile under `value` ms, or throughput above `value` tok/s."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    metric: Literal["ttft", "tpot", "itl", "e2e", "throughput"]
    stat: Literal["mean", "median", "p50", "p90", "p95", "p99"] = "p90"
    """The statistic the limit is judged on (ignored for throughput)."""
    value: float = Field(gt=0)
    """Milliseconds for a latency, output tok/s for throughput."""

    @property
    def key(self) -> str:
        """The bench metrics key the limit reads (`ttft_ms_p90`, `output_throughput`)."""
        info = METRICS[self.metric]
        return info.key_prefix if not info.has_stats else f"{info.key_prefix}{'p50' if self.stat == 'median' else self.stat}"

    def describe(self) -> str:
        if self.metric == "throughput":
            return f"throughput >= {self.value:g} tok/s"
        return f"{self.stat} {self.metric.upper()} <= {self.value:g} ms"


class SloGoal(BaseModel):
    """"Maximize X subject to latency limits", or "minimize a latency at a throughput floor"."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    maximize: Literal["rate", "goodput"] | None = None
    """`rate`: the highest sustainable request rate meeting every limit ("maximize throughput");
    `goodput`: the rate of requests that each met the limits, at that rate."""
    minimize: Literal["ttft", "tpot", "itl", "e2e"] | None = None
    """A latency to cut, measured at the load the throughput limit sets."""
    stat: Literal["mean", "median", "p50", "p90", "p95", "p99"] = "p90"
    """The statistic of `minimize`."""
    limits: tuple[SloLimit, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> SloGoal:
        if (self.maximize is None) == (self.minimize is None):
            raise ValueError("an SLO goal gives exactly one of maximize or minimize")
        metrics = [lim.metric for lim in self.limits]
        if len(set(metrics)) < len(metrics):
            raise ValueError("an SLO goal limits each metric once")
        floors = metrics.count("throughput")
        if self.maximize and floors:
            raise ValueError(f"maximize {self.maximize} takes latency limits, not a throughput limit")
        if self.minimize and floors != 1:
            raise ValueError(f"minimize {self.minimize} needs a throughput limit: the load to measure it at")
        return self

    @property
    def latency_limits(self) -> list[tuple[str, float]]:
        """(metrics key, most allowed ms) for each latency limit."""
        return [(lim.key, lim.value) for lim in self.limits if lim.metric != "throughput"]

    @property
    def floor_tok_s(self) -> float | None:
        """The throughput limit of a `minimize` goal (output tok/s), else None."""
        return next((lim.value for lim in self.limits if lim.metric == "throughput"), None)

    @property
    def goodput_slos(self) -> dict[str, float]:
        """Per-request limits for the bench's goodput count (a request is good when it meets each)."""
        names = {"ttft": "slo_ttft_ms", "tpot": "slo_tpot_ms", "e2e": "slo_e2e_ms"}
        return {names[lim.metric]: lim.value for lim in self.limits if lim.metric in names}

    def objective(self) -> Objective:
        """The one objective such a goal is scored on, over the baseline's (paired ratios of rates)."""
        if self.maximize:
            return Objective(metric=self.maximize, kind="best")
        return Objective(metric=self.minimize or "", stat=self.stat, kind="best", at_load=True)

    def describe(self) -> str:
        head = (f"maximize {'request rate' if self.maximize == 'rate' else 'goodput'}" if self.maximize
                else f"minimize {self.stat} {(self.minimize or '').upper()}")
        return f"{head} with " + " and ".join(lim.describe() for lim in self.limits)


class GoalSpec(BaseModel):
    """A parsed goal. Frozen; `digest` identifies it in the run row."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    text: str = ""
    objectives: tuple[Objective, ...] = Field(min_length=1)
    constraints: tuple[Constraint, ...] = ()
    budget: Budget = Budget()
    slo: SloGoal | None = None
    """Limits an SLO goal's objective is measured under (the `slo` scenario's rate search)."""

    @model_validator(mode="after")
    def _no_duplicates(self) -> GoalSpec:
        if self.slo is not None and (self.objectives[0] != self.slo.objective()
                                     or any(not _second_at_load(o, self.slo) for o in self.objectives[1:2])
                                     or len(self.objectives) > 2):
            raise ValueError("an SLO goal has the objective its maximize/minimize names, and at most one latency "
                             "minimized at that load (a second objective of a maximize goal)")
        if len([o for o in self.objectives if o.kind == "best"]) not in (0, len(self.objectives)):
            raise ValueError("'maximize'/'minimize' objectives (no target) cannot be mixed with targets")
        if len(self.objectives) > 2 and self.objectives[0].kind == "best":
            raise ValueError("a goal trades off at most two objectives")
        if self.slo is None and any(o.scenario == SLO_SCENARIO for o in self.objectives):
            raise ValueError("an objective on the SLO rate needs the goal's [slo] limits")
        # Two clauses on one thing would silently let one of them win.
        seen = [(o.scenario, o.key) for o in self.objectives]
        for i, key in enumerate(seen):
            if key in seen[:i]:
                raise ValueError(f"duplicate objective on {self.objectives[i].metric} ({key[1]}); give each metric once")
        kinds = [c.kind for c in self.constraints]
        if len(set(kinds)) < len(kinds):
            raise ValueError("duplicate accuracy constraint; give it once")
        return self

    @property
    def digest(self) -> str:
        data = self.model_dump(exclude={"text"})
        # Fields added for SLO goals leave other goals' digests as they were.
        if data["slo"] is None:
            del data["slo"]
        for o in data["objectives"]:
            if not o["at_load"]:
                del o["at_load"]
        payload = json.dumps(data, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def multi_objective(self) -> bool:
        """Two objectives without targets ("maximize throughput and minimize p90 TPOT"): the search is
        multi-objective and the run's answer is a Pareto front (`orchestrator.review.pareto`), not one best."""
        return len(self.objectives) == 2 and all(o.kind == "best" for o in self.objectives)

    @property
    def scenarios(self) -> list[str]:
        """Scenario names the goal needs, in first-use order."""
        return list(dict.fromkeys(o.scenario for o in self.objectives))

    @property
    def accuracy_mode(self) -> str:
        for c in self.constraints:
            if c.kind == "accuracy":
                return c.mode
        return "gated"

    def describe(self) -> str:
        parts = [self.slo.describe() if self.slo else ", ".join(o.describe() for o in self.objectives)]
        if self.slo and len(self.objectives) > 1:
            parts[0] += "; and " + ", ".join(f"lowest {o.stat} {o.metric.upper()} at that rate" for o in self.objectives[1:])
        if self.accuracy_mode == "no_loss":
            parts.append("without accuracy loss")
        b = self.budget
        limits = [f"{b.wall_s / 60:g} min" if b.wall_s else "", f"{b.trials} trials" if b.trials else "",
                  f"${b.cost_usd:g}" if b.cost_usd else ""]
        if any(limits):
            parts.append("within " + " and ".join(x for x in limits if x))
        return "; ".join(parts)


def _second_at_load(o: Objective, slo: SloGoal) -> bool:
    """The one second objective an SLO goal allows: a latency minimized at the rate its maximize finds."""
    return slo.maximize is not None and o.kind == "best" and o.at_load and o.info.direction == "minimize"
