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
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import optuna

from orchestrator.core.candidate import Candidate, knob_key
from orchestrator.core.roles import BASELINES
from orchestrator.proposers import multiobjective
from orchestrator.proposers.costmodel import CostModel, GoalAim
from orchestrator.proposers.modelstep import Ranker, model_step, walk_loses
from orchestrator.targets import TargetSpec
from orchestrator.targets.attribution import attribute, bisect
from orchestrator.targets.failures import refused_values
from orchestrator.targets.regions import FailedRegion, failed_regions, region_containing
from orchestrator.targets.space import active_only, is_active
from orchestrator.targets.spec import ConstraintViolated
from orchestrator.trial.fidelity import is_screened, is_stopped

__all__ = ["SCREEN_MARGIN", "SCREEN_STARTUP", "STARTUP_DESIGNS", "SearchProposer", "by_entry", "distributions", "neighbours", "prior_region", "prior_weight", "swaps"]

# What the sampler is told for trials that produced no valid speed: worse than any real result,
# so TPE steers away from knob sets that crash the server or break accuracy.
FAILED_VALUE = 0.0
_FINISHED = {"kept", "discarded", "failed", "invalid", "needs_approval", "rejected"}
# The Optuna constraint a knob set inside a failed region breaks (> 0: infeasible).
REGION_CONSTRAINT = "failed_region"
# The Optuna constraint a trial that misses one of the goal's bars breaks (`SearchProposer.goal`).
GOAL_CONSTRAINT = "goal_bars"


# Multi-fidelity screening (`orchestrator.trial.fidelity`): a candidate whose short-bench score falls
# below the best kept score less the short bench's noise margin (SCREEN_MARGIN unless the caller
# knows the noise) is not measured in full; a caller that does not state the noise gets a bar only once
# SCREEN_STARTUP trials were measured in full (`fidelity.screen_for` states it: `KNOWN_NOISE_STARTUP`, 0).
SCREEN_MARGIN = 0.10
SCREEN_STARTUP = 4

# Start-up designs (`SearchProposer(startup=...)`), and how many random knob sets "cover" draws to
# pick one start-up proposal from; numeric knobs count as tried per third of their (log) range.
STARTUP_DESIGNS = ("cover", "random")
STARTUP_POOL = 24
LEVEL_BINS = 3
# A start-up proposal stakes at most this many knob levels that no trial served yet (a knob's default
# aside): one crash then throws away what the trial would have said about a few levels, not about
# a dozen (`SearchProposer(max_untried=...)`; the rest of a draw's untried levels go back to defaults).
MAX_UNTRIED = 3
ATTRIBUTE_PREFIX = "attribute:"
# After the start-up, TPE is asked for this many admissible knob sets and the one the run's cost model
# (`costmodel.CostModel`, refitted from every measured trial) predicts highest is proposed (1: TPE's first).
RANK_POOL = 8
# A start-up draw the cost model predicts under this fraction of the best measured score is not proposed
# while another draw is admissible: its untried levels are not worth a trial the model expects to lose.
SCREEN_PREDICTED = 0.5

# The walk (`SearchProposer(walk=True)`): after the start-up, each new best trial is stepped once along a
# numeric knob (x2 or /2 on a log scale, a tenth of the range otherwise: `neighbours`), and the steps go
# on the same way while each becomes the new best. Its rationale starts WALK_PREFIX.
WALK_PREFIX = "walk:"
_WALK_RE = re.compile(r"^walk: (\S+) (up|down) from #(\d+)")


def distributions(target: TargetSpec) -> dict[str, optuna.distributions.BaseDistribution]:
    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for name, k in target.knobs.items():
        if k.type == "bool":
            out[name] = optuna.distributions.CategoricalDistribution([False, True])
        elif k.type == "categorical":
            out[name] = optuna.distributions.CategoricalDistribution(list(k.choices))
        elif k.type == "int":
            out[name] = optuna.distributions.IntDistribution(int(k.low), int(k.high), log=k.log)
        else:
            out[name] = optuna.distributions.FloatDistribution(k.low, k.high, log=k.log)
    return out


