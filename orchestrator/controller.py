"""THE loop: baseline, then propose -> trial -> verdict -> record, until a stop.

Stops are exceptions (`GoalMet`, `BudgetExhausted`, `Stalled`, `ProposerExhausted`, and the
gate suite's `GateTampered`), so the loop body stays straight-line. Every decision is in the
store before the next one is taken; `resume` needs nothing else.
"""

from __future__ import annotations

import errno
import math
from dataclasses import dataclass
from typing import Any

from orchestrator.proposers import Candidate, Proposer
from orchestrator.targets.spec import ConstraintViolated
from orchestrator.trial import TrialContext, TrialResult, objective_label, run_trial

__all__ = ["BudgetExhausted", "Controller", "GoalMet", "ProposerExhausted", "Stalled", "StopRun"]

CONFIRM = "confirm"


class StopRun(Exception):
    """The run ends; the message is the stop reason."""


class GoalMet(StopRun):
    pass


class BudgetExhausted(StopRun):
    pass


class Stalled(StopRun):
    pass


class ProposerExhausted(StopRun):
    pass


@dataclass
class Baseline:
    samples: dict[str, list[float]]
    """objective label -> the baseline's repeated measurements."""
    values: dict[str, float]
    """objective label -> mean baseline value."""
    noise: float
    """Largest relative spread between baseline repeats (0.0 with one repeat)."""


