"""Measurements that can be trusted: host state around each one, redo when it cannot be used.

A number is redone, not used, when the client was saturated (`bench.saturation`), when other
tenants used clearly more of the host than during the reference (baseline) measurement, or when
the run was too short. Every attempt's host state is stored as a `measure.host` event on the
trial, so `infergoal show` and the report can say under what conditions each number was taken.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from orchestrator.bench.saturation import SaturationPolicy, saturation_reasons
from orchestrator.hosts.state import RunQueueSampler, contention, self_cpu_s, window

__all__ = [
    "TrustPolicy", "bench_trusted", "busier_reason", "host_during", "host_state", "idle_state", "min_requests_for",
    "scale_refusal", "slowdown", "state_change",
]


@dataclass(frozen=True)
class TrustPolicy:
    """When a measurement is redone, and when the baseline is measured again."""

    max_slowdown: float = 0.2
    """Redo a measurement when other tenants' runnable tasks would slow our server by more than this
    relative to the reference (baseline) measurement (`hosts.state.contention`)."""
    max_redo: int = 2
    """Extra attempts for one untrusted measurement; after them the trial is invalid, not judged."""
    min_seconds: float = 0.3
    """A measured scenario shorter than this is mostly start-up (first requests, warm caches) and cannot
    resolve a few-percent step on a shared host. 1 s refused honest runs at bench.scale 0.5 on a quiet
    2-core machine (0.57 s for the naive baseline's throughput scenario); claims rest on paired rounds."""
    min_requests: int = 8
    """Fewest measured requests per scenario, whatever the noise says."""
    sentinel_every: int = 4
    """Re-measure the baseline after this many search trials since the last one, while that keeps the
    re-measures within `sentinel_share` of the run's time so far."""
    sentinel_share: float = 0.08
    """The most of the run's trial time (baseline, sentinels, candidates, paired rounds) that re-measuring
    the baseline every `sentinel_every` trials may take; past it the count waits (1: no limit). A host whose
    state moved (`state_change`), a candidate measured on a busier host, and every claim's paired rounds
    re-measure the baseline whatever the share: those are what guard a verdict against a moved host."""
    state_change: float = 0.25
    """A change of the expected contention (either way), or of a GPU's clock or memory share, this
    large re-measures the baseline."""
    probe_s: float = 1.0
    """Length of the idle host-state probe taken before each candidate."""
    settle_s: float = 30.0
    """Before a paired round redone for a busy host: how long to wait for the host to calm down to the
    baseline's contention (probed every `probe_s`). Redoing at once mostly meets the same tenant."""
    saturation: SaturationPolicy = SaturationPolicy()


def slowdown(win: dict[str, Any], ref: dict[str, Any], own_load: float | None = None) -> float:
    """How much more contended `win` was than `ref`, for the same load of our own (ratio, 1.0 = same)."""
    own = win.get("own_load", 0.0) if own_load is None else own_load
    return contention(win.get("foreign_load", 0.0), own) / contention(ref.get("foreign_load", 0.0), own)


def busier_reason(win: dict[str, Any], ref: dict[str, Any] | None, policy: TrustPolicy) -> str | None:
    """Why the host was busier than during `ref` (None when it was not, or there is no reference)."""
    if not ref or "foreign_load" not in win or "foreign_load" not in ref:
        return None
    x = slowdown(win, ref)
    if x > 1 + policy.max_slowdown:
        return (f"host busier than at the baseline: others' runnable tasks {win['foreign_load']:.2f}/CPU vs "
                f"{ref['foreign_load']:.2f}/CPU (expected slowdown {x - 1:.0%})")
    return None


def state_change(now: dict[str, Any], ref: dict[str, Any] | None, policy: TrustPolicy) -> str | None:
    """Why the host is no longer in the state the reference baseline was measured in."""
    if not ref:
        return None
    if "foreign_load" in now and "foreign_load" in ref:
        # The probe runs with no server of ours: judge it as if ours ran as it did at the baseline.
        x = slowdown(now, ref, own_load=ref.get("own_load", 0.0))
        if max(x, 1 / x) > 1 + policy.state_change:
            return (f"others' runnable tasks moved {ref['foreign_load']:.2f} -> {now['foreign_load']:.2f} per CPU "
                    f"(contention x{x:.2f})")
    for i, (g_now, g_ref) in enumerate(zip(now.get("gpus") or [], ref.get("gpus") or [], strict=False)):
        clk, clk0 = g_now.get("sm_clock_max_mhz"), g_ref.get("sm_clock_max_mhz")
        if clk and clk0 and abs(clk / clk0 - 1) > 0.1:
            return f"GPU {i} max SM clock moved {clk0:.0f} -> {clk:.0f} MHz"
        # Only other tenants' memory: ours (the server under test, the accuracy reference, a forge)
        # comes and goes with a trial or a resume. A state recorded without that split (an older
        # run, an nvidia-smi that cannot list processes) cannot tell the two apart: not compared.
        tot = g_now.get("mem_total_mib") or 0
        others, others0 = g_now.get("mem_others_mib"), g_ref.get("mem_others_mib")
        if tot and others is not None and others0 is not None and abs(others - others0) / tot > policy.state_change:
            return f"GPU {i} memory used by others moved {others0:.0f} -> {others:.0f} MiB"
    return None


def host_during(store: Any, run_id: int, trial_id: int) -> dict[str, Any] | None:
    """The host's state during a trial's used measurements (mean run-queue loads, last GPU state)."""
    wins = [(e.data or {}).get("window") or {} for e in store.events(run_id, kind="measure.host")
            if e.trial_id == trial_id and not (e.data or {}).get("untrusted")]
    wins = [w for w in wins if "foreign_load" in w]
    if not wins:
        return None
    mean = {k: sum(w.get(k, 0.0) for w in wins) / len(wins) for k in ("foreign_load", "own_load", "foreign_cpu")}
    return mean | {"gpus": wins[-1].get("gpus") or []}


def host_state(host: Any, proc: Any = None, *, gpus: bool = True) -> dict[str, Any]:
    """`host.host_state(...)`, or only this process's clock and CPU for a host that cannot say more
    (its measurements are then judged on the client's signs alone)."""
    if hasattr(host, "host_state"):
        return host.host_state(proc, gpus=gpus)
    return {"t": time.monotonic(), "load1": float("nan"), "load5": float("nan"), "cpu_count": 1, "cpu": {},
            "own_cpu_s": 0.0, "self_cpu_s": self_cpu_s(), "gpus": []}


def idle_state(host: Any, seconds: float) -> dict[str, Any]:
    """Host state over `seconds` with no server of ours running: everything busy is someone else's.
    The host's own work (a standby importing) is paused meanwhile (`host.quiet()`): it is not another
    tenant, and it never runs beside a measurement."""
    quiet = host.quiet() if hasattr(host, "quiet") else nullcontext()
    with quiet:
        before = host_state(host)
        with RunQueueSampler(lambda: host_state(host, gpus=False), period_s=0.1) as rq:
            time.sleep(seconds)
        return window(before, host_state(host)) | rq.loads(int(before.get("cpu_count") or 1))


def min_requests_for(cv_request: float, margin: float, z: float = 2.0) -> int:
    """Requests needed so the mean of a per-request metric with spread `cv_request` resolves `margin`.

    Standard error of the mean = cv / sqrt(n); ask for z of them to fit inside the margin."""
    if margin <= 0:
        return 10**9
    return math.ceil((z * cv_request / margin) ** 2)


def scale_refusal(scenarios: dict[str, Any], names: list[str], policy: TrustPolicy,
                  baseline_metrics: dict[str, dict[str, float]] | None = None, margin: float | None = None,
                  per_request: dict[str, str] | None = None, rounds: int = 1) -> str | None:
    """Why this bench scale cannot resolve the goal (None when it can).

    Before any measurement only the request count is known; with the baseline's metrics the
    duration is checked too, and for objectives on a per-request metric (`per_request`: scenario ->
    metric prefix such as `tpot_ms`) the number of requests needed to resolve `margin` at the
    baseline's per-request spread. Throughput has no per-request spread; its noise is what the
    paired rounds measure. A claim is judged over `rounds` paired rounds, each with the scenario's
    requests."""
    for name in names:
        sc = scenarios[name]
        if sc.num_requests < policy.min_requests:
            return (f"scenario '{name}' has {sc.num_requests} measured requests at this bench.scale; a measurement needs "
                    f">= {policy.min_requests} to resolve the goal: raise bench.scale")
        m = (baseline_metrics or {}).get(name)
        if not m:
            continue
        if m.get("duration_s", math.inf) < policy.min_seconds:
            return (f"scenario '{name}' ran {m['duration_s']:.2f} s at this bench.scale, shorter than the "
                    f"{policy.min_seconds:g} s a measurement needs on a shared host: raise bench.scale")
        prefix = (per_request or {}).get(name)
        mean, std = (m.get(f"{prefix}_mean", 0.0), m.get(f"{prefix}_std", 0.0)) if prefix else (0.0, 0.0)
        if margin is not None and mean > 0:
            need = max(policy.min_requests, min_requests_for(std / mean, margin))
            if sc.num_requests * rounds < need:
                return (f"scenario '{name}' has {sc.num_requests} requests x {rounds} paired rounds; at the baseline's "
                        f"per-request {prefix} spread ({std / mean:.0%}) resolving the goal's {margin:.0%} step needs "
                        f">= {need}: raise bench.scale")
    return None


def bench_trusted(run_once: Any, host: Any, proc: Any, *, ref: dict[str, Any] | None, policy: TrustPolicy,
                  on_redo: Any = lambda attempt, reasons: None) -> tuple[Any, dict[str, Any], list[str], int]:
    """Run `run_once()` (one scenario, returns a ScenarioResult) until it can be trusted.

    Returns (result, host window, reasons it is still untrusted ([] = trusted), attempts made)."""
    attempt = 0
    while True:
        before = host_state(host, proc)
        with RunQueueSampler(lambda: host_state(host, proc, gpus=False)) as rq:
            res = run_once()
        win = window(before, host_state(host, proc)) | rq.loads(int(before.get("cpu_count") or 1))
        reasons = saturation_reasons(res.metrics, res.requests, win["client_cpu"], policy.saturation)
        busier = busier_reason(win, ref, policy)
        if busier:
            reasons.append(busier)
        attempt += 1
        if not reasons or attempt > policy.max_redo or res.metrics.get("failed", 0) > 0:
            return res, win, reasons, attempt
        on_redo(attempt, reasons)
