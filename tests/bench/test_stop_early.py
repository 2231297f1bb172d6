"""A scenario stopped as soon as its throughput is out of reach (`Scenario.stop_below`, a screen's early
stop): stopped only when provably out of reach, cleanly (every request cancelled, nothing left running,
the server serving the next scenario), and never for a server fast enough (in-process fake server)."""

from __future__ import annotations

import asyncio
import time

import fakeserver
from conftest import serving

from orchestrator.bench import Scenario, run_scenario
from orchestrator.bench.loadgen import STOPPED

# A one-wave burst, as the H200's throughput scenario: 16 requests at once, 32 tokens each (512 in all).
BURST = Scenario(name="burst", prompt_tokens=16, output_tokens=32, num_requests=16, concurrency=16, warmup_requests=0)


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
            cut = await run_scenario(url, "fake", BURST.model_copy(update={"stop_below": 2048.0}))
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
            return free, floor, await run_scenario(url, "fake", BURST.model_copy(update={"stop_below": floor}))

    free, floor, res = asyncio.run(go())
    assert "stopped_early" not in res.metrics and res.metrics["completed"] == 16 and res.metrics["failed"] == 0
    assert res.metrics["output_throughput"] >= floor


def test_an_open_loop_scenario_stops_with_nothing_left_behind() -> None:
    # Poisson arrivals over ~1 s: stopped while requests are still being scheduled; those sent are
    # cancelled, those not yet sent never are, and no task of ours outlives the stop.
    app = fakeserver.make_app(ttft_ms=5, tpot_ms=20)
    sc = Scenario(name="poisson", prompt_tokens=16, output_tokens=16, num_requests=16, concurrency=0, arrival="poisson",
                  rate=16.0, warmup_requests=0, stop_below=10_000.0)

    async def go():
        async with serving(app) as url:
            res = await run_scenario(url, "fake", sc)
            return res, _client_tasks(), app[fakeserver.STATE].count

    res, leftover, sent = asyncio.run(go())
    assert res.metrics["stopped_early"] == 1 and leftover == [] and sent < 16
    assert res.metrics["duration_s"] < 0.2 and res.metrics["output_throughput"] < 10_000


def test_the_floor_travels_with_the_scenario_to_the_hosts_worker_and_the_server_drains() -> None:
    """Over SSH the bench runs in the measurement worker on the host (`orchestrator.remote.worker`): the
    scenario's JSON carries `stop_below`, and the worker's bench stops there. The server (its own process,
    one request at a time: a burst queues, as on a slow candidate) is left serving: the requests queued
    behind the stopped ones are dropped, not worked through, so the next scenario's first token is prompt."""
    import loadserver

    from orchestrator.bench import ScenarioResult
    from orchestrator.remote.worker import op_bench

    with loadserver.running(slots=1, ttft_ms=2, tpot_ms=5) as url:  # serial: ~16 x 0.16 s for the burst
        sc = BURST.model_copy(update={"stop_below": 1000.0})  # out of reach once 512 / elapsed < 1000: 0.51 s
        t0 = time.perf_counter()
        cut = ScenarioResult.from_dict(op_bench({"base_url": url, "model": "fake", "scenario": sc.model_dump(mode="json")})["result"])
        cut_s = time.perf_counter() - t0
        after = ScenarioResult.from_dict(op_bench({"base_url": url, "model": "fake", "scenario": Scenario(
            name="after", prompt_tokens=16, output_tokens=8, num_requests=2, concurrency=1, warmup_requests=0).model_dump(mode="json")})["result"])
    assert cut.scenario.stop_below == 1000.0 and cut.metrics["stopped_early"] == 1 and cut_s < 1.5
    assert 0 < cut.metrics["completed"] < 16 and cut.metrics["failed"] == 0  # the first few finished, the rest stopped
    assert cut.metrics["output_throughput"] == 512 / cut.metrics["duration_s"] < 1000
    assert after.metrics["completed"] == 2 and after.metrics["ttft_ms_p50"] < 200, after.metrics["ttft_ms_p50"]
