"""Metric formulas on hand-made event timelines (times in ns; 1 ms = 1_000_000)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.bench.metrics import compute_metrics, failures, is_good, stats
from orchestrator.bench.timeline import RequestRecord

MS = 1_000_000


def rec(i: int = 0, sent: int = 0, first_chunk: int | None = None, tokens: tuple[int, ...] = (),
        usage: int | None = None, done: int | None = None, ok: bool = True, err: str | None = None,
        out: int = 4, client_tokens: int | None = None) -> RequestRecord:
    """A record whose content chunks arrived at ``tokens`` (ms after 0)."""
    ch = [t * MS for t in tokens]
    return RequestRecord(
        index=i, prompt_tokens=8, output_tokens=out, t_scheduled_ns=sent * MS, t_sent_ns=sent * MS,
        t_first_chunk_ns=(first_chunk * MS if first_chunk is not None else (ch[0] if ch else None)),
        t_first_token_ns=ch[0] if ch else None, t_last_token_ns=ch[-1] if ch else None,
        t_done_ns=(done * MS if done is not None else (ch[-1] if ch else sent * MS)), chunk_ns=ch,
        usage_completion_tokens=usage, usage_prompt_tokens=8, client_chunks=len(ch),
        client_tokens=client_tokens, done_seen=ok, success=ok, error=err)


def test_basic_timeline() -> None:
    # sent at 0, tokens at 100, 110, 130, 160 ms -> TTFT 100, E2E 160, TPOT 60/3 = 20
    r = rec(tokens=(100, 110, 130, 160), usage=4)
    assert r.ttft_ns == 100 * MS and r.e2e_ns == 160 * MS
    assert r.tpot_ns == pytest.approx(20 * MS)
    assert r.chunk_gaps_ns == [10 * MS, 20 * MS, 30 * MS]
    m = compute_metrics([r], bench_start_ns=0, bench_end_ns=200 * MS)
    assert m["ttft_ms_mean"] == pytest.approx(100) and m["e2e_ms_max"] == pytest.approx(160)
    assert m["tpot_ms_mean"] == pytest.approx(20)
    assert m["itl_ms_mean"] == pytest.approx(20) and m["itl_ms_min"] == pytest.approx(10)
    assert m["completed"] == 1 and m["failed"] == 0
    assert m["duration_s"] == pytest.approx(0.2)  # vLLM: benchmark wall time
    assert m["duration_aiperf_s"] == pytest.approx(0.16)  # AIPerf: first send -> last done
    assert m["output_throughput"] == pytest.approx(4 / 0.2)
    assert m["output_throughput_aiperf"] == pytest.approx(4 / 0.16)


def test_tpot_uses_usage_osl_not_chunk_count() -> None:
    # Server bundles 2 tokens per chunk: 2 chunks, usage says 4 tokens.
    r = rec(tokens=(50, 80), usage=4)
    assert r.osl == 4
    assert r.tpot_ns == pytest.approx(30 * MS / 3)
    m = compute_metrics([r], bench_start_ns=0, bench_end_ns=100 * MS)
    # Chunks are not tokens: without returned ids the request is uncounted, not a mismatch.
    assert m["osl_mismatch"] == 0 and m["osl_uncounted"] == 1
    assert m["itl_ms_mean"] == pytest.approx(30)  # inter-chunk, not per token


def test_usage_that_disagrees_with_the_counted_ids_is_flagged() -> None:
    liar = rec(0, tokens=(50, 80), usage=8, client_tokens=4)
    honest = rec(1, tokens=(50, 80), usage=4, client_tokens=4)
    m = compute_metrics([liar, honest], bench_start_ns=0, bench_end_ns=100 * MS)
    assert m["osl_mismatch"] == 1 and m["osl_uncounted"] == 0
    assert m["osl_short"] == 1  # the liar's usage also says 8 tokens where 4 were asked


def test_outputs_shorter_than_asked_are_flagged_even_when_usage_agrees() -> None:
    short = rec(0, tokens=(50, 80), usage=3, client_tokens=3, out=4)
    m = compute_metrics([short], bench_start_ns=0, bench_end_ns=100 * MS)
    assert m["osl_mismatch"] == 0 and m["osl_short"] == 1


def test_one_token_output_has_no_tpot() -> None:
    r = rec(tokens=(70,), usage=1, out=1)
    assert r.tpot_ns is None and r.chunk_gaps_ns == []
    m = compute_metrics([r], bench_start_ns=0, bench_end_ns=100 * MS)
    assert m["ttft_ms_mean"] == pytest.approx(70) and m["e2e_ms_mean"] == pytest.approx(70)
    assert m["tpot_ms_count"] == 0 and m["tpot_ms_mean"] == 0.0  # vLLM reports 0 when empty
    assert m["itl_ms_count"] == 0


def test_empty_first_chunk_separates_first_chunk_from_ttft() -> None:
    # Role-only chunk at 5 ms (vLLM chat), first content at 40 ms.
    r = rec(first_chunk=5, tokens=(40, 50), usage=2)
    assert r.first_chunk_ns == 5 * MS and r.ttft_ns == 40 * MS
    m = compute_metrics([r], bench_start_ns=0, bench_end_ns=60 * MS)
    assert m["first_chunk_ms_mean"] == pytest.approx(5) and m["ttft_ms_mean"] == pytest.approx(40)


def test_usage_only_final_chunk_does_not_extend_e2e() -> None:
    # Last content at 90 ms; usage-only chunk and [DONE] at 150 ms -> E2E stays 90.
    r = rec(tokens=(30, 60, 90), usage=3, done=150)
    assert r.e2e_ns == 90 * MS
    m = compute_metrics([r], bench_start_ns=0, bench_end_ns=150 * MS)
    assert m["e2e_ms_mean"] == pytest.approx(90)
    assert m["duration_aiperf_s"] == pytest.approx(0.15)  # but "response done" is the stream end


def test_osl_falls_back_to_client_count_without_usage() -> None:
    r = rec(tokens=(10, 20, 30), usage=None)
    assert r.osl == 3
    m = compute_metrics([r], bench_start_ns=0, bench_end_ns=MS * 40)
    assert m["osl_usage_missing"] == 1 and m["osl_mismatch"] == 0
    r2 = rec(tokens=(10, 20, 30), usage=None, client_tokens=5)
    assert r2.osl == 5


def test_failed_requests_are_excluded_from_latency_and_counted() -> None:
    good = rec(0, tokens=(100, 120), usage=2)
    bad = rec(1, tokens=(5,), usage=None, ok=False, err="connection_error")
    bad2 = rec(2, ok=False, err="http_500")
    m = compute_metrics([good, bad, bad2], bench_start_ns=0, bench_end_ns=200 * MS)
    assert m["completed"] == 1 and m["failed"] == 2
    assert m["ttft_ms_count"] == 1 and m["ttft_ms_mean"] == pytest.approx(100)
    assert m["total_output_tokens"] == 2
    assert failures([good, bad, bad2]) == {"connection_error": 1, "http_500": 1}


def test_all_failed_gives_zero_metrics_not_exceptions() -> None:
    m = compute_metrics([rec(ok=False, err="timeout")], bench_start_ns=0, bench_end_ns=MS)
    assert m["completed"] == 0 and m["failed"] == 1 and m["output_throughput"] == 0
    assert all(math.isfinite(v) for v in m.values())


def test_percentiles_are_numpy_linear() -> None:
    vals = [1.0, 2.0, 3.0, 4.0, 10.0]
    s = stats("x", vals)
    assert s["x_p90"] == pytest.approx(np.percentile(vals, 90))  # 7.6 with linear interpolation
    assert s["x_p90"] == pytest.approx(7.6)
    assert s["x_median"] == s["x_p50"] == 3.0
    assert s["x_std"] == pytest.approx(np.std(vals))
    assert s["x_min"] == 1.0 and s["x_max"] == 10.0


def test_itl_is_pooled_across_requests() -> None:
    a = rec(0, tokens=(10, 20, 30), usage=3)  # gaps 10, 10
    b = rec(1, tokens=(10, 50), usage=2)  # gap 40
    m = compute_metrics([a, b], bench_start_ns=0, bench_end_ns=60 * MS)
    assert m["itl_ms_count"] == 3 and m["itl_ms_mean"] == pytest.approx(20)  # pooled, not per-request mean
    assert m["tpot_ms_mean"] == pytest.approx((10 + 40) / 2)  # per-request TPOT averaged


def test_goodput_queue_time_and_achieved_rate() -> None:
    recs = [rec(i, sent=i * 100, tokens=(i * 100 + 20 * (i + 1), i * 100 + 20 * (i + 1) + 10), usage=2)
            for i in range(3)]  # TTFTs 20, 40, 60 ms; sends every 100 ms
    recs[2].t_scheduled_ns = recs[2].t_sent_ns - 7 * MS  # sent 7 ms late
    m = compute_metrics(recs, bench_start_ns=0, bench_end_ns=300 * MS, target_rate=10.0, slo_ttft_ms=50)
    assert m["goodput"] == pytest.approx(2 / 0.3) and m["goodput_fraction"] == pytest.approx(2 / 3)
    assert m["queue_ms_max"] == pytest.approx(7)
    assert m["achieved_rate"] == pytest.approx(10.0) and m["target_rate"] == 10.0
    assert is_good(recs[0], 50, None, None) and not is_good(recs[2], 50, None, None)
    assert not is_good(recs[0], None, 5, None)  # TPOT 10 ms > 5 ms SLO
