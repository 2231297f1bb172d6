"""Bounds on a scenario's final metrics while its requests still run: what a screen's early stop is proven with.

A scenario stopped early (`Scenario.stop`, `orchestrator.trial.fidelity`) is stopped only once the speedups
its metrics can still reach, multiplied, are under the rule's `below`: then no way the rest of its
requests can go lifts the candidate's short score to the screen's bar. Each bound here holds for
the metric `compute_metrics` would compute at the end, in the only outcome a screen judges: every
request succeeds with its pinned length (a failed or mis-sized request makes the trial fail or
invalid whatever else it measured, and a stopped scenario keeps the failures it saw).

* output tok/s (`output_throughput`): at most every request's max_tokens over the seconds elapsed
  (a valid output is never longer; the end is later than now);
* a request's latency, at the end, is at least (`request_bounds`):
  - TTFT: its value where its first content came; else now - its send time (its first content is
    stamped by a later read); 0 where it was not sent yet;
  - E2E: its last content so far - its send time (the last content's stamp only moves later); now -
    its send time where no content came yet; 0 where not sent;
  - TPOT = (last content - first content) / (max_tokens - 1): (last content so far - first content) /
    (max_tokens - 1) with the length pinned (`ignore_eos`: the output is max_tokens long or the trial
    is invalid); 0 where no content came yet. Without pinned lengths, or with a one-token request
    (no TPOT: left out of the statistic, which changes who is in it), no bound.
* the scenario's statistic over those requests (`stat_bound`): the mean, or numpy's linear-interpolation
  median / p50, of the per-request bounds. Both are monotone non-decreasing in every element: the mean
  plainly; a linear percentile at q of n values is (1 - w) s_(j) + w s_(j+1), the sorted values' j-th
  and (j+1)-th with j and w in [0, 1) fixed by n and q, and each order statistic s_(j) = min over
  (n-j+1)-subsets of their max is monotone in every element, so with final values x_i >= bound b_i,
  stat(x) >= stat(b). Other statistics (p90-p99 share the argument but are not tested here; std is not
  monotone; ITL pools gaps whose count is unknown) get no bound: a rule naming one never stops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .timeline import RequestRecord

__all__ = ["LATENCIES", "STATS", "THROUGHPUT", "bounded", "request_bounds", "speedup_bound", "stat_bound"]

THROUGHPUT = "output_throughput"
LATENCIES = ("ttft_ms", "tpot_ms", "e2e_ms")
"""The per-request latencies a bound is known for."""
STATS = ("mean", "median", "p50")
"""The statistics over requests a bound is proven (and tested) for."""


def bounded(key: str) -> bool:
    """Whether metric `key` (a `compute_metrics` key) has a bound while its scenario runs."""
    if key == THROUGHPUT:
        return True
    prefix, _, stat = key.rpartition("_")
    return prefix in LATENCIES and stat in STATS


def request_bounds(latency: str, recs: Sequence[RequestRecord], now_ns: int, *, pinned: bool) -> list[float] | None:
    """Each request's lower bound (ms) on `latency` (one of LATENCIES) at the end, as of `now_ns`; None when
    there is none (TPOT without pinned lengths, or with a request of one output token)."""
    out = []
    for r in recs:
        sent = r.t_sent_ns > 0
        if latency == "ttft_ms":
            ns = r.t_first_token_ns - r.t_sent_ns if r.t_first_token_ns is not None else (now_ns - r.t_sent_ns if sent else 0)
        elif latency == "e2e_ms":
            ns = r.t_last_token_ns - r.t_sent_ns if r.t_last_token_ns is not None else (now_ns - r.t_sent_ns if sent else 0)
        elif latency == "tpot_ms":
            if not pinned or r.output_tokens <= 1:
                return None
            last = r.t_last_token_ns
            ns = (last - r.t_first_token_ns) / (r.output_tokens - 1) if r.t_first_token_ns is not None and last is not None else 0
        else:
            return None
        out.append(max(0.0, ns / 1e6))
    return out


def stat_bound(key: str, recs: Sequence[RequestRecord], now_ns: int, *, pinned: bool) -> float | None:
    """A lower bound on metric `key` (`{latency}_{stat}`) at the end, as of `now_ns`; None when none is known."""
    prefix, _, stat = key.rpartition("_")
    if prefix not in LATENCIES or stat not in STATS or not recs:
        return None
    b = request_bounds(prefix, recs, now_ns, pinned=pinned)
    if b is None:
        return None
    a = np.asarray(b, dtype=np.float64)
    # As `metrics.stats` computes them: np.median and np.percentile(..., method="linear") agree at 50.
    return float(a.mean()) if stat == "mean" else float(np.percentile(a, 50, method="linear"))


def speedup_bound(speedups: Sequence[tuple[str, float]], recs: Sequence[RequestRecord], possible_tokens: int,
                  t0_ns: int, now_ns: int, *, pinned: bool) -> tuple[float, dict[str, float]]:
    """(the most the product of `speedups` ((metric key, the baseline's value) pairs) can still reach, the bound
    of each key), as of `now_ns`: a throughput's speedup is its value over the baseline's, at most its bound
    over it; a latency's the baseline's over its value, at most the baseline's over its bound. A key with no
    bound, or a latency bounded by 0 so far, can still reach any speedup: inf."""
    product, values = 1.0, {}
    for key, base in speedups:
        if base <= 0 or not np.isfinite(base):
            return float("inf"), values  # `Objective.speedup` is then 1 whatever the value: no bound here
        if key == THROUGHPUT:
            elapsed = (now_ns - t0_ns) / 1e9
            if elapsed <= 0:
                return float("inf"), values
            values[key] = possible_tokens / elapsed
            product *= values[key] / base
            continue
        b = stat_bound(key, recs, now_ns, pinned=pinned)
        if b is None or b <= 0:
            return float("inf"), values
        values[key] = b
        product *= base / b
    return product, values
