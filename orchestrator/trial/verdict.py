"""Judging one trial against a baseline: the score, the performance gate, the keep line, and why.

Plain functions of what they need (the measured samples, the baseline, the goal's objectives,
the best score so far): the controller calls them and records what they say; this module
decides nothing on its own and writes nothing but the stored `trial.why` it is asked for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gates import GateResult, performance, plausible
from gates.thresholds import section
from orchestrator.config.goal import SLO_SCENARIO
from orchestrator.core.roles import BASELINES
from orchestrator.trial.context import TrialResult, objective_label
from orchestrator.trial.paired import describe

__all__ = [
    "ASSUMED_NOISE", "NOISE_HIGH", "noise_warning", "Baseline", "baseline_noise", "borderline", "needed_gain", "no_target", "noise_of", "noise_words", "perf_gate", "score",
    "speed_of_light", "speed_of_light_limits", "speedup_caps", "why_data", "why_of", "why_record",
]

ASSUMED_NOISE = 0.05
"""The noise assumed while a baseline's spread is unknown (measured once, no sentinel yet): never 0,
which would let any win count. The same default knobs on an H200 measured 31.96 / 26.33 / 23.50 /
27.20 ms TPOT across four baseline measurements (31% spread), so 0 was never true; 5% sits above
the default min_gain (3%). The keep line says it was assumed; the first sentinel replaces it."""


@dataclass
class Baseline:
    samples: dict[str, list[float]]
    """objective label -> the baseline's repeated measurements."""
    values: dict[str, float]
    """objective label -> mean baseline value."""
    noise: float
    """Largest relative spread between the baseline's measurements (`baseline_noise`)."""
    trial: int = 0
    """Number of the baseline (or sentinel) trial these values come from."""
    host: dict[str, Any] | None = None
    """The host's state while it was measured (others' CPU share, GPU clocks)."""
    noise_basis: str = ""
    """How `noise` is known: "" (the newest baseline's repeats), "across N baseline measurements"
    (the baseline and its sentinels, each measured once), or "assumed" (`ASSUMED_NOISE`)."""


def noise_of(samples: dict[str, list[float]]) -> float:
    """Largest relative spread between a baseline's repeats, over its objectives (0.0 with one repeat)."""
    return max(((max(v) - min(v)) / (sum(v) / len(v)) for v in samples.values() if len(v) > 1), default=0.0)


def baseline_noise(newest: dict[str, list[float]], measured: Sequence[dict[str, list[float]]]) -> tuple[float, str]:
    """(noise, how it is known) of a baseline: `Baseline.noise` and `Baseline.noise_basis`.

    `newest`: objective label -> the newest baseline measurement's repeats; `measured`: the same for
    every good baseline measurement of the run (trial #0 and its sentinels). The newest's repeats
    give the noise when there are several; a baseline measured once takes the spread of the
    same default knobs across all of the run's baseline measurements; with only one of those,
    `ASSUMED_NOISE`, said as assumed."""
    if any(len(v) > 1 for v in newest.values()):
        return noise_of(newest), ""
    pooled: dict[str, list[float]] = {}
    for samples in measured:
        for label, values in samples.items():
            pooled.setdefault(label, []).extend(values)
    n = max((len(v) for v in pooled.values()), default=0)
    if n > 1:
        return noise_of(pooled), f"across {n} baseline measurements"
    return ASSUMED_NOISE, "assumed"


NOISE_HIGH = "noise.high"
"""The event kind that says a run's baseline is noisier than the change its goal asks for."""


def noise_warning(noise: float, step: float) -> str | None:
    """What to say when the baseline's spread between repeats (`noise`) is larger than the smallest change
    the goal asks a measurement to resolve (`step`, 0.5 for "by 1.5x"); None when it is not. Every keep
    line then sits at least `noise` above the best, and a screen that says "met" is luck more often
    than not: the run says so when its baseline is measured, and again in its stop reason."""
    if noise <= step:
        return None
    return (f"the baseline's noise {noise:.1%} is larger than the {step:.1%} change the goal asks for, so this run's "
            "verdicts are unreliable: raise bench.baseline_repeats and bench.repeats, pin the server to cores "
            "(target prefix = \"taskset -c 0-3\"), or measure on a quieter host")


def noise_words(noise: float, basis: str = "") -> str:
    """How the keep line names the noise: `noise 2.0%`, `noise 31.0% across 4 baseline measurements`,
    `noise assumed 5.0% (one baseline measurement)`."""
    if basis == "assumed":
        return f"noise assumed {noise:.1%} (one baseline measurement)"
    return f"noise {noise:.1%}" + (f" {basis}" if basis else "")


