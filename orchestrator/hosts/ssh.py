"""SSHHost: the Host protocol on a remote machine over SSH (paramiko).

Everything that happens on the host goes through two shipped modules, run with the host's own
Python: `orchestrator.remote.hostd` (one short command per call: start a detached server in its
own session, or hand it to the standby interpreter waiting there, stop its group, health, pids,
pidfile sweep, tree manifests, fingerprint) and
`orchestrator.remote.worker` (one long-lived process per run: gates and bench, next to the server).
The code is shipped once per version (a stamp of its manifest); engine trees and models are
synced by manifest, so only what changed travels.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from orchestrator.hosts.base import HostError, Proc, ServerCrashed, ServerTimeout
from orchestrator.hosts.sshconn import HostSpec, SSHConnection, remote_cmd
from orchestrator.hosts.sshsite import RemoteSite
from orchestrator.hosts.standby import QUIET_CORES
from orchestrator.remote import hostlock
from orchestrator.remote.manifest import manifest, tar_files, tree_digest

__all__ = ["PACKAGE_ROOT", "RemoteLease", "SSHHost", "owner_id"]

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_SHIPPED = ("orchestrator", "gates")


def owner_id(state_dir: str | Path) -> str:
    """Who started a server: this workspace on this machine. `clean` stops only its own."""
    key = f"{socket.gethostname()}:{Path(state_dir).resolve()}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class SSHHost:
    """A GPU box over SSH. `state_dir` is the workspace's `.infergoal/` (known_hosts lives there)."""

    def __init__(self, spec: HostSpec, *, state_dir: str | Path, known_hosts: str | Path | None = None,
                 model_cache: str = "off", standby: bool = True, standby_idle_s: float | None = None) -> None:
        self.spec, self.name = spec, spec.name
        self.model_cache = model_cache
        """The workspace's `model_cache`, applied on the host (orchestrator.remote.modelcache: "auto" = where it has a GPU)."""
        self.state_dir = Path(state_dir)
        self.known_hosts = Path(known_hosts) if known_hosts else self.state_dir / "known_hosts"
        self.conn = SSHConnection(spec, self.known_hosts)
        self.owner = owner_id(self.state_dir)
        self.python = spec.python
        self._workdir: str | None = None
        self._code_stamp: str | None = None
        self._local_logs: dict[str, Path] = {}
        self._fingerprint: dict | None = None
        self._site: Any = None
        self.use_standby = standby
        """Keep a standby interpreter on the host for launches that name modules to preload (as LocalHost
        does: orchestrator.hosts.standby; on the host, orchestrator/remote/hostd.py)."""
        self.standby_idle_s = standby_idle_s
        """A standby on the host that got no launch for this long exits by itself (None: it waits to be ended)."""
        self.standby_slot = hashlib.sha256(f"{self.owner}:{spec.name}:{spec.gpus}".encode()).hexdigest()[:16]
        """This host entry's standby on the host (a workspace's two entries for two GPUs of one box get two)."""
        self._standby: int | None = None
        """The pid of the standby the last launch left waiting on the host, if any."""
        self._host_cores = 0
        """The host's usable cores (from its last `start` answer): `quiet(server=True)` pauses below QUIET_CORES."""

    @property
    def gpus(self) -> str:
        """The GPU set its servers see (`--gpus`, `CUDA_VISIBLE_DEVICES`); empty: all."""
        return self.spec.gpus

    # --- plumbing ----------------------------------------------------------------------------
    @property
    def workdir(self) -> str:
        """The host's work dir as an absolute path (resolved once)."""
        if self._workdir is None:
            rc, out, err = self.conn.exec(f"mkdir -p {self.spec.workdir} && cd {self.spec.workdir} && pwd")
            if rc != 0:
                raise HostError(f"{self.name}: cannot create {self.spec.workdir}: {err.decode(errors='replace')[-300:]}")
            self._workdir = out.decode().strip()
        return self._workdir

    def ship_code(self) -> bool:
        """Send orchestrator/ and gates/ to `workdir/code` unless the host has this exact version. True if sent."""
        files = {f"{pkg}/{rel}": d for pkg in _SHIPPED for rel, d in manifest(PACKAGE_ROOT / pkg).items()}
        stamp = tree_digest(files)
        if self._code_stamp == stamp:
            return False
        w = self.workdir
        rc, out, _ = self.conn.exec(f"cat {w}/code/.stamp 2>/dev/null")
        if out.decode().strip() != stamp:
            blob = tar_files(PACKAGE_ROOT, sorted(files), {".stamp": stamp.encode()}, gz=True)
            # Unpack beside, then swap: a half-shipped tree never runs.
            rc, _, err = self.conn.exec(
                f"rm -rf {w}/code.new && mkdir -p {w}/code.new && tar -xzf - -C {w}/code.new && "
                f"rm -rf {w}/code && mv {w}/code.new {w}/code", stdin=blob)
            if rc != 0:
                raise HostError(f"{self.name}: shipping the measurement code failed: {err.decode(errors='replace')[-300:]}")
        self._code_stamp = stamp
        return True

    def py_cmd(self, module: str, *args: str) -> str:
        w = self.workdir
        return remote_cmd(self.spec.python, "-m", module, *args, env={"PYTHONPATH": f"{w}/code"})

    def hostd(self, *args: str, stdin: bytes = b"", timeout_s: float = 600.0) -> dict:
        """Run one op of the host-side helper (`orchestrator.remote.hostd`) and return its JSON answer."""
        self.ship_code()
        cmd = self.py_cmd("orchestrator.remote.hostd", "--workdir", self.workdir, *args)
        rc, out, err = self.conn.exec(cmd, stdin=stdin, timeout_s=timeout_s)
        lines = out.decode(errors="replace").strip().splitlines()
        if rc != 0 or not lines:
            detail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise HostError(f"{self.name}: `{args[0]}` failed on the host (exit {rc}): {' | '.join(detail)}"
                            f" — is {self.spec.python!r} a Python 3.11+ there? (`infergoal hosts check {self.name}`)")
        return json.loads(lines[-1])

    # --- the Host protocol -------------------------------------------------------------------
    def start(self, argv: list[str], *, env: dict[str, str] | None, cwd: str | None, log_path: str | Path,
              preload: Sequence[str] = ()) -> Proc:
        local_log = Path(log_path)
        remote_log = f"{self.workdir}/logs/{self.owner}/{'-'.join(local_log.parts[-3:])}"
        full_env = dict(env or {})
        if self.spec.gpus:
            full_env["CUDA_VISIBLE_DEVICES"] = self.spec.gpus
        req = {"argv": list(argv), "cwd": cwd, "env": full_env, "log_path": remote_log, "owner": self.owner,
               "token": uuid.uuid4().hex}
        if self.use_standby:
            # One round trip: the host runs the launch on its waiting standby where that is a cold start
            # done early (the same interpreter, modules and environment: hostd's os.environ, i.e. the SSH
            # session's, under `full_env`), else cold, ending a standby of no use; then, where the launch
            # is eligible, it starts the next one, importing beside this server's start-up.
            req["standby"] = {"slot": self.standby_slot, "preload": list(preload), "idle_s": self.standby_idle_s}
        res = self.hostd("start", stdin=json.dumps(req).encode())
        if "error" in res:
            raise HostError(f"{self.name}: {res['error']}")
        if self.use_standby:
            self._standby, self._host_cores = res.get("next_standby"), int(res.get("cores") or self._host_cores)
        self._local_logs[remote_log] = local_log
        return Proc(pid=res["pid"], pgid=res["pgid"], argv=tuple(argv), log_path=remote_log,
                    standby=bool(res.get("standby")))

    def stop(self, proc: Proc, grace_s: float = 10.0) -> None:
        try:
            res = self.hostd("stop", str(proc.pgid), "--grace", str(grace_s), timeout_s=grace_s + 60)
        except HostError:
            # The host is unreachable: its pidfile stays, and `hosts clean` / resume stops it later.
            return
        local = self._local_logs.get(proc.log_path)
        if local is not None and res.get("log"):
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(res["log"])

    def log_tail(self, proc: Proc, lines: int = 30) -> str:
        return self.hostd("tail", proc.log_path, "--lines", str(lines))["tail"]

    def alive(self, proc: Proc) -> bool:
        return bool(self.hostd("alive", str(proc.pid))["alive"])

    def quiet(self, *, server: bool = False) -> AbstractContextManager[None]:
        """As `LocalHost.quiet`: the standby waiting on the host is paused (SIGSTOP) while the host is probed,
        and beside a server (`server`) only on a host with fewer than `QUIET_CORES` usable cores. Two
        round trips (`hostd standby-signal`), only while a standby of this host waits there."""
        if self._standby is None or (server and self._host_cores >= QUIET_CORES):
            return nullcontext()
        return self._standby_paused()

    @contextmanager
    def _standby_paused(self) -> Iterator[None]:
        try:
            paused = self.hostd("standby-signal", "STOP", "--slot", self.standby_slot)["pid"] is not None
        except HostError:
            paused = False
        try:
            yield
        finally:
            if paused:
                try:
                    self.hostd("standby-signal", "CONT", "--slot", self.standby_slot)
                except HostError:
                    pass  # unreachable: the next launch sends it CONT before its job

    def wait_healthy(self, url: str, timeout_s: float, proc: Proc) -> float:
        # The probe runs on the host: the server listens on the host's loopback.
        res = self.hostd("health", url, str(timeout_s), str(proc.pid), proc.log_path, timeout_s=timeout_s + 120)
        if res.get("error") == "crashed":
            raise ServerCrashed(f"server exited before it became healthy on {self.name}; last log lines:\n{res['tail']}")
        if res.get("error") == "timeout":
            raise ServerTimeout(
                f"server not healthy at {url} on {self.name} after {timeout_s:.0f}s; last log lines:\n{res['tail']}")
        return float(res["waited"])

    def listening_pids(self, port: int) -> set[int]:
        return set(self.hostd("listening-pids", str(port))["pids"])

    def group_pids(self, proc: Proc) -> set[int]:
        return set(self.hostd("group-pids", str(proc.pgid))["pids"])

    def fingerprint(self) -> dict:
        if self._fingerprint is None:
            fp = self.hostd("fingerprint")
            fp.update(host=f"ssh://{self.spec.user + '@' if self.spec.user else ''}{self.spec.hostname}:{self.spec.port}",
                      host_name=self.name, gpus_visible=self.spec.gpus or "all")
            self._fingerprint = fp
        return dict(self._fingerprint)

    def free_port(self) -> int:
        return int(self.hostd("free-port")["port"])

    def run(self, argv: list[str], timeout_s: float = 600.0) -> tuple[int, str]:
        rc, out, err = self.conn.exec(remote_cmd(*argv), timeout_s=timeout_s)
        return rc, (out + err).decode(errors="replace")

    def sweep_orphans(self, *, everyone: bool = False) -> list[int]:
        """Stop the servers (and waiting standbys) this workspace started on the host (pidfiles there); return their pgids."""
        args = ["clean", "--all"] if everyone else ["clean", "--owner", self.owner]
        return list(self.hostd(*args)["killed"])

    def site(self) -> Any:
        if self._site is None:
            self._site = RemoteSite(self)
        return self._site

    def take_lease(self, identity: dict[str, Any]) -> RemoteLease:
        """The host's lease for this host's GPUs (`--gpus`, else all), held on the host itself, so
        runs from any workspace or machine see it; raises `hostlock.Busy` naming the holders."""
        lease = RemoteLease(self, identity)
        lease.take()
        return lease

    def close(self) -> None:
        """End the standby waiting on the host (a run's end), the measurement worker and the connection."""
        if self._standby is not None:
            self._standby = None
            try:
                self.hostd("standby-end", "--slot", self.standby_slot, timeout_s=60)
            except HostError:
                pass  # unreachable: `hosts clean` (or the next run's sweep) ends it
        if self._site is not None:
            self._site.close()
        self.conn.close()



