"""Cross-check: AIPerf and our bench against the same fake server agree within 10%.

The server's delays (TTFT 60 ms, 12 ms per token) dominate both clients' own overhead, so a
disagreement beyond 10% means a metric definition differs, not that one client is slower.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import fakeserver
import pytest

from orchestrator.bench import Scenario, run_scenario_sync
from orchestrator.remote.procs import free_port

pytestmark = pytest.mark.slow

TTFT_MS, TPOT_MS, OSL, ISL, N, CONC = 60.0, 12.0, 16, 32, 32, 4


def _aiperf_cmd() -> list[str]:
    try:
        import aiperf  # noqa: F401
    except ImportError as e:  # only reason to skip: the reference tool is missing
        pytest.skip(f"aiperf cannot be imported ({e}); `pip install aiperf` to run this cross-check")
    exe = Path(sys.executable).parent / "aiperf"
    return [str(exe)] if exe.exists() else [shutil.which("aiperf") or "aiperf"]


def _free_port() -> int:
    return free_port()  # never one this process handed out before


@pytest.fixture(scope="module")
def server():
    with fakeserver.launched(_free_port(), "--ttft-ms", str(TTFT_MS), "--tpot-ms", str(TPOT_MS)) as url:
        yield url


def test_ttft_tpot_throughput_match_aiperf(server: str, tmp_path: Path) -> None:
    cmd = _aiperf_cmd()
    tok = fakeserver.make_tokenizer(tmp_path / "tok")
    art = tmp_path / "aiperf"
    subprocess.run(cmd + [
        "profile", "--model", "fake", "--url", server, "--endpoint-type", "completions", "--streaming",
        "--tokenizer", str(tok), "--concurrency", str(CONC), "--request-count", str(N),
        "--warmup-request-count", "4", "--prompt-input-tokens-mean", str(ISL),
        "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(OSL),
        "--prompt-output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
        "--use-server-token-count", "--random-seed", "1", "--output-artifact-dir", str(art),
        "--no-auto-plot"], check=True, timeout=400, cwd=tmp_path, capture_output=True)
    ref = json.loads((art / "profile_export_aiperf.json").read_text())

    sc = Scenario(name="xcheck", prompt_tokens=ISL, output_tokens=OSL, num_requests=N,
                  concurrency=CONC, warmup_requests=4, seed=1)
    res = run_scenario_sync(server, "fake", sc, tokenizer=str(tok))
    m = res.metrics
    assert m["failed"] == 0 and m["osl_mismatch"] == 0 and m["isl_mismatch"] == 0

    pairs = {
        "ttft": (m["ttft_ms_mean"], ref["time_to_first_token"]["avg"]),
        "ttft_p50": (m["ttft_ms_p50"], ref["time_to_first_token"]["p50"]),
        "tpot": (m["tpot_ms_mean"], ref["inter_token_latency"]["avg"]),
        "e2e": (m["e2e_ms_mean"], ref["request_latency"]["avg"]),
        "output_throughput": (m["output_throughput_aiperf"], ref["output_token_throughput"]["avg"]),
    }
    report = {k: f"ours {a:.2f} vs aiperf {b:.2f} ({(a / b - 1) * 100:+.1f}%)" for k, (a, b) in pairs.items()}
    print(json.dumps(report, indent=1))
    (tmp_path / "xcheck.json").write_text(json.dumps(report))
    for k, (a, b) in pairs.items():
        assert a == pytest.approx(b, rel=0.10), f"{k}: {report[k]}"
    # Both must also see the server's known delays (sanity: neither client is broken).
    assert TTFT_MS <= m["ttft_ms_p50"] < TTFT_MS * 1.5
    assert TPOT_MS <= m["tpot_ms_p50"] < TPOT_MS * 1.5
