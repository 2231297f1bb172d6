"""The highest request rate a server sustains under latency limits (an SLO), and what it serves there.

Poisson arrivals at a set rate, each step long enough to be trusted (`RatePolicy.min_requests`,
`min_seconds`); a step passes when every request succeeded, every limit holds on the percentile the
goal names, the queue did not grow over the step, and the client was not the bottleneck
(`bench.saturation`). The search brackets the rate (doubling from `start_rate` until a step fails,
halving when the first one already fails) and then bisects the bracket, geometrically, until it is
narrower than `precision`. A search given a rate the same server already reached (`near`: a paired
round's half, a sentinel, a retry of a knob set measured earlier in the run) brackets around it
instead: `near`, then strides of `precision` that double, up while steps pass or down while they
fail, so a few short steps near the answer replace the climb from `start_rate` (at 1 req/s and 30
requests a step, the lowest steps are the longest). The answer is the highest passing rate — a lower bound on the true
limit within `precision` — or 0 when no rate down to `min_rate` met the limits.

A found rate counts only once it has passed twice: near saturation one short step's pass/fail is
not monotone in the rate (on real vLLM a rate failed between two that had passed once each), so
the search re-runs the step at its best passing rate, `confirm_length` times as long, and on a
failure steps down by `precision` (then by strides that double) and tries again, at most
`confirmations` times. When the rate that passed was reached by a doubled stride (more than
`precision` below the lowest failed confirmation), the search bisects back up between the two with
confirmation-length steps until they are within `precision` (at most `confirmations` - 2 more
steps): the answer is the highest rate a confirmation-length step passed. A rate none of
them confirmed scores 0 (`RateSearch.confirmed` False), as a broken SLO does.

SGLang's tuner and GuideLLM's sweep search the rate the same way; SLO goals
(`orchestrator.config.goal.SloGoal`) are scored on this rate, or on the goodput at it, for the baseline
and every candidate alike.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from orchestrator.core.oneline import plain_number

from .results import ScenarioResult
from .saturation import SaturationPolicy, saturation_reasons
from .scenarios import Scenario

__all__ = ["RatePolicy", "RateSearch", "Step", "at_rate", "confirm_policy", "find_rate", "judge", "step_scenario"]

Limits = Sequence[tuple[str, float]]
"""(metrics key, largest allowed value), e.g. ("ttft_ms_p90", 300.0)."""


@dataclass(frozen=True)
class RatePolicy:
    """How the rate search steps, and when a step is long enough to be trusted."""

    start_rate: float = 1.0
    """First rate tried (req/s)."""
    max_rate: float = 4096.0
    """The search stops doubling here: a server still meeting the SLO scores this."""
    min_rate: float = 0.05
    """Below this the SLO counts as broken at every rate (score 0)."""
    max_step_seconds: float = 40.0
    """Longest step: rates below `min_requests` / this are not tried either (a step at 0.05 req/s would
    take ten minutes), so the SLO counts as broken below them."""
    precision: float = 0.05
    """Bisect until (fail - pass) / pass is at most this: the answer is within it of the limit."""
    min_requests: int = 30
    """Fewest measured requests per step: a p90 over fewer is three requests' word."""
    min_seconds: float = 4.0
    """Shortest step (requests = rate x this, at least `min_requests`): queues need time to build."""
    max_requests: int = 4000
    max_steps: int = 24
    """Steps of the bracketing and bisection; the confirmation steps come on top (`confirmations`)."""
    confirmations: int = 4
    """Most confirmation tries downwards: the found rate, then one `precision` lower, then strides that
    double (2, 4, ... precisions: at 5%, four steps reach 29% below the found rate). A pass reached by
    a doubled stride is then refined by bisecting back up towards the lowest failed try, also with
    confirmation-length steps, to within `precision`: at most `confirmations` - 2 steps more (2 at the
    default 4), so at most 2 x `confirmations` - 2 confirmation-length steps in all. 0 trusts the
    bisection's single pass (the search before confirmation)."""
    confirm_length: float = 2.0
    """A confirmation step is this many times as long (`min_seconds`, `min_requests`) as a search step:
    it settles the answer, so it gets more requests than the steps that only steered the search."""
    max_growth: float = 2.0
    """A step whose last quarter of requests took this many times longer (median E2E) than its first
    quarter was still queueing up: the rate is not sustainable, whatever its percentiles say."""
    saturation: SaturationPolicy = SaturationPolicy()


