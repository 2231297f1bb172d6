"""Multi-fidelity screening: a candidate is benched short first, and in full only when promising.

With `bench.screen_fraction` f > 0, a search candidate's bench step starts with a short pass: each
goal scenario with about f of its measured requests (`short_scenario`). Its score against the
newest baseline goes to the proposer (`should_stop_early`: the search asks Optuna's pruner); a
candidate it calls unpromising ends `discarded` with the reason and the bench time saved, and is
never kept; the others are gated, then get the full bench, unchanged, with the short pass as its
warm-up. A screened-out candidate is not gated (`orchestrator.trial.run_trial`): it can never be kept.

Full fidelity always: baselines and sentinels (everything is judged against them), paired rounds
(the claim), probes (evidence for the knowledge base) and retries (a re-judgement). The decision
is recorded once, as a `screen` event for every trial that had a short pass, and read back from the store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.roles import BASELINES, NOT_SEARCH, RETRY

__all__ = ["FULL_FIDELITY", "KNOWN_NOISE_STARTUP", "MAX_SHORT_SHARE", "MIN_MARGIN", "SCREENED", "Z", "Screen", "is_screened",
           "margin", "screen_for", "short_scenario"]

SCREENED = "screened out at"
"""How a screened trial's reason starts (`trials.error`): readers that must tell it apart ask `is_screened`."""
FULL_FIDELITY = (*BASELINES, *NOT_SEARCH, RETRY)
"""Roles never screened: baselines, sentinels, paired rounds, probes, retries."""


MIN_MARGIN = 0.10
"""The least noise margin a short bench gets: a baseline measured twice can show almost no spread."""
Z = 2.0
"""Standard deviations of the short bench's noise a candidate may fall below the best and still be measured in full."""
KNOWN_NOISE_STARTUP = 0
"""Full measurements (the baseline counted) the pruner waits for when the screen states the short bench's
noise (the baseline's, measured or assumed: `verdict.baseline_noise`): none. The bar is then the best kept
score (the baseline's 1.0 until a candidate beats it) less that noise margin, and a short score under it is
slower than the default knobs beyond the noise: the keep rule would discard it anyway. The proposer's own
start-up (`SCREEN_STARTUP`, 4) is for a caller that does not know the noise. On the H200 a run holds 4-5
search trials, so a start-up of 4 screened nothing (docs/benchmarks.md, "Multi-fidelity screening (replay)")."""
MAX_SHORT_SHARE = 0.5
"""A short pass that would run more than this share of the full bench's measured requests is not run: a
candidate it passes pays it on top of its full bench, one it screens out saves only the rest, so with about
half of the candidates screened out (the replays) it pays off only below half. A scenario of one wave (the
H200 goal's burst of 16 requests at concurrency 16) cannot be shortened at all: whole waves keep a batching
server's batches full, and fewer requests in the wave would measure another load."""


def margin(noise: float, fraction: float) -> float:
    """The short bench's noise margin: Z x the baseline's relative noise scaled to the short bench's
    requests (noise of a mean ~ 1/sqrt(requests)), at least MIN_MARGIN."""
    return max(MIN_MARGIN, Z * noise / math.sqrt(fraction))


def is_screened(trial: Any) -> bool:
    """Whether `trial` (a TrialRecord) ended on its short bench."""
    return trial.status == "discarded" and (trial.error or "").startswith(SCREENED)


def short_scenario(scenario: Any, fraction: float) -> Any:
    """`scenario` with about `fraction` of its measured requests, rounded up to whole waves of its
    concurrency (a batch-filling server is measured with full batches, as in the full bench), never
    more than the scenario has; warm-up as in the scenario.

    The prompts come from another seed: the full bench that may follow re-sends the scenario's own
    prompts, and a prefix cache must not get them served once already (a head start no baseline had)."""
    wave = max(int(scenario.concurrency), 1)
    n = min(int(scenario.num_requests), max(wave, math.ceil(fraction * scenario.num_requests / wave) * wave))
    return scenario.model_copy(update={"name": f"{scenario.name}@{fraction:g}", "num_requests": n,
                                       "seed": int(scenario.seed) + 7919})


