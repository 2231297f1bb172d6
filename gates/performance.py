"""Performance gate: noise-aware pass / fail / remeasure from repeated measurements.

Pure functions, no I/O. A benchmark number alone says little on a shared machine: the same
server measured twice differs by a few percent. So every decision compares the observed
relative change with the standard error of that change, estimated from the repeats:

    delta  = relative improvement of the candidate mean over the baseline mean (sign-corrected
             so that positive is always better)
    se     = sqrt(cv_b**2 / n_b + cv_c**2 / n_c)   with cv = max(std/mean, cv_floor)

A target metric passes when ``delta - k*se >= required`` (the improvement holds even at the
pessimistic end of the noise band), fails when ``delta + k*se < required`` (even the optimistic end
misses), and is *borderline* otherwise -> ``remeasure`` while fewer than ``max_samples`` repeats
exist, then decided on the point estimate. Non-target ("guard") metrics must not regress by more
than ``max_regression``, judged the same way.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from gates.result import GateResult
from gates.thresholds import section

__all__ = [
    "MetricComparison", "PairedComparison", "bootstrap_interval", "check", "compare_metric", "higher_is_better",
    "pair_speedups", "paired_check",
]

Verdict = Literal["pass", "fail", "remeasure"]


def higher_is_better(metric: str) -> bool:
    """Direction from the bench's naming: throughputs go up, latencies (``*_ms_*``) go down."""
    return "throughput" in metric or metric in {"completed"}


@dataclass(frozen=True)
class MetricComparison:
    """One metric's comparison (all relative numbers are fractions, 0.1 = 10 %)."""

    metric: str
    role: Literal["target", "guard"]
    baseline_mean: float
    candidate_mean: float
    delta: float
    se: float
    required: float
    verdict: Verdict
    why: str


def _cv(values: Sequence[float], floor: float) -> float:
    mean = statistics.fmean(values)
    if len(values) < 2 or mean == 0:
        return max(floor, 0.0)
    return max(statistics.stdev(values) / abs(mean), floor)


def compare_metric(
    metric: str,
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    role: Literal["target", "guard"],
    required: float,
    k_sigma: float,
    cv_floor: float,
    max_samples: int,
    higher_better: bool | None = None,
) -> MetricComparison:
    """Compare one metric. For a target, ``required`` is the minimum relative improvement;
    for a guard it is the maximum tolerated relative regression."""
    if not baseline or not candidate:
        raise ValueError(f"{metric}: need at least one baseline and one candidate measurement")
    hb = higher_is_better(metric) if higher_better is None else higher_better
    mb, mc = statistics.fmean(baseline), statistics.fmean(candidate)
    if mb == 0:
        raise ValueError(f"{metric}: baseline mean is 0, relative change undefined")
    delta = (mc - mb) / abs(mb) if hb else (mb - mc) / abs(mb)
    se = math.sqrt(_cv(baseline, cv_floor) ** 2 / len(baseline) + _cv(candidate, cv_floor) ** 2 / len(candidate))
    # One repeat gives no spread estimate: never decide a borderline case on it.
    exhausted = min(len(baseline), len(candidate)) >= max_samples
    lo, hi = delta - k_sigma * se, delta + k_sigma * se
    if role == "target":
        if lo >= required:
            verdict, why = "pass", f"improvement {delta:+.3f} (±{k_sigma:g}·{se:.3f}) clears {required:.3f}"
        elif hi < required:
            verdict, why = "fail", f"improvement {delta:+.3f} (±{k_sigma:g}·{se:.3f}) misses {required:.3f}"
        elif exhausted:
            ok = delta >= required and delta > k_sigma * se
            verdict = "pass" if ok else "fail"
            why = f"borderline after {max_samples} repeats: improvement {delta:+.3f} vs {required:.3f}, noise {se:.3f}"
        else:
            verdict, why = "remeasure", f"improvement {delta:+.3f} within noise ±{k_sigma:g}·{se:.3f} of {required:.3f}"
    else:
        regression = -delta
        if regression - k_sigma * se > required:
            verdict, why = "fail", f"regressed {regression:.3f} (±{k_sigma:g}·{se:.3f}) > allowed {required:.3f}"
        elif regression <= required:
            verdict, why = "pass", f"regression {regression:+.3f} within allowed {required:.3f}"
        elif exhausted:
            verdict, why = "fail", f"regression {regression:.3f} > allowed {required:.3f} after {max_samples} repeats"
        else:
            verdict, why = "remeasure", f"regression {regression:.3f} > {required:.3f} but within noise {se:.3f}"
    return MetricComparison(metric, role, mb, mc, delta, se, required, verdict, why)


