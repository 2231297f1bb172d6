"""An archived workspace on a read-only mount can be reviewed: status, trials, show, why, log and a
report written elsewhere, and nothing on the mount changes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_workspace import db_path, seed_run


def _ro_cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the CLI with `folder` bind-mounted read-only (a user+mount namespace; nothing outside changes)."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1)")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip("user namespaces are not available here")
    cmd = (f'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}" && '
           f'exec "{sys.executable}" -m orchestrator.cli -w "{folder}" "$@"')
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(["unshare", "-rm", "sh", "-c", cmd, "sh", *args], capture_output=True, text=True, env=env)


def test_archived_workspace_on_a_read_only_mount_can_be_audited(tmp_path):
    store, run = seed_run(tmp_path)
    t0 = store.create_trial(run.id, 0, commit="", knobs={"k": 1}, rationale="baseline", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0, objective={"decode:tpot_ms_p50": 10.0}, timings={"total": 1.0})
    store.close()
    before = sorted(p.name for p in db_path(tmp_path).parent.iterdir())
    assert _ro_cli(tmp_path, "status").returncode == 0
    r = _ro_cli(tmp_path, "trials", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["status"] == "kept", r.stderr
    assert _ro_cli(tmp_path, "show", "0").returncode == 0
    for cmd in (["why", "0"], ["log"]):  # the review commands read, never write (cli/review.py opens read-only)
        r = _ro_cli(tmp_path, *cmd, "--json")
        assert r.returncode == 0 and json.loads(r.stdout) is not None, (cmd, r.stderr)
    out = tmp_path.parent / f"{tmp_path.name}-report"
    r = _ro_cli(tmp_path, "report", "--out", str(out))
    assert r.returncode == 0 and (out / "report.md").is_file(), r.stderr
    r = _ro_cli(tmp_path, "report")  # the default folder is on the read-only mount: one clear line
    assert r.returncode == 4 and "pass --out" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in db_path(tmp_path).parent.iterdir()) == before


def test_status_in_an_empty_read_only_folder_is_not_an_error(tmp_path):
    r = _ro_cli(tmp_path, "status")
    assert r.returncode == 0 and "no runs yet" in r.stdout, r.stderr
    assert not (tmp_path / ".infergoal").exists()
