"""Driving a run from the terminal: the live view, how a run's errors end the command, its exit code.

`infergoal goal` and `infergoal resume` hand their run to `drive`, which shows a bar over the
trials and a line per trial on stderr, and to `finish`, which prints how it ended and exits with
the outcome's code (orchestrator/core/exitcodes.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
)
from rich.text import Text

from orchestrator.cli.common import console, err, get_store, get_workspace
from orchestrator.cli.errors import ERRORS, emit, fail
from orchestrator.review import trials as listing

__all__ = ["drive", "finish", "resume_progress"]


class _WallClock(ProgressColumn):
    """The command's wall time so far. Rich's own elapsed column stops once the bar is full (the
    trial budget spent), while the paired rounds and sentinels after the last trial still take
    minutes: this one runs until the view stops."""

    def __init__(self, t0: float, clock: Callable[[], float]) -> None:
        super().__init__()
        self.t0, self.clock = t0, clock

    def render(self, task: Task) -> Text:
        return Text(str(timedelta(seconds=int(max(self.clock() - self.t0, 0)))), style="progress.elapsed")


class _Progress:
    """Rich live view: a bar over trials, a line for the step in flight, the wall time so far."""

    def __init__(self, budget_trials: int | None, quiet: bool, done: int = 0,
                 clock: Callable[[], float] = time.monotonic, notes: Callable[[Any], list[str]] | None = None) -> None:
        self.quiet = quiet
        self.notes = notes or (lambda t: [])
        """A finished row -> warnings the run recorded on it (a baseline noisier than the goal), printed under it."""
        self.t0 = clock()
        self.clock = _WallClock(self.t0, clock)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[step]}"), self.clock, console=err, transient=False, get_time=clock,
        )
        self.task = self.progress.add_task("trials", total=budget_trials, completed=done, step="starting")
        self.shown: dict[int, str] = {}
        """Trial number -> the status its line said: a row printed again says what it was before."""

    def step(self, name: str) -> None:
        self.progress.update(self.task, step=name)

    def trial(self, t: Any) -> None:
        from orchestrator.core.roles import LOOP_ADDED

        status = listing.shown_status(t)
        before = self.shown.get(t.number)
        self.shown[t.number] = status
        if t.proposer not in LOOP_ADDED and before is None:  # the bar counts the budget's trials; re-measures are listed only
            self.progress.advance(self.task)
        score = f"{t.score:.3f}x" if t.score else "—"
        obj = "  ".join(f"{k.split(':')[1]}={v:.2f}" for k, v in (t.objective or {}).items())
        colour = {"kept": "green", "measured": "cyan", "discarded": "white", "failed": "red",
                  "invalid": "magenta"}.get(status, "yellow")
        label, who = f"#{t.number:<3}", t.proposer
        if listing.is_measurement(t):  # a paired round, sentinel or re-run: a measurement of a trial, not one
            of = listing.measured_trial(t)
            label, who = f"↳{t.number:<3}", f"{t.proposer} of #{of}" if of is not None else t.proposer
        # A row told again (a paired round redone after it was measured) says so, and why (its error).
        said = status if before is None or before == status else f"{status} (was {before})"
        line = f"{label} [{colour}]{said:<14}[/] {score:>8}  {obj}  [dim]{who}[/]"
        if t.error:
            from orchestrator.core.oneline import summarize_failure

            line += f"\n      [dim red]{escape(summarize_failure(t.error, 200))}[/]"
        for note in self.notes(t):
            line += f"\n      [bold yellow]warning:[/] {escape(note)}"
        self.progress.console.print(line, highlight=False)


def resume_progress(store: Any, run_id: int | None) -> tuple[int | None, int]:
    """The bar of a resumed run: (its trial budget, its trials the bar counts that already finished).

    A resumed run keeps its goal's budget (`6/20`, not `6/?`); interrupted trials are not done yet:
    they count when their re-run ends. (None, 0) when there is no such run: resume says so."""
    from orchestrator.config.goal import GoalSpec
    from orchestrator.core.roles import LOOP_ADDED

    run = store.get_run(run_id) if run_id is not None else store.latest_run()
    if run is None:
        return None, 0
    try:
        budget = GoalSpec.model_validate(run.goal).budget.trials
    except ValueError:  # a stored goal today's rules refuse: resume says so
        budget = None
    done = sum(1 for t in store.list_trials(run.id) if t.proposer not in LOOP_ADDED and t.status not in ("pending", "running"))
    return budget, done


def drive(fn: Any, budget_trials: int | None, as_json: bool, done: int = 0, **kw: Any) -> Any:
    """Run `fn` under the live view. An error before the run row exists is bad input (nothing
    was created); after, the run failed (it is marked so in the store). `done`: trials the bar
    starts at (a resumed run's finished ones)."""
    from gates.lock import GateTampered
    from orchestrator.agent import AgentError
    from orchestrator.core import interrupts
    from orchestrator.core.oneline import one_line
    from orchestrator.hosts import HostError
    from orchestrator.hosts.runlease import LeaseHeld

    started: list[int] = []

    def noise_notes(t: Any) -> list[str]:  # said when the baseline is measured, not only at the stop
        from orchestrator.trial.verdict import NOISE_HIGH

        if t.number != 0 or not started:
            return []
        return [e.message for e in get_store().events(started[0], kind=NOISE_HIGH, trial_id=t.id)]

    view = _Progress(budget_trials, as_json, done, notes=noise_notes)

    def on_run(run_id: int) -> None:
        started.append(run_id)
        if not as_json:  # drawn once the run exists: a refused request prints its error line alone
            view.progress.start()

    try:
        with interrupts.installed():
            try:
                return fn(on_step=view.step, on_trial=view.trial, on_run=on_run, **kw)
            finally:
                view.progress.stop()
    except KeyboardInterrupt:
        if not started:  # stopped before the run row exists (e.g. while the model is built): nothing to resume
            fail("interrupted before the run was created: nothing was saved; run the same `infergoal goal` again", "interrupted")
        fail(f"interrupted; run {started[0]} is saved — continue it with `infergoal resume`", "interrupted")
    except (LeaseHeld, GateTampered):
        raise
    except (HostError, AgentError, FileNotFoundError, LookupError, ValueError) as e:
        fail(str(e), "failed" if started else "bad_input")
    except Exception as e:
        if started and not ERRORS.debug:
            fail(f"run {started[0]} failed: {one_line(e)}; see `infergoal status` and `infergoal show`", "failed")
        raise


def finish(outcome: Any, as_json: bool, report: bool) -> None:
    """Print how the run ended and exit with its outcome's code (see orchestrator/core/exitcodes.py)."""
    from orchestrator.core.exitcodes import EXIT_CODES
    from orchestrator.core.oneline import summarize_failure

    ws = get_workspace()
    store = get_store()
    path = None
    if report:
        from orchestrator.report import write_report

        path = write_report(store, outcome.run_id, ws.run_dir(outcome.run_id) / "report")
    run = store.get_run(outcome.run_id)
    best = store.get_trial(run.best_trial_id) if run.best_trial_id else None
    code = EXIT_CODES[outcome.outcome]
    if as_json:
        emit({"run": outcome.run_id, "outcome": outcome.outcome, "exit_code": code, "stop_reason": outcome.stop_reason,
              "report": str(path) if path else None, "best": asdict(best) if best else None})
    else:
        console.print(f"\n[bold]run {outcome.run_id}[/] {outcome.outcome.replace('_', ' ')}: "
                      f"{escape(summarize_failure(outcome.stop_reason))}", highlight=False)
        if best and best.number:
            said = listing.score_text(best.score, listing.paired_scores(store, run.id).get(best.id), unit="x")
            console.print(f"best: trial #{best.number}, score {said} — knobs {escape(listing.knob_text(best.knobs))}", highlight=False)
        if path:
            console.print(f"report: {path}")
    if code:
        raise typer.Exit(code)