# A transferred prior steers the search until the run has this many scored trials of its own
# (times the prior's weight), or until its winner loses here; then the run's own evidence rules.
# 6, not 12: over five runs of model A replayed on model B (docs/results.md) a prior that held
# longer cost more trials at the top goal than it saved, because B's best lay where A's did not.
PRIOR_HORIZON = 6


def prior_weight(priors: Sequence[dict[str, Any]]) -> float:
    """How much the priors together are worth, in [0, 1]: 1 - prod(1 - w) over their source entries
    (each entry's weight is its similarity x status). One source counts its own weight; two runs on
    other models that each carry weight 0.53 count 0.78, so their joint region is searched longer
    than either's alone, and never past PRIOR_HORIZON trials."""
    miss = 1.0
    for obs in by_entry(priors).values():
        miss *= 1.0 - min(max(max(float(o["weight"]) for o in obs), 0.0), 1.0)
    return 1.0 - miss


def by_entry(priors: Sequence[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """The prior observations grouped by their source entry (one source run each)."""
    out: dict[Any, list[dict[str, Any]]] = {}
    for p in priors:
        out.setdefault(p.get("entry"), []).append(p)
    return out


class SearchProposer:
    """TPE after `n_startup` start-up trials; prior good knob sets (the KB) are tried first.

    `startup`: how the start-up trials are drawn. "random" is TPE's own (independent uniform draws);
    "cover" (the default) draws STARTUP_POOL random knob sets and proposes the one that tries the most
    knob levels no trial of the run tried yet (`_coverage`), so a few start-up trials spread over every
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
            if not _fits(knobs, dists) or active_only(target, knobs) != knobs or region_containing(regions, knobs):
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
            if not _fits(t.knobs, dists) or active_only(target, t.knobs) != t.knobs:
                continue
            if t.status not in _FINISHED:  # in flight on a pool's other host
                study.add_trial(optuna.trial.create_trial(params=t.knobs, distributions={k: dists[k] for k in t.knobs},
                                                          state=optuna.trial.TrialState.RUNNING))
                continue
            told = _told(t, self.objectives, failed)
            inside = region_containing(regions, t.knobs)  # infeasible for the constraint-aware TPE
            params = t.knobs
            # A crash condemns its suspects, not its whole knob set (a start-up crash's exact set is its region's already).
            if blame is not None and t.number in blame.told and inside is None:
                params = {k: t.knobs[k] for k in blame.told[t.number]}
                if not params:
                    continue
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions={k: dists[k] for k in params}, **told,
                constraints=_constraints(self.goal, t.number, inside is not None),
                user_attrs={REGION_CONSTRAINT: inside.describe()} if inside else None))
        if self.startup == "cover" and _complete(study) < self.n_startup:
            cand = self._cover(history, target, dists, seen, refused, regions)
            if cand is not None:
                return cand
        # Skip knob sets already measured, or inside a failed region (re-asked at most 50 times in
        # all); a small space can run out, which ends the search. Of up to `rank` admissible ones, the
        # one the cost model predicts highest.
        pool: list[dict[str, Any]] = []
        for _ in range(50):
            trial = study.ask()
            params = _suggest(trial, target, dists)
            for name, value in (_constraints(self.goal, None) or {}).items():  # a draw not proposed misses the goal
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

    def _cover(self, history: Sequence[Any], target: TargetSpec, dists: dict[str, Any], seen: set[str],
               refused: set[tuple[str, str]], regions: Sequence[FailedRegion]) -> Candidate | None:
        """A start-up proposal that covers: of STARTUP_POOL random knob sets the loop may propose, the one
        with the most (knob, level) pairs that none of the run's trials tried (the first drawn on a tie);
        None when no draw is admissible (TPE's own start-up then asks)."""
        tried = {(k, _level(dists[k], v)) for t in history for k, v in t.knobs.items() if k in dists}
        sampler = optuna.samplers.RandomSampler(seed=self.seed + len(history))
        pool = (optuna.create_study(directions=multiobjective.directions(self.objectives), sampler=sampler) if self.objectives
                else optuna.create_study(direction="maximize", sampler=sampler))
        conditional = frozenset(k for k, spec in target.knobs.items() if spec.when)
        served = {(k, repr(v)) for t in history if t.status in ("kept", "discarded", "invalid") for k, v in t.knobs.items()}
        model = CostModel(target, history) if self.rank > 1 else None
        # screened by the prediction: a draw the model puts under SCREEN_PREDICTED of the best measured score
        # covers levels the run has reason to expect nothing of (unless every draw is such)
        top = max((float(t.score) for t in history if t.status in ("kept", "discarded") and t.score), default=0.0)
        floor = SCREEN_PREDICTED * top if model is not None else 0.0
        low: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        best: tuple[tuple[int, int], dict[str, Any]] | None = None
        for _ in range(STARTUP_POOL):
            params = _suggest(pool.ask(), target, dists)
            try:
                if self.max_untried is not None:
                    params = _capped(target, target.validate_knobs(params), served, self.max_untried)
                target.validate_knobs(params)
            except ConstraintViolated:
                continue
            if (knob_key(params) in seen or any((k, repr(v)) in refused for k, v in params.items())
                    or region_containing(regions, params) is not None):  # a draw, not a proposal: not recorded
                continue
            new = _coverage(params, tried, dists, conditional)
            # equal coverage: the knob set the cost model predicts highest (with `rank` > 1)
            key = (*new, model.predict(params) if model is not None else 0.0)
            if model is not None and key[2] < floor:
                if low is None or key[2] > low[0][2]:
                    low = (key, params)
                continue
            if best is None or key > best[0]:
                best = (key, params)
        best = best or low
        if best is None:
            return None
        return Candidate(knobs=best[1], proposer=self.name,
                         rationale=f"start-up proposal {len(history)}{' (multi-objective search)' if self.objectives else ''}: "
                                   f"of {STARTUP_POOL} random knob sets, the one "
                                   f"trying the most knob levels not tried yet ({best[0][0]} + {best[0][1]} conditional)"
                                   + (f", the cost model's pick of those ({best[0][2]:.2f}x)" if model is not None else ""))


def _told(t: Any, objectives: Sequence[Any], failed: Any) -> dict[str, Any]:
    """What TPE is told of finished trial `t`: its score (MOTPE: its objective values; a failure: `failed`).
    A screened trial whose short pass was stopped early (`fidelity.is_stopped`) scored only "at most" its
    stored bound (~the bar), not a measurement: told as pruned at it, which Optuna's TPE ranks under every
    complete trial (its short score was under the bar; told as the bound it would rank beside the best)."""
    if objectives:
        return {"values": multiobjective.values_of(t, objectives, failed)}
    if is_stopped(t) and t.score:
        return {"state": optuna.trial.TrialState.PRUNED, "intermediate_values": {0: float(t.score)}}
    return {"value": t.score if t.status in ("kept", "discarded") and t.score else FAILED_VALUE}


def _constraints(goal: dict[int, float], number: int | None, inside: bool = False) -> dict[str, float] | None:
    """The Optuna constraints of trial `number` (None: a draw told as failed): REGION_CONSTRAINT inside a failed
    region; GOAL_CONSTRAINT while the loop steers by the goal's bars (`SearchProposer.goal`), a trial it does
    not name missing them by more than any it names. None when neither applies."""
    out = {REGION_CONSTRAINT: 1.0} if inside else {}
    if goal:
        out[GOAL_CONSTRAINT] = goal[number] if number in goal else 1.0 + max(max(goal.values()), 0.0)
    return out or None


def _capped(target: TargetSpec, knobs: dict[str, Any], served: set[tuple[str, str]], cap: int) -> dict[str, Any]:
    """`knobs` with its untried levels past the first `cap` (a knob's default and levels a served trial
    carried are tried; the target's knob order: the top of the knob tree first) set to their defaults."""
    untried = [k for k in target.knobs if k in knobs and knobs[k] != target.knobs[k].default
               and (k, repr(knobs[k])) not in served]
    if len(untried) <= cap:
        return knobs
    out = dict(knobs) | {k: target.knobs[k].default for k in untried[cap:]}
    return active_only(target, {k: v.default for k, v in target.knobs.items()} | out)


def _complete(study: optuna.Study) -> int:
    """Trials TPE counts for its start-up (complete and pruned, as `TPESampler` counts them)."""
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state in done)


def _level(d: optuna.distributions.BaseDistribution, value: Any) -> Any:
    """The level a knob value counts as for coverage: the value itself, or a numeric knob's third of its range."""
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return repr(value)
    lo, hi, v = float(d.low), float(d.high), float(value)
    if getattr(d, "log", False) and lo > 0:
        lo, hi, v = math.log(lo), math.log(hi), math.log(max(v, lo))
    return min(LEVEL_BINS - 1, int(LEVEL_BINS * (v - lo) / (hi - lo))) if hi > lo else 0


def _coverage(knobs: dict[str, Any], tried: set[tuple[str, Any]], dists: dict[str, Any],
              conditional: frozenset[str] = frozenset()) -> tuple[int, int]:
    """How many of `knobs`' (knob, level) pairs no trial tried yet: (among the knobs that always exist,
    among the conditional ones). Compared in that order, so the top of the knob tree is covered first:
    otherwise a value that switches on many conditional knobs (an engine with its own options) would
    win every draw, and the values that switch on few would never be tried."""
    new = [k for k, v in knobs.items() if k in dists and (k, _level(dists[k], v)) not in tried]
    return sum(1 for k in new if k not in conditional), sum(1 for k in new if k in conditional)


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


# A one-knob change that moved a source winner by less than this did nothing there: not worth a swap.
SWAP_MIN_EFFECT = 0.05
MAX_SWAPS = 3


def swaps(priors: Sequence[dict[str, Any]], history: Sequence[Any]) -> list[tuple[dict[str, Any], str]]:
    """One-knob swaps between the winners of two or more source runs, most promising first.

    The transferred winner that scored best *here* (its warm-start trial) gets one knob at a time
    set to another source winner's value; only knobs whose one-knob change moved some source's
    winner by at least SWAP_MIN_EFFECT (the probes measured that), largest effect first, then the
    knobs no source probed. At most MAX_SWAPS. Why: two models whose winners differ often differ
    on one knob that matters here, and the next model's best recombines them (sdpa from one
    source, bfloat16 from the other); the probes say which knobs matter at all (a thread count
    that moved nothing is not worth a trial), and the search's prior cannot express that."""
    sources = by_entry(priors)
    if len(sources) < 2:
        return []
    # Each source's winner is its run's answer (`winner`, sent with its probes), not whatever
    # observation scored highest: a probe that changed nothing ties with it (threads 0 and 2 alike).
    winners = {e: next((o for o in obs if o.get("winner")), None) or max(obs, key=lambda o: float(o["score"]))
               for e, obs in sources.items()}
    here = {knob_key(t.knobs): t.score for t in history if (t.rationale or "").startswith("warm start")
            and t.status in ("kept", "discarded") and t.score}
    scored = [(here[knob_key(w["knobs"])], e) for e, w in winners.items() if knob_key(w["knobs"]) in here]
    if not scored:
        return []
    base = winners[max(scored)[1]]["knobs"]
    effect: dict[str, float] = {}  # knob -> the largest relative change a one-knob neighbour made to a source's winner
    for e, obs in sources.items():
        w = winners[e]
        for o in obs:
            diff = [k for k in w["knobs"] if o["knobs"].get(k) != w["knobs"][k]]
            if len(diff) == 1 and set(o["knobs"]) == set(w["knobs"]):
                moved = abs(float(w["score"]) - float(o["score"])) / float(w["score"])
                effect[diff[0]] = max(effect.get(diff[0], 0.0), moved)
    ranked = []
    for w in winners.values():
        for k, v in w["knobs"].items():
            if base.get(k) != v and effect.get(k, SWAP_MIN_EFFECT) >= SWAP_MIN_EFFECT:
                ranked.append((-effect.get(k, SWAP_MIN_EFFECT / 2), k, v))
    ranked.sort(key=lambda x: x[0])
    return [(dict(base) | {k: v}, f"swap: the transferred winner that scored best here, with {k}={v!r} from another "
             "source's winner (knowledge base)") for _, k, v in ranked[:MAX_SWAPS]]


def neighbours(target: TargetSpec, knobs: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any]]]:
    """(knob, value, knob set): `knobs` with one knob changed. Every other value of a categorical or
    bool knob (choices are unordered: `threads` 0 means "all cores", not "fewer than 1"); the
    adjacent values of an int or float knob (x2 and /2 on a log scale, a tenth of the range
    otherwise, clamped). In the target's knob order; only knob sets its constraints allow."""
    out = []
    for name, knob in target.knobs.items():
        if name not in knobs or not is_active(knob, knobs):
            continue
        v = knobs[name]
        if knob.type == "bool":
            values: list[Any] = [not v]
        elif knob.type == "categorical":  # unordered: a declared choice list says nothing about distance
            values = [c for c in knob.choices if c != v]
        else:
            lo, hi = float(knob.low), float(knob.high)
            cand = [v / 2, v * 2] if knob.log else [v - (hi - lo) / 10, v + (hi - lo) / 10]
            if knob.type == "int":
                cand = [round(c) for c in cand]
            values = sorted({min(max(c, lo), hi) for c in cand} - {v})
            if knob.type == "int":
                values = [int(c) for c in values]
        for value in values:
            k = active_only(target, dict(knobs) | {name: value})
            try:
                target.validate_knobs(k)
            except ValueError:
                continue
            out.append((name, value, k))
    return out


