"""The search's model steps: the best trial with the levels the run's cost model (`costmodel.CostModel`) predicts better.

After the start-up, between TPE's proposals, the search proposes the best trial so far with the knob levels the
cost model predicts better (coordinate ascent on the model over the best trial's served neighbourhood), while
the model predicts a gain of at least MODEL_STEP_GAIN: the best region of an engine's space is often the best
trial with a few levels changed that each do a little (a fused kernel, fp8 KV, fewer launches), and TPE's
independent draws over a dozen knobs rarely change just those; the model names them from the knobs' priors,
corrected by what the run measured, and each step it measures corrects it again.

An int or float knob moves along its ladder (`ladder`: every doubling and halving within its range, its ends
included), not one neighbour at a time: the model's effect is a slope on its log2 value, so one step goes as far
as the fitted slope says pays, where a walk of doublings spends a trial on each. The walk (`SearchProposer`)
skips a step the model predicts a loss for (`walk_loses`): stepping the batch down from the top of its range
while the fitted slope is positive measures what the run's evidence already says.

The ascent takes the move the model predicts best first (steepest ascent, not the knobs in declaration order:
under the cap on untried levels, the first knob declared that gains a little would otherwise use up the step).
A step stakes at most the proposer's `max_untried` levels no served trial carried, as a start-up trial does, and
TPE has its turn after MODEL_STEPS steps in a row that did not become the best.

Once a paired confirmation missed the goal (`costmodel.GoalAim`), the steps and the walk climb the goal, not the
score (`Ranker`): they start from the trial whose screen came closest to clearing every bar (its goal margin, the
smallest over the objectives of speedup / bar), and of their moves take the one the per-objective models
(`costmodel.GoalModel`) predict the largest goal margin for while it is under 1, the highest score only among the
moves predicted to clear every bar. The score's best may sit at one objective's edge (the largest batch: the
most throughput, TPOT just at its bar): after its paired rounds missed, climbing the score would push further
the way that misses, while the goal margin turns the batch back to where both bars are cleared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from orchestrator.core.candidate import Candidate, knob_key
from orchestrator.proposers.costmodel import CostModel, GoalAim, GoalModel
from orchestrator.targets import TargetSpec
from orchestrator.targets.regions import FailedRegion, region_containing
from orchestrator.targets.space import active_only, is_active

__all__ = ["MODEL_PREFIX", "MODEL_STARTUP", "MODEL_STEPS", "MODEL_STEP_GAIN", "Ranker", "gains", "ladder", "model_step",
           "walk_loses"]

MODEL_PREFIX = "model step:"
# A step is proposed while the model predicts at least this gain over the best trial (all its changes together).
MODEL_STEP_GAIN = 0.01
# TPE's turn after this many model steps in a row that did not become the best.
MODEL_STEPS = 2
# The model steps begin once this many trials finished: the baseline alone, so the first search trial is the
# target's prior's best guess (a few levels from the baseline), not a random covering draw; the start-up's
# covering draws come on TPE's turns. A target without priors predicts no gain from the baseline alone: TPE first.
MODEL_STARTUP = 1
# The walk skips a step the model predicts at least this much under the knob set it steps from.
WALK_LOSS = 0.01
_FINISHED = {"kept", "discarded", "failed", "invalid", "needs_approval", "rejected"}


def ladder(knob: Any, value: Any) -> list[Any]:
    """The values a model step may move an int or float knob to from `value`: on a log scale every doubling and
    halving of it within the range and the range's ends; otherwise every tenth of the range from it and the ends."""
    lo, hi, v = float(knob.low), float(knob.high), float(value)
    if knob.log and lo > 0:
        out = [v * 2.0 ** k for k in range(-int(math.log2(hi / lo)) - 1, int(math.log2(hi / lo)) + 2)]
    else:
        out = [v + k * (hi - lo) / 10 for k in range(-10, 11)]
    out = [min(max(x, lo), hi) for x in [*out, lo, hi]]
    if knob.type == "int":
        out = [int(round(x)) for x in out]
    return sorted(set(out) - {value})