@dataclass
class Step:
    """One measured rate and what was judged of it."""

    rate: float
    passed: bool
    trusted: bool
    why: str
    """Why it failed or was not trusted; the limits' values when it passed."""
    metrics: dict[str, float] = field(default_factory=dict)
    result: ScenarioResult | None = field(default=None, repr=False)
    confirm: bool = False
    """A confirmation step (longer, run after the bisection to settle the answer)."""

    def to_dict(self) -> dict[str, Any]:
        keep = ("completed", "failed", "duration_s", "request_throughput", "output_throughput", "goodput",
                "ttft_ms_p90", "ttft_ms_p99", "tpot_ms_p90", "tpot_ms_p99", "e2e_ms_p90", "loop_lag_ms_p50")
        return {"rate": self.rate, "passed": self.passed, "trusted": self.trusted, "why": self.why,
                "confirm": self.confirm, "metrics": {k: self.metrics[k] for k in keep if k in self.metrics}}


@dataclass
class RateSearch:
    """What the search found: the rate, the measurement at it, and every step on the way."""

    rate: float
    """Highest passing rate (req/s), confirmed by a longer step (`confirmed`); 0.0 when no rate met the limits."""
    steps: list[Step]
    best: Step | None
    client_bound: bool = False
    """A step was client-bound: the server may sustain more than `rate` (the answer is a lower bound)."""
    confirmed: bool = False
    """`rate` passed a confirmation step (False when confirmation is off or none passed)."""
    confirmations: int = 0
    """Confirmation-length steps run (the last of `steps`): the tries downwards (at most
    `RatePolicy.confirmations`) and those bisecting back up after a doubled stride (at most
    `RatePolicy.confirmations` - 2 more)."""
    unconfirmed_rate: float = 0.0
    """The bisection's answer before confirmation (its best single pass); equals `rate` when that passed."""
    near: float | None = None
    """The rate the search bracketed around (an earlier answer for the same server), None when it climbed
    from `RatePolicy.start_rate`."""

    @property
    def goodput(self) -> float:
        """Requests per second that each met the per-request limits, at `rate`."""
        return self.best.metrics.get("goodput", 0.0) if self.best else 0.0

    @property
    def error(self) -> str | None:
        """Why there is no rate to score (the SLO broke at every rate tried), or None."""
        if self.rate > 0:
            return None
        last = self.steps[-1].why if self.steps else "no step ran"
        if self.unconfirmed_rate > 0:  # a rate passed once, but no confirmation step held
            low = min(s.rate for s in self.steps if s.confirm)
            return (f"SLO met once at {plain_number(self.unconfirmed_rate)} req/s but not confirmed by {self.confirmations} "
                    f"longer step(s) down to {plain_number(low)} req/s ({last})")
        tried = min((s.rate for s in self.steps), default=0.0)
        return f"SLO not met at any rate down to {plain_number(tried)} req/s ({last})"

    def metrics(self) -> dict[str, float]:
        """The measurement at the found rate, with the search's answer (`slo_rate`, `slo_goodput`)."""
        base = dict(self.best.metrics) if self.best else {}
        return base | {"slo_rate": self.rate, "slo_goodput": self.goodput, "slo_steps": float(len(self.steps)),
                       "slo_client_bound": float(self.client_bound), "slo_confirmations": float(self.confirmations),
                       "slo_confirmed": float(self.confirmed)}

    def result(self) -> ScenarioResult | None:
        """The found rate's `ScenarioResult`, its metrics extended by `metrics()` and the steps in `meta`."""
        if self.best is None or self.best.result is None:
            return None
        res = self.best.result
        return ScenarioResult(scenario=res.scenario, metrics=self.metrics(), requests=res.requests,
                              failures=res.failures, meta=res.meta | self.meta())

    def meta(self) -> dict[str, Any]:
        """The steps (and the rate bracketed around, if any) for a result's `meta`."""
        return {"rate_search": [s.to_dict() for s in self.steps]} | ({"rate_near": self.near} if self.near else {})


def step_scenario(base: Scenario, rate: float, policy: RatePolicy = RatePolicy()) -> Scenario:
    """`base` as an open-loop Poisson step at `rate`, long enough to be trusted."""
    n = min(policy.max_requests, max(policy.min_requests, math.ceil(rate * policy.min_seconds)))
    return base.model_copy(update={"arrival": "poisson", "rate": rate, "num_requests": n, "concurrency": 0,
                                   "burstiness": 1.0, "name": base.name})


