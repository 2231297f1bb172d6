"""Real OpenSSH servers on loopback ports for the SSH host tests (generated host and user keys).

Each `Sshd` runs `/usr/sbin/sshd -D` with its own config, host key and authorized_keys, as the
current user (root in CI), so the tests log in to this machine exactly as to a GPU box.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.hosts.sshconn import HostSpec
from orchestrator.remote.procs import free_port

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


TEMPLATE = Path(__file__).with_name("sshd_config.template")
"""The servers' config, shared with benchmarks/gpu/ssh_host.sh (the H200's loopback sshd)."""


def config(d: Path, port: int, log_level: str = "ERROR") -> str:
    """The sshd_config of a server whose keys, authorized_keys, pid file and lease dir are in `d`."""
    return (TEMPLATE.read_text().replace("@RUN@", str(d)).replace("@PORT@", str(port))
            .replace("@LOGLEVEL@", log_level))


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def _free_port() -> int:
    return free_port()  # never one this process handed out before


@dataclass
class Sshd:
    dir: Path
    port: int
    host_key: Path
    user_key: Path
    proc: subprocess.Popen
    user: str = getpass.getuser()

    @classmethod
    def start(cls, d: Path) -> Sshd:
        d.mkdir(parents=True, exist_ok=True)
        host_key, user_key = keygen(d / "host_ed25519"), keygen(d / "user_ed25519")
        (d / "authorized_keys").write_text((d / "user_ed25519.pub").read_text())
        port = _free_port()
        (d / "sshd_config").write_text(config(d, port))
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation dir
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                                stderr=open(d / "sshd.log", "ab"))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"sshd exited: {(d / 'sshd.log').read_text()}") from None
                time.sleep(0.1)
        return cls(dir=d, port=port, host_key=host_key, user_key=user_key, proc=proc)

    def spec(self, name: str = "box", *, workdir: Path, key: Path | None = None, **kw) -> HostSpec:
        return HostSpec(name=name, hostname="127.0.0.1", port=self.port, user=self.user, key=str(key or self.user_key),
                        python=sys.executable, workdir=str(workdir), **kw)

    def known_hosts_line(self) -> str:
        kind, blob = (self.dir / "host_ed25519.pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {blob}\n"

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of this daemon)."""
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == self.proc.pid:
                    out.append(int(d.name))
        return out

    def drop_connections(self) -> int:
        """Kill every live session of this daemon: the client sees its connection go away."""
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def stop(self) -> None:
        self.drop_connections()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
