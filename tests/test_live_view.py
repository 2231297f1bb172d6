"""The live view of a run (`orchestrator.cli.live`): its clock, its rows' statuses, how a stop is told.

Driven in-process with trial rows shaped like the store's and a clock the test moves, so no
test waits: the view under test is the one `infergoal goal` draws on stderr.
"""

from types import SimpleNamespace

import pytest
import typer
from rich.console import Console

from orchestrator.cli import live
from orchestrator.cli.common import err
from orchestrator.core.exitcodes import EXIT_CODES


def _row(number, proposer, status, *, score=None, error=None, rationale=""):
    return SimpleNamespace(number=number, proposer=proposer, status=status, score=score, objective={},
                           error=error, rationale=rationale)


def _columns(view) -> str:
    """The bar's line as drawn."""
    console = Console(record=True, width=200)
    console.print(view.progress.make_tasks_table(view.progress.tasks))
    return console.export_text()


def _lines(view, rows) -> list[str]:
    with err.capture() as cap:
        for r in rows:
            view.trial(r)
    return [line for line in cap.get().splitlines() if line.strip()]


def test_the_clock_is_the_wall_time_of_the_run_past_the_last_trial():
    """A budget of 2 trials fills the bar at minute 3; the paired rounds after it ran to minute 13.7:
    the clock says 0:13:42, not the 0:02:51 at which rich's own column stops when the bar is full."""
    now = [0.0]
    view = live._Progress(2, False, clock=lambda: now[0])
    for minute, row in ((1.0, _row(0, "baseline", "kept", score=1.0)), (2.85, _row(1, "search", "kept", score=1.3)),
                        (2.86, _row(2, "search", "discarded", score=0.9))):
        now[0] = minute * 60
        _lines(view, [row])
    assert view.progress.tasks[0].finished  # the budget is spent
    assert "0:02:51" in _columns(view)
    now[0] = 13.7 * 60  # 14 measurements later
    assert "0:13:42" in _columns(view)


def test_measurements_read_measured_and_a_row_told_again_says_what_it_was():
    view = live._Progress(2, False)
    lines = _lines(view, [
        _row(0, "baseline", "kept", score=1.0),
        _row(1, "search", "kept", score=1.368),
        _row(2, "paired", "kept", rationale="paired A/B of #1, round 1: baseline"),
        _row(2, "paired", "invalid", rationale="paired A/B of #1, round 1: baseline",
             error="round redone: its ratio 3.10x is far from the other rounds' median 1.10x"),
    ])
    assert lines[0].startswith("#0") and "measured" in lines[0] and "kept" not in lines[0]
    assert "kept" in lines[1]  # a candidate is kept
    assert lines[2].startswith("↳2") and "measured" in lines[2] and "kept" not in lines[2] and "paired of #1" in lines[2]
    assert lines[3].startswith("↳2") and "invalid (was measured)" in lines[3]
    assert "round redone" in lines[4]  # why it changed, under it
    assert view.progress.tasks[0].completed == 2  # #0 and #1; the paired half, told twice, counts no trial


def test_stopped_before_the_run_exists_says_nothing_was_saved(capsys):
    """Ctrl-C while the model is built (before the run row): no `infergoal resume` to offer."""
    def building(**kw):
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as e:
        live.drive(building, 2, True)
    said = capsys.readouterr().err
    assert e.value.exit_code == EXIT_CODES["interrupted"]
    assert "nothing was saved" in said and "run the same `infergoal goal` again" in said and "resume" not in said

    def running(on_run, **kw):
        on_run(7)
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit):
        live.drive(running, 2, True)
    said = capsys.readouterr().err
    assert "run 7 is saved" in said and "infergoal resume" in said


def test_a_warning_recorded_on_a_row_is_printed_under_it():
    view = live._Progress(2, False, notes=lambda t: ["the baseline's noise 56.4% is larger than ..."] if t.number == 0 else [])
    lines = _lines(view, [_row(0, "baseline", "kept", score=1.0), _row(1, "search", "kept", score=1.4)])
    assert lines[0].startswith("#0") and lines[1].strip().startswith("warning: the baseline's noise 56.4%")
    assert lines[2].startswith("#1") and len(lines) == 3