def _growth(result: ScenarioResult) -> float:
    """Median E2E of the last quarter of requests (in send order) over that of the first quarter."""
    ok = sorted((r for r in result.requests if r.success and r.e2e_ns is not None), key=lambda r: r.t_sent_ns)
    q = len(ok) // 4
    if q < 3:
        return 1.0
    first = float(np.median([r.e2e_ns for r in ok[:q]]))
    last = float(np.median([r.e2e_ns for r in ok[-q:]]))
    return last / first if first > 0 else 1.0


def judge(result: ScenarioResult, limits: Limits, policy: RatePolicy = RatePolicy(),
          client_cpu: float | None = None) -> tuple[bool, bool, str]:
    """(passed, trusted, why) for one step."""
    m = result.metrics
    sat = saturation_reasons(m, result.requests, client_cpu, policy.saturation)
    if sat:
        return False, False, "client-bound: " + "; ".join(sat)
    if m.get("failed", 0) > 0 or m.get("completed", 0) == 0:
        return False, True, f"{int(m.get('failed', 0))} request(s) failed"
    broken = [f"{key} {plain_number(m.get(key, math.inf))} > {plain_number(float(most))}" for key, most in limits if not m.get(key, math.inf) <= most]
    if broken:
        return False, True, "; ".join(broken)
    growth = _growth(result)
    if growth > policy.max_growth:
        return False, True, f"queue growing: E2E of the last requests {growth:.1f}x the first"
    return True, True, "; ".join(f"{key} {plain_number(m[key])} <= {plain_number(float(most))}" for key, most in limits) or "no failures"


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def confirm_policy(policy: RatePolicy) -> RatePolicy:
    """`policy` with steps `confirm_length` times as long: the length of a confirmation step."""
    k = policy.confirm_length
    return replace(policy, min_seconds=policy.min_seconds * k, min_requests=math.ceil(policy.min_requests * k),
                   max_requests=math.ceil(policy.max_requests * k))


def at_rate(run: Callable[[Scenario], ScenarioResult], base: Scenario, rate: float, limits: Limits,
            policy: RatePolicy = RatePolicy()) -> Step:
    """Measure one step at `rate` with `run` (a bench of one scenario) and judge it.

    The client's CPU share is this process's: right for a local bench, an underestimate (never a
    false alarm) when `run` benches elsewhere."""
    cpu0 = _cpu_s()
    res = run(step_scenario(base, rate, policy))
    dur = res.metrics.get("duration_s", 0.0)
    cpu = (_cpu_s() - cpu0) / dur if dur > 0 else None
    passed, trusted, why = judge(res, limits, policy, cpu)
    return Step(rate, passed, trusted, why, dict(res.metrics), res)


def find_rate(run: Callable[[Scenario], ScenarioResult], base: Scenario, limits: Limits,
              policy: RatePolicy = RatePolicy(), on_step: Callable[[Step], None] = lambda s: None,
              near: float | None = None) -> RateSearch:
    """The highest Poisson request rate at which `limits` hold, within `policy.precision`.

    Bracket (from `policy.start_rate` by doubling, or around `near`, a rate this server already
    reached, by strides of the precision that double), bisect, then confirm the best passing rate with a longer step (stepping down by the
    precision, then by doubling strides, after each failed confirmation, at most
    `policy.confirmations` times; a pass a doubled stride reached is refined by bisecting back up
    towards the lowest failed confirmation with longer steps, to within the precision); every step,
    confirmation steps included (`Step.confirm`), is kept in `RateSearch.steps`."""
    steps: list[Step] = []
    lo: Step | None = None  # highest trusted passing step
    hi: float | None = None  # lowest failing (or untrusted) rate
    client_bound = False

    def probe(rate: float, confirm: bool = False) -> Step:
        nonlocal client_bound
        st = at_rate(run, base, rate, limits, confirm_policy(policy) if confirm else policy)
        st.confirm = confirm
        steps.append(st)
        client_bound |= not st.trusted
        on_step(st)
        return st

    def budget() -> bool:
        return len(steps) < policy.max_steps

    floor = max(policy.min_rate, policy.min_requests / policy.max_step_seconds)
    if near is not None and near > 0:
        near = min(max(near, floor), policy.max_rate)
        lo, hi = _bracket_near(probe, budget, near, floor, policy)
    else:
        rate = policy.start_rate
        while budget():  # bracket upwards: double until a step fails
            st = probe(rate)
            if not st.passed:
                hi = rate
                break
            lo = st
            if rate * 2 > policy.max_rate:
                break
            rate *= 2
        if lo is None and hi is not None:  # the first rate already failed: halve until one passes
            rate = hi / 2
            while rate >= floor and budget():
                st = probe(rate)
                if st.passed:
                    lo = st
                    break
                hi, rate = rate, rate / 2
    # (1e-9: a bracket of exactly one precision, as `_bracket_near` makes, needs no step in between)
    while lo is not None and hi is not None and (hi - lo.rate) / lo.rate > policy.precision * (1 + 1e-9) and budget():
        st = probe(math.sqrt(lo.rate * hi))  # rates span orders of magnitude: bisect the ratio
        if st.passed:
            lo = st
        else:
            hi = st.rate
    near = near if near is not None and near > 0 else None
    if lo is None:
        return RateSearch(rate=0.0, steps=steps, best=None, client_bound=client_bound, near=near)
    # Confirm: the answer is a rate that passed twice (its search step, then a longer one). A failure
    # steps down by the precision, the search's own resolution, and confirms there instead; when that
    # fails too, the longer step sees a queue the short ones missed (a server near its limit queues
    # slowly), so the stride doubles rather than creeping down 5% at a time. A doubled stride can
    # overshoot (on real vLLM it jumped from a failed 110.6 to 91.0 req/s where 102.4 held), so a pass
    # it reached is bisected back up towards the failure with confirmation-length steps.
    unconfirmed, rate, tries, stride = lo.rate, lo.rate, 0, 1
    failed: float | None = None  # the lowest rate a confirmation step failed at
    while tries < policy.confirmations:
        st = probe(rate, confirm=True)
        tries += 1
        if st.passed:
            best, extra = _bisect_back(probe, st, failed, policy.precision)
            return RateSearch(rate=best.rate, steps=steps, best=best, client_bound=client_bound, confirmed=True,
                              confirmations=tries + extra, unconfirmed_rate=unconfirmed, near=near)
        failed = rate
        rate /= (1 + policy.precision) ** stride
        stride *= 2
    if tries:
        return RateSearch(rate=0.0, steps=steps, best=None, client_bound=client_bound, confirmations=tries,
                          unconfirmed_rate=unconfirmed, near=near)
    return RateSearch(rate=lo.rate, steps=steps, best=lo, client_bound=client_bound, unconfirmed_rate=unconfirmed,
                      near=near)


