"""What a proposer is shown of a run (`orchestrator.core.roles.search_history`): its own trials and the
baseline in order, never the loop's re-measurements; a trial re-run on a busy host reads as its re-run."""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator.core.roles import retried, search_history
from orchestrator.store.records import TrialRecord

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def _t(number: int, proposer: str, status: str, score: float | None = None, knobs: dict | None = None,
       error: str | None = None) -> TrialRecord:
    return TrialRecord(id=100 + number, run_id=1, number=number, status=status, commit="c", knobs=knobs or {"b": number},
                       rationale="", prediction=None, proposer=proposer, launch_cmd=None, score=score,
                       objective={"decode:tpot_ms_p50": 10.0 / score} if score else None, error=error, started_at=NOW,
                       finished_at=NOW, timings={"trial": 30.0}, log_path=None, optuna_trial_number=number)


def test_a_trial_re_run_on_a_busy_host_reads_as_its_re_run_under_its_own_number() -> None:
    busy = "untrusted: host busier than at the baseline (x1.4 contention)"
    trials = [_t(0, "baseline", "kept", 1.0, {"b": 1}), _t(1, "search", "kept", 1.5, {"b": 2}),
              _t(2, "search", "invalid", None, {"b": 4}, busy), _t(3, "sentinel", "kept", 1.0, {"b": 1}),
              _t(4, "retry", "kept", 2.4, {"b": 4}), _t(5, "paired", "kept", 2.3, {"b": 4}),
              _t(6, "search", "discarded", 1.1, {"b": 8})]
    assert [(rerun.number, first.number) for rerun, first in retried(trials)] == [(4, 2)]
    shown = search_history(trials)
    assert [t.number for t in shown] == [0, 1, 2, 6]  # no sentinel, paired half or retry row
    two = shown[2]
    assert (two.proposer, two.status, two.score, two.error, two.optuna_trial_number) == ("search", "kept", 2.4, None, 2)
    assert two.objective == trials[4].objective and two.knobs == {"b": 4}
    assert shown[1] is trials[1] and shown[3] is trials[6]  # the others as they are


def test_a_retry_stands_only_for_an_invalid_trial_of_its_own_knobs() -> None:
    # A retry whose knobs differ from the trial before it, or after a trial that was not invalid, replaces nothing.
    trials = [_t(0, "baseline", "kept", 1.0, {"b": 1}), _t(1, "search", "invalid", None, {"b": 2}, "untrusted"),
              _t(2, "retry", "kept", 2.0, {"b": 3}), _t(3, "search", "kept", 1.5, {"b": 4}),
              _t(4, "retry", "kept", 2.0, {"b": 4})]
    assert retried(trials) == []
    assert [(t.number, t.status) for t in search_history(trials)] == [(0, "kept"), (1, "invalid"), (3, "kept")]
