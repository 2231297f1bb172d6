"""Filters and sorting for `infergoal trials`: by status, proposer and metric thresholds.

A metric is `score`, `time` (the trial's total seconds), `number`, an objective label as stored
(`decode:tpot_ms_p50`) or its bare key (`tpot_ms_p50`, matched against the objective labels).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["QueryError", "parse_condition", "select_trials", "trial_value"]

_COND = re.compile(r"^\s*([A-Za-z_][\w:.]*)\s*(<=|>=|==|!=|<|>|=)\s*([-+]?[\d.]+(?:[eE][-+]?\d+)?)\s*$")
_OPS = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "=": lambda a, b: a == b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


class QueryError(ValueError):
    """A filter or sort key that cannot be used; the message lists what can."""


def trial_value(t: Any, key: str) -> float | None:
    """The trial's value of `key` (None when it has none, e.g. a failed trial's score)."""
    if key == "score":
        return t.score
    if key == "number":
        return float(t.number)
    if key == "time":
        return (t.timings or {}).get("total")
    objective = t.objective or {}
    if key in objective:
        return objective[key]
    hits = [v for label, v in objective.items() if label.split(":", 1)[-1] == key]
    return hits[0] if hits else None


def parse_condition(text: str) -> tuple[str, str, float]:
    m = _COND.match(text)
    if not m:
        raise QueryError(f"cannot read the filter {text!r}; write METRIC OP NUMBER, e.g. 'score>1.2' or 'tpot_ms_p50<40'")
    return m.group(1), m.group(2), float(m.group(3))


def _known_keys(trials: Sequence[Any]) -> list[str]:
    labels = sorted({label for t in trials for label in (t.objective or {})})
    return ["number", "score", "time", *labels, *sorted({label.split(":", 1)[-1] for label in labels})]


def select_trials(
    trials: Sequence[Any], *, status: Sequence[str] = (), proposer: str = "", where: Sequence[str] = (),
    sort: str = "number", descending: bool = False,
) -> list[Any]:
    """Filter and sort trials. Trials without a value for a filtered metric are left out; when
    sorting, they go last whichever the direction."""
    from orchestrator.store import TRIAL_STATUSES

    bad = [s for s in status if s not in TRIAL_STATUSES]
    if bad:
        raise QueryError(f"unknown status {', '.join(bad)}; use one of {', '.join(TRIAL_STATUSES)}")
    known = _known_keys(trials)
    conds = [parse_condition(w) for w in where]
    for key in [c[0] for c in conds] + [sort]:
        if trials and key not in known:
            raise QueryError(f"unknown metric {key!r}; this run has {', '.join(known)}")
    out = []
    for t in trials:
        if status and t.status not in status:
            continue
        if proposer and proposer not in t.proposer:
            continue
        values = [(trial_value(t, k), op, v) for k, op, v in conds]
        if any(x is None or (isinstance(x, float) and math.isnan(x)) or not _OPS[op](x, v) for x, op, v in values):
            continue
        out.append(t)
    present = [t for t in out if trial_value(t, sort) is not None]
    missing = [t for t in out if trial_value(t, sort) is None]
    return sorted(present, key=lambda t: trial_value(t, sort), reverse=descending) + missing
