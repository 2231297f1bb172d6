"""Why a trial was kept or discarded, in one sentence (stored as a `trial.why` event)."""

from __future__ import annotations

from typing import Any

from orchestrator.paired import describe

__all__ = ["why_data", "why_of"]


def why_data(*, number: int, status: str, proposer: str, score: float | None, best: float, min_gain: float,
             noise: float, baseline_trial: int | None, gates: list[Any], error: str | None,
             paired: dict[str, Any] | None = None, screen_met: bool = False) -> dict[str, Any]:
    """The facts behind a verdict, and the sentence that says them."""
    need = max(min_gain, noise)
    threshold = best * (1 + need)
    set_by = f"baseline noise {noise:.1%}" if noise > min_gain else f"min_gain {min_gain:.0%} (noise {noise:.1%})"
    verdicts = ", ".join(f"{g.gate} {g.status}" for g in gates) or "none"
    vs = f"against baseline #{baseline_trial}" if baseline_trial is not None else ""
    if error:
        head = f"#{number} {status}: {error[:160]}"
    elif proposer in ("baseline", "sentinel"):
        head = f"#{number} {status}: a baseline measurement ({proposer}); candidates after it are judged against it"
    elif status == "kept":
        how = (f"cleared {threshold:.3f}x" if (score or 0) > threshold else f"is under {threshold:.3f}x")
        head = (f"#{number} kept: score {score:.3f}x {vs} {how} (best {best:.3f}x + {need:.1%}, set by {set_by})"
                + ("; the performance screen says it may meet the goal" if screen_met else ""))
    elif status == "discarded":
        head = (f"#{number} discarded: score {score:.3f}x {vs} did not clear {threshold:.3f}x "
                f"(best {best:.3f}x + {need:.1%}, set by {set_by}) and missed the goal")
    else:
        head = f"#{number} {status}: score {score if score is None else f'{score:.3f}x'} {vs}"
    sentence = f"{head}; gates: {verdicts}"
    if paired:
        sentence += f"; paired A/B: {describe(paired)}, goal {'met' if paired['met'] else 'not met'}"
    return {"score": score, "best": best, "threshold": threshold, "needed_gain": need, "noise": noise,
            "min_gain": min_gain, "baseline_trial": baseline_trial, "screen_met": screen_met,
            "gates": {g.gate: g.status for g in gates}, "paired": paired, "sentence": sentence}


def why_of(store: Any, run_id: int, trial_id: int) -> str | None:
    """The stored sentence for a trial (the newest one, if it was re-judged)."""
    found = [e for e in store.events(run_id, kind="trial.why") if e.trial_id == trial_id]
    return (found[-1].data or {}).get("sentence") if found else None