def check(
    baseline: Mapping[str, Sequence[float]],
    candidate: Mapping[str, Sequence[float]],
    *,
    targets: Mapping[str, float],
    guards: Sequence[str] | Mapping[str, float] | None = None,
    directions: Mapping[str, bool] | None = None,
    thresholds: Mapping[str, Any] | None = None,
) -> GateResult:
    """Decide whether the candidate meets the goal, noise-aware.

    Args:
        baseline, candidate: metric name -> repeated measurements (one float per repeat).
        targets: metric -> required relative improvement from the goal (0.10 = 10 % better;
            0.0 = any improvement that stands out of the noise).
        guards: non-target metrics that must not regress; a list uses the default
            ``max_regression`` from the thresholds, a mapping gives one bound per metric.
            None = every metric present in both inputs that is not a target.
        directions: metric -> True when higher is better (default from the metric's name).
        thresholds: a parsed thresholds dict (default: ``gates/thresholds.toml``).

    Returns:
        GateResult with status ``pass``, ``fail`` (reason names the metric, value and bound) or
        ``remeasure`` (borderline: collect more repeats of both and call again).
    """
    start = time.perf_counter()
    cfg = section(dict(thresholds) if thresholds is not None else None, "performance")
    k, floor, max_n = float(cfg["k_sigma"]), float(cfg["cv_floor"]), int(cfg["max_samples"])
    directions = directions or {}
    if guards is None:
        guards = [m for m in baseline if m in candidate and m not in targets]
    guard_bounds = dict(guards) if isinstance(guards, Mapping) else {g: float(cfg["max_regression"]) for g in guards}
    rows: list[MetricComparison] = []
    missing = [m for m in [*targets, *guard_bounds] if m not in baseline or m not in candidate]
    if missing:
        return GateResult("performance", "fail", f"missing measurements for {', '.join(missing)}",
                          {"missing": missing}, time.perf_counter() - start)
    for metric, required in targets.items():
        rows.append(compare_metric(metric, baseline[metric], candidate[metric], role="target", required=required,
                                   k_sigma=k, cv_floor=floor, max_samples=max_n, higher_better=directions.get(metric)))
    for metric, bound in guard_bounds.items():
        rows.append(compare_metric(metric, baseline[metric], candidate[metric], role="guard", required=bound,
                                   k_sigma=k, cv_floor=floor, max_samples=max_n, higher_better=directions.get(metric)))
    details = {"k_sigma": k, "cv_floor": floor, "max_samples": max_n, "metrics": [asdict(r) for r in rows]}
    for verdict in ("fail", "remeasure"):
        hits = [r for r in rows if r.verdict == verdict]
        if hits:
            reason = "; ".join(f"{r.role} {r.metric}: {r.why}" for r in hits)
            return GateResult("performance", verdict, reason, details, time.perf_counter() - start)
    return GateResult("performance", "pass", "all targets met, no guard regressed", details,
                      time.perf_counter() - start)


@dataclass(frozen=True)
class PairedComparison:
    """A paired A/B ratio: baseline and candidate measured alternately on fresh servers.

    ``ratio`` is the geometric mean of the per-pair speedups (>1 is better), ``lo``/``hi`` a
    two-sided percentile-bootstrap interval at ``confidence`` over the pairs; ``wins`` counts the
    pairs whose own speedup reached ``required`` (a sign test's statistic).
    """

    ratio: float
    lo: float
    hi: float
    confidence: float
    required: float
    pairs: tuple[float, ...]
    wins: int
    verdict: Verdict
    why: str


def pair_speedups(baseline: Sequence[float], candidate: Sequence[float], *, higher_better: bool) -> list[float]:
    """Per-pair speedups: candidate/baseline when higher is better, baseline/candidate otherwise."""
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError("paired comparison needs equally many baseline and candidate measurements (>= 1)")
    if min(*baseline, *candidate) <= 0:
        raise ValueError("paired comparison needs positive measurements")
    return [c / b if higher_better else b / c for b, c in zip(baseline, candidate, strict=True)]


def bootstrap_interval(speedups: Sequence[float], *, confidence: float, n_boot: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the geometric mean of `speedups` (resampled in log space).

    Seeded: the same pairs always give the same interval, so a verdict can be re-derived."""
    import random

    logs = [math.log(s) for s in speedups]
    if len(logs) == 1:
        return speedups[0], speedups[0]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(n_boot))
    tail = (1 - confidence) / 2
    lo = means[int(tail * (n_boot - 1))]
    hi = means[int(math.ceil((1 - tail) * (n_boot - 1)))]
    return math.exp(lo), math.exp(hi)


def paired_check(speedups: Sequence[float], *, required: float, thresholds: Mapping[str, Any] | None = None,
                 can_add_rounds: bool = False) -> PairedComparison:
    """Judge per-pair speedups against a required speedup factor (2.5 = 2.5x).

    ``pass`` when the interval's lower end reaches ``required``; ``fail`` when its upper end is
    below it, or when it straddles the line and no more rounds may be added; ``remeasure`` when it
    straddles and ``can_add_rounds``.
    """
    cfg = section(dict(thresholds) if thresholds is not None else None, "performance")
    conf = float(cfg.get("paired_confidence", 0.9))
    ratio = math.exp(statistics.fmean(math.log(s) for s in speedups))
    lo, hi = bootstrap_interval(speedups, confidence=conf)
    wins = sum(1 for s in speedups if s >= required)
    band = f"{ratio:.3f}x [{lo:.3f}, {hi:.3f}] ({conf:.0%}, {len(speedups)} pairs)"
    if lo >= required and wins == len(speedups):
        verdict, why = "pass", f"paired {band} reaches {required:.3f}x in every pair"
    elif hi < required or not can_add_rounds:
        verdict, why = "fail", f"paired {band} does not clear {required:.3f}x ({wins}/{len(speedups)} pairs reach it)"
    else:
        verdict, why = "remeasure", f"paired {band} straddles {required:.3f}x: more rounds"
    return PairedComparison(ratio, lo, hi, conf, required, tuple(speedups), wins, verdict, why)