def _bracket_near(probe: Callable[..., Step], budget: Callable[[], bool], near: float, floor: float,
                  policy: RatePolicy) -> tuple[Step | None, float | None]:
    """(highest passing step, lowest failing rate) around `near`: a step at `near`, then up while steps
    pass (or down while they fail) by strides of `policy.precision` that double (each step (1+p),
    (1+p)^2, (1+p)^4, ... from the last), so a server still where it was costs two steps, and one that
    moved far is found in a few more. Stops at `policy.max_rate` going up and at `floor` going down,
    as the climb from `start_rate` does."""
    grow = 1 + policy.precision
    st = probe(near)
    lo, hi = (st, None) if st.passed else (None, near)
    rate, stride = near, 1
    while budget():
        nxt = rate * grow ** stride if lo is not None else rate / grow ** stride
        if nxt > policy.max_rate or nxt < floor:
            break
        st = probe(nxt)
        if lo is not None and st.passed:
            lo = st
        elif lo is not None:  # going up: the first failure closes the bracket
            return lo, nxt
        elif st.passed:  # going down: the first pass closes it
            return st, hi
        else:
            hi = nxt
        rate, stride = nxt, stride * 2
    return lo, hi


def _refine_steps(gap: float, precision: float) -> int:
    """Confirmation-length steps the bisection back up takes over a gap `gap` = failed / passed rate:
    the halvings of log(gap) down to one `precision` (0 when the gap is within it)."""
    units = math.log(gap) / math.log1p(precision) if gap > 1 else 0.0
    return max(0, math.ceil(math.log2(units) - 1e-9)) if units > 1 + 1e-9 else 0


def _bisect_back(probe: Callable[..., Step], passed: Step, failed: float | None,
                 precision: float) -> tuple[Step, int]:
    """(the highest passing confirmation-length step, steps taken) after a confirmation passed at
    `passed.rate`: when the lowest failed confirmation `failed` lies more than `precision` above it
    (a doubled stride jumped that far), bisect geometrically back up between the two, each try a
    confirmation-length step, until they are within `precision`: `_refine_steps` tries at most."""
    best, taken = passed, 0
    if failed is None:
        return best, taken
    lo, hi = passed.rate, failed
    bound = _refine_steps(hi / lo, precision)
    while taken < bound and hi / lo - 1 > precision * (1 + 1e-9):
        st = probe(math.sqrt(lo * hi), confirm=True)
        taken += 1
        if st.passed:
            best, lo = st, st.rate
        else:
            hi = st.rate
    return best, taken
