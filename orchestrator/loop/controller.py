"""THE loop: baseline, then propose -> trial -> verdict -> record, until a stop.

Stops are exceptions (`GoalMet`, `BudgetExhausted`, `Stalled`, `ProposerExhausted`, and the
gate suite's `GateTampered`), so the loop body stays straight-line. Every decision is in the
store before the next one is taken; `resume` needs nothing else.

On a shared host a baseline measured once is not a baseline: the baseline is re-measured
(`sentinel` trials) every few trials and whenever the host's state moved, each candidate is
judged against the newest one, and a claim (goal met; the best of a run that stopped) rests on
a paired A/B confirmation on fresh servers (`orchestrator.trial.paired`), never on the search's screen.

After the stop, `probe` > 0 measures the winner's one-knob neighbours for the knowledge base
(`_probe_winner`): never kept, outside the trial budget, and a resume finishes them.
"""

from __future__ import annotations

import dataclasses
import errno
import time
from typing import Any

from gates.lock import GateTampered, verify
from gates.thresholds import section
from orchestrator.core import interrupts
from orchestrator.core.candidate import Candidate, knob_key
from orchestrator.core.roles import (
    BASELINE,
    BASELINES,
    LOOP_ADDED,
    NEVER_KEPT,
    NOT_SEARCH,
    PAIRED,
    PROBE,
    RETRY,
    SENTINEL,
    BudgetExhausted,
    GoalMet,
    ProposerExhausted,
    Refused,
    Stalled,
    StopRun,
    retried,
    search_history,
)
from orchestrator.hosts.measure import host_during, idle_state, scale_refusal, state_change
from orchestrator.proposers.base import Proposer
from orchestrator.proposers.costmodel import GoalAim
from orchestrator.proposers.optspace import neighbours
from orchestrator.targets.regions import region_of
from orchestrator.targets.spec import ConstraintViolated
from orchestrator.trial import fidelity, goalbars, verdict
from orchestrator.trial.context import TrialContext, TrialResult, objective_label
from orchestrator.trial.paired import describe, interrupted, latest_paired, measured_rounds, run_paired
from orchestrator.trial.run import run_trial
from orchestrator.trial.verdict import Baseline

# The stop exceptions live in `orchestrator.core.roles`; importing them from here keeps working.
__all__ = ["Baseline", "BudgetExhausted", "Controller", "GoalMet", "ProposerExhausted", "Refused", "Stalled", "StopRun"]