# Within this fraction of a prior run's best, an observation counts as one of its top results: the
# source run could not tell them apart (its own noise), so none of their values is ruled out.
NEAR_TOP = 0.10


def prior_region(priors: Sequence[dict[str, Any]], target: TargetSpec) -> dict[str, Any]:
    """knob -> the values (categorical) or [low, high] (numeric) a prior run's evidence still allows.

    Per source entry, knobs are narrowed in the target's order: a value is ruled out only when the
    source *measured* it inside the region narrowed so far and it lost to the source's top results
    (all within NEAR_TOP of its best). A value the source never measured there stays open: the
    source not having tried it says nothing about it. Narrowing inside the region, rather than over
    all observations, keeps one knob's bad neighbours from condemning another's value (sdpa measured
    only with tiny batches is not evidence against sdpa with large ones).

    Several sources (runs on other models) join knob by knob: what every source still allows, plus
    every value that was among some source's top results. Where the sources agree, the region stays
    as narrow as the narrowest of them; where their top results disagree (bfloat16 won on one model,
    float32 on another), the knob does not transfer between models and every top value stays open.
    An empty dict means no narrowing."""
    ones = [_region_one(obs, target) for obs in by_entry(priors).values()]
    region: dict[str, Any] = {}
    # A region over fewer sources than there are must not narrow a knob only some of them judged.
    for name in [n for n in target.knobs if ones and all(n in one for one in ones)]:
        allowed = [one[name][0] for one in ones]
        tops = [v for one in ones for v in one[name][1]]
        if isinstance(allowed[0], tuple):
            lo, hi = max(a[0] for a in allowed), min(a[1] for a in allowed)
            lo, hi = (min(lo, *tops), max(hi, *tops)) if lo <= hi else (min(tops), max(tops))
            region[name] = (lo, hi)
        else:
            knob = target.knobs[name]
            choices = list(knob.choices) if knob.type == "categorical" else [False, True]
            region[name] = [c for c in choices if all(c in a for a in allowed) or c in tops]
    return region


