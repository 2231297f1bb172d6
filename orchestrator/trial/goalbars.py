"""The goal's bars for screening: which trial earns a paired confirmation, and what the search is told.

A goal with several objectives is met only when every objective clears its bar (TPOT 4x *and*
throughput 19x), while the search and the keep line rank trials by the score, the geometric mean of
the objectives' speedups: the highest score may sit just at one objective's edge. A screen is one
measurement against a baseline whose own value moves between launches, so a trial whose screen
meets an objective by less than that movement is as likely to miss it in the paired rounds.

So a trial is sent to the paired A/B only when its screening speedup clears every objective's bar,
the speedup the goal asks for times (1 + margin); of several such trials, the one with the largest
goal margin (the smallest, over the objectives, of speedup / bar) goes first, not the highest score.
The margin is the baseline's noise (`verdict.Baseline.noise`), raised per objective by what failed
paired confirmations showed: an objective whose paired rounds missed, after a screen of s, at a
worst round (or interval's low end) of p, has its bar raised by s / p for every later screen, so a
neighbour that screens no better is not confirmed again. The same bars are what the search is told
as constraints (`constraint`, Optuna's constraint-aware TPE): a trial's value is its shortfall summed
over the objectives, <= 0 where it clears them all.

Plain functions of stored facts (the goal, the baseline, the run's `paired` events): the loop calls
them and records what they say (`trial.why`'s `goal` entry); nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.trial.context import objective_label
from orchestrator.trial.verdict import why_record

__all__ = ["Bars", "bars", "goal_margin", "names", "raised", "raised_words", "ratios", "screen", "steer", "to_confirm", "words"]


@dataclass(frozen=True)
class Bars:
    """Per objective label: the speedup the goal asks for and the margin a screen must clear it by."""

    required: dict[str, float]
    """Objective label -> the speedup over the baseline the goal asks for (4.0 for "4x")."""
    noise: float
    """The baseline's noise: every objective's margin is at least this."""
    raised: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Objective label -> (factor, candidate trial number): a failed paired confirmation's screen / paired ratio."""

    def margin_of(self, label: str) -> float:
        """The relative margin a screen must clear `label`'s goal by."""
        return max(self.noise, self.raised.get(label, (1.0, 0))[0] - 1.0)

    def bar(self, label: str) -> float:
        return self.required[label] * (1.0 + self.margin_of(label))

    def margin(self, speedups: Mapping[str, float]) -> float | None:
        """The goal margin of `speedups` against these bars (`goal_margin`)."""
        return goal_margin(speedups, {label: self.bar(label) for label in self.required})

    def clears(self, speedups: Mapping[str, float]) -> bool:
        m = self.margin(speedups)
        return m is not None and m >= 1.0

    def constraint(self, speedups: Mapping[str, float]) -> float:
        """Optuna's constraint value: the shortfall bar / speedup - 1 summed over the objectives that miss,
        or, when all clear, minus the goal margin's excess (<= 0: feasible)."""
        short = sum(max(0.0, self.bar(k) / max(float(speedups[k]), 1e-9) - 1.0) for k in self.required)
        return short if short > 0 else 1.0 - (self.margin(speedups) or 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"required": dict(self.required), "noise": self.noise,
                "raised": {k: list(v) for k, v in self.raised.items()},
                "bars": {k: self.bar(k) for k in self.required}}


def goal_margin(speedups: Mapping[str, float], bar: Mapping[str, float]) -> float | None:
    """min over the objectives of speedup / bar (>= 1: clears every bar); None when one is unmeasured."""
    if any(label not in speedups for label in bar):
        return None
    return min(float(speedups[label]) / b for label, b in bar.items())


def ratios(values: Mapping[str, float], baseline: Mapping[str, float], objectives: Sequence[Any]) -> dict[str, float]:
    """Objective label -> the speedup of `values` over `baseline` (>1 is better), for the objectives both measured."""
    out = {}
    for o in objectives:
        label = objective_label(o.scenario, o.key)
        if label in values and label in baseline:
            out[label] = o.speedup(float(values[label]), float(baseline[label]))
    return out


def bars(objectives: Sequence[Any], baseline: Mapping[str, float], noise: float,
         paired: Iterable[Mapping[str, Any]] = ()) -> Bars | None:
    """The run's bars against `baseline` (objective label -> value), or None for a goal with an objective
    that has no target (an SLO goal's "best": nothing is ever met). `paired`: the run's paired outcomes."""
    required: dict[str, float] = {}
    for o in objectives:
        label = objective_label(o.scenario, o.key)
        if o.kind == "best" or label not in baseline:
            return None
        required[label] = o.speedup(o.target_for(float(baseline[label])), float(baseline[label]))
    return Bars(required, max(0.0, noise), raised(paired)) if required else None


