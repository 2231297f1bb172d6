"""Multi-fidelity screening: a candidate is benched short first, and in full only when promising.

With `bench.screen_fraction` f > 0, a search candidate's bench step starts with a short pass: each
goal scenario's first requests, about f of its measured requests (`short_scenario`). Its score against the
newest baseline goes to the proposer (`should_stop_early`: the search asks Optuna's pruner); a
candidate it calls unpromising ends `discarded` with the reason and the bench time saved, and is
never kept; the others are gated, then their full bench *continues* the short pass: each scenario's
remaining requests (the same seeded prompts and arrival schedule, no second warm-up), joined with
the short pass's into the one measurement a single full bench would have given
(`orchestrator.bench.passes`). A one-wave scenario is measured once, in the short pass. The short
pass so never costs a promising candidate extra, except on a scenario that cannot be continued
(the SLO rate search, `continues`): that one is re-run in full, and a screen whose re-run would be
most of the bench's time is not run (`MAX_REPEAT_SHARE`). A screened-out candidate is not gated
(`orchestrator.trial.run_trial`): it can never be kept.

A short pass also stops early where its outcome is already certain (`Screen.stop_below`): a
scenario's output throughput at its end is at most every request's max_tokens over the time elapsed,
so once the candidate's short score could not reach the bar even at that bound (the goal's other
objectives measured already, `out_of_reach`), its requests are cancelled on the host
(`Scenario.stop_below`, `orchestrator.bench.loadgen`) and the candidate is screened out as it would
have been at the end, its reason saying so. Only a proposer that names its bar (`stop_bar`, the
search's) gets it, only for a goal scenario whose objectives are all output throughput and the last
of its screen to be measured: a latency objective's speedup has no upper bound while unmeasured.

Full fidelity always: baselines and sentinels (everything is judged against them), paired rounds
(the claim), probes (evidence for the knowledge base) and retries (a re-judgement); a re-measure of
a borderline result runs the whole scenario again. The decision is recorded once, as a `screen`
event for every trial that had a short pass, and read back from the store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.bench.passes import rest_of
from orchestrator.goal import SLO_SCENARIO
from orchestrator.roles import BASELINES, NOT_SEARCH, RETRY
from orchestrator.trial import objective_label

__all__ = ["FULL_FIDELITY", "KNOWN_NOISE_STARTUP", "MAX_REPEAT_SHARE", "MIN_MARGIN", "SCREENED", "STOP_SLACK", "Z", "Screen",
           "STOPPED_EARLY", "continues", "is_screened", "is_stopped", "margin", "out_of_reach", "screen_for", "short_scenario"]

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
MAX_REPEAT_SHARE = 0.5
"""A short pass whose requests a promising candidate would measure again (the scenarios that cannot be
continued, `continues`) is not run when they would take more than this share of the full bench's time
(judged from the newest baseline's measured durations; by requests where none is stored): a candidate
the screen passes pays them on top of its full bench, one it screens out saves the rest, so with about
half of the candidates screened out (the replays) it pays off only below half. Continued scenarios cost
nothing extra: their short pass is the first part of the full bench. (It replaces MAX_SHORT_SHARE, a
rule on the whole short pass's request share from before the full bench continued the short pass,
which kept the H200 goal from being screened at all: docs/benchmarks.md, "Continued full bench".)"""


STOP_SLACK = 1e-9
"""A short pass is stopped only under its floor less this share: the score recomputed from the bound
(`verdict.score`'s logs and exp) must land under the bar, never on it by a rounding."""
THROUGHPUT = "output_throughput"


def out_of_reach(bar: float, name: str, objectives: Sequence[Any], baseline: dict[str, float],
                 measured: dict[str, list[float]]) -> float | None:
    """The output tok/s under which goal scenario `name`'s short pass scores under `bar` whatever else
    happens, or None where that cannot be proven.

    The score is the geometric mean of the objectives' speedups over `baseline` (`verdict.score`): with
    every objective outside `name` already `measured` (objective label -> values) and every objective on
    `name` its output throughput (speedup = throughput / the baseline's), the score is under `bar` exactly
    when throughput < exp((N log bar - sum of the measured log speedups + sum of the log baseline
    throughputs) / k), k of the N objectives on `name`. An objective not yet measured (a latency's
    speedup is unbounded), another metric on `name`, or the SLO rate search: None."""
    mine = [o for o in objectives if o.scenario == name]
    if not mine or name == SLO_SCENARIO or bar <= 0:
        return None
    if any(o.key != THROUGHPUT or o.info.direction != "maximize" for o in mine):
        return None
    logs = 0.0
    for o in objectives:
        label = objective_label(o.scenario, o.key)
        base = baseline.get(label, 0.0)
        if not base or base <= 0 or not math.isfinite(base):
            return None  # `speedup` is then 1.0 whatever the value: no bound from the throughput
        if o.scenario == name:
            logs -= math.log(base)
            continue
        values = measured.get(label)
        if not values:
            return None
        value = sum(values) / len(values)
        logs += math.log(o.speedup(value, base))
    return math.exp((len(objectives) * math.log(bar) - logs) / len(mine))


def continues(name: str) -> bool:
    """Whether goal scenario `name`'s full bench continues its short pass. Not the SLO scenario: its
    measurement is a request-rate search, every step a bench of its own, which has no "rest"."""
    return name != SLO_SCENARIO


def margin(noise: float, fraction: float) -> float:
    """The short bench's noise margin: Z x the baseline's relative noise scaled to the short bench's
    requests (noise of a mean ~ 1/sqrt(requests)), at least MIN_MARGIN."""
    return max(MIN_MARGIN, Z * noise / math.sqrt(fraction))


STOPPED_EARLY = "stopped early after"
"""How a screened trial's reason says its short pass was stopped early (`is_stopped`)."""


def is_stopped(trial: Any) -> bool:
    """Whether `trial` was screened out on a short pass stopped early: its score is then a bound (the
    short score was at most that), not a measurement, and readers that learn from scores (the
    knowledge base's observations and effects) leave it out."""
    return is_screened(trial) and STOPPED_EARLY in (trial.error or "")


def is_screened(trial: Any) -> bool:
    """Whether `trial` (a TrialRecord) ended on its short bench."""
    return trial.status == "discarded" and (trial.error or "").startswith(SCREENED)


def short_scenario(scenario: Any, fraction: float, *, continued: bool = True) -> Any:
    """`scenario`'s short pass: about `fraction` of its measured requests, rounded up to whole waves
    of its concurrency (a batch-filling server is measured with full batches, as in the full bench),
    never more than the scenario has; warm-up as in the scenario.

    Continued (the default): its first requests (`Scenario.part` (0, k): the scenario's own prompts
    and schedule), which the full bench does not send again. Not continued: the full bench re-sends
    the scenario's own prompts, so these come from another seed (a prefix cache must not get them
    served once already: a head start no baseline had)."""
    wave = max(int(scenario.concurrency), 1)
    n = min(int(scenario.num_requests), max(wave, math.ceil(fraction * scenario.num_requests / wave) * wave))
    if continued:
        return scenario.model_copy(update={"name": f"{scenario.name}@{fraction:g}", "part": (0, n)})
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
    bar: float | None = None
    """The score under which the proposer screens a candidate out (its `stop_bar`), None if it names none."""
    objectives: tuple[Any, ...] = ()
    baseline: dict[str, float] | None = None
    """Objective label -> the newest baseline's value: what the short score is against."""

    def stop_below(self, name: str, measured: dict[str, list[float]]) -> float | None:
        """The output tok/s under which goal scenario `name`'s short pass is stopped early (`Scenario.stop_below`):
        the floor `out_of_reach` proves, less STOP_SLACK, given the objectives `measured` so far; None: run to the end."""
        if self.bar is None or self.baseline is None:
            return None
        floor = out_of_reach(self.bar, name, self.objectives, self.baseline, measured)
        return None if floor is None else floor * (1 - STOP_SLACK)

    def full(self, name: str, scenario: Any) -> Any:
        """Goal scenario `name`'s full bench after a passed screen: its requests after the short pass's
        (`Scenario.part`, no warm-up; joined with the short pass's by the bench step), or, where it
        cannot be continued, the whole scenario again with the short pass as its warm-up."""
        short = self.scenarios[name]
        if short.part is not None:
            return rest_of(scenario, short.part[1])
        return scenario.model_copy(update={"warmup_requests": 0})


def screen_for(
    *, fraction: float, trial: Any, proposer: Any, history: Sequence[Any], scenarios: dict[str, Any],
    goal_scenarios: Sequence[str], score: Callable[[Any], float], noise: float, store: Any, run_id: int,
    durations: dict[str, float] | None = None, objectives: Sequence[Any] = (), baseline: dict[str, float] | None = None,
) -> Screen | None:
    """The screen for `trial`, or None when it is measured at full fidelity only.

    `history`: the run's trials; `score(result)`: the short pass's score against the newest
    baseline (the keep rule's score, `verdict.score`); `noise`: that baseline's relative noise;
    `durations`: goal scenario -> the newest baseline's measured seconds (None: unknown). The
    proposer's `should_stop_early(history, value, margin, startup=KNOWN_NOISE_STARTUP)` decides (the
    noise is known: measured, or assumed and said); a proposer without it never stops a candidate early.
    A short pass whose non-continued part would be more than MAX_REPEAT_SHARE of the full bench's time
    is not run: a `screen` event with `skipped` says why, and the candidate is measured in full only.
    `objectives` and `baseline` (objective label -> the newest baseline's value), with a proposer that
    names its bar (`stop_bar`), let a short pass stop as soon as it is certain to be screened out
    (`Screen.stop_below`); without them it always runs to its end."""
    if fraction <= 0 or trial.proposer in FULL_FIDELITY or trial.number == 0:
        return None
    ask = getattr(proposer, "should_stop_early", None)
    if ask is None:
        return None
    short = {name: short_scenario(scenarios[name], fraction, continued=continues(name)) for name in goal_scenarios}
    # What the keep rule judges against: the search's trials and retries (not sentinels, paired rounds, probes).
    seen = [t for t in history if t.proposer not in NOT_SEARCH and t.id != trial.id]
    full_n = sum(scenarios[n].num_requests for n in goal_scenarios)
    short_n = sum(short[n].measured_requests for n in goal_scenarios)
    repeated = [n for n in goal_scenarios if short[n].part is None]  # measured again in full if it passes
    # The bench's requests a passed candidate still runs after the short pass.
    rest_n = sum(scenarios[n].num_requests - (short[n].measured_requests if n not in repeated else 0) for n in goal_scenarios)
    base = {"fraction": fraction, "short_requests": short_n, "full_requests": full_n, "rest_requests": rest_n,
            "continued": [n for n in goal_scenarios if n not in repeated]}
    if repeated:
        known = durations is not None and all((durations.get(n) or 0) > 0 for n in goal_scenarios)
        weight = {n: (durations[n] if known else scenarios[n].num_requests) for n in goal_scenarios}  # type: ignore[index]
        share = sum(weight[n] * short[n].measured_requests / scenarios[n].num_requests for n in repeated) / sum(weight.values())
        if share > MAX_REPEAT_SHARE:
            why = (f"{', '.join(repeated)} cannot be continued: a promising candidate would measure its short "
                   f"pass again, {share:.0%} of the full bench's {'time' if known else 'requests'} "
                   f"(> {MAX_REPEAT_SHARE:.0%}): no saving worth its cost")
            store.add_event(run_id, "screen", f"#{trial.number} not screened: {why}; measured in full",
                            data={**base, "skipped": True, "screened_out": False, "reason": why, "repeat_share": round(share, 3),
                                  "saved_bench_s": 0.0}, trial_id=trial.id)
            return None
    share = short_n / full_n  # the fraction the short pass really runs (whole waves)
    m = margin(noise, share)

    stop_bar = getattr(proposer, "stop_bar", None)
    bar = stop_bar(seen, m, startup=KNOWN_NOISE_STARTUP) if stop_bar is not None and baseline is not None else None

    def judge(result: Any, bench_s: float) -> str | None:
        value = score(result)
        why = ask(seen, value, m, startup=KNOWN_NOISE_STARTUP)
        stopped = {n: x for n, x in (getattr(result, "metrics", None) or {}).items() if x.get("stopped_early")}
        if stopped and not why:  # out_of_reach proved the score under the bar: the proposer disagrees
            raise RuntimeError(f"the short pass of {', '.join(stopped)} was stopped early as out of reach of the bar "
                               f"{bar}, yet its bound {value:.6f}x passed the screen: not judged")
        # The bench time not spent: the rest of the full bench at the short pass's pace (its warm-up,
        # paid either way, counted with the short pass). Not counted: the gates, also not run.
        saved = bench_s * rest_n / (short_n + sum(short[n].warmup_requests for n in goal_scenarios)) if why else 0.0
        # A stopped scenario's own rest: the tokens still to come at the pace they came (an estimate).
        cut = {n: x["duration_s"] * (x["output_tokens_possible"] / x["output_tokens_seen"] - 1)
               if x.get("output_tokens_seen", 0) > 0 else 0.0 for n, x in stopped.items()}
        saved += sum(cut.values())
        data = {**base, "score": value, "margin": m, "screened_out": bool(why), "reason": why,
                "short_bench_s": round(bench_s, 3), "saved_bench_s": round(saved, 3), "bar": bar,
                **({"stopped_early": {n: {"after_s": round(x["duration_s"], 3), "floor_tok_s": x["stop_below"],
                                          "bound_tok_s": x[THROUGHPUT], "saved_s": round(cut[n], 3)}
                                      for n, x in stopped.items()}} if stopped else {})}
        if why:
            said = "".join(f"; {n} {STOPPED_EARLY} {x['duration_s']:.3g} s: its output throughput could no longer "
                           f"reach the {x['stop_below']:.1f} tok/s the bar needs (at most {x[THROUGHPUT]:.1f})"
                           for n, x in stopped.items())
            why = (f"{SCREENED} {fraction:.0%} fidelity: short-bench score {'at most ' if stopped else ''}{value:.3f}x "
                   f"vs {why}{said}; ~{saved:.1f} s of bench saved")
        store.add_event(run_id, "screen", why or f"#{trial.number} passed its {fraction:.0%} screen ({value:.3f}x): "
                        f"measured in full ({rest_n} more requests)", data=data, trial_id=trial.id)
        return why

    return Screen(fraction=fraction, scenarios=short, judge=judge, bar=bar, objectives=tuple(objectives), baseline=baseline)