def score(r: TrialResult, baseline: Baseline, objectives: Sequence[Any]) -> float:
    """Geometric mean of per-objective speedups over the baseline (>1 is better)."""
    speedups = [
        o.speedup(r.mean(objective_label(o.scenario, o.key)), baseline.values[objective_label(o.scenario, o.key)])
        for o in objectives
    ]
    return math.exp(sum(math.log(s) for s in speedups) / len(speedups))


def perf_gate(r: TrialResult, baseline: Baseline, objectives: Sequence[Any]) -> Any:
    """The performance gate on the goal's objectives: noise-aware pass / fail / remeasure.

    Relative objectives go through `gates.performance` (improvement beyond k standard errors
    of the change); absolute ones compare the candidate's mean with the threshold.
    """
    if (untargeted := no_target(objectives)) is not None:
        return untargeted
    rel = [o for o in objectives if o.kind == "relative"]
    absolute = [o for o in objectives if o.kind == "absolute"]
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


def speed_of_light(store: Any, run_id: int, r: TrialResult, baseline: Baseline | None, model_dir: Path,
                   scenarios: dict[str, Any]) -> GateResult | None:
    """The trial's measurements against the run's recorded floors (`gates.plausible`), or None when the
    run has no floors for this model shape (nothing is checked, nothing said). The margin's noise is
    the baseline's spread; for a baseline itself, its own repeats' (assumed when measured once)."""
    if not r.metrics:
        return None
    lims = speed_of_light_limits(store, run_id, model_dir, scenarios)
    return plausible.check(r.metrics, lims, noise=baseline.noise if baseline else baseline_noise(r.samples, [r.samples])[0]) if lims else None


def speed_of_light_limits(store: Any, run_id: int, model_dir: Path, scenarios: dict[str, Any]) -> dict[str, dict[str, tuple[float, bool]]]:
    """The run's recorded floors recomputed for its model and scenarios (`gates.plausible.limits`), as
    `speed_of_light` checks a trial against them; {} where the run has none for this model shape."""
    found = store.events(run_id, kind="speed_of_light")
    if not found:
        return {}
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return plausible.limits(found[-1].data, cfg, scenarios)


def speedup_caps(store: Any, run_id: int, baseline: Baseline, model_dir: Path, scenarios: dict[str, Any],
                 objectives: Sequence[Any]) -> dict[str, tuple[float, float]]:
    """Objective label -> (the most speedup over `baseline` it can show, the value at it), where the run's
    floors bound it: the speed-of-light gate (`speed_of_light`, `gates.plausible.check`) calls a trial
    invalid once a latency is under floor / (1 + margin) or an output throughput over ceiling x (1 + margin),
    margin = the baseline's noise + the locked `[speed_of_light] slack`, so no trial that can be kept shows
    more. {} without floors (nothing bounds an objective not measured yet: a screen then stops only a
    scenario whose other objectives are measured)."""
    lims = speed_of_light_limits(store, run_id, model_dir, scenarios)
    if not lims:
        return {}
    margin = max(0.0, baseline.noise) + float(section(None, "speed_of_light")["slack"])  # as `plausible.check`
    out: dict[str, tuple[float, float]] = {}
    for o in objectives:
        if o.scenario == SLO_SCENARIO:  # a rate search's step metrics: never capped (its short pass is never stopped)
            continue
        label = objective_label(o.scenario, o.key)
        lim, base = lims.get(o.scenario, {}).get(o.key), baseline.values.get(label)
        if lim is None or not base or base <= 0 or not math.isfinite(base):
            continue
        floor, higher = lim
        if floor <= 0 or not math.isfinite(floor) or higher != (o.info.direction == "maximize"):
            continue
        value = floor * (1 + margin) if higher else floor / (1 + margin)
        out[label] = (o.speedup(value, base), value)
    return out


def no_target(objectives: Sequence[Any]) -> Any:
    """An SLO goal's objective (`kind="best"`: the highest rate under the limits) has no target to meet:
    the screen never says "met", so a candidate is kept on its score (the paired ratio of rates) alone and
    the run goes on to its budget. None for goals with targets."""
    best = [o.describe() for o in objectives if o.kind == "best"]
    if not best:
        return None
    return GateResult("performance", "fail", "no target to meet (" + "; ".join(best) + "): scored, never met", {}, 0.0)


def needed_gain(min_gain: float, baseline: Baseline) -> float:
    """Noise-aware: a win smaller than the baseline's own spread between repeats is not a win."""
    return max(min_gain, baseline.noise)