def _moves(target: TargetSpec, knobs: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """`knobs` with knob `name` at each other value it may take (a numeric knob: its `ladder`), as the loop
    records them (knobs switched on at their defaults); only knob sets the target's constraints allow."""
    knob = target.knobs[name]
    if name not in knobs or not is_active(knob, knobs):
        return []
    v = knobs[name]
    if knob.type == "bool":
        values: list[Any] = [not v]
    elif knob.type == "categorical":
        values = [c for c in knob.choices if c != v]
    else:
        values = ladder(knob, v)
    out = []
    for value in values:
        try:
            out.append(target.validate_knobs(active_only(target, dict(knobs) | {name: value})))
        except ValueError:
            continue
    return out


Key = tuple[float, float]


def gains(new: Key, old: Key, gain: float) -> bool:
    """Whether `Ranker.key` `new` beats `old` by at least `gain`: clearing every bar where `old` misses one, a goal
    margin `gain` larger while both miss, a score `gain` higher while both clear (always, without a goal)."""
    if new[0] < 1.0:
        return new[0] >= old[0] * (1 + gain)
    return old[0] < 1.0 or new[1] >= old[1] * (1 + gain)


def loses(new: Key, old: Key, loss: float) -> bool:
    """Whether `new` falls at least `loss` under `old`: in goal margin where either misses a bar, else in score."""
    if new[0] < 1.0 or old[0] < 1.0:
        return new[0] < old[0] * (1 - loss)
    return new[1] < old[1] * (1 - loss)


class Ranker:
    """How the steps and the walk rank knob sets: the cost model's predicted score, or, with `aim` (a paired
    confirmation missed the goal), `GoalModel.key`: the predicted goal margin under 1, then the predicted score."""

    def __init__(self, target: TargetSpec, history: Sequence[Any], aim: GoalAim | None = None) -> None:
        self.goal = GoalModel(target, history, aim) if aim is not None else None
        self.model = self.goal.score if self.goal is not None else CostModel(target, history)

    def key(self, knobs: dict[str, Any]) -> Key:
        return (self.goal or self.model).key(knobs)

    def start(self, scored: Sequence[Any]) -> Any:
        """The trial to step from: the highest score; with a goal, the largest measured goal margin (capped at 1: of
        the trials clearing every bar, the highest score)."""
        def measured(t: Any) -> float:
            m = self.goal.aim.margin(self.goal.aim.ratios.get(t.number, {})) if self.goal is not None else 1.0
            return min(m, 1.0) if m is not None else -1.0
        return max(scored, key=lambda t: (measured(t), float(t.score), -t.number))

    def words(self, knobs: dict[str, Any]) -> str:
        """`5.21x` (the predicted score), with a goal `goal margin 1.04 (tpot 6.9x / bar 6.5x, ...), 5.21x`."""
        if self.goal is None:
            return f"{self.model.predict(knobs):.2f}x"
        got = self.goal.speedups(knobs)
        per = ", ".join(f"{k.split(':')[-1]} {got[k]:.2f}x / bar {b:.2f}x" for k, b in self.goal.aim.bars.items())
        return f"goal margin {self.goal.aim.margin(got):.2f} ({per}), {self.model.predict(knobs):.2f}x"


def walk_loses(rank: Ranker | CostModel, src: dict[str, Any], step: dict[str, Any]) -> bool:
    """Whether the model predicts the walk's `step` at least WALK_LOSS under the knob set `src` it steps from
    (with a goal: in goal margin while either misses a bar)."""
    return loses(rank.key(step), rank.key(src), WALK_LOSS)


def model_step(history: Sequence[Any], target: TargetSpec, *, name: str, max_untried: int | None,
               seen: set[str], refused: set[tuple[str, str]], regions: Sequence[FailedRegion],
               aim: GoalAim | None = None) -> Candidate | None:
    """The best trial with the levels the cost model predicts better, while it predicts a gain of at least
    MODEL_STEP_GAIN over the best; None (TPE proposes) otherwise, before MODEL_STARTUP trials finished, and after
    MODEL_STEPS steps in a row that did not become the best. Never a measured knob set (`seen`), a refused level,
    a knob set inside a failed region, or more than `max_untried` levels no served trial carried. With `aim`, "best"
    and "better" are the goal's (`Ranker`)."""
    finished = [t for t in history if t.status in _FINISHED]
    scored = [t for t in finished if t.status in ("kept", "discarded") and t.score]
    if len(finished) < MODEL_STARTUP or not scored:
        return None
    rank = Ranker(target, history, aim)
    best = rank.start(scored)
    own = [t for t in history if t.proposer == name and t.number > best.number]
    if len(own) >= MODEL_STEPS and all((t.rationale or "").startswith(MODEL_PREFIX) for t in own[-MODEL_STEPS:]):
        return None  # the model's last steps did not pay: TPE's turn
    here = rank.key(best.knobs)
    served = {(k, repr(v)) for t in history if t.status in ("kept", "discarded", "invalid") for k, v in t.knobs.items()}

    def untried(k: dict[str, Any]) -> int:
        return sum(1 for n, x in k.items() if x != target.knobs[n].default and (n, repr(x)) not in served)

    def ok(k: dict[str, Any]) -> bool:  # and no more untried levels staked than a start-up trial may
        return (not any((n, repr(x)) in refused for n, x in k.items()) and region_containing(regions, k) is None
                and (max_untried is None or untried(k) <= max_untried))

    # steepest ascent on the model from the best trial: the one move (a knob to another value) the model predicts
    # best, while it gains at least MODEL_STEP_GAIN; else the best single unmeasured move
    knobs, pred = dict(best.knobs), here
    for _ in range(2 * len(target.knobs)):
        steps = [(rank.key(k), k) for n in target.knobs for k in _moves(target, knobs, n) if ok(k)]
        top = max(steps, key=lambda s: s[0], default=None)
        if top is None or not gains(top[0], pred, MODEL_STEP_GAIN):
            break
        pred, knobs = top
    if knob_key(knobs) in seen:
        options = [(rank.key(k), k) for n in target.knobs for k in _moves(target, best.knobs, n)
                   if knob_key(k) not in seen and ok(k)]
        if not options:
            return None
        pred, knobs = max(options, key=lambda o: o[0])
    if not gains(pred, here, MODEL_STEP_GAIN):
        return None
    changed = ", ".join(f"{k}={v}" for k, v in knobs.items() if best.knobs.get(k) != v)
    what = "the best so far" if aim is None else "the closest to the goal's bars so far"
    return Candidate(knobs=knobs, proposer=name,
                     rationale=f"{MODEL_PREFIX} #{best.number} ({float(best.score):.3f}x, {what}) with "
                               f"{changed}: the cost model predicts {rank.words(knobs)} against {rank.words(best.knobs)}")
