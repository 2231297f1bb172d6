"""Trials and the measurements of them, as every face shows them (CLI, shell, report).

A trial is what the budget counts: the baseline and each proposal. The loop adds measurements
of trials on top (paired rounds, sentinels, re-runs, probes: `roles.LOOP_ADDED`); they are
shown under or beside the trial they measure, never counted or plotted as trials, and the
budget line says the same number wherever it is printed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.core.roles import BASELINE, BASELINES, LOOP_ADDED, MEASUREMENTS, PAIRED

__all__ = ["MEASURED", "budget_line", "is_measurement", "knob_text", "measured_trial", "measurement_note", "paired_scores",
           "score_text", "shown_status", "split_trials"]

_NAMED = re.compile(r"#(\d+)")


MEASURED = "measured"
"""How a measurement that went well reads: the baseline, a sentinel or a paired half is stored `kept`
(later candidates are judged against it), but it was measured, not kept as a candidate."""


def shown_status(t: Any) -> str:
    """A trial's status as every face prints it: `measured` for a good baseline, sentinel or paired
    half (never `kept`: only a candidate is kept), else its stored status."""
    if t.status == "kept" and (t.number == 0 or t.proposer in (BASELINE, *MEASUREMENTS)):
        return MEASURED
    return str(t.status)


def is_measurement(t: Any) -> bool:
    """A trial row the loop added to measure another (not counted in the budget, not a trial)."""
    return t.proposer in LOOP_ADDED


def measured_trial(t: Any) -> int | None:
    """The number of the trial that measurement `t` measures (0 for a sentinel: it re-measures the
    baseline); None for a trial, or a measurement whose rationale names none."""
    if not is_measurement(t):
        return None
    if t.proposer in BASELINES:
        return 0
    found = _NAMED.search(t.rationale or "")
    return int(found.group(1)) if found else None


def measurement_note(t: Any) -> str:
    """`; a measurement (paired of #5), not a trial` for a row the loop added; '' for a trial."""
    if not is_measurement(t):
        return ""
    of = measured_trial(t)
    return f"; a measurement ({t.proposer}" + (f" of #{of}" if of is not None else "") + "), not a trial"


def split_trials(rows: Iterable[Any]) -> tuple[list[Any], list[Any]]:
    """(trials, measurements): the rows the budget counts, and the ones the loop added."""
    rows = list(rows)
    return [t for t in rows if not is_measurement(t)], [t for t in rows if is_measurement(t)]


def budget_line(trials: int, budget: int | None, measurements: int) -> str:
    """`5 of 5 trials +6 measurements`: the one way every face says what the budget counted."""
    line = f"{trials} of {budget if budget is not None else 'unlimited'} trials"
    return line + (f" +{measurements} measurement{'s' if measurements != 1 else ''}" if measurements else "")


def paired_scores(store: Any, run_id: int) -> dict[int, float]:
    """Trial id -> the ratio of its newest paired A/B (the `paired` events), for the trials that had one."""
    return {e.trial_id: e.data["score"] for e in store.events(run_id, kind=PAIRED)
            if e.trial_id is not None and isinstance(e.data, dict) and e.data.get("score")}


def score_text(score: float | None, paired: float | None = None, digits: int = 3, unit: str = "") -> str:
    """A trial's score as printed: `1.621 paired` (with `unit="x"`: `1.621x paired`) when it is its paired A/B ratio (the loop replaces
    a confirmed candidate's screening score by it; `why N` keeps both), '' when it has none."""
    if not score:
        return ""
    return f"{score:.{digits}f}{unit}" + (" paired" if paired is not None and abs(paired - score) < 1e-9 else "")


def knob_text(knobs: Mapping[str, Any] | None) -> str:
    """`tpot_ms=4.0 max_num_seqs=64`: knobs as a user would type them (`(defaults)` when none)."""
    return " ".join(f"{k}={v}" for k, v in (knobs or {}).items()) or "(defaults)"
