"""The carried sshd of the GPU runs through SSH (benchmarks/gpu/sshd_bundle.sh, ssh_host.sh): it runs
on its own loader and libraries with an empty environment, and the workspace it registers reaches
it as an SSH host whose Python has the command's environment."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sshd_server import SSHD

from orchestrator.hosts import get_host
from orchestrator.hosts.registry import HostRegistry

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (SSHD and shutil.which("ssh-keygen") and shutil.which("ldd")),
                                reason="needs OpenSSH's sshd and ssh-keygen, and ldd")


def test_the_bundled_sshd_serves_a_registered_host_with_the_commands_environment(tmp_path):
    bundle, ws = tmp_path / "bundle", tmp_path / "ws"
    subprocess.run(["bash", str(ROOT / "benchmarks/gpu/sshd_bundle.sh"), str(bundle)], check=True, capture_output=True)
    assert (bundle / "sshd").is_file() and list(bundle.glob("ld-linux-*.so.*")) and (bundle / "lib/libc.so.6").is_file()
    ws.mkdir()
    (ws / "infergoal.toml").write_text('target = "t.toml"\n')
    script = f"""
set -u
ROOT={ROOT}; WS_ROOT={tmp_path}; PY={sys.executable}; OUT={tmp_path}/out; WHEELS_SITE=/opt/wheels-site
SSHD_BUNDLE={bundle}; export PYTHONPATH={ROOT} MARK_FROM_THE_COMMAND=yes
mkdir -p $OUT; log() {{ echo "$*"; }}
. {ROOT}/benchmarks/gpu/ssh_host.sh
ssh_host_up {ws} || exit 1
echo "PID=$SSHD_PID"
"""
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    pid = int(res.stdout.split("PID=")[1].split()[0])
    try:
        # The daemon's loader and libraries are the bundle's, none of this machine's.
        maps = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if ".so" in line}
        assert maps and all(m.startswith(str(bundle)) for m in maps), maps
        spec = HostRegistry(ws / ".infergoal").get("gpu-ssh")
        assert spec.python == f"{tmp_path}/sshd-run/python"
        host = get_host("gpu-ssh", state_dir=ws / ".infergoal")  # the pinned host key: no trust step
        try:
            rc, out = host.run([spec.python, "-c", "import os; print(os.environ['MARK_FROM_THE_COMMAND'], "
                                "os.environ['PYTHONPATH'], os.environ['INFERGOAL_LEASE_DIR'])"])
        finally:
            host.close()
        assert rc == 0, out
        mark, path, leases = out.split()
        assert mark == "yes" and path == "/opt/wheels-site" and leases == f"{tmp_path}/sshd-run/leases"
    finally:
        for p in [*subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split(), pid]:
            with contextlib.suppress(ProcessLookupError):  # a session's child may end between pgrep and kill
                os.kill(int(p), signal.SIGTERM)
