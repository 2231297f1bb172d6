"""Process groups on a host (orchestrator/remote/procs.py): an exited server nobody has reaped yet is gone."""

import subprocess
import sys
import time
from pathlib import Path

from orchestrator.remote.procs import group_exists, group_pids, kill_group


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_group_of_zombies_is_gone_and_a_stop_does_not_wait_for_its_reaper():
    # On an SSH host a server's parent is the host's init once hostd exits, and it reaps when it
    # does: the group then holds only a zombie, which killpg(pgid, 0) still finds.
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while _state(dead.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _state(dead.pid) == "Z"  # exited, not reaped (no wait() yet)
        assert group_exists(live.pid) and not group_exists(dead.pid)
        assert group_pids(live.pid) == {live.pid} and group_pids(dead.pid) == set()
        t0 = time.monotonic()
        kill_group(dead.pid, grace_s=5.0)
        assert time.monotonic() - t0 < 1.0
    finally:
        live.kill()
        live.wait()
        dead.wait()
