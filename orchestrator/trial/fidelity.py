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
(`orchestrator.trial.run.run_trial`): it can never be kept.

A short pass also stops early where its outcome is already certain (`Screen.plan`): the score is the
geometric mean of the objectives' speedups, and while a scenario runs each of its metrics is bounded
(`orchestrator.bench.bounds`: its output throughput at most every request's max_tokens over the time
elapsed; a TTFT, TPOT or E2E mean or median at least that of what each request already took, TPOT only
with pinned lengths). Once the candidate's short score could not reach the bar even at those bounds,
with every objective outside the scenario measured already or capped (`out_of_reach`), its requests
are cancelled on the host (`Scenario.stop`, `orchestrator.bench.loadgen`) and the candidate is screened
out as it would have been at the end, its reason saying which bound. The caps come from the run's
speed-of-light floors (`verdict.speedup_caps`): an objective not measured yet shows no more speedup than
the plausibility gate accepts, so a trial past them would be invalid, never kept. Without floors an
objective not measured yet is unbounded (a latency's speedup has no upper bound) and only the short
pass's last scenarios can be stopped. With caps the short pass measures the least bounded scenario
first (`short_order`: on the H200 the throughput burst, capped ~144x, before the decode, TPOT capped
~13x), and once a scenario was stopped, or even its caps leave the score under the bar, the short
pass's other scenarios are not run (`NOT_RUN`): their objectives count at their caps. Only a proposer
that names its bar (`stop_bar`, the search's) gets any of this; the SLO rate search is never stopped.

Full fidelity always: baselines and sentinels (everything is judged against them), paired rounds
(the claim), probes (evidence for the knowledge base) and retries (a re-judgement); a re-measure of
a borderline result runs the whole scenario again. The decision is recorded once, as a `screen`
event for every trial that had a short pass, and read back from the store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.bench import bounds
from orchestrator.bench.passes import rest_of
from orchestrator.bench.scenarios import StopRule
from orchestrator.config.goal import SLO_SCENARIO
from orchestrator.core.roles import BASELINES, NOT_SEARCH, RETRY
from orchestrator.trial.context import objective_label

__all__ = ["FULL_FIDELITY", "KNOWN_NOISE_STARTUP", "MAX_REPEAT_SHARE", "MIN_MARGIN", "NOT_RUN", "SCREENED", "STOP_SLACK", "Z",
           "Screen", "STOPPED_EARLY", "continues", "is_screened", "is_stopped", "margin", "out_of_reach", "screen_for",
           "short_order", "short_scenario", "throughput_floor"]

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
search trials, so a start-up of 4 screened nothing (docs/results.md)."""
MAX_REPEAT_SHARE = 0.5
"""A short pass whose requests a promising candidate would measure again (the scenarios that cannot be
continued, `continues`) is not run when they would take more than this share of the full bench's time
(judged from the newest baseline's measured durations; by requests where none is stored): a candidate
the screen passes pays them on top of its full bench, one it screens out saves the rest, so with about
half of the candidates screened out (the replays) it pays off only below half. Continued scenarios cost
nothing extra: their short pass is the first part of the full bench. (It replaces MAX_SHORT_SHARE, a
rule on the whole short pass's request share from before the full bench continued the short pass,
which kept the H200 goal from being screened at all: docs/results.md.)"""


STOP_SLACK = 1e-9
"""A short pass is stopped only under its rule less this share: the score recomputed from the bound
(`verdict.score`'s logs and exp) must land under the bar, never on it by a rounding."""
THROUGHPUT = bounds.THROUGHPUT


def out_of_reach(bar: float, name: str, objectives: Sequence[Any], baseline: dict[str, float],
                 measured: dict[str, list[float]], caps: dict[str, tuple[float, float]] | None = None) -> float | None:
    """The product of goal scenario `name`'s objectives' speedups under which its short pass scores under `bar`
    whatever else happens, or None where that cannot be proven.

    The score is the geometric mean of the N objectives' speedups over `baseline` (`verdict.score`): under
    `bar` exactly when the product of all N is under bar^N, so `name`'s objectives' product must reach bar^N
    over the others'. Every other objective is `measured` (objective label -> values: their mean's speedup,
    as the score takes it) or capped (`caps`: label -> (the most speedup it can show, the value at it),
    `verdict.speedup_caps`: the run's speed-of-light floors); one that is neither (a latency's speedup is
    unbounded while unmeasured) gives None, as do the SLO rate search and a baseline value that is not
    positive (its speedup is then 1 whatever the value)."""
    mine = [o for o in objectives if o.scenario == name]
    if not mine or name == SLO_SCENARIO or bar <= 0:
        return None
    logs = 0.0
    for o in objectives:
        label = objective_label(o.scenario, o.key)
        base = baseline.get(label, 0.0)
        if not base or base <= 0 or not math.isfinite(base):
            return None
        if o.scenario == name:
            continue
        values = measured.get(label)
        if values:
            logs += math.log(o.speedup(sum(values) / len(values), base))
        elif caps and label in caps:
            logs += math.log(caps[label][0])
        else:
            return None
    return math.exp(len(objectives) * math.log(bar) - logs)


def throughput_floor(rule: Any) -> float | None:
    """The output tok/s under which a rule on output throughput alone (`Scenario.stop`) stops its scenario."""
    if not rule.speedups or any(k != THROUGHPUT for k, _ in rule.speedups):
        return None
    return (rule.below * math.prod(b for _, b in rule.speedups)) ** (1 / len(rule.speedups))


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
NOT_RUN = "not run as out of reach"
"""How a screened trial's reason says a scenario of its short pass was not run at all, its outcome certain (`is_stopped`)."""


def is_stopped(trial: Any) -> bool:
    """Whether `trial` was screened out on a short pass stopped early: its score is then a bound (the
    short score was at most that), not a measurement, and readers that learn from scores (the
    knowledge base's observations and effects) leave it out."""
    return is_screened(trial) and (STOPPED_EARLY in (trial.error or "") or NOT_RUN in (trial.error or ""))


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
    caps: dict[str, tuple[float, float]] | None = None
    """Objective label -> (the most speedup it can show, the value at it) before the speed-of-light gate calls
    it invalid (`verdict.speedup_caps`); None or missing: unbounded."""
    order: tuple[str, ...] = ()
    """The goal scenarios in the order the short pass measures them (`short_order`); empty: the goal's."""
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Goal scenario -> how `plan` had it measured: {"rule": StopRule} or {"skipped": label -> capped value}."""

    def plan(self, name: str, measured: dict[str, list[float]], *, after_stop: bool = False) -> tuple[Any, dict[str, float] | None]:
        """How goal scenario `name`'s short pass is measured, given the objectives `measured` so far: (a
        `StopRule` that travels with it to the host's bench, which stops it once out of reach, or None: run to
        the end; None, or objective label -> value when it is not run at all: even at the value its
        objectives' caps allow, the short score is under the bar, so the short pass's outcome is certain and
        its score at most that of those values). `after_stop`: a scenario before it was stopped out of reach,
        which with every objective not yet measured at its cap put the score under the bar: `name` is not
        run where its objectives are capped (the same proof, not redone in floats)."""
        if self.bar is None or self.baseline is None:
            return None, None
        mine = [o for o in self.objectives if o.scenario == name]
        labels = [objective_label(o.scenario, o.key) for o in mine]
        caps = self.caps or {}
        below = out_of_reach(self.bar, name, self.objectives, self.baseline, measured, caps)
        capped = bool(mine) and all(label in caps for label in labels)
        if capped and (after_stop or (below is not None and math.prod(caps[label][0] for label in labels) < below * (1 - STOP_SLACK))):
            self.plans[name] = {"skipped": {label: caps[label][1] for label in labels}}
            return None, self.plans[name]["skipped"]
        if below is None or not all(bounds.bounded(o.key) for o in mine):
            return None, None
        rule = StopRule(speedups=tuple((o.key, float(self.baseline[label])) for o, label in zip(mine, labels, strict=True)),
                        below=below * (1 - STOP_SLACK))
        self.plans[name] = {"rule": rule}
        return rule, None

    def full(self, name: str, scenario: Any) -> Any:
        """Goal scenario `name`'s full bench after a passed screen: its requests after the short pass's
        (`Scenario.part`, no warm-up; joined with the short pass's by the bench step), or, where it
        cannot be continued, the whole scenario again with the short pass as its warm-up."""
        short = self.scenarios[name]
        if short.part is not None:
            return rest_of(scenario, short.part[1])
        return scenario.model_copy(update={"warmup_requests": 0})


def short_order(goal_scenarios: Sequence[str], objectives: Sequence[Any], caps: dict[str, tuple[float, float]] | None) -> tuple[str, ...]:
    """The order a short pass measures `goal_scenarios` in: the least bounded first. A scenario can be
    stopped only once every objective outside it is measured or capped (`out_of_reach`), and the tighter
    those caps the sooner, so the scenarios whose objectives have no cap go first, then by the product of
    their caps, largest first (the goal's order among equals, and with no caps at all). On the H200 (sol.json):
    output throughput capped ~144x the one-at-a-time baseline's, TPOT ~13x, so the burst goes first, and a
    slow candidate's burst can be stopped with TPOT at its cap, its decode then not run at all."""
    caps = caps or {}

    def room(name: str) -> float:
        labels = [objective_label(o.scenario, o.key) for o in objectives if o.scenario == name]
        return math.inf if any(label not in caps for label in labels) else math.prod(caps[label][0] for label in labels)

    return tuple(sorted(goal_scenarios, key=lambda n: -room(n)))


def screen_for(
    *, fraction: float, trial: Any, proposer: Any, history: Sequence[Any], scenarios: dict[str, Any],
    goal_scenarios: Sequence[str], score: Callable[[Any], float], noise: float, store: Any, run_id: int,
    durations: dict[str, float] | None = None, objectives: Sequence[Any] = (), baseline: dict[str, float] | None = None,
    caps: dict[str, tuple[float, float]] | None = None,
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
    (`Screen.plan`); without them it always runs to its end. `caps` (objective label -> the most speedup
    the speed-of-light gate lets it show, `verdict.speedup_caps`; None where the run has no floors) bound
    the objectives not measured yet: with them the short pass's first scenario can be stopped too, it
    measures the least bounded scenarios first (`short_order`), and a scenario whose outcome is certain is
    not run."""
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

    order = short_order(goal_scenarios, objectives, caps) if bar is not None and caps else tuple(goal_scenarios)
    plans: dict[str, dict[str, Any]] = {}

    def judge(result: Any, bench_s: float) -> str | None:
        value = score(result)
        why = ask(seen, value, m, startup=KNOWN_NOISE_STARTUP)
        metrics = getattr(result, "metrics", None) or {}
        stopped = {n: x for n, x in metrics.items() if x.get("stopped_early")}
        skipped = {n: p["skipped"] for n, p in plans.items() if "skipped" in p}
        if (stopped or skipped) and not why:  # out_of_reach proved the score under the bar: the proposer disagrees
            raise RuntimeError(f"the short pass of {', '.join([*stopped, *skipped])} was stopped early or not run as out of "
                               f"reach of the bar {bar}, yet its bound {value:.6f}x passed the screen: not judged")
        # The bench time not spent: the rest of the full bench at the short pass's pace (its warm-up,
        # paid either way, counted with the short pass). Not counted: the gates, also not run. A scenario not
        # run: its short pass and warm-up too, at that pace.
        ran = [n for n in goal_scenarios if n not in skipped]
        ran_n = sum(short[n].measured_requests + short[n].warmup_requests for n in ran)
        left_n = rest_n + sum(short[n].measured_requests + short[n].warmup_requests for n in skipped)
        saved = bench_s * left_n / ran_n if why and ran_n else 0.0
        # A stopped scenario's own rest: the tokens still to come at the pace they came (an estimate).
        cut = {n: x["duration_s"] * (x["output_tokens_possible"] / x["output_tokens_seen"] - 1)
               if x.get("output_tokens_seen", 0) > 0 else 0.0 for n, x in stopped.items()}
        saved += sum(cut.values())
        data = {**base, "score": value, "margin": m, "screened_out": bool(why), "reason": why,
                "short_bench_s": round(bench_s, 3), "saved_bench_s": round(saved, 3), "bar": bar,
                **({"order": list(order)} if order != tuple(goal_scenarios) else {}),
                **({"stopped_early": {n: _stop_data(x, plans.get(n, {}).get("rule"), cut[n]) for n, x in stopped.items()}}
                   if stopped else {}),
                **({"not_run": {n: {"capped": v} for n, v in skipped.items()}} if skipped else {})}
        if why:
            said = "".join(f"; {n} {STOPPED_EARLY} {x['duration_s']:.3g} s: {_stop_words(x, plans.get(n, {}).get('rule'))}"
                           f"{_capped_words(n, objectives, caps, metrics)}" for n, x in stopped.items())
            said += "".join(f"; {n} {NOT_RUN}: the short score is under the bar even at "
                            + ", ".join(f"{label.split(':')[1]} {v:.4g}" for label, v in vals.items())
                            + ", the best the speed-of-light gate accepts" for n, vals in skipped.items())
            at_most = stopped or skipped
            why = (f"{SCREENED} {fraction:.0%} fidelity: short-bench score {'at most ' if at_most else ''}{value:.3f}x "
                   f"vs {why}{said}; ~{saved:.1f} s of bench saved")
        store.add_event(run_id, "screen", why or f"#{trial.number} passed its {fraction:.0%} screen ({value:.3f}x): "
                        f"measured in full ({rest_n} more requests)", data=data, trial_id=trial.id)
        return why

    return Screen(fraction=fraction, scenarios=short, judge=judge, bar=bar, objectives=tuple(objectives), baseline=baseline,
                  caps=caps, order=order, plans=plans)


def _stop_data(x: dict[str, float], rule: Any, saved: float) -> dict[str, Any]:
    """What the `screen` event keeps of a scenario stopped early: when, the rule, the bounds it was proven with."""
    out: dict[str, Any] = {"after_s": round(x["duration_s"], 3), "below": x.get("stop_below"), "bound": x.get("stop_bound"),
                           "saved_s": round(saved, 3)}
    if rule is not None:
        out["bounds"] = {k: x.get(k) for k, _ in rule.speedups}
        if (floor := throughput_floor(rule)) is not None:
            out.update(floor_tok_s=floor, bound_tok_s=x[THROUGHPUT])
    return out


def _stop_words(x: dict[str, float], rule: Any) -> str:
    """Which bound stopped a scenario, in words: the value the bar needed and the bound it was past."""
    if rule is not None and (floor := throughput_floor(rule)) is not None:
        return f"its output throughput could no longer reach the {floor:.1f} tok/s the bar needs (at most {x[THROUGHPUT]:.1f})"
    if rule is not None and len(rule.speedups) == 1:
        key, base = rule.speedups[0]
        return (f"its {key} could no longer get under the {base / rule.below:.4g} ms the bar needs "
                f"(at least {x.get(key, float('nan')):.4g} ms already)")
    keys = ", ".join(k for k, _ in rule.speedups) if rule is not None else "metrics"
    return (f"the speedups of its {keys} could no longer reach the {x.get('stop_below', float('nan')):.4g}x the bar needs "
            f"(at most {x.get('stop_bound', float('nan')):.4g}x)")


def _capped_words(name: str, objectives: Sequence[Any], caps: dict[str, tuple[float, float]] | None,
                  metrics: dict[str, dict[str, float]]) -> str:
    """The objectives a stop counted at their speed-of-light caps (measured after it, or never), in words."""
    order = list(metrics)
    later = [o for o in objectives if o.scenario != name and (o.scenario not in metrics or order.index(o.scenario) > order.index(name))]
    labels = [objective_label(o.scenario, o.key) for o in later if caps and objective_label(o.scenario, o.key) in caps]
    return f", with {', '.join(labels)} at the speed of light's cap" if labels else ""
