"""Was the bench client itself the bottleneck? Then the numbers measure the client, not the server.

Three signs, each seen on this project's shared 2-core machine (docs/facts.md):
- the client's event loop wakes late (`loop_lag_ms`: a 10 ms sleep that takes 25 ms means every
  timestamp taken in that window can be 15 ms late);
- the client process used (nearly) a whole core for the whole run;
- tokens arrive in one burst: every content chunk of a multi-token stream stamped in one read, so
  TTFT equals E2E and TPOT is zero — the loop was too busy to read the socket as bytes came in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SaturationPolicy", "one_burst_fraction", "saturation_reasons"]


@dataclass(frozen=True)
class SaturationPolicy:
    """Limits beyond which a measurement says more about the client than the server."""

    max_loop_lag_ms: float = 10.0
    """Median wake-up delay of the event loop's 10 ms tick. When half the ticks are a whole tick late
    the client is saturated, not merely sharing a busy host (brief scheduling hiccups move the tail,
    not the median; on this project's shared 2-core box the median stayed at 1-6 ms at load 10-15
    and reached 14-18 ms at load 25, as in a vLLM run on that box)."""
    max_client_cpu: float = 0.9
    """The client's CPU as a fraction of one core (asyncio uses one)."""
    max_one_burst: float = 0.5
    """Largest share of multi-token streams whose content all arrived in a single read."""
    min_stream_tokens: int = 4
    """Streams shorter than this are not judged for bursts (one read may honestly hold them)."""


def one_burst_fraction(requests: Sequence[Any], min_tokens: int = 4) -> float:
    """Share of successful streams of >= `min_tokens` tokens whose content chunks share one timestamp."""
    judged = [r for r in requests if r.success and r.osl >= min_tokens and r.chunk_ns]
    if not judged:
        return 0.0
    return sum(1 for r in judged if len(set(r.chunk_ns)) == 1) / len(judged)


def saturation_reasons(metrics: dict[str, float], requests: Sequence[Any], client_cpu: float | None,
                       policy: SaturationPolicy = SaturationPolicy()) -> list[str]:
    """Why this measurement is the client's, not the server's ([] = trustworthy on these signs)."""
    out = []
    lag = metrics.get("loop_lag_ms_p50", 0.0)
    if lag > policy.max_loop_lag_ms:
        out.append(f"client event loop lagged {lag:.1f} ms (median) > {policy.max_loop_lag_ms:g} ms")
    if client_cpu is not None and client_cpu > policy.max_client_cpu:
        out.append(f"client used {client_cpu:.0%} of a core > {policy.max_client_cpu:.0%}")
    burst = one_burst_fraction(requests, policy.min_stream_tokens)
    if burst > policy.max_one_burst:
        out.append(f"{burst:.0%} of streams arrived in one burst (TTFT = E2E)")
    return out
