"""A scenario stopped as soon as its throughput is out of reach (`Scenario.stop`, a screen's early
stop): stopped only when provably out of reach, cleanly (every request cancelled, nothing left running,
the server serving the next scenario), and never for a server fast enough (in-process fake server)."""

from __future__ import annotations

import asyncio
import time

import fakeserver
from conftest import serving

from orchestrator.bench import Scenario, run_scenario
from orchestrator.bench.loadgen import STOPPED
from orchestrator.bench.scenarios import StopRule

# A one-wave burst, as the H200's throughput scenario: 16 requests at once, 32 tokens each (512 in all).
BURST = Scenario(name="burst", prompt_tokens=16, output_tokens=32, num_requests=16, concurrency=16, warmup_requests=0)


def _floor(tok_s: float) -> StopRule:
    """Stop once output throughput can no longer reach `tok_s` (its speedup over a baseline of 1 tok/s)."""
    return StopRule(speedups=(("output_throughput", 1.0),), below=tok_s)


def _client_tasks() -> list[str]:
    """The load generator's own tasks still alive (the server's handlers, in this loop too, are not ours)."""
    return [t.get_coro().__qualname__ for t in asyncio.all_tasks() if t is not asyncio.current_task()
            and t.get_coro().__qualname__.split(".")[0] in ("send_request", "_closed_loop", "_open_loop", "worker", "one")]


def test_a_burst_that_cannot_reach_the_floor_is_stopped_at_the_bound_and_the_server_serves_on() -> None:
    # 40 ms a token: the burst takes ~1.25 s, 512 / 1.25 = ~410 tok/s. Asked for 2048 tok/s it is out of
    # reach once 512 / elapsed < 2048, at 0.25 s: stopped there, a fifth of its time.
    app = fakeserver.make_app(ttft_ms=5, tpot_ms=40)

    async def go():
        async with serving(app) as url:
            t0 = time.perf_counter()
            cut = await run_scenario(url, "fake", BURST.model_copy(update={"stop": _floor(2048.0)}))
            cut_s = time.perf_counter() - t0
            leftover = _client_tasks()
            t0 = time.perf_counter()
            full = await run_scenario(url, "fake", BURST)  # the same server, right after: whole and healthy
            return cut, cut_s, leftover, full, time.perf_counter() - t0

    cut, cut_s, leftover, full, full_s = asyncio.run(go())
    m = cut.metrics
    assert m["stopped_early"] == 1 and m["stop_below"] == 2048.0 and m["output_tokens_possible"] == 512
    assert 0.25 <= m["duration_s"] < 0.5 and cut_s < full_s / 2, (m["duration_s"], cut_s, full_s)
    # The bound it was stopped on: all 512 tokens over the time elapsed, under the floor.
    assert m["output_throughput"] == 512 / m["duration_s"] < 2048
    assert m["stopped_requests"] == 16 and m["failed"] == 0 and cut.failures == {}
    assert all(r.error == STOPPED and not r.success for r in cut.requests)
    assert 0 < m["output_tokens_seen"] < 512  # tokens were coming: partial streams, cancelled
    assert leftover == []  # no request of ours left running
    # Uncut, the burst really is under the floor (the stop changed when it ended, not what it would say).
    assert full.metrics["failed"] == 0 and full.metrics["completed"] == 16 and "stopped_early" not in full.metrics
    assert full.metrics["output_throughput"] < 2048


def test_a_server_fast_enough_is_never_stopped() -> None:
    # 5 ms a token: ~3000 tok/s. A floor just under what it reaches never stops it (the bound is only
    # under the floor once the time is past what a floor-reaching run could take).
    app = fakeserver.make_app(ttft_ms=5, tpot_ms=5)

    async def go():
        async with serving(app) as url:
            free = await run_scenario(url, "fake", BURST)
            floor = free.metrics["output_throughput"] * 0.7
            return free, floor, await run_scenario(url, "fake", BURST.model_copy(update={"stop": _floor(floor)}))

    free, floor, res = asyncio.run(go())
    assert "stopped_early" not in res.metrics and res.metrics["completed"] == 16 and res.metrics["failed"] == 0
    assert res.metrics["output_throughput"] >= floor