class RemoteLease:
    """The host lease of an SSH host, held by a `hostd lease` process on the host for as long as
    its SSH channel stays open (orchestrator/remote/hostd.py `op_lease`).

    Bound to the channel rather than to a detached holder with a heartbeat: when the orchestrator
    exits or is killed -9, its TCP connection closes, sshd ends the session and the kernel frees the
    lock at once, with no renewal traffic and no timeout to wait out. The price is that a dropped
    connection drops the lease; `held()` sees it and `take()` takes it again on reconnection.
    """

    def __init__(self, host: SSHHost, identity: dict[str, Any]) -> None:
        self.host, self.identity = host, dict(identity)
        self.stale: list[dict[str, Any]] = []
        self._chan: Any = None

    def take(self) -> None:
        h = self.host
        h.ship_code()
        chan = h.conn.open_stream(h.py_cmd("orchestrator.remote.hostd", "--workdir", h.workdir, "lease"))
        chan.settimeout(h.spec.connect_timeout_s + 30)
        chan.sendall(json.dumps({"identity": self.identity, "gpus": h.spec.gpus}).encode() + b"\n")
        line = bytearray()
        try:
            while not line.endswith(b"\n"):
                chunk = chan.recv(4096)
                if not chunk:
                    break
                line += chunk
        except OSError:  # socket.timeout among them
            pass
        try:
            answer = json.loads(line)
        except ValueError:
            err = chan.recv_stderr(4096).decode(errors="replace").strip().splitlines()[-3:] if chan.recv_stderr_ready() else []
            chan.close()
            raise HostError(f"{h.name}: the host lease could not be taken ({' | '.join(err) or 'no answer'})") from None
        if "busy" in answer:
            chan.close()
            raise hostlock.Busy(answer["busy"])
        if "error" in answer:
            chan.close()
            raise HostError(f"{h.name}: {answer['error']}")
        chan.settimeout(None)
        self.stale, self._chan = answer.get("stale", []), chan

    def update(self, **fields: Any) -> None:
        self.identity |= fields
        if self.held():
            self._chan.sendall(json.dumps(fields).encode() + b"\n")

    def held(self) -> bool:
        c = self._chan
        return c is not None and not c.closed and not c.exit_status_ready() and c.get_transport().is_active()

    def lost_reason(self) -> str:
        """'' while held; else what ended it, in words (the host freed the lock when its channel closed)."""
        if self.held():
            return ""
        if self._chan is None:
            return "it was released"
        said = b""
        try:
            while self._chan.recv_ready():  # `hostd lease` says why when the host's lock file went
                said += self._chan.recv(4096)
            lost = json.loads(said.splitlines()[-1]).get("lost") if said.strip() else None
        except (OSError, ValueError, AttributeError):
            lost = None
        if lost:
            return f"on {self.host.name}, {lost}"
        return f"the SSH channel of `hostd lease` on {self.host.name} closed (connection dropped); the host freed its lock"

    def release(self, wait_s: float = 10.0) -> None:
        """End of input frees the lock; wait (briefly) for the holder to exit, so a run started
        right after this one finds the host free."""
        c, self._chan = self._chan, None
        if c is None:
            return
        try:
            c.shutdown_write()
            deadline = time.monotonic() + wait_s
            while not c.exit_status_ready() and time.monotonic() < deadline and c.get_transport().is_active():
                time.sleep(0.05)
        except (OSError, EOFError):
            pass
        finally:
            c.close()