@dataclass(frozen=True)
class Screen:
    """One candidate's screen: the short scenarios, and `judge(short result) -> reason to stop, or None`."""

    fraction: float
    scenarios: dict[str, Any]
    """Goal scenario name -> its short version."""
    judge: Callable[[Any, float], str | None]
    """(the short pass's TrialResult, its bench seconds) -> why the candidate ends here, or None for the full bench."""

    def full(self, scenario: Any) -> Any:
        """The full bench after a passed screen: unchanged, except that the short pass was its warm-up."""
        return scenario.model_copy(update={"warmup_requests": 0})


def screen_for(
    *, fraction: float, trial: Any, proposer: Any, history: Sequence[Any], scenarios: dict[str, Any],
    goal_scenarios: Sequence[str], score: Callable[[Any], float], noise: float, store: Any, run_id: int,
) -> Screen | None:
    """The screen for `trial`, or None when it is measured at full fidelity only.

    `history`: the run's trials; `score(result)`: the short pass's score against the newest
    baseline (the keep rule's score, `verdict.score`); `noise`: that baseline's relative noise. The
    proposer's `should_stop_early(history, value, margin, startup=KNOWN_NOISE_STARTUP)` decides (the
    noise is known: measured, or assumed and said); a proposer without it never stops a candidate early.
    A short pass that cannot save (more than MAX_SHORT_SHARE of the full bench's requests) is not run:
    a `screen` event with `skipped` says why, and the candidate is measured in full only."""
    if fraction <= 0 or trial.proposer in FULL_FIDELITY or trial.number == 0:
        return None
    ask = getattr(proposer, "should_stop_early", None)
    if ask is None:
        return None
    short = {name: short_scenario(scenarios[name], fraction) for name in goal_scenarios}
    # What the keep rule judges against: the search's trials and retries (not sentinels, paired rounds, probes).
    seen = [t for t in history if t.proposer not in NOT_SEARCH and t.id != trial.id]
    full_n = sum(scenarios[n].num_requests for n in goal_scenarios)
    short_n = sum(short[n].num_requests for n in goal_scenarios)
    share = short_n / full_n  # the fraction the short pass really runs (whole waves)
    if share > MAX_SHORT_SHARE:
        whole = [n for n in goal_scenarios if short[n].num_requests >= scenarios[n].num_requests]
        why = (f"the short pass would run {short_n} of the full bench's {full_n} requests ({share:.0%} > "
               f"{MAX_SHORT_SHARE:.0%})" + (f"; {', '.join(whole)} cannot be shorter than one wave of its concurrency"
                                            if whole else "") + ": no saving worth its cost")
        store.add_event(run_id, "screen", f"#{trial.number} not screened: {why}; measured in full",
                        data={"fraction": fraction, "skipped": True, "screened_out": False, "reason": why,
                              "short_requests": short_n, "full_requests": full_n, "saved_bench_s": 0.0},
                        trial_id=trial.id)
        return None
    m = margin(noise, share)

    def judge(result: Any, bench_s: float) -> str | None:
        value = score(result)
        why = ask(seen, value, m, startup=KNOWN_NOISE_STARTUP)
        # The bench time not spent: the full bench's requests at the short pass's pace (its
        # warm-up, paid either way, counted with the short pass).
        saved = bench_s * full_n / (short_n + sum(short[n].warmup_requests for n in goal_scenarios)) if why else 0.0
        data = {"fraction": fraction, "score": value, "margin": m, "screened_out": bool(why), "reason": why,
                "short_bench_s": round(bench_s, 3), "saved_bench_s": round(saved, 3)}
        if why:
            why = f"{SCREENED} {fraction:.0%} fidelity: short-bench score {value:.3f}x vs {why}; ~{saved:.1f} s of bench saved"
        store.add_event(run_id, "screen", why or f"#{trial.number} passed its {fraction:.0%} screen ({value:.3f}x): "
                        "measured in full", data=data, trial_id=trial.id)
        return why

    return Screen(fraction=fraction, scenarios=short, judge=judge)