def test_an_open_loop_scenario_stops_with_nothing_left_behind() -> None:
    # Poisson arrivals over ~1 s: stopped while requests are still being scheduled; those sent are
    # cancelled, those not yet sent never are, and no task of ours outlives the stop.
    app = fakeserver.make_app(ttft_ms=5, tpot_ms=20)
    sc = Scenario(name="poisson", prompt_tokens=16, output_tokens=16, num_requests=16, concurrency=0, arrival="poisson",
                  rate=16.0, warmup_requests=0, stop=_floor(10_000.0))

    async def go():
        async with serving(app) as url:
            res = await run_scenario(url, "fake", sc)
            return res, _client_tasks(), app[fakeserver.STATE].count

    res, leftover, sent = asyncio.run(go())
    assert res.metrics["stopped_early"] == 1 and leftover == [] and sent < 16
    assert res.metrics["duration_s"] < 0.2 and res.metrics["output_throughput"] < 10_000


def test_the_floor_travels_with_the_scenario_to_the_hosts_worker_and_the_server_drains() -> None:
    """Over SSH the bench runs in the measurement worker on the host (`orchestrator.remote.worker`): the
    scenario's JSON carries `stop`, and the worker's bench stops there. The server (its own process,
    one request at a time: a burst queues, as on a slow candidate) is left serving: the requests queued
    behind the stopped ones are dropped, not worked through, so the next scenario's first token is prompt."""
    import loadserver

    from orchestrator.bench import ScenarioResult
    from orchestrator.remote.worker import op_bench

    with loadserver.running(slots=1, ttft_ms=2, tpot_ms=5) as url:  # serial: ~16 x 0.16 s for the burst
        sc = BURST.model_copy(update={"stop": _floor(1000.0)})  # out of reach once 512 / elapsed < 1000: 0.51 s
        t0 = time.perf_counter()
        cut = ScenarioResult.from_dict(op_bench({"base_url": url, "model": "fake", "scenario": sc.model_dump(mode="json")})["result"])
        cut_s = time.perf_counter() - t0
        after = ScenarioResult.from_dict(op_bench({"base_url": url, "model": "fake", "scenario": Scenario(
            name="after", prompt_tokens=16, output_tokens=8, num_requests=2, concurrency=1, warmup_requests=0).model_dump(mode="json")})["result"])
    assert cut.scenario.stop.below == 1000.0 and cut.metrics["stopped_early"] == 1 and cut_s < 1.5
    assert 0 < cut.metrics["completed"] < 16 and cut.metrics["failed"] == 0  # the first few finished, the rest stopped
    assert cut.metrics["output_throughput"] == 512 / cut.metrics["duration_s"] < 1000
    assert after.metrics["completed"] == 2 and after.metrics["ttft_ms_p50"] < 200, after.metrics["ttft_ms_p50"]


# --- latency bounds (`orchestrator.bench.bounds`): a decode stopped once its TPOT cannot get under a limit ---

DECODE = Scenario(name="decode", prompt_tokens=16, output_tokens=32, num_requests=2, concurrency=1, warmup_requests=0,
                  primary_metric="tpot_ms_mean", direction="lower")


def _tpot_under(limit_ms: float, key: str = "tpot_ms_p50") -> StopRule:
    """Stop once `key` can no longer get under `limit_ms` (its speedup over a baseline of `limit_ms` under 1)."""
    return StopRule(speedups=((key, limit_ms),), below=1.0)


def test_a_decode_whose_tpot_cannot_get_under_the_limit_is_stopped_at_a_bound_under_its_real_tpot() -> None:
    # 40 ms a token, 2 requests one at a time: ~2.5 s whole. Its TPOT p50 (the mean of the two, numpy's
    # median) is bounded by half the first request's (last token so far - first) / 31 while the second is
    # not sent: over 8 ms once ~13 tokens came, ~0.5 s in.
    app = fakeserver.make_app(ttft_ms=5, tpot_ms=40)

    async def go():
        async with serving(app) as url:
            cut = await run_scenario(url, "fake", DECODE.model_copy(update={"stop": _tpot_under(8.0)}))
            leftover = _client_tasks()
            return cut, leftover, await run_scenario(url, "fake", DECODE)

    cut, leftover, full = asyncio.run(go())
    m = cut.metrics
    assert m["stopped_early"] == 1 and m["stopped_requests"] == 2 and m["failed"] == 0 and leftover == []
    assert 8.0 < m["tpot_ms_p50"] <= full.metrics["tpot_ms_p50"], (m["tpot_ms_p50"], full.metrics["tpot_ms_p50"])
    assert m["stop_bound"] == 8.0 / m["tpot_ms_p50"] < 1.0  # the speedup it was proven with
    assert m["duration_s"] < full.metrics["duration_s"] / 3, (m["duration_s"], full.metrics["duration_s"])
    assert "stopped_early" not in full.metrics and full.metrics["tpot_ms_p50"] > 8.0


