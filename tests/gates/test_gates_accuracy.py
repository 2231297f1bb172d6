"""Accuracy gate against real servers: honest precisions pass, damaged models fail.

Measured metrics of every case are written to ``$INFERGOAL_GATE_REPORT/accuracy.json`` (if that
folder is set) so the thresholds in ``gates/thresholds.toml`` can be checked against fresh numbers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from gate_servers import Served

from gates import GateResult, accuracy

pytestmark = pytest.mark.slow

MEASURED: dict[str, dict[str, Any]] = {}


def _run(fleet: dict[str, Served], model_dir: Path, name: str, seed: int | None = 1234) -> GateResult:
    server = fleet[name]
    result = accuracy.check(server.url, served_model=server.name, reference_model_dir=model_dir, seed=seed)
    MEASURED[name] = {"status": result.status, **result.details.get("metrics", {}), "reason": result.reason}
    return result


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    folder = os.environ.get("INFERGOAL_GATE_REPORT")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "accuracy.json").write_text(json.dumps(MEASURED, indent=2, sort_keys=True))


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16", "batched"])
def test_honest_candidates_pass(fleet: dict[str, Served], model_dir: Path, name: str) -> None:
    result = _run(fleet, model_dir, name)
    assert result.status == "pass", result.reason
    assert result.details["metrics"]["positions"] > 500


@pytest.mark.parametrize("name", ["drop_layer", "quant3", "rope", "other_model"])
def test_damaged_models_fail(fleet: dict[str, Served], model_dir: Path, name: str) -> None:
    result = _run(fleet, model_dir, name)
    assert result.status == "fail", (result.status, result.reason)
    assert "hard limit" in result.reason and " > " in result.reason  # names metric, value and limit


def test_mild_damage_is_drift_or_fail_never_pass(fleet: dict[str, Served], model_dir: Path) -> None:
    result = _run(fleet, model_dir, "quant6")
    assert result.status in ("drift", "fail"), result.reason


def test_secret_seed_is_fresh_and_hashed(fleet: dict[str, Served], model_dir: Path) -> None:
    server = fleet["fp32"]
    a = accuracy.check(server.url, served_model=server.name, reference_model_dir=model_dir)
    b = accuracy.check(server.url, served_model=server.name, reference_model_dir=model_dir)
    assert a.details["seed_sha256"] != b.details["seed_sha256"]
    assert a.details["metrics"]["ppl_reference"] != b.details["metrics"]["ppl_reference"]  # other windows
    assert "seed" not in a.details and a.status == "pass"


def test_constant_proxy_fails_accuracy_too(fleet: dict[str, Served], model_dir: Path) -> None:
    # Prompt swapped upstream: echoed tokens no longer match what was sent.
    result = _run(fleet, model_dir, "proxy:constant")
    assert result.status == "fail" and "echo" in result.reason
