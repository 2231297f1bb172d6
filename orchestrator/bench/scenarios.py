"""Benchmark scenarios (InferenceBench A–D style) and arrival schedules.

A scenario fixes everything that changes a number: prompt/output lengths, request count,
concurrency, arrival process, warmup and seed.  ``scaled(f)`` lets the same scenario run in
seconds against a tiny CPU model (scale 1.0) and at full size on a GPU (scale ~8–16).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Arrival = Literal["closed", "poisson", "constant", "gamma", "trace"]


class TraceEntry(BaseModel):
    """One request of a Mooncake-style trace line."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: list[int] = Field(default_factory=list)


class StopRule(BaseModel):
    """When a scenario's measured requests are stopped early (`Scenario.stop`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    speedups: tuple[tuple[str, float], ...]
    """(metric key, the baseline's value), one per goal objective on the scenario: the speedup of
    `output_throughput` is its value over the baseline's, of a latency (`bounds.LATENCIES` with a
    statistic of `bounds.STATS`) the baseline's over its value. A key without a bound never stops."""
    below: float
    """Stopped once the product of those speedups can no longer reach this."""


class Scenario(BaseModel):
    """A reproducible workload.  Field names are a contract with the controller."""

    name: str
    prompt_tokens: int = 128
    output_tokens: int = 32
    num_requests: int = 16
    # Closed loop: number of workers.  Open loop: cap on in-flight requests (0 = unlimited),
    # like vLLM's --max-concurrency; waiting for the cap shows up as client queue time.
    concurrency: int = 1
    arrival: Arrival = "closed"
    rate: float | None = None  # req/s; None for closed loop
    burstiness: float = 1.0  # gamma shape; 1.0 = Poisson, <1 burstier, >1 smoother
    warmup_requests: int = 2
    seed: int = 0
    prompt_seed: int | None = None
    """This measurement's own draw of prompts (`orchestrator.trial.run` gives each measurement a fresh one, both
    halves of a paired round the same): with `seed` it seeds every prompt (the shared prefix, each request,
    the warm-up, a trace's blocks), so no server has seen them before. None: `seed` alone, the same prompts
    every time (`python -m orchestrator.bench` without `--prompt-seed`). The arrival schedule is `seed`'s."""
    prefix_tokens: int = 0  # leading tokens shared by every prompt (prefix caching)
    # Extensions (defaults keep the contract above unchanged).
    arrival_scaling: Literal["vllm", "aiperf"] = "vllm"
    trace_path: str | None = None
    trace_block_tokens: int = 512  # Mooncake hash_id block size
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    primary_metric: str = "output_throughput"
    direction: Literal["lower", "higher"] = "higher"
    description: str = ""
    part: tuple[int, int] | None = None
    """Measure only requests [lo, hi) of the `num_requests` (their prompts and arrival schedule as in the
    whole scenario): one pass of a bench measured in several, joined by `orchestrator.bench.passes`
    (multi-fidelity screening's short pass and its continuation, `orchestrator.trial.fidelity`). None: all."""
    stop: StopRule | None = None
    """Stop the measured requests as soon as this scenario can no longer score what the rule asks (a screen's
    early stop, `orchestrator.trial.fidelity`: the candidate is screened out whatever the rest would measure): the
    speedups its metrics can still reach, bounded while the requests run (`orchestrator.bench.bounds`),
    multiplied, under `StopRule.below` (`loadgen.run_scenario`). None: run to the end."""

    @property
    def measured_requests(self) -> int:
        """How many requests this scenario measures (its `part`'s, or all)."""
        return self.num_requests if self.part is None else max(0, self.part[1] - self.part[0])

    def scaled(self, factor: float) -> Scenario:
        """Return a copy sized for faster hardware.

        Token lengths and request counts grow by ``factor``; concurrency and rate grow too
        unless the scenario is single-stream (concurrency 1 measures latency, not load).
        """
        if factor <= 0:
            raise ValueError("scale factor must be > 0")

        def s(x: int, lo: int = 1) -> int:
            return max(lo, int(round(x * factor)))

        upd: dict = {
            "prompt_tokens": s(self.prompt_tokens),
            "output_tokens": s(self.output_tokens) if self.output_tokens > 1 else self.output_tokens,
            "num_requests": s(self.num_requests),
            "prefix_tokens": s(self.prefix_tokens, 0) if self.prefix_tokens else 0,
            "warmup_requests": s(self.warmup_requests) if self.warmup_requests else 0,  # keep >= 1
        }
        if self.concurrency > 1:
            upd["concurrency"] = s(self.concurrency)
        if self.rate is not None and self.concurrency != 1:
            upd["rate"] = self.rate * factor
        return self.model_copy(update=upd)


