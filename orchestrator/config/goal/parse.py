"""Reading goals: what the engineer wants, from text or a TOML file, into one `GoalSpec`.

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

import math
import re
from pathlib import Path

from pydantic import ValidationError

from orchestrator.config.goal.spec import (
    METRICS,
    STATS,
    Budget,
    Constraint,
    GoalSpec,
    Objective,
    SloGoal,
    SloLimit,
)
from orchestrator.core.tomlfile import read_toml, validation_message

__all__ = ["ACCEPTED_FORMS", "GoalError", "load_goal", "parse_goal"]


class GoalError(ValueError):
    """A goal that cannot be understood. The message shows the accepted forms."""


_ALIASES = {"latency": "e2e", "output throughput": "throughput", "tok/s": "throughput", "throughput per host": "throughput",
            "tok/s per host": "throughput", "throughput per gpu": "throughput_per_gpu", "tok/s per gpu": "throughput_per_gpu"}
# Units a threshold may be written in, per metric unit, with the factor to the metric's unit.
_UNITS: dict[str, dict[str, float]] = {
    "ms": {"ms": 1.0, "s": 1000.0, "sec": 1000.0, "seconds": 1000.0},
    "tok/s": {"tok/s": 1.0, "tokens/s": 1.0},
}

ACCEPTED_FORMS = """\
Accepted goal forms (clauses combine with "and" or ","):
  beat the baseline by 20% on TTFT and TPOT
  improve throughput by 2x
  get p90 TTFT under 150 ms        |  get throughput above 500 tok/s  |  improve throughput per GPU by 2x
  maximize throughput with p90 TTFT under 300 ms and p90 TPOT under 40 ms   (SLO goals: one per goal)
  maximize goodput at p99 TTFT under 1 s  |  minimize p90 TPOT with throughput above 500 tok/s
  maximize throughput and minimize p90 TPOT [with p90 TTFT under 300 ms]   (two objectives: a Pareto front)
  without accuracy loss
  within 30m  |  within 2h  |  within 12 trials  |  within 1h and 20 trials  |  within $20 (agent spend)
Metrics: ttft, tpot, itl, e2e, throughput (optionally prefixed by mean, median, p50, p90, p95, p99);
  throughput is per host, `throughput per GPU` divides it by the GPUs a trial's server takes.
Example: infergoal goal "beat the baseline by 20% on TTFT and TPOT without accuracy loss within 30m"
A goal may also be a TOML file: see examples/goals/."""


_METRIC_RE = r"(?:(?P<stat>mean|median|p50|p90|p95|p99)\s+)?(?P<metric>[a-z][a-z0-9_ /]*?)"
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
    if stat and stat not in STATS:
        raise _slo_error(f"unknown percentile {stat!r} in {text!r}; known: {', '.join(STATS)}")
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
