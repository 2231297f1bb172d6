"""The one-command GPU scripts (benchmarks/gpu/*.sh) parse: a syntax error found on the device costs a fresh machine's
start (minutes of the session's device time) for nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "benchmarks/gpu").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_gpu_script_parses(script: Path) -> None:
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_the_scripts_are_found() -> None:
    assert {"device_env.sh", "step12_one.sh", "step12_show.sh"} <= {s.name for s in SCRIPTS}