def raised(paired: Iterable[Mapping[str, Any]]) -> dict[str, tuple[float, int]]:
    """Objective label -> (factor, trial): how far failed paired confirmations fell under the screens that sent
    them, for each objective they missed: the screening speedup over the paired rounds' worst (the lower of
    the interval's low end and the worst round; the ratio for a target without an interval). The largest wins."""
    out: dict[str, tuple[float, int]] = {}
    for p in paired:
        screen = p.get("screen") or {}
        if p.get("met") or not p.get("score"):
            continue
        for label, o in (p.get("objectives") or {}).items():
            if o.get("verdict") == "pass" or label not in screen:
                continue
            worst = min([x for x in (o.get("lo"), *(o.get("pairs") or ())) if x] or [o.get("ratio") or 0.0])
            if worst > 0 and screen[label] / worst > out.get(label, (1.0, 0))[0]:
                out[label] = (float(screen[label]) / worst, int(p.get("trial", 0)))
    return out


def words(b: Bars, speedups: Mapping[str, float], names: Mapping[str, str]) -> str:
    """`TPOT 4.26x vs bar 4.48x (4.00x + 12%: #8's paired rounds), throughput 32.9x vs bar 19.95x (19.00x + noise 5.0%)`."""
    parts = []
    for label in b.required:
        why = (f"#{b.raised[label][1]}'s paired rounds" if b.margin_of(label) > b.noise else f"noise {b.noise:.1%}")
        got = f"{speedups[label]:.2f}x" if label in speedups else "unmeasured"
        parts.append(f"{names.get(label, label)} {got} vs bar {b.bar(label):.2f}x "
                     f"({b.required[label]:.2f}x + {b.margin_of(label):.0%}: {why})")
    return ", ".join(parts)


def names(objectives: Sequence[Any]) -> dict[str, str]:
    """Objective label -> the name a sentence gives it (`TPOT`, `throughput`)."""
    return {objective_label(o.scenario, o.key): o.metric.upper() if o.info.has_stats else o.metric for o in objectives}


def screen(b: Bars, values: Mapping[str, float], baseline: Mapping[str, float], objectives: Sequence[Any]) -> dict[str, Any]:
    """A trial's screening speedups against the bars: the `goal` entry of its `trial.why`."""
    got = ratios(values, baseline, objectives)
    return {"ratios": got, "margin": b.margin(got), "clears": b.clears(got), **b.to_dict(),
            "words": words(b, got, names(objectives))}


def screens(store: Any, run_id: int, trials: Iterable[Any]) -> list[tuple[Any, dict[str, float]]]:
    """(trial, its screening speedups) for each of `trials` whose `trial.why` has them."""
    out = []
    for t in trials:
        got = (why_record(store, run_id, t.id).get("goal") or {}).get("ratios")
        if got:
            out.append((t, got))
    return out


def to_confirm(b: Bars, screened: Iterable[tuple[Any, dict[str, float]]]) -> Any | None:
    """Of `screened` (trial, speedups), the trial whose screen clears every bar by the largest goal margin
    (the earlier on a tie); None when none clears them."""
    ok = [(m, t) for t, got in screened if (m := b.margin(got)) is not None and m >= 1.0]
    return max(ok, key=lambda x: (x[0], -x[1].number))[1] if ok else None


def steer(b: Bars | None, screened: Iterable[tuple[Any, dict[str, float]]]) -> dict[int, float]:
    """Trial number -> its constraint for the search (`Bars.constraint`), once a paired confirmation missed
    (the bars then carry what its rounds showed); {} before, and for a goal without bars."""
    if b is None or not b.raised:
        return {}
    return {t.number: b.constraint(got) for t, got in screened if all(k in got for k in b.required)}


def raised_words(before: Bars | None, after: Bars | None, number: int, screened: Mapping[str, float],
                 objectives: Sequence[Any]) -> list[tuple[str, str]]:
    """(objective label, sentence) for each bar a paired confirmation of trial `number` raised."""
    if before is None or after is None:
        return []
    said = names(objectives)
    out = []
    for label, (factor, _) in after.raised.items():
        if factor > before.raised.get(label, (1.0, 0))[0] and label in screened:
            out.append((label, f"#{number}'s paired rounds missed {said.get(label, label)} at {screened[label] / factor:.2f}x "
                               f"after a screen of {screened[label]:.2f}x: later screens must clear "
                               f"{after.required[label]:.2f}x by {after.margin_of(label):.0%} ({after.bar(label):.2f}x) "
                               "to be confirmed"))
    return out