def test_a_decode_fast_enough_and_a_statistic_without_a_proven_bound_are_never_stopped() -> None:
    fast = fakeserver.make_app(ttft_ms=5, tpot_ms=5)
    slow = fakeserver.make_app(ttft_ms=5, tpot_ms=40)

    async def go():
        async with serving(fast) as url:
            ok = await run_scenario(url, "fake", DECODE.model_copy(update={"stop": _tpot_under(8.0)}))
        async with serving(slow) as url:  # the same slow server as above: p99, or lengths not pinned, never stop it
            p99 = await run_scenario(url, "fake", DECODE.model_copy(update={"num_requests": 1, "stop": _tpot_under(8.0, "tpot_ms_p99")}))
            unpinned = await run_scenario(url, "fake", DECODE.model_copy(update={"num_requests": 1, "stop": _tpot_under(8.0)}),
                                          capabilities={"ignore_eos": False})
        return ok, p99, unpinned

    ok, p99, unpinned = asyncio.run(go())
    assert "stopped_early" not in ok.metrics and ok.metrics["completed"] == 2 and ok.metrics["tpot_ms_p50"] < 8.0
    for res in (p99, unpinned):
        assert "stopped_early" not in res.metrics and res.metrics["completed"] == 1 and res.metrics["tpot_ms_p99"] > 8.0


def test_every_latency_bound_is_under_the_final_statistic_at_any_moment() -> None:
    """The proof's claim, checked on random timelines: at any moment, the bound computed from what had
    happened by then (`request_bounds`, `stat_bound`) is at most the statistic `compute_metrics` gives at the end."""
    import random

    from orchestrator.bench.bounds import stat_bound
    from orchestrator.bench.metrics import compute_metrics
    from orchestrator.bench.timeline import RequestRecord

    rng = random.Random(7)
    for _ in range(300):
        n, out = rng.randint(1, 7), rng.choice([2, 3, 16])
        final, t = [], 1_000
        for i in range(n):
            r = RequestRecord(index=i, prompt_tokens=4, output_tokens=out)
            t += rng.randint(0, 50_000_000) if rng.random() < 0.5 else 0  # concurrent or one after another
            r.t_sent_ns = t
            chunks = sorted(t + rng.randint(1, 400_000_000) for _ in range(rng.randint(1, out)))
            r.chunk_ns, r.t_first_token_ns, r.t_last_token_ns = chunks, chunks[0], chunks[-1]
            r.usage_completion_tokens = r.client_tokens = out
            r.success, r.finish_reason = True, "length"
            final.append(r)
        end = max(r.t_last_token_ns for r in final)
        m = compute_metrics(final, bench_start_ns=1_000, bench_end_ns=end, tolerance=0.0)
        for _ in range(5):
            now = rng.randint(1_000, end + 1)
            seen = []
            for r in final:  # what the bench had seen by `now`
                c = [x for x in r.chunk_ns if x <= now]
                seen.append(RequestRecord(index=r.index, prompt_tokens=4, output_tokens=out, t_sent_ns=r.t_sent_ns if r.t_sent_ns <= now else 0,
                                          t_first_token_ns=c[0] if c else None, t_last_token_ns=c[-1] if c else None, chunk_ns=c))
            for key in ("ttft_ms_p50", "ttft_ms_mean", "tpot_ms_p50", "tpot_ms_median", "tpot_ms_mean", "e2e_ms_p50", "e2e_ms_mean"):
                b = stat_bound(key, seen, now, pinned=True)
                final_key = key.replace("median", "p50")
                assert b is not None and b <= m[final_key] + 1e-9, (key, b, m[final_key])
            assert stat_bound("tpot_ms_p99", seen, now, pinned=True) is None and stat_bound("itl_ms_p50", seen, now, pinned=True) is None
            assert stat_bound("tpot_ms_p50", seen, now, pinned=False) is None
