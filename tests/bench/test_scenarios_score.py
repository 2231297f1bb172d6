"""Scenarios, arrival schedules and the standalone CLI."""

from __future__ import annotations

import asyncio
import json
import threading

import fakeserver
import numpy as np
import pytest
from aiohttp import web

from orchestrator.bench import Scenario, arrival_offsets, builtin_scenarios
from orchestrator.bench.__main__ import main


def test_builtin_scenarios_contract() -> None:
    sc = builtin_scenarios()
    assert {"prefill", "decode", "throughput"} <= set(sc)
    assert sc["prefill"].output_tokens == 1 and sc["prefill"].primary_metric == "ttft_ms_mean"
    assert sc["decode"].concurrency == 1 and sc["decode"].direction == "lower"
    assert sc["throughput"].concurrency > 1 and sc["throughput"].direction == "higher"
    assert {s.arrival for s in sc.values()} >= {"closed", "poisson", "constant", "gamma"}
    # ~5–15 s on a 150 tok/s single-stream server: total decode work / 150.
    for k in ("decode", "throughput"):
        s = sc[k]
        assert 2 <= s.num_requests * s.output_tokens / 150 <= 15


def test_scaled() -> None:
    d = builtin_scenarios()["decode"].scaled(4)
    assert d.output_tokens == 256 and d.num_requests == 64 and d.concurrency == 1  # latency stays single-stream
    t = builtin_scenarios()["throughput_poisson"]
    t4 = t.scaled(4)
    assert t4.concurrency == 4 * t.concurrency and t4.rate == pytest.approx(4 * t.rate)
    assert builtin_scenarios()["prefill"].scaled(2).output_tokens == 1  # prefill keeps 1 output token
    assert builtin_scenarios(2.0)["decode"] == builtin_scenarios()["decode"].scaled(2.0)
    with pytest.raises(ValueError):
        d.scaled(0)


def test_closed_has_no_schedule_and_constant_is_even() -> None:
    assert arrival_offsets(Scenario(name="c")) is None
    off = arrival_offsets(Scenario(name="k", arrival="constant", rate=4.0, num_requests=5))
    assert off == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])


def test_vllm_scaling_lands_on_n_over_rate_and_is_seeded() -> None:
    sc = Scenario(name="p", arrival="poisson", rate=10.0, num_requests=50, seed=3)
    off = arrival_offsets(sc)
    assert off[-1] == pytest.approx(50 / 10.0)  # vLLM rescales cumulative delays to n/rate
    assert all(b >= a for a, b in zip(off, off[1:], strict=False))
    assert off == arrival_offsets(sc)  # same seed, same schedule
    assert off != arrival_offsets(sc.model_copy(update={"seed": 4}))


def test_aiperf_scaling_is_unscaled_and_starts_at_zero() -> None:
    sc = Scenario(name="p", arrival="gamma", burstiness=2.0, rate=10.0, num_requests=20000, seed=1,
                  arrival_scaling="aiperf")
    off = np.array(arrival_offsets(sc))
    assert off[0] == 0.0
    gaps = np.diff(off)
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)  # mean 1/rate without rescaling
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(2.0), rel=0.05)  # gamma CV = 1/sqrt(shape)


def test_burstiness_below_one_is_burstier() -> None:
    def cv(b: float) -> float:
        g = np.diff(arrival_offsets(Scenario(name="g", arrival="gamma", burstiness=b, rate=5.0,
                                             num_requests=5000, seed=2)))
        return float(g.std() / g.mean())

    assert cv(0.25) > cv(1.0) > cv(4.0)
    assert cv(1.0) == pytest.approx(1.0, rel=0.08)  # Poisson: exponential gaps


def test_cli_main_runs_standalone(tmp_path, capsys) -> None:
    """`python -m orchestrator.bench` path: main(argv) against a server in another thread."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(fakeserver.make_app(ttft_ms=2, tpot_ms=1), access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        rc = main(["--url", f"http://127.0.0.1:{port}", "--model", "fake", "--scenario", "decode",
                   "--num-requests", "3", "--output-tokens", "4", "--out", str(tmp_path), "--json"])
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
    assert rc == 0
    metrics = json.loads(capsys.readouterr().out.split("\n  wrote")[0])
    assert metrics["completed"] == 3 and metrics["total_output_tokens"] == 12
    assert (tmp_path / "decode" / "profile_export_aiperf.json").exists()
    assert (tmp_path / "decode.requests.jsonl").read_text().count("\n") == 3


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--confirmations", "-1", "--confirmations must be >= 0, not -1"),
    ("--precision", "0", "--precision must be > 0, not 0.0"),
    ("--min-seconds", "-2", "--min-seconds must be > 0, not -2.0"),
    ("--min-requests", "0", "--min-requests must be >= 1, not 0"),
])
def test_bad_slo_search_options_are_refused_in_one_line(flag: str, value: str, message: str) -> None:
    # Refused before any request: the URL points nowhere.
    with pytest.raises(SystemExit) as e:
        main(["--url", "http://127.0.0.1:9", "--model", "m", "--slo",
              "maximize throughput with p90 TTFT under 300 ms", flag, value])
    assert str(e.value) == message