def borderline(r: TrialResult, baseline: Baseline, objectives: Sequence[Any], *, best: float, min_gain: float) -> bool:
    """Re-measure when the performance gate asks for it, or the score sits in the noise band of the keep line."""
    if not r.samples or any(not v for v in r.samples.values()):
        return False
    if perf_gate(r, baseline, objectives).status == "remeasure":
        return True
    threshold = best * (1 + needed_gain(min_gain, baseline))
    return abs(score(r, baseline, objectives) / threshold - 1) < max(baseline.noise, 0.01)


def why_data(*, number: int, status: str, proposer: str, score: float | None, best: float, min_gain: float,
             noise: float, baseline_trial: int | None, gates: list[Any], error: str | None,
             paired: dict[str, Any] | None = None, screen_met: bool = False, noise_basis: str = "",
             region: Any = None, goal: dict[str, Any] | None = None) -> dict[str, Any]:
    """The facts behind a verdict, and the sentence that says them (stored as a `trial.why` event).

    `noise_basis`: how the noise is known (`Baseline.noise_basis`); an assumed one is said so.
    `region`: the failed region the trial marked (`targets.regions.FailedRegion`), if it marked one.
    `goal`: its screening speedups against the goal's bars (`trial.goalbars`: ratios, margin, clears, words)."""
    need = max(min_gain, noise)
    threshold = best * (1 + need)
    said = noise_words(noise, noise_basis)
    set_by = f"baseline {said}" if noise > min_gain else f"min_gain {min_gain:.0%} ({said})"
    verdicts = ", ".join(f"{g.gate} {g.status}" for g in gates) or "none"
    vs = f"against baseline #{baseline_trial}" if baseline_trial is not None else ""
    if error:
        head = f"#{number} {status}: {error[:160]}"
    elif proposer in BASELINES:
        said_status = "measured" if status == "kept" else status  # a measurement is never "kept"
        head = f"#{number} {said_status}: a baseline measurement ({proposer}); candidates after it are judged against it"
    elif status == "kept" and (score or 0) > threshold:
        head = (f"#{number} kept: score {score:.3f}x {vs} cleared the keep line {threshold:.3f}x (best {best:.3f}x + {need:.1%}, "
                f"set by {set_by})" + ("; the performance screen says it may meet the goal" if screen_met else ""))
    elif status == "kept":  # under its keep line: only a paired A/B that meets the goal keeps it
        head = (f"#{number} kept: its paired A/B meets the goal, though its score {score:.3f}x {vs} is under the keep line "
                f"{threshold:.3f}x (best {best:.3f}x + {need:.1%}, set by {set_by})"
                + ("; the performance screen said it may meet the goal" if screen_met else ""))
    elif status == "discarded":
        head = (f"#{number} discarded: score {score:.3f}x {vs} did not clear the keep line {threshold:.3f}x "
                f"(best {best:.3f}x + {need:.1%}, set by {set_by})"
                + ("; the performance screen says it may meet the goal, so a paired A/B decides" if screen_met
                   else " and missed the goal"))
    else:
        head = f"#{number} {status}: score {score if score is None else f'{score:.3f}x'} {vs}"
    sentence = f"{head}; gates: {verdicts}"
    if goal and goal.get("words") and proposer not in BASELINES:
        sentence += f"; goal bars: {goal['words']}: " + (
            ("clears every bar" + (", so a paired A/B decides" if screen_met else "")) if goal.get("clears")
            else "misses a bar, so its screen sends it to no paired A/B")
    if paired:
        sentence += f"; paired A/B: {describe(paired)}, goal {'met' if paired['met'] else 'not met'}"
    if region is not None:
        sentence += f"; marked the failed region ({region.describe()}): the search will not propose it again"
    return {"score": score, "best": best, "threshold": threshold, "needed_gain": need, "noise": noise,
            "min_gain": min_gain, "noise_basis": noise_basis, "baseline_trial": baseline_trial, "screen_met": screen_met,
            "gates": {g.gate: g.status for g in gates}, "paired": paired, "sentence": sentence,
            **({"goal": goal} if goal else {}),
            **({"region": region.to_dict()} if region is not None else {})}


def why_record(store: Any, run_id: int, trial_id: int) -> dict[str, Any]:
    """The stored facts behind a trial's verdict (the newest, if it was re-judged); {} when none."""
    found = store.events(run_id, kind="trial.why", trial_id=trial_id)
    return dict(found[-1].data or {}) if found else {}


def why_of(store: Any, run_id: int, trial_id: int) -> str | None:
    """The stored sentence for a trial (the newest one, if it was re-judged)."""
    return why_record(store, run_id, trial_id).get("sentence")