def _region_one(obs: list[dict[str, Any]], target: TargetSpec) -> dict[str, tuple[Any, list[Any]]]:
    """knob -> (what this source's evidence allows, the values of its top results)."""
    scored = [o for o in obs if float(o.get("score") or 0.0) > 0.0]
    if len(scored) < 3:
        return {}
    best = max(float(o["score"]) for o in scored)
    top = [o for o in scored if float(o["score"]) >= best * (1 - NEAR_TOP)]
    inside = list(obs)
    out: dict[str, tuple[Any, list[Any]]] = {}
    left = list(target.knobs)
    while left:  # a decision tree of top against the rest: the most decisive knob, inside the region so far
        name = min(left, key=lambda n: _decisive(inside, top, n))
        left.remove(name)
        knob = target.knobs[name]
        good = [o["knobs"][name] for o in top if name in o["knobs"]]
        if not good:
            continue
        tried = [o["knobs"][name] for o in inside if name in o["knobs"]]
        lost = [v for v in tried if v not in good]
        if knob.type in ("categorical", "bool"):
            choices = list(knob.choices) if knob.type == "categorical" else [False, True]
            allowed: Any = [c for c in choices if c not in lost]
        else:
            lo, hi = min(good), max(good)
            below, above = [v for v in lost if v < lo], [v for v in lost if v > hi]
            step = 1 if knob.type == "int" else 0
            allowed = (max(below) + step if below else knob.low, min(above) - step if above else knob.high)
        out[name] = (allowed, sorted(set(good), key=repr))
        inside = [o for o in inside if name not in o["knobs"] or _allows(allowed, o["knobs"][name])]
    return out