class Controller:
    """Drives one run. `ctx` holds the run's fixed parts; the store holds its state."""

    def __init__(
        self, ctx: TrialContext, proposer: Proposer, *, repeats: int = 1, baseline_repeats: int = 2,
        min_gain: float = 0.03, on_trial: Any = None,
    ) -> None:
        self.ctx, self.proposer, self.store = ctx, proposer, ctx.store
        self.repeats, self.baseline_repeats, self.min_gain = repeats, baseline_repeats, min_gain
        self.on_trial = on_trial or (lambda trial: None)

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> str:
        """Run (or resume) until a stop; return the stop reason."""
        from gates.lock import GateTampered, verify

        run_id = self.ctx.run_id
        self.store.set_run_status(run_id, "running")
        try:
            verify()
            self._loop()
        except StopRun as stop:
            reason = f"{type(stop).__name__}: {stop}"
            self.store.set_run_status(run_id, "finished", stop_reason=reason)
            self.store.add_event(run_id, "stop", reason)
            return reason
        except GateTampered as e:
            reason = f"GateTampered: {e}"
            self.store.set_run_status(run_id, "failed", stop_reason=reason)
            self.store.add_event(run_id, "gates.tampered", str(e))
            raise
        except KeyboardInterrupt:
            self.store.set_run_status(run_id, "stopped", stop_reason="interrupted; `infergoal resume` continues")
            raise
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            try:  # the database may sit on the same full disk
                self.store.set_run_status(run_id, "stopped", stop_reason="disk full; free space, then `infergoal resume`")
            except Exception:  # noqa: BLE001
                pass
            raise OSError(e.errno, f"disk full ({e.filename or e}); free space, then `infergoal resume` continues the run") from e

    def _start(self) -> None:
        """Redo what a kill interrupted, then run the baseline; a failed baseline stops the run here."""
        for trial in self.store.unfinished_trials(self.ctx.run_id):  # resume: redo what a kill interrupted
            self.store.add_event(self.ctx.run_id, "resume", f"re-running interrupted trial #{trial.number}", trial_id=trial.id)
            self.store.reset_trial(trial.id)
            self._execute(trial, _candidate_of(trial))
        if not self.store.list_trials(self.ctx.run_id):
            baseline = Candidate(self.ctx.target.baseline_knobs(), rationale="baseline: the target's defaults", proposer="baseline")
            self._execute(self._create(baseline), baseline)
        self._baseline()  # raises if the baseline failed, before a trial is created that never runs

    def _loop(self) -> None:
        """Resume, run the baseline, then propose and run one trial at a time."""
        self._start()
        while True:
            self._check_budget()
            t0 = _now()
            candidate = self._propose()
            self._execute(self._create(candidate), candidate, propose_s=_now() - t0)

    def _propose(self) -> Candidate:
        """The proposer's next candidate with its knobs validated. A knob set that breaks one of the
        target's constraints is recorded as a failed trial, never launched, and the proposer asked again."""
        while True:
            self.ctx.on_step("propose")
            candidate = self.proposer.propose(self._history(), self.ctx.target)
            if candidate is None:
                raise ProposerExhausted(f"the {self.proposer.name} proposer has nothing left to try")
            try:
                return Candidate(**{**candidate.__dict__, "knobs": self.ctx.target.validate_knobs(candidate.knobs)})
            except ConstraintViolated as e:
                self.store.finish_trial(self._create(candidate).id, "failed",
                                        error=f"start-up failure (constraint_violated, not launched): {e}")
                self._check_budget()

    # --- one trial -----------------------------------------------------------------------
    def _create(self, c: Candidate) -> Any:
        trials = self.store.list_trials(self.ctx.run_id)
        number = max((t.number for t in trials), default=-1) + 1
        return self.store.create_trial(
            self.ctx.run_id, number, commit=c.commit or self.ctx.base_commit or "", knobs=c.knobs,
            rationale=c.rationale, proposer=c.proposer, prediction=c.prediction,
        )

    def _execute(self, trial: Any, candidate: Candidate, propose_s: float = 0.0) -> None:
        baseline = None if trial.number == 0 else self._baseline()
        self._settle(trial, candidate, self._run(trial, candidate, baseline), baseline, propose_s)

    def _run(self, trial: Any, candidate: Candidate, baseline: Baseline | None, ctx: TrialContext | None = None) -> TrialResult:
        """Deploy, gate and measure (on `ctx.host`; a pool calls this from its worker threads)."""
        is_baseline = baseline is None
        try:
            return run_trial(
                ctx or self.ctx, trial, candidate,
                repeats=self.baseline_repeats if is_baseline else self.repeats,
                remeasure=(lambda r: False) if is_baseline else (lambda r: self._borderline(r, baseline)),
            )
        except Exception as e:
            if type(e).__name__ == "GateTampered":  # the trial cannot count: say so, then stop the run
                self.store.finish_trial(trial.id, "invalid", error=f"GateTampered: {e}")
            raise

    def _settle(self, trial: Any, candidate: Candidate, result: TrialResult, baseline: Baseline | None, propose_s: float) -> None:
        """The verdict, recorded: this is the one place keep / discard / stop is decided."""
        status, score, objective, met = self._verdict(trial, result, baseline)
        timings = dict(result.timings, propose=propose_s)
        self.ctx.on_step("record")
        t_rec = _now()
        self.store.finish_trial(trial.id, status, score=score, objective=objective, error=result.error, timings=timings)
        if status == "kept" and trial.proposer != CONFIRM and (score or 0) >= self._best_score():
            self.store.set_best_trial(self.ctx.run_id, trial.id)
        timings["record"] = _now() - t_rec
        timings["total"] = timings.get("trial", 0.0) + timings["record"] + timings.get("propose", 0.0)
        self.store.finish_trial(trial.id, status, score=score, objective=objective, error=result.error, timings=timings)
        finished = self.store.get_trial(trial.id)
        self.on_trial(finished)
        if status == "kept" and met:
            if trial.proposer == CONFIRM:
                original = self.store.get_trial_by_number(self.ctx.run_id, int(trial.rationale.rsplit("#", 1)[1]))
                self.store.set_best_trial(self.ctx.run_id, original.id)  # the confirmed winner is the answer
                raise GoalMet(f"{trial.rationale.split(': ')[-1]} meets every objective, confirmed by a clean relaunch (#{trial.number})")
            confirm = Candidate(candidate.knobs, commit=candidate.commit, rationale=f"confirm by a clean relaunch: #{trial.number}", proposer=CONFIRM)
            self._confirm(confirm)

    def _confirm(self, confirm: Candidate) -> None:
        self._execute(self._create(confirm), confirm)

    def _verdict(self, trial: Any, r: TrialResult, baseline: Baseline | None) -> tuple[str, float | None, dict, bool]:
        """(status, score, objective values, whether the performance gate says the goal is met)."""
        objective = {label: r.mean(label) for label in r.samples}
        if r.error:
            return r.status_hint, None, objective, False
        if baseline is None:
            return "kept", 1.0, objective, False
        score = self._score(r, baseline)
        perf = self._perf_gate(r, baseline)
        self.store.add_gate_result(trial.id, perf.gate, perf.status,
                                   perf.reason, perf.details, perf.duration_s)
        met = perf.status == "pass"
        if trial.proposer == CONFIRM:
            return ("kept" if met else "discarded"), score, objective, met
        # A candidate that meets the whole goal is kept even if another scored higher on the geomean.
        if not met and score <= self._best_score() * (1 + self._needed_gain(baseline)):
            return "discarded", score, objective, met
        if r.gate_drift and self.ctx.goal.accuracy_mode == "no_loss":
            # Faster but measurably different: a person decides (`infergoal approve N`).
            return "needs_approval", score, objective, met
        return "kept", score, objective, met

    # --- judging helpers -----------------------------------------------------------------
    def _score(self, r: TrialResult, baseline: Baseline) -> float:
        """Geometric mean of per-objective speedups over the baseline (>1 is better)."""
        speedups = [
            o.speedup(r.mean(objective_label(o.scenario, o.key)), baseline.values[objective_label(o.scenario, o.key)])
            for o in self.ctx.goal.objectives
        ]
        return math.exp(sum(math.log(s) for s in speedups) / len(speedups))

    def _perf_gate(self, r: TrialResult, baseline: Baseline) -> Any:
        """The performance gate on the goal's objectives: noise-aware pass / fail / remeasure.

        Relative objectives go through `gates.performance` (improvement beyond k standard errors
        of the change); absolute ones compare the candidate's mean with the threshold.
        """
        from gates import GateResult, performance

        rel = [o for o in self.ctx.goal.objectives if o.kind == "relative"]
        absolute = [o for o in self.ctx.goal.objectives if o.kind == "absolute"]
        misses = [
            o.describe() for o in absolute
            if not o.met(r.mean(objective_label(o.scenario, o.key)), baseline.values[objective_label(o.scenario, o.key)])
        ]
        if not rel:
            return GateResult("performance", "fail" if misses else "pass",
                              "missed: " + "; ".join(misses) if misses else "absolute targets met", {}, 0.0)
        labels = {objective_label(o.scenario, o.key): o for o in rel}
        res = performance.check(
            {k: baseline.samples[k] for k in labels}, {k: r.samples.get(k, []) for k in labels},
            targets={k: o.value for k, o in labels.items()}, guards=[],
            directions={k: o.info.direction == "maximize" for k, o in labels.items()},
        )
        if misses and res.status != "fail":
            return GateResult("performance", "fail", "missed: " + "; ".join(misses), res.details, res.duration_s)
        return res

    def _needed_gain(self, baseline: Baseline) -> float:
        # Noise-aware: a win smaller than the baseline's own spread between repeats is not a win.
        return max(self.min_gain, baseline.noise)

    def _borderline(self, r: TrialResult, baseline: Baseline) -> bool:
        """Re-measure when the performance gate asks for it, or the score sits in the noise band of the keep line."""
        if not r.samples or any(not v for v in r.samples.values()):
            return False
        if self._perf_gate(r, baseline).status == "remeasure":
            return True
        threshold = self._best_score() * (1 + self._needed_gain(baseline))
        return abs(self._score(r, baseline) / threshold - 1) < max(baseline.noise, 0.01)

    def _best_score(self) -> float:
        kept = [t.score for t in self.store.list_trials(self.ctx.run_id) if t.status == "kept" and t.score and t.proposer != CONFIRM]
        return max(kept, default=1.0)

    def _baseline(self) -> Baseline:
        t0 = self.store.get_trial_by_number(self.ctx.run_id, 0)
        if t0 is None or t0.status != "kept":
            raise StopRun(f"the baseline trial failed ({t0.error if t0 else 'missing'}); fix the target and start a new run")
        samples: dict[str, list[float]] = {}
        for m in self.store.measurements(t0.id):
            for o in self.ctx.goal.objectives:
                if m.scenario == o.scenario and m.metric == o.key:
                    samples.setdefault(objective_label(o.scenario, o.key), []).append(m.value)
        values = {k: sum(v) / len(v) for k, v in samples.items()}
        noise = max(((max(v) - min(v)) / (sum(v) / len(v)) for v in samples.values() if len(v) > 1), default=0.0)
        return Baseline(samples=samples, values=values, noise=noise)

    def _history(self) -> list[Any]:
        return self.store.list_trials(self.ctx.run_id)

    def _check_budget(self) -> None:
        trials = [t for t in self._history() if t.proposer != CONFIRM]
        budget = self.ctx.goal.budget
        if budget.trials is not None and len(trials) >= budget.trials:
            raise BudgetExhausted(f"{len(trials)} trials run, the budget was {budget.trials}")
        spent = sum((t.timings or {}).get("total", 0.0) for t in self._history())
        if budget.wall_s is not None and spent >= budget.wall_s:
            raise BudgetExhausted(f"{spent / 60:.1f} min of trial time spent, the budget was {budget.wall_s / 60:g} min")
        since_best = 0
        for t in reversed(trials):
            if t.status == "kept":
                break
            since_best += 1
        if since_best >= budget.stall_trials:
            raise Stalled(f"{since_best} trials in a row without a new best")


def _candidate_of(trial: Any) -> Candidate:
    return Candidate(knobs=dict(trial.knobs), commit=trial.commit, rationale=trial.rationale, proposer=trial.proposer)


def _now() -> float:
    import time

    return time.perf_counter()
