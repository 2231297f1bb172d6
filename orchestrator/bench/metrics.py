"""Metric formulas (vLLM / AIPerf conventions).  Pure functions of request records.

- TTFT: POST sent → first chunk with non-empty content; ``first_chunk`` keeps vLLM's
  first-SSE-event time beside it.
- E2E: POST sent → last content-bearing chunk (not [DONE]).
- TPOT: per request (E2E − TTFT)/(OSL − 1), requests with OSL ≤ 1 excluded.
- ITL: pooled gaps between content chunks of all successful requests (``itl`` in vLLM,
  ``inter_chunk_latency`` in AIPerf).
- Throughput: Σ over successful requests / duration, with both durations: vLLM's benchmark
  wall time and AIPerf's first-send → last-response-done.
- Percentiles: numpy linear interpolation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from gates.api import ApiMode

from .timeline import RequestRecord

STAT_NAMES = ("mean", "median", "std", "p50", "p90", "p95", "p99", "min", "max")


def stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """``{prefix}_{mean,median,std,p50,...}``; all 0.0 when there are no values (vLLM does the same)."""
    out: dict[str, float] = {}
    if len(values) == 0:
        for s in STAT_NAMES:
            out[f"{prefix}_{s}"] = 0.0
        out[f"{prefix}_count"] = 0.0
        return out
    a = np.asarray(values, dtype=np.float64)
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99], method="linear")
    out.update({
        f"{prefix}_mean": float(a.mean()),
        f"{prefix}_median": float(np.median(a)),
        f"{prefix}_std": float(a.std()),  # population std, as vLLM (np.std) reports
        f"{prefix}_p50": float(p50),
        f"{prefix}_p90": float(p90),
        f"{prefix}_p95": float(p95),
        f"{prefix}_p99": float(p99),
        f"{prefix}_min": float(a.min()),
        f"{prefix}_max": float(a.max()),
        f"{prefix}_count": float(a.size),
    })
    return out


def failures(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Failure reason → count."""
    return dict(Counter(r.error or "unknown" for r in records if not r.success))


def is_good(r: RequestRecord, slo_ttft_ms: float | None, slo_tpot_ms: float | None,
            slo_e2e_ms: float | None) -> bool:
    """A successful request meeting every SLO that is set (vLLM goodput semantics)."""
    if not r.success:
        return False
    if slo_ttft_ms is not None and (r.ttft_ns is None or r.ttft_ns / 1e6 > slo_ttft_ms):
        return False
    tpot = r.tpot_ns
    if slo_tpot_ms is not None and tpot is not None and tpot / 1e6 > slo_tpot_ms:
        return False
    return not (slo_e2e_ms is not None and (r.e2e_ns is None or r.e2e_ns / 1e6 > slo_e2e_ms))


