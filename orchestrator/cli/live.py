"""Driving a run from the terminal: the live view, how a run's errors end the command, its exit code.

`infergoal goal` and `infergoal resume` hand their run to `drive`, which shows a bar over the
trials and a line per trial on stderr, and to `finish`, which prints how it ended and exits with
the outcome's code (orchestrator/exitcodes.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from orchestrator.audit.trials import is_measurement, knob_text, measured_trial, paired_scores, score_text
from orchestrator.cli.common import console, err, get_store, get_workspace
from orchestrator.cli.errors import ERRORS, emit, fail

__all__ = ["drive", "finish", "resume_progress"]


class _Progress:
    """Rich live view: a bar over trials and a line for the step in flight."""

    def __init__(self, budget_trials: int | None, quiet: bool, done: int = 0) -> None:
        self.quiet = quiet
        self.progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[step]}"), TimeElapsedColumn(), console=err, transient=False,
        )
        self.task = self.progress.add_task("trials", total=budget_trials, completed=done, step="starting")
        self.t0 = time.monotonic()

    def step(self, name: str) -> None:
        self.progress.update(self.task, step=name)

    def trial(self, t: Any) -> None:
        from orchestrator.roles import LOOP_ADDED

        if t.proposer not in LOOP_ADDED:  # the bar counts the budget's trials; re-measures are listed only
            self.progress.advance(self.task)
        score = f"{t.score:.3f}x" if t.score else "—"
        obj = "  ".join(f"{k.split(':')[1]}={v:.2f}" for k, v in (t.objective or {}).items())
        colour = {"kept": "green", "discarded": "white", "failed": "red", "invalid": "magenta"}.get(t.status, "yellow")
        label, who = f"#{t.number:<3}", t.proposer
        if is_measurement(t):  # a paired round, sentinel or re-run: a measurement of a trial, not one
            of = measured_trial(t)
            label, who = f"↳{t.number:<3}", f"{t.proposer} of #{of}" if of is not None else t.proposer
        line = f"{label} [{colour}]{t.status:<14}[/] {score:>8}  {obj}  [dim]{who}[/]"
        if t.error:
            from orchestrator.errors import summarize_failure

            line += f"\n      [dim red]{escape(summarize_failure(t.error, 200))}[/]"
        self.progress.console.print(line, highlight=False)


def resume_progress(store: Any, run_id: int | None) -> tuple[int | None, int]:
    """The bar of a resumed run: (its trial budget, its trials the bar counts that already finished).

    A resumed run keeps its goal's budget (`6/20`, not `6/?`); interrupted trials are not done yet:
    they count when their re-run ends. (None, 0) when there is no such run: resume says so."""
    from orchestrator.goal import GoalSpec
    from orchestrator.roles import LOOP_ADDED

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
    from orchestrator import interrupts
    from orchestrator.agent import AgentError
    from orchestrator.errors import one_line
    from orchestrator.hosts import HostError
    from orchestrator.lease import LeaseHeld

    started: list[int] = []
    view = _Progress(budget_trials, as_json, done)

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
        fail("interrupted; the run is saved — continue it with `infergoal resume`", "interrupted")
    except (LeaseHeld, GateTampered):
        raise
    except (HostError, AgentError, FileNotFoundError, LookupError, ValueError) as e:
        fail(str(e), "failed" if started else "bad_input")
    except Exception as e:
        if started and not ERRORS.debug:
            fail(f"run {started[0]} failed: {one_line(e)}; see `infergoal status` and `infergoal show`", "failed")
        raise


def finish(outcome: Any, as_json: bool, report: bool) -> None:
    """Print how the run ended and exit with its outcome's code (see orchestrator/exitcodes.py)."""
    from orchestrator.errors import summarize_failure
    from orchestrator.exitcodes import EXIT_CODES

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
            said = score_text(best.score, paired_scores(store, run.id).get(best.id), unit="x")
            console.print(f"best: trial #{best.number}, score {said} — knobs {escape(knob_text(best.knobs))}", highlight=False)
        if path:
            console.print(f"report: {path}")
    if code:
        raise typer.Exit(code)
