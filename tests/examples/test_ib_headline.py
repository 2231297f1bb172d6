"""benchmarks/gpu/headline.py on synthetic ib_baseline.py results (no GPU, no server)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")  # sol.py imports it

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"

import headline  # noqa: E402
import ib_baseline  # noqa: E402

SOL = {"ceilings": {"copy_bytes_per_s": 4.0e12, "bf16_flops_per_s": 8.0e14, "gpu": "test"},
       "model": {"matmul_params": 7.0e9, "weight_bytes": 1.4e10, "layers": 32, "d_attn": 4096,
                 "kv_bytes_per_token": 131072}}


def _sc(ttft: float, tpot: float, rps: float, tps: float, ok: bool = True) -> dict:
    return {"ok": ok, "metrics": {"ttft_ms_p50": ttft, "ttft_ms_mean": ttft * 1.1, "tpot_ms_p50": tpot,
                                  "tpot_ms_mean": tpot * 1.05, "request_throughput": rps, "output_throughput": tps}}


def _report() -> dict:
    naive = {"prefill": _sc(400, 60, 0.1, 15), "decode": _sc(100, 65, 0.03, 15),
             "throughput": _sc(100, 60, 0.12, 16), "general": _sc(20000, 62, 0.06, 15)}
    fast = {"prefill": _sc(100, 8, 1, 100), "decode": _sc(20, 5, 0.4, 200),
            "throughput": _sc(300, 30, 2.4, 1500), "general": _sc(1000, 15, 0.9, 230)}
    return {"servers": {"fast": {"scenarios": fast}, "ib_naive": {"scenarios": naive}}}


def test_speedups_are_ib_scores() -> None:
    r = _report()
    sp = headline.speedups({k: v["metrics"] for k, v in r["servers"]["ib_naive"]["scenarios"].items()},
                           {k: v["metrics"] for k, v in r["servers"]["fast"]["scenarios"].items()})
    assert sp["prefill"] == pytest.approx(4.0)  # TTFT p50 400 -> 100
    assert sp["decode"] == pytest.approx(13.0)  # TPOT p50 65 -> 5
    assert sp["throughput"] == pytest.approx(20.0)  # req/s 0.12 -> 2.4
    assert sp["general"] == pytest.approx((20.0 * 62 / 15 * 15.0) ** (1 / 3))
    assert headline.geomean(list(sp.values())) == pytest.approx(math.prod(sp.values()) ** 0.25)
    assert headline.geomean([2.0, None]) is None


def test_write_headline_updates_and_names_sources(tmp_path: Path) -> None:
    res, sol, out = tmp_path / "ib.json", tmp_path / "sol.json", tmp_path / "headline.json"
    res.write_text(json.dumps(_report()))
    sol.write_text(json.dumps(SOL))
    out.write_text(json.dumps({"other": 1, "tpot_b_ms": {"value": 99}}))
    h = headline.write_headline(res, sol, GPU / "scenarios_ib.toml", out)
    doc = json.loads(out.read_text())
    assert doc["other"] == 1 and doc["tpot_b_ms"]["value"] == pytest.approx(5 * 1.05)
    assert doc["ttft_a_ms"]["value"] == pytest.approx(110.0)
    for key in ("tpot_b_ms", "ttft_a_ms", "c_frac_of_floor", "geomean_vs_ib_naive"):
        assert doc[key]["source"] == str(res) and doc[key]["server"] == "fast"
    assert doc["c_frac_of_floor"]["floor_source"] == str(sol)
    # C's floor at the full-size shape (64 x 512/128): decode-bound, 128 steps reading the weights.
    floor = doc["c_frac_of_floor"]["floor_tok_s"]
    assert floor == pytest.approx(64 * 128 / max(64 * (2 * 7e9 * 512 + 2 * 32 * 512 * 512 * 4096) / 8e14,
                                                 128 * 1.4e10 / 4e12))
    assert doc["c_frac_of_floor"]["value"] == pytest.approx(1500 / floor)
    assert h["geomean_vs_ib_naive"]["value"] == pytest.approx(
        headline.geomean(list(h["geomean_vs_ib_naive"]["per_scenario"].values())))
    assert set(doc["frac_of_floor"]["value"]) == {"prefill", "decode", "throughput"}


def test_failed_scenario_gives_no_speedup(tmp_path: Path) -> None:
    r = _report()
    r["servers"]["fast"]["scenarios"]["decode"]["ok"] = False
    h = headline.compute(r, SOL, {"prefill": {"prompt_tokens": 4096}, "decode": {"prompt_tokens": 512, "output_tokens": 512},
                                  "throughput": {"num_requests": 64, "prompt_tokens": 512, "output_tokens": 128}})
    assert h["geomean_vs_ib_naive"]["per_scenario"]["decode"] is None
    assert h["geomean_vs_ib_naive"]["value"] is None and h["tpot_b_ms"]["value"] is None


def test_naive_cap_keeps_shapes() -> None:
    from orchestrator.bench.scenarios import load_scenarios_file

    full = load_scenarios_file(GPU / "scenarios_ib.toml")
    assert {n: (s.prompt_tokens, s.output_tokens, s.concurrency) for n, s in full.items()} == {
        "prefill": (4096, 128, 1), "decode": (512, 512, 1), "throughput": (512, 128, 64), "general": (2048, 256, 4)}
    cap = ib_baseline.capped(full, ib_baseline.parse_cap(ib_baseline.DEFAULT_CAP))
    assert {n: s.num_requests for n, s in cap.items()} == {"prefill": 2, "decode": 2, "throughput": 4, "general": 4}
    assert all(cap[n].prompt_tokens == full[n].prompt_tokens and cap[n].warmup_requests == 0 for n in full)
    assert ib_baseline.command("{python} x.py --model {model} --port {port}", {"python": "py", "model": "/m"}) == [
        "py", "x.py", "--model", "/m", "--port", "{port}"]


def test_naive_plan_measures_every_scenario_within_its_budget() -> None:
    """The naive server's counts are planned up front: one request per scenario always (D included),
    then more in turn while the window holds; the plan is what the JSON states."""
    from orchestrator.bench.scenarios import load_scenarios_file

    full = load_scenarios_file(GPU / "scenarios_ib.toml")
    cap = ib_baseline.parse_cap(ib_baseline.DEFAULT_CAP)
    per = {n: ib_baseline.naive_request_s(s) for n, s in full.items()}
    assert per["general"] == pytest.approx(0.2 + 2048 * 5e-5 + 256 * 0.09)
    for budget in (0.0, 100.0, 210.0, 1000.0):
        plan = ib_baseline.plan_naive(full, budget, cap)
        counts = {n: p["num_requests"] for n, p in plan.items()}
        assert all(1 <= counts[n] <= cap[n] for n in full), counts  # every scenario measured, none over its cap
        total = sum(p["est_s"] for p in plan.values())
        assert total <= max(budget, sum(per.values())) + 0.5  # within the window (or the minimum)
        left = budget - total  # nothing that fits was left out
        assert all(counts[n] == cap[n] or per[n] > left for n in full), (budget, counts)
    assert {n: p["num_requests"] for n, p in ib_baseline.plan_naive(full, 160.0, cap).items()} == {
        "prefill": 2, "decode": 1, "throughput": 3, "general": 2}  # the default 200 s less 40 s of start-up
    assert {n: p["num_requests"] for n, p in ib_baseline.plan_naive(full, 210.0, cap).items()} == {
        "prefill": 2, "decode": 2, "throughput": 3, "general": 2}


def _rec(i: int, sent: float, first: float, gaps: list[float]):
    from orchestrator.bench.timeline import RequestRecord

    ms = 1_000_000
    chunks = [int(first * ms)]
    for g in gaps:
        chunks.append(chunks[-1] + int(g * ms))
    return RequestRecord(index=i, prompt_tokens=8, output_tokens=len(chunks), t_sent_ns=int(sent * ms),
                         t_first_token_ns=chunks[0], t_last_token_ns=chunks[-1], chunk_ns=chunks, client_chunks=len(chunks),
                         success=True)


def test_request_cis() -> None:
    """95% t intervals per metric; one request: TPOT from its inter-token gaps, TTFT without interval;
    served one at a time, request throughput is 1 / service time (queueing excluded)."""
    ci = ib_baseline.ci95([10.0, 12.0, 14.0])
    assert ci["mean"] == pytest.approx(12.0) and ci["hi"] - ci["mean"] == pytest.approx(4.30 * 2 / 3 ** 0.5)
    assert ib_baseline.ci95([5.0])["lo"] is None and ib_baseline.ci95([])["mean"] is None
    one = ib_baseline.request_cis([_rec(0, 0, 100, [80, 82, 78, 80])])
    assert one["tpot_from"] == "inter-token gaps of one request" and one["tpot_ms"]["n"] == 4
    assert one["tpot_ms"]["mean"] == pytest.approx(80.0) and one["tpot_ms"]["lo"] < 80 < one["tpot_ms"]["hi"]
    assert one["ttft_ms"]["mean"] == pytest.approx(100.0) and one["ttft_ms"]["lo"] is None
    # A serial server, three requests sent at once: each 1 s of service, the later ones queued.
    burst = [_rec(i, 0, 1000 * i + 100, [300, 300, 300]) for i in range(3)]
    for i, r in enumerate(burst[1:], 1):  # each starts when the one before it ended
        r.t_first_token_ns = burst[i - 1].t_last_token_ns + 100_000_000
        r.chunk_ns = [r.t_first_token_ns + k * 300_000_000 for k in range(4)]
        r.t_last_token_ns = r.chunk_ns[-1]
    rps = ib_baseline.request_cis(burst)["request_throughput"]
    assert rps["mean"] == pytest.approx(1.0, rel=1e-6) and rps["n"] == 3


def test_request_clock_keeps_each_request_on_the_clients_clock() -> None:
    """Per request (in index order), sent / first / last token ms after the bench's start; a failed request's
    missing times stay None."""
    from orchestrator.bench.timeline import RequestRecord

    a, b = _rec(1, 2.0, 50.0, [5.0, 5.0]), _rec(0, 1.0, 40.0, [5.0])
    failed = RequestRecord(index=2, prompt_tokens=8, output_tokens=4, t_sent_ns=3_000_000)
    c = ib_baseline.request_clock([a, b, failed], origin_ns=500_000)
    assert c == {"origin_s": 0.0005, "sent_ms": [0.5, 1.5, 2.5], "first_ms": [39.5, 49.5, None],
                 "last_ms": [44.5, 59.5, None]}


def test_headline_states_naive_counts_and_intervals(tmp_path: Path) -> None:
    r = _report()
    for name, sc in r["servers"]["ib_naive"]["scenarios"].items():
        sc["num_requests"] = 2
        sc["ci95"] = {"ttft_ms": {"n": 2, "mean": 1.0, "lo": 0.5, "hi": 1.5}, "scenario": name}
    h = headline.compute(r, SOL, {"prefill": {"prompt_tokens": 4096}, "decode": {"prompt_tokens": 512, "output_tokens": 512},
                                  "throughput": {"num_requests": 64, "prompt_tokens": 512, "output_tokens": 128}})
    g = h["geomean_vs_ib_naive"]
    assert g["value"] is not None and g["naive_requests"] == dict.fromkeys(("prefill", "decode", "throughput", "general"), 2)
    assert g["naive_ci95"]["general"]["scenario"] == "general"


def test_request_cis_counts_tokens_not_chunks() -> None:
    """A text streamer's chunk can carry several tokens: TPOT is per output token, as the scenario's
    metric counts it; one such request gives no gap interval (its gaps are not inter-token times).
    On the H200 (2026-12-02) counting chunks put the naive server's TPOT at 1554 ms for a 95 ms metric."""
    r = _rec(0, 0, 100, [80, 320, 80])  # 4 chunks ...
    r.usage_completion_tokens = 10  # ... carrying 10 tokens: (580 - 100) / 9 ms per token
    ci = ib_baseline.request_cis([r])
    assert ci["tpot_ms"]["n"] == 1 and ci["tpot_ms"]["mean"] == pytest.approx(480 / 9)
    assert ci["tpot_ms"]["lo"] is None and "several tokens" in ci["tpot_from"]
    two = ib_baseline.request_cis([r, _rec(1, 1000, 1100, [80, 320, 80])])
    assert two["tpot_ms"]["n"] == 2 and two["tpot_from"] == "requests"


def test_naive_window_yields_to_our_server_or_the_run_is_refused() -> None:
    """2026-12-02: the ib step got 240 s, the naive window 170 s, and our server's 70 s held its start but
    no scenario: every speedup was lost. Now the naive window shrinks, and a deadline for neither is refused."""
    assert ib_baseline.window_for_naive(345.0, 170.0, 120.0) == 170.0  # room for both: as asked
    assert ib_baseline.window_for_naive(240.0, 170.0, 120.0) == 120.0  # shrunk: ours keep 120 s
    with pytest.raises(SystemExit, match="too short"):
        ib_baseline.window_for_naive(200.0, 170.0, 120.0)  # 80 s left for the naive server: refused
