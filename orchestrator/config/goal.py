"""Goals: what the engineer wants, parsed into one frozen, hashable `GoalSpec`.

A goal comes either as text (the `/goal ...` line an engineer types) or as a TOML file.
The text grammar is deliberately small: a sentence the parser does not fully understand is
refused with the accepted forms, never guessed at — a mis-read goal would optimise the wrong
thing for hours.

Accepted text forms (clauses may be combined, in any order, joined by "and"/","):

    [/goal] beat the baseline by 20% on TTFT and TPOT
    [/goal] improve throughput by 2x
    [/goal] get p90 TTFT under 150 ms
    [/goal] get throughput above 500 tok/s
    ... without accuracy loss
    ... within 30m | within 2h | within 12 trials | within 1h and 20 trials

Goals under latency limits (SLO goals; one per goal, budget and accuracy clauses as above):

    maximize throughput with p90 TTFT under 300 ms and p90 TPOT under 40 ms
    maximize goodput at p99 TTFT under 1 s
    minimize p90 TPOT with throughput above 500 tok/s

Two objectives, traded off on a Pareto front (multi-objective search; one maximized, one minimized):

    maximize throughput and minimize p90 TPOT
    maximize throughput and minimize p90 TPOT with p90 TTFT under 300 ms   (the SLO rate, and TPOT at it)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.core.tomlfile import read_toml, validation_message

__all__ = [
    "METRICS",
    "Budget",
    "Constraint",
    "GoalError",
    "GoalSpec",
    "MetricInfo",
    "Objective",
    "SloGoal",
    "SloLimit",
    "load_goal",
    "parse_goal",
]


class GoalError(ValueError):
    """A goal that cannot be understood. The message shows the accepted forms."""


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
_ALIASES = {"latency": "e2e", "output throughput": "throughput", "tok/s": "throughput"}
_STATS = ("mean", "median", "p50", "p90", "p95", "p99")
# Units a threshold may be written in, per metric unit, with the factor to the metric's unit.
_UNITS: dict[str, dict[str, float]] = {
    "ms": {"ms": 1.0, "s": 1000.0, "sec": 1000.0, "seconds": 1000.0},
    "tok/s": {"tok/s": 1.0, "tokens/s": 1.0},
}

ACCEPTED_FORMS = """\
Accepted goal forms (clauses combine with "and" or ","):
  beat the baseline by 20% on TTFT and TPOT
  improve throughput by 2x
  get p90 TTFT under 150 ms        |  get throughput above 500 tok/s
  maximize throughput with p90 TTFT under 300 ms and p90 TPOT under 40 ms   (SLO goals: one per goal)
  maximize goodput at p99 TTFT under 1 s  |  minimize p90 TPOT with throughput above 500 tok/s
  maximize throughput and minimize p90 TPOT [with p90 TTFT under 300 ms]   (two objectives: a Pareto front)
  without accuracy loss
  within 30m  |  within 2h  |  within 12 trials  |  within 1h and 20 trials  |  within $20 (agent spend)