def compute_metrics(
    records: Sequence[RequestRecord],
    *,
    bench_start_ns: int,
    bench_end_ns: int,
    target_rate: float | None = None,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    slo_e2e_ms: float | None = None,
    loop_lag_ms: Sequence[float] = (),
    intended_prompt_check: bool = False,
    mode: ApiMode = ApiMode(),
    tolerance: float | None = None,
    passes: Sequence[tuple[int, float]] = (),
) -> dict[str, float]:
    """Flat metric dict for one measured (post-warmup) run.

    ``mode``: the engine's API (gates/api.py). Lengths are pinned with ``ignore_eos`` where it
    exists, and any output of another length counts in ``osl_short`` (the trial is invalid).
    Without it they are bounded: an output that stopped at EOS (``finish_reason: "stop"``) is
    counted in ``osl_eos_short`` and its per-token metrics use the tokens it delivered (TPOT
    per request, throughput over delivered tokens, as AIPerf and ``vllm bench serve`` without
    ``--ignore-eos`` do); one longer than asked, or short without saying so, is still ``osl_short``.
    Without token ids the client's count is the re-tokenized text, agreeing with usage within
    ``tolerance`` (the gates' ``retokenize_tolerance``) per reply, or else over the scenario's
    totals with no reply off by more than half.

    ``passes``: a bench measured in several passes (``orchestrator.bench.passes``): (how many of
    ``records``, in order, each pass measured, its measured wall time in s). Durations and rates are then
    summed over the passes, never counting the time between them; ``bench_start_ns``/``bench_end_ns``
    are not used."""
    ok = [r for r in records if r.success]
    m: dict[str, float] = {}
    m.update(stats("ttft_ms", [r.ttft_ns / 1e6 for r in ok if r.ttft_ns is not None]))
    m.update(stats("first_chunk_ms", [r.first_chunk_ns / 1e6 for r in ok if r.first_chunk_ns is not None]))
    m.update(stats("tpot_ms", [r.tpot_ns / 1e6 for r in ok if r.tpot_ns is not None]))
    m.update(stats("itl_ms", [g / 1e6 for r in ok for g in r.chunk_gaps_ns]))
    m.update(stats("e2e_ms", [r.e2e_ns / 1e6 for r in ok if r.e2e_ns is not None]))
    m.update(stats("queue_ms", [r.queue_ns / 1e6 for r in records]))
    m.update(stats("loop_lag_ms", list(loop_lag_ms)))

    groups, i = [], 0
    for n, _ in passes or ((len(records), 0.0),):
        groups.append(records[i:i + n])
        i += n
    dur_vllm = max(1e-9, sum(d for _, d in passes) if passes else (bench_end_ns - bench_start_ns) / 1e9)
    spans = [(max((r.t_done_ns or r.t_last_token_ns or r.t_sent_ns) for r in g) - min(r.t_sent_ns for r in g)) / 1e9
             for g in groups if g]
    dur_aiperf = max(1e-9, sum(spans)) if spans else dur_vllm
    out_tok = float(sum(r.osl for r in ok))
    in_tok = float(sum(r.usage_prompt_tokens if r.usage_prompt_tokens is not None else r.prompt_tokens
                       for r in ok))
    n_good = sum(is_good(r, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms) for r in records)
    m.update({
        "completed": float(len(ok)),
        "failed": float(len(records) - len(ok)),
        "duration_s": dur_vllm,
        "duration_aiperf_s": dur_aiperf,
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "output_throughput": out_tok / dur_vllm,
        "output_throughput_aiperf": out_tok / dur_aiperf,
        "request_throughput": len(ok) / dur_vllm,
        "request_throughput_aiperf": len(ok) / dur_aiperf,
        "total_token_throughput": (in_tok + out_tok) / dur_vllm,
        "goodput": n_good / dur_vllm,
        "goodput_fraction": n_good / len(records) if records else 0.0,
    })
    # Achieved vs target arrival rate: (n−1) sends over the span between first and last send (per pass).
    gaps, span = 0, 0.0
    for g in groups:
        sends = sorted(r.t_sent_ns for r in g)
        if len(sends) > 1:
            gaps, span = gaps + len(sends) - 1, span + (sends[-1] - sends[0]) / 1e9
    m["achieved_rate"] = gaps / span if span > 0 else 0.0
    m["target_rate"] = float(target_rate) if target_rate else 0.0
    # Integrity signals: server usage vs client count; server prompt length vs intended.
    # Client counts come from token ids only (never re-tokenized text, never chunks: a chunk can
    # hold several tokens or none); a server that returns no ids is counted as uncounted.
    if tolerance is None:
        from gates.thresholds import load_thresholds

        tolerance = float(load_thresholds()["integrity"]["retokenize_tolerance"]) if not mode.token_ids else 0.0

    def stopped(r: RequestRecord) -> bool:  # ended at EOS, which an engine without ignore_eos may do
        return not mode.ignore_eos and r.finish_reason == "stop" and r.osl < r.output_tokens

    def client(r: RequestRecord) -> int:  # usage bills the EOS; its text is empty
        return r.client_tokens + (1 if r.client_tokens_from_text and stopped(r) else 0)

    # Text has no one true split: a round trip merges tokens a model spelled unusually (a degenerate
    # 16-token reply re-tokenized 13), so without ids one reply may miss the tolerance by itself. Its
    # count is then judged with the scenario's: the totals must agree within the tolerance, and no
    # reply may be off by more than half (a server short-changing every reply fails the totals).
    pairs = [(r, client(r), r.usage_completion_tokens) for r in ok
             if r.usage_completion_tokens is not None and r.client_tokens is not None]
    asked = [(r, r.client_tokens, r.output_tokens) for r in ok if not stopped(r) and r.client_tokens is not None]

    def off(rows: list[tuple[RequestRecord, int, int]]) -> set[int]:
        """Indices into ``rows`` whose two counts disagree."""
        tight = {i for i, (_, a, b) in enumerate(rows) if not mode.agree(a, b, tolerance)}
        if mode.token_ids or not tight:
            return tight
        if mode.agree(sum(a for _, a, _ in rows), sum(b for _, _, b in rows), tolerance):
            return {i for i in tight if not mode.agree(rows[i][1], rows[i][2], 0.5)}
        return tight

    m["osl_mismatch"] = float(len(off(pairs)))
    m["osl_usage_missing"] = float(sum(1 for r in ok if r.usage_completion_tokens is None))
    m["osl_uncounted"] = float(sum(1 for r in ok if r.client_tokens is None))
    # Shorter or longer than asked (every request pins its length with ignore_eos), by either count.
    miscounted = {id(asked[i][0]) for i in off(asked)}
    m["osl_short"] = float(sum(1 for r in ok if not stopped(r) and (r.osl != r.output_tokens or id(r) in miscounted)))
    m["osl_eos_short"] = float(sum(1 for r in ok if stopped(r)))
    m["osl_pinned"] = float(mode.ignore_eos)
    if intended_prompt_check:
        m["isl_mismatch"] = float(sum(1 for r in ok if r.usage_prompt_tokens is not None
                                      and r.usage_prompt_tokens != r.prompt_tokens))
    return m
