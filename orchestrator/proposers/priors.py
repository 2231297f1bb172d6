"""The knowledge base's priors for the search: what similar settings' runs measured, turned into steering.

`prior_weight` says how long the priors steer (PRIOR_HORIZON trials times their weight), `prior_region` the
region of the knob space their evidence still allows, `swaps` the one-knob recombinations of two or more source
runs' winners that their probes say are worth a trial. `SearchProposer` (`orchestrator.proposers.search`) reads
them; `orchestrator.proposers.optspace.restrict` narrows its Optuna distributions to the region.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.core.candidate import knob_key
from orchestrator.targets import TargetSpec

__all__ = ["MAX_SWAPS", "NEAR_TOP", "PRIOR_HORIZON", "SWAP_MIN_EFFECT", "by_entry", "prior_region", "prior_weight", "swaps"]

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