class Controller:
    """Drives one run. `ctx` holds the run's fixed parts; the store holds its state."""

    def __init__(
        self, ctx: TrialContext, proposer: Proposer, *, repeats: int = 1, baseline_repeats: int = 2,
        min_gain: float = 0.03, on_trial: Any = None, probe: int = 0, screen_fraction: float = 0.0,
    ) -> None:
        self.ctx, self.proposer, self.store = ctx, proposer, ctx.store
        self.repeats, self.baseline_repeats, self.min_gain = repeats, baseline_repeats, min_gain
        self.probe = probe
        """After the stop, measure up to this many one-knob neighbours of the winner (`_probe_winner`)."""
        self.on_trial = on_trial or (lambda trial: None)
        self.screen_fraction = screen_fraction
        """`bench.screen_fraction`: search candidates get a short bench first (`orchestrator.trial.fidelity`); 0 = off."""

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> str:
        """Run (or resume) until a stop; return the stop reason."""
        run_id = self.ctx.run_id
        self.store.set_run_status(run_id, "running")
        try:
            verify()
            reason = self._decided()  # resumed while probing: the stop was decided before
            if reason is None:
                reason = self._search()
            else:
                self._redo_unfinished()
            if self.probe and not reason.startswith(("Refused", "StopRun")):
                self._probe_winner(reason)
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

    def _search(self) -> str:
        """The loop until a stop; the stop reason (a stop without a met goal confirms the best first)."""
        try:
            refusal = scale_refusal(self.ctx.scenarios, self.ctx.goal.scenarios, self.ctx.trust)
            if refusal:
                raise Refused(refusal)
            self._loop()
        except StopRun as stop:
            reason = f"{type(stop).__name__}: {stop}"
            if not isinstance(stop, (GoalMet, Refused)):
                reason = self._confirm_best(reason)
            noisy = self.store.events(self.ctx.run_id, kind=verdict.NOISE_HIGH)
            if noisy and not reason.startswith("GoalMet"):  # the verdict says it too, with what to do
                reason += f"; {noisy[-1].message}"
            return reason
        raise AssertionError("the loop ends only with a stop")  # pragma: no cover

    # --- after the stop: probes for the knowledge base ----------------------------------------
    def _decided(self) -> str | None:
        """The stop reason of a run that was interrupted while probing its winner (resume finishes the probes)."""
        events = self.store.events(self.ctx.run_id, kind="probe.start")
        return events[-1].message if events else None

    def _probe_winner(self, reason: str) -> None:
        """Measure the winner's one-knob neighbours (at most `probe`), each judged like a candidate
        against the newest baseline but never kept: they are evidence for the knowledge base (which
        knob moved the winner, and by how much), not answers. The stop is recorded first, so a
        resume finishes the probes and keeps the stop. Knob sets the run measured already count."""
        run = self.store.get_run(self.ctx.run_id)
        best = self.store.get_trial(run.best_trial_id) if run.best_trial_id else None
        if best is None or best.number == 0:
            return  # no winner: nothing to probe
        if self._decided() is None:
            self.store.add_event(self.ctx.run_id, "probe.start", reason, data={"winner": best.number, "limit": self.probe})
        seen = {knob_key(t.knobs) for t in self._history() if t.status != "running"}
        todo = [(k, v, knobs) for k, v, knobs in neighbours(self.ctx.target, dict(best.knobs)) if knob_key(knobs) not in seen]
        done = sum(1 for t in self._history() if t.proposer == PROBE)
        for knob, value, knobs in todo[: max(self.probe - done, 0)]:
            interrupts.check()
            self._sentinel_if_needed()
            c = Candidate(knobs, commit=best.commit, rationale=f"probe: the winner #{best.number} with {knob}={value!r}",
                          proposer=PROBE)
            self._execute(self._create(c), c)

    def _start(self) -> None:
        """Redo what a kill interrupted, then run the baseline; a failed baseline stops the run here. A paired
        confirmation the kill cut short continues first, from its whole rounds (`paired.run_paired` reads them),
        or starts again when the kill came before its first whole round."""
        self._redo_unfinished()
        if not self.store.list_trials(self.ctx.run_id):
            baseline = Candidate(self.ctx.target.baseline_knobs(), rationale="baseline: the target's defaults", proposer=BASELINE)
            self._execute(self._create(baseline), baseline)
        baseline = self._baseline()  # raises if the baseline failed, before a trial is created that never runs
        if (n := interrupted(self.store, self.ctx.run_id)) is not None:
            trial = self.store.get_trial_by_number(self.ctx.run_id, n)
            if trial is not None and trial.status in ("kept", "discarded") and latest_paired(self.store, self.ctx.run_id, trial.id) is None:
                if not measured_rounds(self.store, self.ctx.run_id, n):
                    self.store.add_event(self.ctx.run_id, "resume", f"paired A/B of #{n} starts again: the interruption "
                                         "came before its first whole round", trial_id=trial.id)
                self._confirm_goal(trial, _candidate_of(trial), baseline)

    def _redo_unfinished(self) -> None:
        for trial in self.store.unfinished_trials(self.ctx.run_id):  # resume: redo what a kill interrupted
            said = (f"interrupted trial #{trial.number} is a paired round: marked invalid, not re-run (its "
                    "confirmation continues from its whole rounds, on new trials)"
                    if trial.proposer == PAIRED else f"re-running interrupted trial #{trial.number}")
            self.store.add_event(self.ctx.run_id, "resume", said, trial_id=trial.id)
            self.store.reset_trial(trial.id)
            self._execute(trial, _candidate_of(trial))

    def _loop(self) -> None:
        """Resume, run the baseline, then propose and run one trial at a time."""
        self._start()
        while True:
            interrupts.check()  # a SIGINT swallowed during the last trial stops the run here
            self._check_budget()
            self._sentinel_if_needed()
            t0 = _now()
            candidate = self._propose()
            self._execute(self._create(candidate), candidate, propose_s=_now() - t0)

    def _propose(self) -> Candidate:
        """The proposer's next candidate with its knobs validated. A knob set that breaks one of the
        target's constraints is recorded as a failed trial, never launched, and the proposer asked again."""
        while True:
            self.ctx.on_step("propose")
            # The proposer sees the search's own trials; sentinels and paired rounds are the loop's, and a
            # trial re-run on a busy host reads as its re-run measured it.
            search = search_history(self._history())
            if hasattr(self.proposer, "goal"):  # the goal's bars as the search's constraints, and what its steps climb
                self.proposer.goal, self.proposer.aim = self._steer()
            candidate = self.proposer.propose(search, self.ctx.target)
            if candidate is None:
                raise ProposerExhausted(f"the {self.proposer.name} proposer has nothing left to try")
            self._record_skips(candidate)
            try:
                knobs = self.ctx.target.validate_knobs(candidate.knobs)
                self.ctx.fit(knobs)  # GPUs, heads and memory of this host and model (targets.parallel)
                return Candidate(**{**candidate.__dict__, "knobs": knobs})
            except ConstraintViolated as e:
                self.store.finish_trial(self._create(candidate).id, "failed",
                                        error=f"start-up failure (constraint_violated, not launched): {e}")
                self._check_budget()

    def _record_skips(self, candidate: Candidate) -> None:
        """A `search.skip` event for each proposal the proposer skipped inside a failed region (once per knob set)."""
        done = {(e.data or {}).get("key") for e in self.store.events(self.ctx.run_id, kind="search.skip")}
        for s in candidate.extra.get("skipped", ()):
            if s["key"] not in done:
                self.store.add_event(self.ctx.run_id, "search.skip", f"skipped {s['source']} {s['key']}: inside the "
                                     f"failed region {s['region']['describe']} (marked by #{s['marked_by']})", data=s)

    # --- one trial -----------------------------------------------------------------------
    def _create(self, c: Candidate) -> Any:
        trials = self.store.list_trials(self.ctx.run_id)
        number = max((t.number for t in trials), default=-1) + 1
        return self.store.create_trial(
            self.ctx.run_id, number, commit=c.commit or self.ctx.base_commit or "", knobs=c.knobs,
            rationale=c.rationale, proposer=c.proposer, prediction=c.prediction,
        )

    def _execute(self, trial: Any, candidate: Candidate, propose_s: float = 0.0) -> None:
        if trial.proposer == PAIRED:  # a paired round cut in half: not used; its confirmation continues from its whole rounds
            self.store.finish_trial(trial.id, "invalid", error="interrupted paired round; not used")
            return
        is_baseline = trial.number == 0 or trial.proposer in BASELINES
        baseline = None if is_baseline else self._baseline()
        self._settle(trial, candidate, self._run(trial, candidate, baseline), baseline, propose_s)

    def _run(self, trial: Any, candidate: Candidate, baseline: Baseline | None, ctx: TrialContext | None = None) -> TrialResult:
        """Deploy, gate and measure (on `ctx.host`; a pool calls this from its worker threads)."""
        is_baseline = baseline is None
        try:
            return run_trial(
                ctx or self.ctx, trial, candidate,
                repeats=self.baseline_repeats if is_baseline else self.repeats,
                remeasure=(lambda r: False) if is_baseline else (lambda r: self._borderline(r, baseline)),
                host_ref=None if baseline is None else baseline.host,
                screen=None if is_baseline else fidelity.screen_for(
                    fraction=self.screen_fraction, trial=trial, proposer=self.proposer, history=self._history(),
                    scenarios=(ctx or self.ctx).scenarios, goal_scenarios=self.ctx.goal.scenarios,
                    score=lambda r: verdict.score(r, baseline, self.ctx.goal.objectives), noise=baseline.noise, store=self.store,
                    run_id=self.ctx.run_id, durations=self._durations(baseline) if self.screen_fraction > 0 else None,
                    objectives=self.ctx.goal.objectives, baseline=baseline.values,
                    caps=verdict.speedup_caps(self.store, self.ctx.run_id, baseline, self.ctx.model_dir, (ctx or self.ctx).scenarios,
                                              self.ctx.goal.objectives) if self.screen_fraction > 0 else None),
            )
        except GateTampered as e:  # the trial cannot count: say so, then stop the run
            self.store.finish_trial(trial.id, "invalid", error=f"GateTampered: {e}")
            raise

    def _settle(self, trial: Any, candidate: Candidate, result: TrialResult, baseline: Baseline | None, propose_s: float) -> None:
        """The verdict, recorded: this is the one place keep / discard / stop is decided."""
        is_baseline = baseline is None
        status, score, objective, met = self._verdict(trial, result, baseline)
        timings = dict(result.timings, propose=propose_s)
        self.ctx.on_step("record")
        t_rec = _now()
        self.store.finish_trial(trial.id, status, score=score, objective=objective, error=result.error, timings=timings)
        if status == "kept" and trial.proposer not in NOT_SEARCH and (score or 0) >= self._best_score():
            self.store.set_best_trial(self.ctx.run_id, trial.id)
        timings["record"] = _now() - t_rec
        timings["total"] = timings.get("trial", 0.0) + timings["record"] + timings.get("propose", 0.0)
        self.store.finish_trial(trial.id, status, score=score, objective=objective, error=result.error, timings=timings)
        bars = self._bars(baseline) if baseline is not None and not result.error and trial.proposer not in NEVER_KEPT else None
        goal = goalbars.screen(bars, objective, baseline.values, self.ctx.goal.objectives) if bars is not None else None
        self._record_why(trial, status, score, result.error, baseline, screen_met=met, goal=goal)
        if is_baseline and status == "kept" and trial.number == 0:
            base = self._baseline()
            if (warning := verdict.noise_warning(base.noise, self._smallest_step())) is not None:
                self.store.add_event(self.ctx.run_id, verdict.NOISE_HIGH, warning, trial_id=trial.id,
                                     data={"noise": base.noise, "step": self._smallest_step()})
            per_request = {o.scenario: o.key.split("_ms_")[0] + "_ms" for o in self.ctx.goal.objectives if "_ms_" in o.key}
            refusal = scale_refusal(self.ctx.scenarios, self.ctx.goal.scenarios, self.ctx.trust,
                                    result.metrics, margin=self._smallest_step(), per_request=per_request,
                                    rounds=int(section(None, "performance").get("paired_rounds", 3)))
            if refusal:
                raise Refused(refusal)
        finished = self.store.get_trial(trial.id)
        self.on_trial(finished)
        if status == "invalid" and "host busier than at the baseline" in (result.error or "") and trial.proposer not in (RETRY, PROBE):
            # The host stayed busier than when the baseline was measured: the baseline is what is stale.
            # Measure it again, then give the candidate one more chance against it.
            self._sentinel(f"host stayed busier during #{trial.number}")
            retry = Candidate(candidate.knobs, commit=candidate.commit, proposer=RETRY,
                              rationale=f"re-run of #{trial.number} against a fresh baseline: {candidate.rationale}")
            self._execute(self._create(retry), retry)
            return
        if met and status in ("kept", "discarded"):  # its screen clears every bar: paired A/B decides
            pick = self._to_confirm(baseline) or finished  # of the unconfirmed ones, the largest goal margin
            self._confirm_goal(pick, candidate if pick.id == trial.id else _candidate_of(pick), baseline)

    def _confirm_goal(self, trial: Any, candidate: Candidate, baseline: Baseline) -> None:
        """Paired A/B of a trial whose screen clears every bar; `GoalMet` when its paired rounds meet the goal."""
        paired = self._confirm_paired(trial, candidate)
        if not paired["met"]:
            return
        if trial.status != "kept":  # under its keep line, kept now because its paired A/B meets the goal
            t = self.store.get_trial(trial.id)
            self.store.finish_trial(t.id, "kept", score=t.score, objective=t.objective, error=t.error, timings=t.timings)
            self._record_why(self.store.get_trial(trial.id), "kept", trial.score, trial.error, baseline,
                             paired=paired, screen_met=True)
            self.on_trial(self.store.get_trial(trial.id))
        self.store.set_best_trial(self.ctx.run_id, trial.id)  # the confirmed winner is the answer
        raise GoalMet(f"#{trial.number} meets every objective: paired speedup {describe(paired)} on fresh servers")

    def _verdict(self, trial: Any, r: TrialResult, baseline: Baseline | None) -> tuple[str, float | None, dict, bool]:
        """(status, score, objective values, whether the performance gate says the goal is met)."""
        objective = {label: r.mean(label) for label in r.samples}
        if r.screened and baseline is not None:  # ended on its short bench: its short score, never kept
            return "discarded", verdict.score(r, baseline, self.ctx.goal.objectives), objective, False
        if r.error:
            return r.status_hint, None, objective, False
        sol = verdict.speed_of_light(self.store, self.ctx.run_id, r, baseline, self.ctx.model_dir, self.ctx.scenarios)
        if sol is not None:  # the run has floors for this model: faster than the hardware allows is invalid
            self.store.add_gate_result(trial.id, sol.gate, sol.status, sol.reason, sol.details, sol.duration_s)
            if sol.status == "fail":
                r.status_hint, r.error = "invalid", sol.reason
                return "invalid", None, objective, False
        if baseline is None:
            return "kept", 1.0, objective, False
        objectives = self.ctx.goal.objectives
        if trial.proposer in NEVER_KEPT:  # a probe; a run from before paired confirmation, resumed
            return "discarded", verdict.score(r, baseline, objectives), objective, False
        score = verdict.score(r, baseline, objectives)
        perf = verdict.perf_gate(r, baseline, objectives)
        self.store.add_gate_result(trial.id, perf.gate, perf.status,
                                   perf.reason, perf.details, perf.duration_s)
        # The screen can only say "possibly met": every objective clears its bar by the noise and what
        # failed paired rounds showed (`goalbars`); the paired A/B confirmation decides (see _settle).
        bars = self._bars(baseline)
        met = perf.status != "fail" and bars is not None and bars.clears(goalbars.ratios(objective, baseline.values, objectives))
        under = score <= self._best_score() * (1 + verdict.needed_gain(self.min_gain, baseline))
        if not met and under:
            return "discarded", score, objective, met
        if r.gate_drift and self.ctx.goal.accuracy_mode == "no_loss":
            # Faster but measurably different: a person decides (`infergoal approve N`).
            return "needs_approval", score, objective, met
        # Under its keep line it is not kept, even when the screen says it may meet the goal (another
        # scored higher on the geomean, or the baseline's noise set the line): its paired A/B still
        # runs (`_settle`), and keeps it only if that meets the goal.
        return ("discarded" if under else "kept"), score, objective, met

    # --- judging: the numbers come from `orchestrator.trial.verdict` ------------------------------
    def _borderline(self, r: TrialResult, baseline: Baseline) -> bool:
        return verdict.borderline(r, baseline, self.ctx.goal.objectives, best=self._best_score(), min_gain=self.min_gain)

    def _best_score(self) -> float:
        kept = [t.score for t in self.store.list_trials(self.ctx.run_id)
                if t.status == "kept" and t.score and t.proposer not in NOT_SEARCH and t.number]
        return max(kept, default=1.0)

    # --- the goal's bars: which trial earns a paired A/B, what the search is told (`trial.goalbars`) ----
    def _bars(self, baseline: Baseline) -> goalbars.Bars | None:
        return goalbars.bars(self.ctx.goal.objectives, baseline.values, baseline.noise,
                             [e.data or {} for e in self.store.events(self.ctx.run_id, kind=PAIRED)])

    def _screens(self, unconfirmed: bool = False) -> list[tuple[Any, dict[str, float]]]:
        """(trial, its screening speedups) of the search's measured trials (`unconfirmed`: of those no paired
        A/B judged yet, and not ended on a short bench)."""
        trials = [t for t in self._history() if t.status in ("kept", "discarded") and t.number
                  and t.proposer not in NOT_SEARCH + BASELINES]
        if unconfirmed:
            trials = [t for t in trials if not fidelity.is_screened(t) and latest_paired(self.store, self.ctx.run_id, t.id) is None]
        return goalbars.screens(self.store, self.ctx.run_id, trials)

    def _steer(self) -> tuple[dict[int, float], GoalAim | None]:
        """Once a paired confirmation missed: trial number -> its goal constraint for the search (`goalbars.steer`),
        and the bars with each trial's screening speedups (the baseline's: 1.0 each) for the search's steps to
        climb; ({}, None) before, and for a goal without bars."""
        if not self.store.events(self.ctx.run_id, kind=PAIRED):
            return {}, None
        bars, screened = self._bars(self._baseline()), self._screens()
        # A re-run's screen stands for the trial it re-ran: the search knows that trial's number.
        redone = {rerun.number: first.number for rerun, first in retried(self._history())}
        screened = [(dataclasses.replace(t, number=redone[t.number]) if t.number in redone else t, got) for t, got in screened]
        steer = goalbars.steer(bars, screened)
        if not steer:
            return {}, None
        ratios = {t.number: got for t, got in screened}
        return steer, GoalAim({k: bars.bar(k) for k in bars.required}, {0: dict.fromkeys(bars.required, 1.0), **ratios})

    def _to_confirm(self, baseline: Baseline) -> Any | None:
        """The unconfirmed trial whose screen clears every bar by the largest goal margin, or None."""
        bars = self._bars(baseline)
        return goalbars.to_confirm(bars, self._screens(unconfirmed=True)) if bars is not None else None

    def _baseline(self) -> Baseline:
        """The newest good baseline measurement (trial #0 or a sentinel): candidates are judged against it."""
        t0 = self.store.get_trial_by_number(self.ctx.run_id, 0)
        if t0 is not None and t0.status == "invalid" and (t0.error or "").startswith("untrusted"):
            raise StopRun(f"the baseline could not be measured reliably ({t0.error}); the host is too busy to measure: "
                          "start a new run when it is quieter, or raise bench.scale")
        if t0 is None or t0.status != "kept":
            raise StopRun(f"the baseline trial failed ({t0.error if t0 else 'missing'}); fix the target and start a new run")
        sentinels = [t for t in self.store.list_trials(self.ctx.run_id) if t.proposer == SENTINEL and t.status == "kept"]
        measured = [self._samples(t.id) for t in (t0, *sentinels)]
        t0 = sentinels[-1] if sentinels else t0
        samples = measured[-1]
        values = {k: sum(v) / len(v) for k, v in samples.items()}
        noise, basis = verdict.baseline_noise(samples, measured)  # never 0 for a baseline measured once
        return Baseline(samples=samples, values=values, noise=noise, trial=t0.number,
                        host=host_during(self.store, self.ctx.run_id, t0.id), noise_basis=basis)

    def _durations(self, baseline: Baseline) -> dict[str, float]:
        """Goal scenario -> the seconds the newest baseline measurement took (its first repeat)."""
        t = self.store.get_trial_by_number(self.ctx.run_id, baseline.trial)
        return {m.scenario: m.value for m in (self.store.measurements(t.id) if t else ())
                if m.metric == "duration_s" and m.repeat == 0 and m.scenario in self.ctx.goal.scenarios}

    def _samples(self, trial_id: int) -> dict[str, list[float]]:
        """Objective label -> a trial's stored measurements of it, one per repeat."""
        samples: dict[str, list[float]] = {}
        for m in self.store.measurements(trial_id):
            for o in self.ctx.goal.objectives:
                if m.scenario == o.scenario and m.metric == o.key:
                    samples.setdefault(objective_label(o.scenario, o.key), []).append(m.value)
        return samples

    # --- trusting the numbers --------------------------------------------------------------
    def _sentinel_if_needed(self) -> None:
        """Re-measure the baseline every few trials, and at once when the host's state moved."""
        base = self._baseline()
        since = [t for t in self._history() if t.number > base.trial and t.proposer not in LOOP_ADDED]
        reason = None
        if len(since) >= self.ctx.trust.sentinel_every and self._sentinel_affordable():
            reason = f"{len(since)} trials since baseline #{base.trial}"
        else:
            self.ctx.on_step("host probe")
            reason = state_change(idle_state(self.ctx.host, self.ctx.trust.probe_s), base.host, self.ctx.trust)
        if reason:
            self._sentinel(reason)

    def _sentinel_affordable(self) -> bool:
        """Whether one more re-measure by count keeps the baseline's re-measures within the trust policy's
        `sentinel_share` of the run's trial time (the next one priced as the last baseline measurement took)."""
        share = self.ctx.trust.sentinel_share
        if share >= 1:
            return True
        timed = [t for t in self.store.list_trials(self.ctx.run_id) if t.timings and t.timings.get("trial")]
        base = [t for t in timed if t.number == 0 or t.proposer in BASELINES]
        if not base:
            return True
        spent = sum(float(t.timings["trial"]) for t in base if t.proposer == SENTINEL)
        total = sum(float(t.timings["trial"]) for t in timed)
        next_s = float(base[-1].timings["trial"])
        return spent + next_s <= share * (total + next_s)

    def _sentinel(self, reason: str) -> None:
        self.store.add_event(self.ctx.run_id, SENTINEL, f"baseline re-measured: {reason}")
        c = Candidate(self.ctx.target.baseline_knobs(), rationale=f"baseline sentinel: {reason}", proposer=SENTINEL)
        self._execute(self._create(c), c)

    def _confirm_paired(self, trial: Any, candidate: Candidate) -> dict[str, Any]:
        """Paired A/B of `trial` against the baseline; its score becomes the paired ratio.
        Its re-told why keeps what the screen said of it (a winner confirmed at the stop may have missed)."""
        why = verdict.why_record(self.store, self.ctx.run_id, trial.id)
        screen_met = bool(why.get("screen_met"))
        bars_before = self._bars(self._baseline())
        out = run_paired(self.ctx, trial, candidate, self.ctx.target.baseline_knobs(), self._create,
                         on_trial=self.on_trial, host_ref=self._baseline().host).to_dict()
        # what its screen said, per objective: a miss raises that objective's bar for later screens (`goalbars.raised`)
        out["screen"] = (why.get("goal") or {}).get("ratios") or {}
        self.store.add_event(self.ctx.run_id, PAIRED, f"#{trial.number}: {describe(out)}; goal {'met' if out['met'] else 'not met'}",
                             data=out, trial_id=trial.id)
        bars_after = self._bars(self._baseline())
        for label, said in goalbars.raised_words(bars_before, bars_after, trial.number, out["screen"], self.ctx.goal.objectives):
            self.store.add_event(self.ctx.run_id, "goal.bar", said, trial_id=trial.id, data={"objective": label, **bars_after.to_dict()})
        if out["score"]:  # the trial's number becomes the paired one: it is the better estimate
            self.store.finish_trial(trial.id, trial.status, score=out["score"], objective=trial.objective,
                                    error=trial.error, timings=trial.timings)
        # The why's score stays the screening score against its baseline; the paired ratio is told as paired.
        self._record_why(self.store.get_trial(trial.id), trial.status, trial.score, trial.error,
                         self._baseline(), paired=out, screen_met=screen_met)
        return out

    def _confirm_best(self, reason: str) -> str:
        """At a stop without a met goal: the best kept candidate's paired ratio, added to the stop reason.

        The search screens on single measurements; a winner whose screen fell short (a noisy
        baseline, a stall) but whose paired rounds meet the goal did meet it: the stop is `GoalMet`."""
        run = self.store.get_run(self.ctx.run_id)
        best = self.store.get_trial(run.best_trial_id) if run.best_trial_id else None
        if best is None or best.number == 0:
            return reason
        # an unconfirmed trial whose screen clears every bar goes first (the largest goal margin), else the best score
        best = self._to_confirm(self._baseline()) or best
        paired = latest_paired(self.store, self.ctx.run_id, best.id) or self._confirm_paired(best, _candidate_of(best))
        if paired["met"]:
            return (f"GoalMet: #{best.number} meets every objective: paired speedup {describe(paired)} on fresh "
                    f"servers, confirmed at the stop ({reason})")
        return f"{reason}; best #{best.number}: paired speedup {describe(paired)}, goal not met"

    def _smallest_step(self) -> float:
        """The smallest relative change the goal asks a measurement to resolve."""
        steps = [o.speedup(o.target_for(1.0), 1.0) - 1 for o in self.ctx.goal.objectives if o.kind == "relative"]
        return min(steps, default=1.0)

    def _record_why(self, trial: Any, status: str, score: float | None, error: str | None, baseline: Baseline | None,
                    paired: dict[str, Any] | None = None, screen_met: bool = False, goal: dict[str, Any] | None = None) -> None:
        if goal is None:  # a re-told why keeps what the screen said against the bars
            goal = verdict.why_record(self.store, self.ctx.run_id, trial.id).get("goal")
        best = max([t.score for t in self.store.list_trials(self.ctx.run_id) if t.status == "kept" and t.score
                    and t.proposer not in NOT_SEARCH and t.number and t.id != trial.id], default=1.0)
        d = verdict.why_data(number=trial.number, status=status, proposer=trial.proposer, score=score, best=best,
                     min_gain=self.min_gain, noise=baseline.noise if baseline else 0.0,
                     noise_basis=baseline.noise_basis if baseline else "",
                     baseline_trial=baseline.trial if baseline else None, gates=self.store.gate_results(trial.id),
                     error=error, paired=paired, screen_met=screen_met, goal=goal,
                     # The proposer sees only the search's own trials, so only they mark regions.
                     region=None if trial.proposer in LOOP_ADDED else region_of(self.ctx.target, trial.number,
                                                                                   trial.knobs, status, error))
        self.store.add_event(self.ctx.run_id, "trial.why", d["sentence"], data=d, trial_id=trial.id)

    def _history(self) -> list[Any]:
        return self.store.list_trials(self.ctx.run_id)

    def _check_budget(self) -> None:
        trials = [t for t in self._history() if t.proposer not in LOOP_ADDED]
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
    return time.perf_counter()
