"""SearchProposer: Optuna TPE over the target's knob space (ask/tell, seeded, no API key).

The study is rebuilt from the stored history on every call instead of being kept in memory:
that makes the proposer stateless, so `infergoal resume` after a kill -9 needs nothing but
the database, and the store stays the single source of truth.

Failures are learned the same way: the regions the run's out-of-memory and start-up-crash trials
marked (`orchestrator.targets.regions`) are rebuilt from the stored trials on every call. TPE sees
the trials inside them as infeasible (Optuna's constraint-aware TPE: a `failed_region` constraint
value > 0, the region in the trial's user attrs), and a hard filter re-asks when it still proposes
inside one; warm starts, swaps and transferred priors inside one are skipped too. Every skipped
proposal travels to the loop in `Candidate.extra["skipped"]`, which records it as `search.skip`.
Once a paired confirmation missed the goal, TPE also sees each trial's shortfall under the goal's
bars as a constraint (`SearchProposer.goal`, set by the loop from `orchestrator.trial.goalbars`), and the model's
steps and the walk climb the goal margin instead of the score (`SearchProposer.aim`, `modelstep.Ranker`).

A crash condemns its cause, not its region (`orchestrator.targets.attribution`): TPE is told a crashed
trial as a failure of its suspect levels alone (those no served trial carried), a crash with several
suspects is bisected by the next proposals (the crashed set with half of them reset), and a level found
alone to blame is never proposed again. The covering start-up stakes at most MAX_UNTRIED untried levels
per trial, so one crash throws away little. After the start-up, TPE's draws are ranked by the run's
per-knob cost model (`costmodel.CostModel`, refitted from every measured trial): a screening level only;
between them, the model's steps (`modelstep`) propose the best trial with the levels the model predicts
better, and the walk steps a numeric knob where the model predicts no gain and no loss.

Beside it: `optspace` (the knob space as the Optuna study sees it, what TPE is told of a trial), `cover` (the
covering start-up) and `priors` (the knowledge base's priors: how long they steer, their region, the swaps).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import optuna

from orchestrator.core.candidate import Candidate, knob_key
from orchestrator.core.roles import BASELINES
from orchestrator.proposers import multiobjective
from orchestrator.proposers.costmodel import GoalAim
from orchestrator.proposers.cover import cover
from orchestrator.proposers.modelstep import Ranker, model_step, walk_loses
from orchestrator.proposers.optspace import (
    FAILED_VALUE,
    REGION_CONSTRAINT,
    complete,
    constraints,
    distributions,
    fits,
    neighbours,
    restrict,
    suggest,
    told,
)
from orchestrator.proposers.priors import PRIOR_HORIZON, prior_region, prior_weight, swaps
from orchestrator.targets import TargetSpec
from orchestrator.targets.attribution import attribute, bisect
from orchestrator.targets.failures import refused_values
from orchestrator.targets.regions import FailedRegion, failed_regions, region_containing
from orchestrator.targets.space import active_only, is_active
from orchestrator.targets.spec import ConstraintViolated
from orchestrator.trial.fidelity import is_screened

__all__ = ["ATTRIBUTE_PREFIX", "MAX_UNTRIED", "RANK_POOL", "SCREEN_MARGIN", "SCREEN_STARTUP", "STARTUP_DESIGNS",
           "SearchProposer", "WALK_PREFIX"]

_FINISHED = {"kept", "discarded", "failed", "invalid", "needs_approval", "rejected"}

# Multi-fidelity screening (`orchestrator.trial.fidelity`): a candidate whose short-bench score falls
# below the best kept score less the short bench's noise margin (SCREEN_MARGIN unless the caller
# knows the noise) is not measured in full; a caller that does not state the noise gets a bar only once
# SCREEN_STARTUP trials were measured in full (`fidelity.screen_for` states it: `KNOWN_NOISE_STARTUP`, 0).
SCREEN_MARGIN = 0.10
SCREEN_STARTUP = 4

# Start-up designs (`SearchProposer(startup=...)`; "cover": `orchestrator.proposers.cover`).
STARTUP_DESIGNS = ("cover", "random")
# A start-up proposal stakes at most this many knob levels that no trial served yet (a knob's default
# aside): one crash then throws away what the trial would have said about a few levels, not about
# a dozen (`SearchProposer(max_untried=...)`; the rest of a draw's untried levels go back to defaults).
MAX_UNTRIED = 3
ATTRIBUTE_PREFIX = "attribute:"
# After the start-up, TPE is asked for this many admissible knob sets and the one the run's cost model
# (`costmodel.CostModel`, refitted from every measured trial) predicts highest is proposed (1: TPE's first).
RANK_POOL = 8

# The walk (`SearchProposer(walk=True)`): after the start-up, each new best trial is stepped once along a
# numeric knob (x2 or /2 on a log scale, a tenth of the range otherwise: `neighbours`), and the steps go
# on the same way while each becomes the new best. Its rationale starts WALK_PREFIX.
WALK_PREFIX = "walk:"
_WALK_RE = re.compile(r"^walk: (\S+) (up|down) from #(\d+)")


class SearchProposer:
    """TPE after `n_startup` start-up trials; prior good knob sets (the KB) are tried first.

    `startup`: how the start-up trials are drawn. "random" is TPE's own (independent uniform draws);
    "cover" (the default) draws STARTUP_POOL random knob sets and proposes the one that tries the most
    knob levels no trial of the run tried yet (`cover.coverage`), so a few start-up trials spread over every
    knob's values instead of repeating some and missing others.

    `priors` ({knobs, score, weight, entry[, probe]}, from `KnowledgeBase.prior_observations`): what
    similar settings measured. The search's own observations enter the TPE model as extra finished
    trials while they still fit (`_prior_trials`), so the first proposals already avoid what failed
    there and aim at what won. Probes (`probe`: a source winner's one-knob neighbours, measured after
    its run stopped) never enter the model or the region; with two or more source runs they rank the
    one-knob `swaps` between the source winners, tried right after the warm starts."""

    name = "search"

    def __init__(self, seed: int = 0, n_startup: int = 4, warm_start: Sequence[dict[str, Any]] = (),
                 priors: Sequence[dict[str, Any]] = (), objectives: Sequence[Any] = (),
                 startup: str = "cover", walk: bool = True, max_untried: int | None = MAX_UNTRIED,
                 attribute: bool = True, rank: int = RANK_POOL, warm_from: Sequence[str] = ()) -> None:
        if startup not in STARTUP_DESIGNS:
            raise ValueError(f"startup must be one of {', '.join(STARTUP_DESIGNS)}, not {startup!r}")
        self.seed = seed
        self.startup = startup
        self.max_untried = max_untried
        self.attribute = attribute
        self.rank = rank if not objectives or len(objectives) < 2 else 1
        self.walk = walk and len(objectives) < 2  # a Pareto search has no single best to walk from
        # Two objectives (a multi-objective goal): MOTPE on their measured values (`multiobjective`), not on the score.
        self.objectives = list(objectives) if len(objectives) > 1 else []
        self.n_startup = n_startup
        self.warm_start = list(warm_start)
        self.warm_from = list(warm_from)
        """The knowledge-base entry each warm-start knob set comes from (same order), named in its rationale."""
        self.priors = [p for p in priors if not p.get("probe")]
        self.probes = [p for p in priors if p.get("probe")]
        self.goal: dict[int, float] = {}
        """Trial number -> its goal constraint (`trial.goalbars.Bars.constraint`: the shortfall under the goal's bars,
        > 0 when it misses one), set by the loop once a paired confirmation missed the goal. TPE is told it as the
        GOAL_CONSTRAINT, so trials that meet every bar rank above those that miss, and those by how little they
        miss; a trial it does not name (a failure, a draw told as failed) counts as missing by more than any."""
        self.aim: GoalAim | None = None
        """The goal's bars and each trial's screening speedups, set by the loop with `goal` once a paired confirmation
        missed: the model's steps and the walk then start from the largest goal margin and climb it (`modelstep.Ranker`)."""

    def stop_bar(self, history: Sequence[Any], margin: float = SCREEN_MARGIN, startup: int | None = None) -> float | None:
        """The bar of `should_stop_early`: the best kept full measurement's score less `margin`, or None while
        it stops nothing. Every short score under it is stopped (Optuna's ThresholdPruner prunes a value
        below its `lower`), which is what lets a screen stop a short pass as soon as its score provably
        ends under it (`orchestrator.trial.fidelity`, `Screen.plan`)."""
        full = [t for t in history if t.status in ("kept", "discarded") and t.score and not is_screened(t)]
        # after a paired miss (`goal`) a kept score that misses the goal's bars sets no bar: a candidate under it may be
        # the one that meets the goal, and a short pass would keep it from its paired confirmation
        best = max((float(t.score) for t in full if t.status == "kept" and self.goal.get(t.number, 0.0) <= 0), default=None)
        if len(full) < (SCREEN_STARTUP if startup is None else startup) or best is None:
            return None
        return best * (1 - margin)

    def should_stop_early(self, history: Sequence[Any], value: float, margin: float = SCREEN_MARGIN,
                          startup: int | None = None) -> str | None:
        """Whether a candidate whose short bench scored `value` is not worth its full bench: why, or None.

        Optuna's pruning API: the candidate is asked as a trial that reports `value` as its
        intermediate value at step 0, and a `ThresholdPruner` whose bar is the best kept score of
        `history` less `margin` (the short bench's noise) decides. Nothing is pruned before `startup`
        trials (the baseline counted) were measured in full: SCREEN_STARTUP when the caller does not
        say; the product's screen, which derives `margin` from the baseline's measured (or assumed)
        noise, passes 0: from the first search trial, a short score more than the noise below the
        baseline's 1.0 is a candidate the keep rule would discard (`fidelity.KNOWN_NOISE_STARTUP`).

        Why a bar under the best, not a percentile of the run's trials (MedianPruner,
        PercentilePruner) or successive halving: the keep rule judges a candidate against the best,
        so a candidate clearly below the best can only be discarded, and its full bench would change
        nothing but the precision of what the search learns from it (its short score is stored and
        told to TPE). A candidate that would be kept is pruned only when its short bench falls more
        than `margin` below its true score. Percentile bars follow the run's early, mostly poor
        trials and prune less; halving needs several rungs, and one short pass is all a trial's
        budget allows (docs/results.md, has both replayed)."""
        bar = self.stop_bar(history, margin, startup)
        if bar is None:
            return None
        full = [t for t in history if t.status in ("kept", "discarded") and t.score and not is_screened(t)]
        best = max(float(t.score) for t in full if t.status == "kept" and self.goal.get(t.number, 0.0) <= 0)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=bar),
                                    sampler=optuna.samplers.RandomSampler(seed=self.seed))
        trial = study.ask()
        trial.report(float(value), 0)
        if not trial.should_prune():
            return None
        only_base = all(t.number == 0 or t.proposer in BASELINES for t in full if t.status == "kept")
        return (f"a bar of {bar:.3f}x: the best kept {best:.3f}x{' (the baseline)' if only_base else ''} less the short "
                f"bench's noise margin {margin:.0%} (Optuna ThresholdPruner)")

    def _priors_hold(self, history: Sequence[Any]) -> bool:
        """Whether the priors still steer: the transferred winner did not lose here, and the run has
        fewer than PRIOR_HORIZON x weight scored trials of its own."""
        if not self.priors:
            return False
        warm = [t for t in history if (t.rationale or "").startswith("warm start") and t.status in _FINISHED]
        if any(t.status not in ("kept", "discarded") or (t.score or 0.0) <= 1.0 for t in warm):
            return False  # the transferred winner lost here: the setting differs more than its similarity said
        # The swaps (at most MAX_SWAPS) are extra: they do not use up the trials the region gets.
        own = sum(1 for t in history if t.number and t.status in ("kept", "discarded") and t.score
                  and not (t.rationale or "").startswith("swap"))
        return own < round(PRIOR_HORIZON * prior_weight(self.priors))

    def _prior_trials(self, history: Sequence[Any], target: TargetSpec, dists: dict[str, Any],
                      regions: Sequence[FailedRegion] = ()) -> list[Any]:
        """The priors as Optuna trials, or none once they stopped fitting this run (a prior inside a
        region this run's failures marked is left out: it did not fail there, it failed here)."""
        if not self._priors_hold(history):
            return []
        out = []
        for p in self.priors:
            knobs = p["knobs"]
            if set(knobs) <= set(target.knobs):  # written before some knobs became conditional: its active part
                knobs = active_only(target, knobs)
            if not fits(knobs, dists) or active_only(target, knobs) != knobs or region_containing(regions, knobs):
                continue
            out.append(optuna.trial.create_trial(params=knobs, distributions={k: dists[k] for k in knobs},
                                                 value=float(p["score"]) or FAILED_VALUE))
        return out

    def propose(self, history: Sequence[Any], target: TargetSpec) -> Candidate | None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        dists = distributions(target)
        seen = {knob_key(t.knobs) for t in history}
        regions = failed_regions(target, history)
        skipped: list[dict[str, Any]] = []  # proposals inside a failed region, for the loop to record
        for i, knobs in enumerate(self.warm_start):
            try:
                knobs = target.validate_knobs(knobs)
            except ValueError:
                continue
            if knob_key(knobs) not in seen and not _inside(regions, knobs, "warm start", skipped):
                entry = self.warm_from[i] if i < len(self.warm_from) else ""
                said = f"the best knob set of knowledge-base entry {entry}" if entry else "a prior best from the knowledge base"
                return _with_skips(Candidate(knobs=knobs, rationale=f"warm start: {said}", proposer=self.name), skipped)
        refused = refused_values(target, history)  # values the engine refused at start-up (bad_flag)
        blame = attribute(target, history) if self.attribute else None
        if blame is not None:
            refused |= blame.culprits  # a level that crashed the server, alone of its trial's untried ones
            for t, suspect in blame.open:  # a crash with several suspects: re-deploy with half of them reset
                knobs = bisect(target, t, suspect)
                if knob_key(knobs) not in seen and not any((k, repr(v)) in refused for k, v in knobs.items()):
                    kept = [k for k in suspect if knobs.get(k) == t.knobs[k]]
                    return _with_skips(Candidate(knobs=knobs, proposer=self.name, rationale=(
                        f"{ATTRIBUTE_PREFIX} #{t.number} crashed with {len(suspect)} levels no served trial carried "
                        f"({', '.join(f'{k}={t.knobs[k]}' for k in suspect)}); the same with "
                        f"{', '.join(k for k in suspect if k not in kept)} at their defaults")), skipped)
        if self.probes and self._priors_hold(history):  # the probes say which knobs are worth a swap
            for knobs, why in swaps([*self.priors, *self.probes], history):
                try:
                    knobs = target.validate_knobs(knobs)
                except ValueError:
                    continue
                if (knob_key(knobs) not in seen and not any((k, repr(v)) in refused for k, v in knobs.items())
                        and not _inside(regions, knobs, "swap", skipped)):
                    return _with_skips(Candidate(knobs=knobs, rationale=why, proposer=self.name), skipped)
        if self.walk:
            # With the cost model (rank > 1) its step goes first (`modelstep`: a numeric knob moves as far as the fitted
            # slope says pays); the walk steps where the model predicts no gain, and only where it predicts no loss.
            step = model_step(history, target, name=self.name, max_untried=self.max_untried,
                              seen=seen, refused=refused, regions=regions, aim=self.aim) if self.rank > 1 else None
            step = step or self._walk(history, target, seen, refused, regions, skipped)
            if step is not None:
                return _with_skips(step, skipped)
        # While the priors hold, search first inside the region they support (`prior_region`);
        # once it is used up, or the priors stop holding, the whole space.
        region = prior_region(self.priors, target) if self._priors_hold(history) else {}
        if region:
            narrowed = {k: restrict(d, region[k]) if k in region else d for k, d in dists.items()}
            cand = self._ask(history, target, narrowed, seen, refused, priors=True, regions=regions, skipped=skipped)
            if cand is not None:
                return _with_skips(dataclasses.replace(cand, rationale=cand.rationale + "; inside the region where a "
                                                       "similar setting's run found its best (knowledge base)"), skipped)
        return _with_skips(self._ask(history, target, dists, seen, refused, priors=True, regions=regions,
                                     skipped=skipped), skipped)

    def _walk(self, history: Sequence[Any], target: TargetSpec, seen: set[str], refused: set[tuple[str, str]],
              regions: Sequence[FailedRegion], skipped: list[dict[str, Any]]) -> Candidate | None:
        """A line search from the best trial along one numeric knob, or None (TPE proposes).

        TPE with a handful of trials samples near the best value it has seen: on the H200 a run whose
        start-up found the CUDA-graph engine at batch 3 proposed batches 2, 2, 7, 6, 10, 8 next
        (benchmarks/gpu/ttb_replay.py). A throughput knob's best is often at an edge of what was tried,
        and doubling reaches it in a few steps. So after the start-up, each new best trial gets one walk
        step along a numeric knob (`neighbours`: x2 or /2 on a log scale, a tenth of the range otherwise):
        the way the best moved from the previous best first (a knob whose value differs between them),
        else the first numeric knob, up first; the first such step no trial measured. While a step
        becomes the new best, the next proposal steps the same knob the same way again. A step that did
        not improve ends the walk: TPE proposes until another trial becomes the best, so a best that is
        not at an edge costs one trial, not every other one. Never inside a failed region, never a
        refused value, never a knob set already measured; with the cost model (rank > 1), the walk comes after
        the model's step and never takes a step the model predicts a loss for (`modelstep.walk_loses`)."""
        finished = [t for t in history if t.status in _FINISHED]
        if len(finished) < self.n_startup:
            return None
        scored = [t for t in finished if t.status in ("kept", "discarded") and t.score]
        if not scored:
            return None
        rank = Ranker(target, history, self.aim) if self.rank > 1 else None
        best = rank.start(scored) if rank is not None else max(scored, key=lambda t: (float(t.score), -t.number))
        own = [t for t in history if t.proposer == self.name]
        last = own[-1] if own else None
        walked = [m for t in own if (m := _WALK_RE.match(t.rationale or ""))]
        steps: list[tuple[str, str, Any]] = []  # (knob, direction, source trial) in the order to try
        m = _WALK_RE.match((last.rationale or "") if last is not None else "")
        if m is not None and last.number == best.number:  # the last step became the best: onwards
            steps.append((m.group(1), m.group(2), last))
        elif any(int(w.group(3)) == best.number for w in walked):
            return None  # this best was walked from already (its step did not improve): TPE's turn
        else:
            before = [t for t in scored if t.number < best.number]
            prev = (rank.start(before) if rank else max(before, key=lambda t: (float(t.score), -t.number))) if before else None
            numeric = [n for n, k in target.knobs.items()
                       if k.type in ("int", "float") and n in best.knobs and is_active(k, best.knobs)]
            for name in numeric:  # momentum: the way the best moved from the previous best
                if prev is not None and name in prev.knobs and prev.knobs[name] != best.knobs[name]:
                    steps.append((name, "up" if best.knobs[name] > prev.knobs[name] else "down", best))
            steps += [(n, d, best) for n in numeric for d in ("up", "down")]
        options = []  # with a goal, of every admissible step the one the Ranker puts highest
        for name, direction, src in steps:
            v = src.knobs.get(name)
            for knob_name, value, knobs in neighbours(target, src.knobs):
                if knob_name != name or (value > v) != (direction == "up"):
                    continue
                if (knob_key(knobs) in seen or any((k, repr(x)) in refused for k, x in knobs.items())
                        or (rank is not None and walk_loses(rank, src.knobs, target.validate_knobs(knobs)))
                        or _inside(regions, knobs, "walk", skipped)):
                    continue
                options.append(Candidate(knobs=knobs, proposer=self.name, rationale=(
                    f"{WALK_PREFIX} {name} {direction} from #{src.number} ({float(src.score):.3f}x, the "
                    f"{'best' if rank is None or rank.goal is None else 'closest to the goal'} so far): {v} -> {value}")))
                if rank is None or rank.goal is None:
                    return options[0]
        return max(options, key=lambda c: rank.key(c.knobs)) if options else None

    def _ask(self, history: Sequence[Any], target: TargetSpec, dists: dict[str, Any], seen: set[str],
             refused: set[tuple[str, str]], *, priors: bool, regions: Sequence[FailedRegion] = (),
             skipped: list[dict[str, Any]] | None = None) -> Candidate | None:
        """One TPE proposal over `dists` (the whole space or a region of it) that was not measured yet
        and lies in no failed region (`regions`; each proposal inside one is added to `skipped`)."""
        # A different seed per step keeps proposals reproducible for a given history.
        # constant_liar: trials still running on other hosts of a pool count as bad guesses, so
        # several proposals asked at once spread out instead of piling onto one region.
        # Multivariate for two objectives: one knob's effect on a trade-off depends on the others
        # (batch size only matters with batching on); benchmarks/pareto_search.py measured it.
        blame = attribute(target, history) if self.attribute else None
        sampler = optuna.samplers.TPESampler(seed=self.seed + len(history), n_startup_trials=self.n_startup,
                                             constant_liar=True, **multiobjective.sampler_options(self.objectives))
        if self.objectives:  # the priors carry scalar scores: a multi-objective model does without them
            study = optuna.create_study(directions=multiobjective.directions(self.objectives), sampler=sampler)
            failed: Any = multiobjective.failed_values(history, self.objectives)
        else:
            study = optuna.create_study(direction="maximize", sampler=sampler)
            failed = FAILED_VALUE
        if priors and not self.objectives:
            study.add_trials(self._prior_trials(history, target, dists, regions))
        for t in history:
            # Conditional knobs: a trial carries only its active knobs (define-by-run). Outside a
            # region, a trial is not part of that region's model.
            if not fits(t.knobs, dists) or active_only(target, t.knobs) != t.knobs:
                continue
            if t.status not in _FINISHED:  # in flight on a pool's other host
                study.add_trial(optuna.trial.create_trial(params=t.knobs, distributions={k: dists[k] for k in t.knobs},
                                                          state=optuna.trial.TrialState.RUNNING))
                continue
            outcome = told(t, self.objectives, failed)
            inside = region_containing(regions, t.knobs)  # infeasible for the constraint-aware TPE
            params = t.knobs
            # A crash condemns its suspects, not its whole knob set (a start-up crash's exact set is its region's already).
            if blame is not None and t.number in blame.told and inside is None:
                params = {k: t.knobs[k] for k in blame.told[t.number]}
                if not params:
                    continue
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions={k: dists[k] for k in params}, **outcome,
                constraints=constraints(self.goal, t.number, inside is not None),
                user_attrs={REGION_CONSTRAINT: inside.describe()} if inside else None))
        if self.startup == "cover" and complete(study) < self.n_startup:
            cand = cover(history, target, dists, seen, refused, regions, seed=self.seed, objectives=self.objectives,
                         max_untried=self.max_untried, rank=self.rank, proposer=self.name)
            if cand is not None:
                return cand
        # Skip knob sets already measured, or inside a failed region (re-asked at most 50 times in
        # all); a small space can run out, which ends the search. Of up to `rank` admissible ones, the
        # one the cost model predicts highest.
        pool: list[dict[str, Any]] = []
        for _ in range(50):
            trial = study.ask()
            params = suggest(trial, target, dists)
            for name, value in (constraints(self.goal, None) or {}).items():  # a draw not proposed misses the goal
                trial.set_constraint(name, value)
            try:  # constraints between knobs: a combination that cannot start is never proposed
                target.validate_knobs(params)
            except ConstraintViolated:
                study.tell(trial, failed)
                continue
            if any((k, repr(v)) in refused for k, v in params.items()):
                study.tell(trial, failed)
                continue
            if _inside(regions, params, "TPE", skipped if skipped is not None else []):
                trial.set_constraint(REGION_CONSTRAINT, 1.0)
                study.tell(trial, failed)
                continue
            if knob_key(params) not in seen and all(knob_key(params) != knob_key(p) for p in pool):
                pool.append(params)
                if len(pool) >= self.rank:
                    break
                continue
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        if not pool:
            return None
        what = f"{'multi-objective TPE' if self.objectives else 'TPE'} proposal after {len(history)} observed trials"
        if len(pool) == 1:
            return Candidate(knobs=pool[0], rationale=what, proposer=self.name)
        rank = Ranker(target, history, self.aim)  # the predicted score, or after a paired miss the goal margin
        pick = max(pool, key=rank.key)
        return Candidate(knobs=pick, proposer=self.name,
                         rationale=f"{what}: of {len(pool)} TPE draws, the one the run's per-knob cost model "
                                   f"predicts highest ({rank.words(pick)})")


def _inside(regions: Sequence[FailedRegion], knobs: dict[str, Any], source: str, skipped: list[dict[str, Any]]) -> bool:
    """Whether `knobs` lies in a failed region; if so, the skip is added to `skipped` (once per knob set)."""
    r = region_containing(regions, knobs)
    if r is not None and all(s["key"] != knob_key(knobs) for s in skipped):
        skipped.append({"key": knob_key(knobs), "knobs": dict(knobs), "source": source, "marked_by": r.trial,
                        "region": r.to_dict()})
    return r is not None


def _with_skips(c: Candidate | None, skipped: list[dict[str, Any]]) -> Candidate | None:
    """`c` carrying the proposals skipped on the way to it (`extra["skipped"]`)."""
    if c is None or not skipped:
        return c
    return dataclasses.replace(c, extra={**c.extra, "skipped": list(skipped)})
