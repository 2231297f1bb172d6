"""Integrity gate against real servers and cheating proxies: each cheat caught by its probe."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from gate_servers import Served

from gates import GateResult, integrity

pytestmark = pytest.mark.slow

MEASURED: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    folder = os.environ.get("INFERGOAL_GATE_REPORT")  # same folder as the accuracy report
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "integrity.json").write_text(json.dumps(MEASURED, indent=2, sort_keys=True, default=str))

CHEAT_DIFF = """diff --git a/examples/hfserve/hfserve/server.py b/examples/hfserve/hfserve/server.py
--- a/examples/hfserve/hfserve/server.py
+++ b/examples/hfserve/hfserve/server.py
@@ -1,1 +1,2 @@
 import time
+time.perf_counter = lambda: 0.0
"""

HONEST_DIFF = """diff --git a/examples/hfserve/hfserve/server.py b/examples/hfserve/hfserve/server.py
--- a/examples/hfserve/hfserve/server.py
+++ b/examples/hfserve/hfserve/server.py
@@ -1,1 +1,2 @@
 import torch
+torch.set_num_threads(2)
"""


def _check(server: Served, *, launched: set[int] | None = None, listening: set[int] | None = None,
           **kwargs: object) -> GateResult:
    return integrity.check(server.url, served_model=server.name, tokenizer_dir=server.model_dir,
                           launched_pids=launched if launched is not None else {server.pid},
                           listening_pids=listening if listening is not None else {server.pid},
                           seed=7, **kwargs)  # type: ignore[arg-type]


def _failed_check(result: GateResult) -> str:
    failed = [c["name"] for c in result.details["checks"] if c["status"] == "fail"]
    return failed[0] if failed else ""


@pytest.mark.parametrize("name", ["fp32", "batched", "bf16"])
def test_honest_servers_pass(fleet: dict[str, Served], name: str) -> None:
    result = _check(fleet[name], diff_text=HONEST_DIFF, allowed_paths=["examples/hfserve/*"])
    MEASURED[name] = {"status": result.status, "reason": result.reason, **result.details}
    assert result.status == "pass", result.reason
    names = [c["name"] for c in result.details["checks"]]
    assert names == ["diff", "process", "models", "max_tokens", "usage", "prompt_dependence", "no_cache", "cross_launch"]
    assert result.details["cache"]["time_ratio"] > 0.35


@pytest.mark.parametrize("mode, caught_by", [
    ("wrong_model_name", "models"),
    ("ignore_max_tokens", "max_tokens"),
    ("lie_usage", "usage"),
    ("constant", "prompt_dependence"),
    ("cache", "no_cache"),
])
def test_cheating_proxies_rejected(fleet: dict[str, Served], mode: str, caught_by: str) -> None:
    proxy = fleet[f"proxy:{mode}"]
    # The host would report the proxy as both launched and listening: only behaviour can betray it.
    result = _check(proxy)
    MEASURED[f"proxy:{mode}"] = {"status": result.status, "reason": result.reason, **result.details}
    assert result.status == "fail"
    assert _failed_check(result) == caught_by, result.reason
    assert result.reason.startswith(caught_by)


def test_foreign_process_on_port_rejected(fleet: dict[str, Served]) -> None:
    proxy, upstream = fleet["proxy:passthrough"], fleet["fp32"]
    result = _check(proxy, launched={upstream.pid}, listening={proxy.pid})
    assert result.status == "fail" and _failed_check(result) == "process", result.reason


def test_cheating_diff_rejected_before_any_request(fleet: dict[str, Served]) -> None:
    result = _check(fleet["fp32"], diff_text=CHEAT_DIFF, allowed_paths=["examples/hfserve/*"])
    assert result.status == "fail" and _failed_check(result) == "diff"
    assert "clock_monkeypatch" in result.reason
    assert len(result.details["checks"]) == 1  # stopped at the first (cheapest) failure


def test_unreachable_server_fails_cleanly(tmp_path: Path, model_dir: Path) -> None:
    result = integrity.check("http://127.0.0.1:9", served_model="x", tokenizer_dir=model_dir, seed=1)
    assert result.status == "fail" and "models" in result.reason