Metrics: ttft, tpot, itl, e2e, throughput (optionally prefixed by mean, median, p50, p90, p95, p99).
Example: infergoal goal "beat the baseline by 20% on TTFT and TPOT without accuracy loss within 30m"
A goal may also be a TOML file: see examples/goals/."""


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
        if self.stat not in _STATS:
            raise ValueError(f"unknown statistic {self.stat!r}; known: {', '.join(_STATS)}")
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


_PERCENTILES = ("mean", "median", "p50", "p90", "p95", "p99")


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


# --- text parsing -----------------------------------------------------------------------

_METRIC_RE = r"(?:(?P<stat>mean|median|p50|p90|p95|p99)\s+)?(?P<metric>[a-z][a-z0-9 /]*?)"
_NUM = r"(?P<num>\d+(?:\.\d+)?)"


def _objective(metric: str, stat: str | None, kind: str, value: float) -> Objective:
    """An objective; `stat` only when the goal named one (throughput has none)."""
    if stat and not METRICS[metric].has_stats:
        raise GoalError(f"{metric} is a single number per measurement; drop {stat!r}.\n{ACCEPTED_FORMS}")
    return Objective(metric=metric, kind=kind, value=value, **({"stat": stat} if stat else {}))


def _metric_name(raw: str) -> str:
    name = _ALIASES.get(raw.strip(), raw.strip())
    if name not in METRICS:
        raise GoalError(f"unknown metric {raw.strip()!r}.\n{ACCEPTED_FORMS}")
    return name


def _duration_s(num: float, unit: str) -> float:
    unit = unit.lower()
    if unit.startswith("h"):
        return num * 3600
    if unit.startswith("m"):
        return num * 60
    return num


def _metric_list(text: str) -> list[tuple[str | None, str]]:
    out = []
    for part in re.split(r"\s*(?:,|\band\b|&)\s*", text.strip()):
        if not part:
            continue
        m = re.fullmatch(_METRIC_RE, part)
        if not m:
            raise GoalError(f"cannot read metric {part!r}.\n{ACCEPTED_FORMS}")
        out.append((m.group("stat"), _metric_name(m.group("metric"))))
    return out


def parse_goal(text: str) -> GoalSpec:
    """Parse goal text into a `GoalSpec`; raise `GoalError` on anything not understood."""
    try:
        return _parse_goal(text)
    except ValidationError as e:
        raise GoalError(f"{validation_message(e)}.\n{ACCEPTED_FORMS}") from None
    except OverflowError:
        raise GoalError(f"a number in the goal is too large.\n{ACCEPTED_FORMS}") from None


def _parse_goal(text: str) -> GoalSpec:
    original = text
    s = " ".join(text.strip().lower().split())
    s = re.sub(r"^/goal\b\s*", "", s).rstrip(".")
    if not s:
        raise GoalError(f"empty goal.\n{ACCEPTED_FORMS}")

    objectives: list[Objective] = []
    constraints: list[Constraint] = []
    budget: dict[str, float | int] = {}

    # Budget clause: "within 30m", "within 2 h and 20 trials", "in at most 12 trials".
    if len(re.findall(r"\b(?:within|in at most)\b", s)) > 1:
        raise GoalError(f"the goal has more than one budget clause ('within ...'); give one, e.g. 'within 1h and 20 trials'.\n{ACCEPTED_FORMS}")

    def take_budget(m: re.Match[str]) -> str:
        units_seen: set[str] = set()
        for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*(hours?|h|minutes?|mins?|m|seconds?|secs?|s|trials?)\b", m.group(1)):
            kind = "trials" if unit.startswith("trial") else unit[0]
            if kind in units_seen:
                raise GoalError(f"the budget {m.group(0)!r} gives {'trials' if kind == 'trials' else 'a duration'} twice; give it once.\n{ACCEPTED_FORMS}")
            units_seen.add(kind)
            if not math.isfinite(float(num)):
                raise GoalError(f"the budget {m.group(0)!r} is not a finite number.\n{ACCEPTED_FORMS}")
            if unit.startswith("trial"):
                budget["trials"] = int(float(num))
            else:
                budget["wall_s"] = budget.get("wall_s", 0) + _duration_s(float(num), unit)
        for dollars in re.findall(r"\$(\d+(?:\.\d+)?)", m.group(1)):
            budget["cost_usd"] = float(dollars)
        leftover = re.sub(
            r"\$\d+(?:\.\d+)?|(\d+(?:\.\d+)?)\s*(hours?|h|minutes?|mins?|m|seconds?|secs?|s|trials?)\b|\band\b|,|\s", "",
            m.group(1),
        )
        if leftover:
            raise GoalError(f"cannot read budget {m.group(0)!r}.\n{ACCEPTED_FORMS}")
        return " "

    s = re.sub(r"\b(?:within|in at most|in)\s+((?:(?:\$\d[\d.]*|\d[\d.]*\s*[a-z]+)(?:\s*(?:,|and)\s*)?)+)$", take_budget, s)

    def take_accuracy(m: re.Match[str]) -> str:
        if constraints:
            raise GoalError(f"'without accuracy loss' is given twice; give it once.\n{ACCEPTED_FORMS}")
        constraints.append(Constraint(kind="accuracy", mode="no_loss"))
        return " "

    s = re.sub(r"\b(?:without|with no)\s+(?:any\s+)?accuracy\s+(?:loss|drop|regression)\b", take_accuracy, s)

    if len(re.findall(r"\b(?:maximi[sz]e|minimi[sz]e)\b", s)) > 1:
        objs, slo2 = _two_objectives(s.strip())
        try:
            return GoalSpec(text=original.strip(), objectives=objs, constraints=tuple(constraints),
                            budget=Budget(**budget), slo=slo2)
        except ValidationError as e:
            raise GoalError(f"{validation_message(e, GoalSpec)}.\n{ACCEPTED_FORMS}") from None
    if re.match(r"\s*(?:maximi[sz]e|minimi[sz]e)\b", s):
        slo = _slo_clause(s.strip())
        try:
            return GoalSpec(text=original.strip(), objectives=(slo.objective(),), constraints=tuple(constraints),
                            budget=Budget(**budget), slo=slo)
        except ValidationError as e:
            raise GoalError(f"{validation_message(e, GoalSpec)}.\n{ACCEPTED_FORMS}") from None

    # Relative: "beat the baseline by 20% on X and Y", "improve X by 20%|2x", "cut X by 30%".
    def rel_value(num: str, unit: str, metrics: list[tuple[str | None, str]]) -> list[Objective]:
        v = float(num)
        out = []
        for stat, metric in metrics:
            maximize = METRICS[metric].direction == "maximize"
            if unit == "x":
                if v <= 1:
                    raise GoalError(f"a speedup of {num}x is not an improvement.\n{ACCEPTED_FORMS}")
                # "2x" on a latency means half the latency; on throughput, double it.
                frac = v - 1 if maximize else 1 - 1 / v
            else:
                frac = v / 100
            try:
                out.append(_objective(metric, stat, "relative", frac))
            except ValidationError as e:
                raise GoalError(f"{validation_message(e)}.\n{ACCEPTED_FORMS}") from None
        return out

    def take_relative(m: re.Match[str]) -> str:
        objectives.extend(rel_value(m.group("num"), m.group("unit"), _metric_list(m.group("metrics"))))
        return " "

    s = re.sub(
        rf"\b(?:beat|outperform)\s+(?:the\s+)?baseline\s+by\s+{_NUM}\s*(?P<unit>%|x)\s+on\s+(?P<metrics>.+?)(?=\s*(?:,\s*)?(?:\band\s+)?(?:get|reach|improve|cut|reduce|$))",
        take_relative,
        s,
    )

    s = re.sub(
        rf"\b(?:improve|cut|reduce|speed up|increase)\s+(?P<metrics>.+?)\s+by\s+{_NUM}\s*(?P<unit>%|x)",
        take_relative,
        s,
    )

    # Absolute: "get p90 TTFT under 150 ms", "reach throughput above 500 tok/s".
    def take_abs(m: re.Match[str]) -> str:
        stat, metric = _metric_list(m.group("m"))[0]
        info = METRICS[metric]
        below = m.group("op") in ("under", "below", "<", "<=", "at most")
        if below != (info.direction == "minimize"):
            raise GoalError(
                f"{metric} should go {'down' if info.direction == 'minimize' else 'up'}: "
                f"{m.group(0)!r} asks the opposite.\n{ACCEPTED_FORMS}"
            )
        unit = (m.group("unit") or info.unit).strip()
        if unit not in _UNITS[info.unit]:
            raise GoalError(f"{metric} is measured in {info.unit}, not {unit}: {m.group(0)!r}.\n{ACCEPTED_FORMS}")
        value = float(m.group("num")) * _UNITS[info.unit][unit]
        try:
            objectives.append(_objective(metric, stat, "absolute", value))
        except ValidationError as e:
            raise GoalError(f"{m.group(0)!r}: {e.errors()[0]['msg'].removeprefix('Value error, ')}.\n{ACCEPTED_FORMS}") from None
        return " "

    s = re.sub(
        rf"\b(?:get|reach|bring|keep)\s+(?P<m>.+?)\s+(?P<op>under|below|above|over|at most|at least|<=|>=|<|>)\s*{_NUM}\s*(?P<unit>ms|s|sec|seconds|tok/s|tokens/s)?",
        take_abs,
        s,
    )

    # A dot inside a number stays (`by 1.5` is echoed as typed, not as `by 1 5`).
    leftover = " ".join(re.sub(r"\b(?:and|,|the|while|with)\b|[,;]|(?<!\d)\.|\.(?!\d)", " ", s).split())
    if leftover:
        unitless = re.search(r"\bby\s+(\d+(?:\.\d+)?)(?!\s*(?:x|%|\d))", leftover)
        hint = (f": a change needs its unit, e.g. 'by {unitless.group(1)}x' (a ratio) or 'by 50%'" if unitless else "")
        raise GoalError(f"could not understand {leftover!r} in goal {original.strip()!r}{hint}.\n{ACCEPTED_FORMS}")
    if not objectives:
        raise GoalError(f"the goal names no measurable objective.\n{ACCEPTED_FORMS}")
    try:
        return GoalSpec(
            text=original.strip(), objectives=tuple(objectives), constraints=tuple(constraints), budget=Budget(**budget)
        )
    except ValidationError as e:
        raise GoalError(f"{validation_message(e, GoalSpec)}.\n{ACCEPTED_FORMS}") from None


_SLO_HEAD = re.compile(r"(?P<dir>maximi[sz]e|minimi[sz]e)\s+(?P<what>.+?)\s+(?:with|at|under|subject to|while keeping)\s+(?P<limits>.+)")
_SLO_LIMIT = re.compile(
    r"(?:(?P<stat>p\d+(?:\.\d+)?|mean|median)\s+)?(?P<metric>[a-z0-9]+)\s+"
    r"(?P<op>under|below|above|over|at most|at least|<=|>=|<|>)\s*(?P<num>[-+]?\d+(?:\.\d+)?)\s*(?P<unit>[a-z/]+)?")
_MAXIMIZED = {"throughput": "rate", "request rate": "rate", "rate": "rate", "goodput": "goodput"}


def _slo_error(why: str) -> GoalError:
    return GoalError(f"{why}.\n{ACCEPTED_FORMS}")


def _slo_limit(text: str) -> SloLimit:
    """One limit: "p90 ttft under 300 ms", "throughput above 500 tok/s"."""
    m = _SLO_LIMIT.fullmatch(text)
    if not m:
        raise _slo_error(f"cannot read the limit {text!r}; write it like 'p90 TTFT under 300 ms'")
    metric = _ALIASES.get(m.group("metric"), m.group("metric"))
    if metric not in METRICS:
        raise _slo_error(f"unknown metric {m.group('metric')!r} in the limit {text!r}")
    stat = m.group("stat")
    if stat and stat not in _PERCENTILES:
        raise _slo_error(f"unknown percentile {stat!r} in {text!r}; known: {', '.join(_PERCENTILES)}")
    info = METRICS[metric]
    if not stat and info.has_stats:
        raise _slo_error(f"the limit {text!r} names no percentile; write e.g. 'p90 {metric.upper()} under ...'")
    if stat and not info.has_stats:
        raise _slo_error(f"{metric} is a single number per measurement; drop {stat!r} in {text!r}")
    below = m.group("op") in ("under", "below", "<", "<=", "at most")
    if below != (info.direction == "minimize"):
        raise _slo_error(f"a limit on {metric} keeps it {'under' if info.direction == 'minimize' else 'above'} "
                         f"a value: {text!r} asks the opposite")
    value = float(m.group("num"))
    if value <= 0 or not math.isfinite(value):
        raise _slo_error(f"a limit must be a positive number: {text!r}")
    unit = m.group("unit")
    if unit is None:
        raise _slo_error(f"the limit {text!r} has no unit; write e.g. {m.group('num')} {info.unit}")
    if unit not in _UNITS[info.unit]:
        raise _slo_error(f"{metric} is measured in {info.unit}, not {unit}: {text!r}")
    return SloLimit(metric=metric, value=value * _UNITS[info.unit][unit], **({"stat": stat} if stat else {}))


def _slo_clause(s: str) -> SloGoal:
    """"maximize throughput with LIMIT and LIMIT", "maximize goodput at LIMIT", "minimize p90 TPOT with LIMIT"."""
    m = _SLO_HEAD.fullmatch(s)
    if not m:
        raise _slo_error(f"an SLO goal names what to maximize or minimize, then its limits ('with p90 TTFT under "
                         f"300 ms'); could not read {s!r}")
    what = [w for w in re.split(r"\s*(?:,|\band\b|&)\s*", m.group("what")) if w]
    direction = "maximize" if m.group("dir").startswith("maxim") else "minimize"
    if len(what) != 1:
        raise _slo_error(f"{direction} names {len(what)} things ({', '.join(what)}) with no trade-off between them; "
                         f"{direction} one and give the others as limits")
    limits = tuple(_slo_limit(p) for p in re.split(r"\s*(?:,|\band\b|&)\s*", m.group("limits")) if p)
    try:
        if direction == "maximize":
            if what[0] not in _MAXIMIZED:
                raise _slo_error(f"an SLO goal maximizes throughput (the request rate) or goodput, not {what[0]!r}")
            return SloGoal(maximize=_MAXIMIZED[what[0]], limits=limits)  # type: ignore[arg-type]
        (stat, metric), = _metric_list(what[0])
        if metric not in ("ttft", "tpot", "itl", "e2e"):
            raise _slo_error(f"an SLO goal minimizes a latency (ttft, tpot, itl, e2e), not {what[0]!r}")
        return SloGoal(minimize=metric, limits=limits, **({"stat": stat} if stat else {}))  # type: ignore[arg-type]
    except ValidationError as e:
        raise _slo_error(e.errors()[0]["msg"].removeprefix("Value error, ")) from None


_TWO = re.compile(r"(?P<d1>maximi[sz]e|minimi[sz]e)\s+(?P<w1>.+?)\s*,?\s*\band\s+(?P<d2>maximi[sz]e|minimi[sz]e)\s+"
                  r"(?P<w2>.+?)(?:\s+(?:with|at|under|subject to|while keeping)\s+(?P<limits>.+))?")


def _two_objectives(s: str) -> tuple[tuple[Objective, ...], SloGoal | None]:
    """"maximize throughput and minimize p90 TPOT [with LIMITS]": two objectives without targets.

    Without limits, throughput (the throughput scenario) and the latency (its own scenario); with
    latency limits, the SLO rate (or goodput) and the latency measured at that rate."""
    shape = "write it as 'maximize throughput and minimize p90 TPOT' (optionally 'with p90 TTFT under 300 ms')"
    m = _TWO.fullmatch(s)
    if not m:
        raise _slo_error(f"cannot read the two objectives in {s!r}; {shape}")
    pairs = [(m.group("d1")[:5], m.group("w1").strip()), (m.group("d2")[:5], m.group("w2").strip())]
    if pairs[0][0] == pairs[1][0]:
        raise _slo_error(f"a goal with two objectives maximizes one and minimizes the other; {shape}")
    up = next(w for d, w in pairs if d == "maxim")
    down = next(w for d, w in pairs if d == "minim")
    if re.search(r"\b(?:maximi[sz]e|minimi[sz]e)\b", f"{up} {down} {m.group('limits') or ''}"):
        raise _slo_error(f"a goal trades off at most two objectives; {shape}")
    if up not in _MAXIMIZED:
        raise _slo_error(f"the maximized objective is throughput (the request rate) or goodput, not {up!r}; {shape}")
    latency = _metric_list(down)
    if len(latency) != 1 or latency[0][1] not in ("ttft", "tpot", "itl", "e2e"):
        raise _slo_error(f"the minimized objective is one latency (ttft, tpot, itl, e2e), not {down!r}; {shape}")
    stat = latency[0][0] or "p90"
    if not m.group("limits"):
        if _MAXIMIZED[up] != "rate":
            raise _slo_error(f"{up} is counted against latency limits: add them ('with p90 TTFT under 300 ms')")
        return (Objective(metric="throughput", kind="best"), Objective(metric=latency[0][1], stat=stat, kind="best")), None
    limits = tuple(_slo_limit(p) for p in re.split(r"\s*(?:,|\band\b|&)\s*", m.group("limits")) if p)
    try:
        slo = SloGoal(maximize=_MAXIMIZED[up], limits=limits)  # type: ignore[arg-type]
    except ValidationError as e:
        raise _slo_error(e.errors()[0]["msg"].removeprefix("Value error, ")) from None
    return (slo.objective(), Objective(metric=latency[0][1], stat=stat, kind="best", at_load=True)), slo


def load_goal(source: str | Path) -> GoalSpec:
    """Goal text, or a path to a goal TOML file (see examples/goals/)."""
    if str(source).endswith(".toml"):
        return _load_goal_toml(Path(source))
    return parse_goal(str(source))


def _load_goal_toml(path: Path) -> GoalSpec:
    data = read_toml(path, "goal file", GoalError, "see examples/goals/ for examples")
    text = data.pop("text", "")
    budget = data.get("budget", {})
    if not isinstance(budget, dict):
        raise GoalError(f"{path}: budget must be a table ([budget]), got {budget!r}")
    wall = budget.pop("wall", None)
    if wall is not None:
        if "wall_s" in budget:
            raise GoalError(f"{path}: budget gives both wall and wall_s; give one")
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(h|m|s)", str(wall).strip())
        if not m:
            raise GoalError(f"{path}: budget.wall must look like '30m', '2h' or '90s', got {wall!r}")
        budget["wall_s"] = _duration_s(float(m.group(1)), m.group(2))
    if not isinstance(text, str):
        raise GoalError(f"{path}: text must be a string, got {text!r}")
    if "slo" in data and "objectives" not in data:  # an [slo] table: its objective follows from it
        try:
            data["objectives"] = [SloGoal.model_validate(data["slo"]).objective().model_dump()]
        except ValidationError as e:
            raise GoalError(f"{path}: slo: {validation_message(e, SloGoal)}") from None
    try:
        return GoalSpec.model_validate({"text": text or f"goal file {path.name}", **data})
    except ValidationError as e:
        raise GoalError(f"{path}: {validation_message(e, GoalSpec)}") from None
