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
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.tomlfile import read_toml, validation_message

__all__ = [
    "METRICS",
    "Budget",
    "Constraint",
    "GoalError",
    "GoalSpec",
    "MetricInfo",
    "Objective",
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
    kind: Literal["relative", "absolute"] = "relative"
    """`relative`: improve on the baseline by `value` (0.2 = 20%); `absolute`: reach `value` in `unit`."""
    value: float
    """Relative improvement as a fraction, or the absolute threshold."""

    @model_validator(mode="after")
    def _check(self) -> Objective:
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; known: {', '.join(METRICS)}")
        if self.stat not in _STATS:
            raise ValueError(f"unknown statistic {self.stat!r}; known: {', '.join(_STATS)}")
        if not METRICS[self.metric].has_stats and "stat" in self.model_fields_set and self.stat != "p50":
            raise ValueError(f"{self.metric} is a single number per measurement; drop stat = {self.stat!r}")
        if self.value <= 0:
            raise ValueError("an objective's value must be positive")
        if self.kind == "relative" and METRICS[self.metric].direction == "minimize" and self.value >= 1:
            raise ValueError(f"cannot cut {self.metric} by {self.value:.0%}: a relative cut must be below 100%")
        return self

    @property
    def info(self) -> MetricInfo:
        return METRICS[self.metric]

    @property
    def scenario(self) -> str:
        return self.info.scenario

    @property
    def key(self) -> str:
        """The `ScenarioResult.metrics` key this objective reads."""
        info = self.info
        return info.key_prefix if not info.has_stats else f"{info.key_prefix}{'p50' if self.stat == 'median' else self.stat}"

    def target_for(self, baseline_value: float) -> float:
        """The value a candidate must reach, given the baseline's value."""
        if self.kind == "absolute":
            return self.value
        if self.info.direction == "minimize":
            return baseline_value * (1 - self.value)
        return baseline_value * (1 + self.value)

    def met(self, value: float, baseline_value: float) -> bool:
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


class GoalSpec(BaseModel):
    """A parsed goal. Frozen; `digest` identifies it in the run row."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    text: str = ""
    objectives: tuple[Objective, ...] = Field(min_length=1)
    constraints: tuple[Constraint, ...] = ()
    budget: Budget = Budget()

    @model_validator(mode="after")
    def _no_duplicates(self) -> GoalSpec:
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
        payload = json.dumps(self.model_dump(exclude={"text"}), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

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
        parts = [", ".join(o.describe() for o in self.objectives)]
        if self.accuracy_mode == "no_loss":
            parts.append("without accuracy loss")
        b = self.budget
        limits = [f"{b.wall_s / 60:g} min" if b.wall_s else "", f"{b.trials} trials" if b.trials else "",
                  f"${b.cost_usd:g}" if b.cost_usd else ""]
        if any(limits):
            parts.append("within " + " and ".join(x for x in limits if x))
        return "; ".join(parts)


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

    leftover = re.sub(r"\b(?:and|,|the|while|with)\b|[,;.]", " ", s).strip()
    if leftover:
        raise GoalError(f"could not understand {leftover!r} in goal {original.strip()!r}.\n{ACCEPTED_FORMS}")
    if not objectives:
        raise GoalError(f"the goal names no measurable objective.\n{ACCEPTED_FORMS}")
    try:
        return GoalSpec(
            text=original.strip(), objectives=tuple(objectives), constraints=tuple(constraints), budget=Budget(**budget)
        )
    except ValidationError as e:
        raise GoalError(f"{validation_message(e, GoalSpec)}.\n{ACCEPTED_FORMS}") from None


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
    try:
        return GoalSpec.model_validate({"text": text or f"goal file {path.name}", **data})
    except ValidationError as e:
        raise GoalError(f"{path}: {validation_message(e, GoalSpec)}") from None