def builtin_scenarios(scale: float = 1.0) -> dict[str, Scenario]:
    """Scenarios A–C (a trial's score is the geometric mean of its speedups, `orchestrator.trial.verdict.score`).

    Sized at scale 1.0 for a tiny CPU model serving ~150 tok/s single-stream: each takes
    roughly 5–15 s against the naive (unbatched) reference server.
    """
    base = {
        "prefill": Scenario(
            name="prefill", prompt_tokens=512, output_tokens=1, num_requests=16, concurrency=1,
            warmup_requests=2, seed=1, primary_metric="ttft_ms_mean", direction="lower",
            description="A: prefill-heavy, TTFT at concurrency 1"),
        "decode": Scenario(
            name="decode", prompt_tokens=32, output_tokens=64, num_requests=16, concurrency=1,
            warmup_requests=3, seed=2, primary_metric="tpot_ms_mean", direction="lower",
            description="B: decode-heavy, TPOT at concurrency 1"),
        "throughput": Scenario(
            name="throughput", prompt_tokens=128, output_tokens=32, num_requests=48, concurrency=8,
            warmup_requests=8, seed=3, description="C: closed-loop load, output tok/s"),
        "throughput_poisson": Scenario(
            name="throughput_poisson", prompt_tokens=128, output_tokens=32, num_requests=32,
            concurrency=16, arrival="poisson", rate=4.0, warmup_requests=2, seed=4,
            description="C: Poisson arrivals"),
        "throughput_constant": Scenario(
            name="throughput_constant", prompt_tokens=128, output_tokens=32, num_requests=32,
            concurrency=16, arrival="constant", rate=4.0, warmup_requests=2, seed=5,
            description="C: constant-rate arrivals"),
        "throughput_burst": Scenario(
            name="throughput_burst", prompt_tokens=128, output_tokens=32, num_requests=32,
            concurrency=16, arrival="gamma", rate=4.0, burstiness=0.25, warmup_requests=2, seed=6,
            description="C: bursty gamma arrivals (burstiness 0.25)"),
        # SLO goals: the shape of every step of the request-rate search (bench/rate.py sets the
        # Poisson rate and the request count per step; num_requests is only the trust floor's check).
        "slo": Scenario(
            name="slo", prompt_tokens=128, output_tokens=32, num_requests=32, concurrency=0,
            arrival="poisson", rate=1.0, warmup_requests=2, seed=8,
            description="SLO: highest Poisson request rate meeting the goal's latency limits"),
        "prefix": Scenario(
            name="prefix", prompt_tokens=512, output_tokens=8, num_requests=16, concurrency=2,
            prefix_tokens=384, warmup_requests=2, seed=7, primary_metric="ttft_ms_mean",
            direction="lower", description="shared 384-token prefix (prefix caching)"),
    }
    if scale == 1.0:
        return base
    return {k: v.scaled(scale) for k, v in base.items()}


def load_scenarios_file(path: str | Path) -> dict[str, Scenario]:
    """Scenarios from a TOML file of `[NAME]` tables of Scenario fields (the name defaults to NAME)."""
    import tomllib

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"scenarios file {p} not found; set bench.scenarios to an existing TOML file")
    data = tomllib.loads(p.read_text())
    return {name: Scenario(**{"name": name, **fields}) for name, fields in data.items()}


def arrival_offsets(scenario: Scenario, n: int | None = None) -> list[float] | None:
    """Scheduled send offsets (seconds from start) for an open-loop scenario; None if closed.

    gamma/poisson: inter-arrival ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)), mean 1/rate.
    ``arrival_scaling="vllm"`` rescales the cumulative delays so the last one is exactly
    n/rate (vLLM bench serve); ``"aiperf"`` keeps the raw draws and sends the first at t=0.
    """
    n = scenario.num_requests if n is None else n
    if scenario.arrival == "closed":
        return None
    if scenario.arrival == "trace":
        entries = load_trace(scenario.trace_path or "")[:n]
        t0 = entries[0].timestamp_ms if entries else 0.0
        return [(e.timestamp_ms - t0) / 1000.0 for e in entries]
    rate = scenario.rate
    if rate is None or rate <= 0 or math.isinf(rate):
        return [0.0] * n  # "infinite" rate: everything at once (vLLM --request-rate inf)
    if scenario.arrival == "constant":
        return [i / rate for i in range(n)]
    shape = 1.0 if scenario.arrival == "poisson" else scenario.burstiness
    if shape <= 0:
        raise ValueError("burstiness must be > 0")
    rng = np.random.default_rng(scenario.seed)
    gaps = rng.gamma(shape=shape, scale=1.0 / (rate * shape), size=n)
    if scenario.arrival_scaling == "vllm":
        # vLLM: every request (the first too) waits its draw; cumulative delays are then
        # rescaled so the last one lands exactly on n/rate.
        delays = np.cumsum(gaps)
        if n and delays[-1] > 0:
            delays = delays * ((n / rate) / delays[-1])
    else:
        # AIPerf: the first request goes at t=0, later ones after raw (unscaled) draws.
        delays = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else np.zeros(0)
    return [float(x) for x in delays]


def load_trace(path: str | Path) -> list[TraceEntry]:
    """Read a Mooncake-style JSONL trace (timestamp ms, input_length, output_length, hash_ids)."""
    out: list[TraceEntry] = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        d = json.loads(line)
        out.append(TraceEntry(
            timestamp_ms=float(d.get("timestamp", d.get("timestamp_ms", 0.0))),
            input_length=int(d["input_length"]), output_length=int(d["output_length"]),
            hash_ids=[int(h) for h in d.get("hash_ids", [])]))
    return out