def _decisive(obs: list[dict[str, Any]], top: list[dict[str, Any]], name: str) -> tuple[float, int]:
    """Sort key, most decisive knob first: the best score any value outside the top's reached
    (lower: the knob's other values never came close), then how often they were measured.

    A loss that could be blamed on two knobs (sdpa tried only with small batches) is blamed on the
    one with more evidence against it; with a wrong attribution the region only misleads while the
    prior holds (PRIOR_HORIZON), then the whole space is searched."""
    good = [o["knobs"][name] for o in top if name in o["knobs"]]
    losers = [float(o.get("score") or 0.0) for o in obs if name in o["knobs"] and o["knobs"][name] not in good]
    return (max(losers), -len(losers)) if losers else (float("inf"), 0)


def _allows(allowed: Any, value: Any) -> bool:
    return allowed[0] <= value <= allowed[1] if isinstance(allowed, tuple) else value in allowed


def restrict(d: optuna.distributions.BaseDistribution, allowed: Any) -> optuna.distributions.BaseDistribution:
    """`d` limited to `allowed` (values, or [low, high]); unchanged where they do not meet (this
    run's space pins the knob elsewhere: the region says nothing about it)."""
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        kept = [c for c in d.choices if c in allowed]
        return optuna.distributions.CategoricalDistribution(kept) if kept else d
    lo, hi = max(d.low, allowed[0]), min(d.high, allowed[1])
    if lo > hi:
        return d
    if isinstance(d, optuna.distributions.IntDistribution):
        return optuna.distributions.IntDistribution(int(lo), int(hi), log=d.log)
    return optuna.distributions.FloatDistribution(lo, hi, log=d.log)


def _fits(knobs: dict[str, Any], dists: dict[str, Any]) -> bool:
    for k, v in knobs.items():
        d = dists.get(k)
        if d is None:
            return False
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            if v not in d.choices:
                return False
        elif not d.low <= v <= d.high:
            return False
    return True


def _suggest(trial: optuna.trial.Trial, target: TargetSpec, dists: dict[str, Any]) -> dict[str, Any]:
    """Ask for each knob in declaration order, skipping the ones inactive under those so far."""
    params: dict[str, Any] = {}
    for name, knob in target.knobs.items():
        if is_active(knob, params):
            d = dists[name]
            if isinstance(d, optuna.distributions.CategoricalDistribution):
                params[name] = trial.suggest_categorical(name, list(d.choices))
            elif isinstance(d, optuna.distributions.IntDistribution):
                params[name] = trial.suggest_int(name, d.low, d.high, log=d.log)
            else:
                params[name] = trial.suggest_float(name, d.low, d.high, log=d.log)
    return params
