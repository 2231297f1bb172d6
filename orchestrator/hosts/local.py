"""LocalHost: run engines on this machine as their own process groups."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.core import interrupts
from orchestrator.hosts.base import HostError, Proc, ServerCrashed, ServerTimeout
from orchestrator.hosts.runlease import pid_alive
from orchestrator.hosts.site import LocalSite
from orchestrator.hosts.standby import QUIET_CORES, Standby, eligible, spawn
from orchestrator.hosts.state import snapshot
from orchestrator.remote import hostlock, procs
from orchestrator.remote.modelcache import resolve

__all__ = ["LocalHost"]

_PR_SET_PDEATHSIG = 1


def _usable_cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's cpuset), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _die_with_parent() -> None:
    """In the child: own session (so we can kill the whole group), and SIGKILL if we are orphaned.

    The pidfile sweep on resume is the second line of defence; this one makes a kill -9 of the
    orchestrator take its server down at once instead of leaving it holding a port and memory.
    """
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class LocalHost:
    """This machine. `state_dir` keeps pidfiles so a resumed run can sweep orphans."""

    name = "local"
    run_id: int | None = None
    """The run whose servers this host starts; recorded in each pidfile for the orphan sweep."""

    def __init__(self, state_dir: str | Path, *, model_cache: str = "off", standby: bool = True,
                 standby_idle_s: float | None = None, gpus: str = "") -> None:
        self.state_dir = Path(state_dir)
        self.gpus = gpus
        """The GPU set its servers see (`CUDA_VISIBLE_DEVICES`) and its lease holds, e.g. "1" or "0,1";
        empty: what this process sees (orchestrator.hosts.gpus makes one per GPU set of a pool)."""
        if gpus:
            self.name = f"local:gpu{gpus}"
        self.model_cache = resolve(model_cache)
        """Where trials' models are copied to load from RAM (orchestrator.remote.modelcache); None: not copied."""
        self.pid_dir = self.state_dir / "servers"
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        self.use_standby = standby
        """Keep a standby interpreter for launches that name modules to preload (orchestrator.hosts.standby)."""
        self.standby_idle_s = standby_idle_s
        """A standby that got no launch for this long exits by itself (None: it waits to be ended)."""
        self._standby: Standby | None = None
        self.base_env = dict(os.environ)
        """What servers launched here inherit: the environment this host was made with. Libraries the
        orchestrator imports later may write to `os.environ` (torch's inductor sets `TORCHINDUCTOR_CACHE_DIR`
        when the accuracy gate runs the reference in-process); a server must not inherit that, and the
        standby made for the first launch would no longer fit the next one's environment (a cold start)."""

    def take_lease(self, identity: dict[str, Any]) -> hostlock.HostLock:
        """This machine's host lease for the GPUs this process sees (`CUDA_VISIBLE_DEVICES`, else all);
        raises `hostlock.Busy` naming the holders. Held by this process: its exit frees it. A host bound
        to a GPU set (`gpus`) leases those GPUs alone."""
        return hostlock.acquire(identity, self.gpus or os.environ.get("CUDA_VISIBLE_DEVICES", ""))

    def start(self, argv: list[str], *, env: dict[str, str] | None, cwd: str | None, log_path: str | Path,
              preload: Sequence[str] = ()) -> Proc:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = self.base_env | (env or {})
        if self.gpus:
            full_env["CUDA_VISIBLE_DEVICES"] = self.gpus
        if self.use_standby and eligible(argv, preload, cwd):
            cwd = cwd or os.getcwd()
            proc = self._start_on_standby(argv, full_env, cwd, log_path, preload)
            # The next launch's interpreter imports now, beside this server's start-up: a cold start
            # imports on one core, so on a 2-core host the other one was idle while it did; once the
            # server is up, gates follow it (or, in back-to-back paired rounds, a bench that pauses
            # the standby at once: started only then, it had imported nothing by the next launch).
            self._spawn_standby(argv[0], tuple(preload), full_env, cwd)
            return proc
        self.close()  # a standby kept for another kind of launch is of no use now
        return self._popen_start(argv, full_env, cwd, log_path)

    def _start_on_standby(self, argv: list[str], full_env: dict[str, str], cwd: str, log_path: Path,
                          preload: Sequence[str]) -> Proc:
        """The launch run by the waiting standby where it fits (same interpreter, environment and
        module list); otherwise the standby is ended and the launch starts cold."""
        sb, self._standby = self._standby, None
        if sb is not None and sb.fits(argv[0], preload, full_env) and sb.popen.poll() is None:
            waited = time.time() - sb.started
            with open(log_path, "ab") as log:  # first in the log, so even a standby dying at once leaves a trace
                log.write(f"infergoal: standby pid={sb.pid} runs this launch (preloaded {' '.join(sb.preload)}, "
                          f"started {waited:.1f}s before)\n".encode())
            try:
                sb.hand_over(argv[1:], full_env, cwd, log_path)
            except OSError:  # it died between the check and the job: the launch starts cold below
                self._end(sb)
            else:
                self._popen = getattr(self, "_popen", {})
                self._popen[sb.pid] = sb.popen
                self._write_pidfile(sb.pid, sb.argv, serves=argv)
                return Proc(pid=sb.pid, pgid=sb.pid, argv=tuple(argv), log_path=str(log_path), standby=True)
        elif sb is not None:
            self._end(sb)
        return self._popen_start(argv, full_env, cwd, log_path)

    def _spawn_standby(self, python: str, preload: tuple[str, ...], full_env: dict[str, str], cwd: str) -> None:
        """Start the interpreter the next launch of this kind will run in (see `_start_on_standby`)."""
        if self._standby is not None and self._standby.popen.poll() is None:
            return
        try:
            self._standby = spawn(python, preload, full_env, cwd, self.pid_dir / "standby.log", _die_with_parent,
                                  self.standby_idle_s)
        except OSError:
            return  # the next launch starts cold, as it would without a standby
        self._write_pidfile(self._standby.pid, self._standby.argv)

    def _end(self, sb: Standby) -> None:
        sb.close_pipe()
        try:
            os.kill(sb.pid, signal.SIGCONT)  # a paused one (`quiet`) would not act on the TERM
        except ProcessLookupError:
            pass
        procs.kill_group(sb.pid, 2.0, reap=sb.popen.poll)
        try:
            sb.popen.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        (self.pid_dir / f"{sb.pid}.json").unlink(missing_ok=True)

    @contextmanager
    def quiet(self, *, server: bool = False) -> Iterator[None]:
        """While the host is probed for other tenants, the standby is paused (SIGSTOP): a probe would count
        its imports as another tenant's load. While a trial is gated or measured (`server`: a server of
        ours runs beside it) it is paused only on a host with fewer than `QUIET_CORES` usable cores: there
        its imports take CPU from the server and the bench (on a 2-core host they did: a bench of 1.2-1.7 s
        took 7-10 s, the e2e run's gates 6.1-8.8 s instead of 1.1-2.7 s). On a larger host it goes on
        importing on a spare core, so the next launch finds it ready: paused there, the H200's standby
        (~15 s of imports under gVisor) had only each deploy to import in and the next launch waited
        3-10 s for the rest (measured on the H200). A launch that comes before it is done waits for the rest."""
        sb = self._standby
        paused = False
        if server and _usable_cores() >= QUIET_CORES:
            sb = None
        if sb is not None and sb.popen.poll() is None:
            try:
                os.kill(sb.pid, signal.SIGSTOP)
                paused = True
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 1.0  # the stop lands when it is next scheduled: wait for it
            while paused and _proc_state(sb.pid) not in ("T", "t", "Z", "") and time.monotonic() < deadline:
                time.sleep(0.005)
        try:
            yield
        finally:
            if paused:
                try:
                    os.kill(sb.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        """End the standby interpreter, if one waits (at a run's end; `start` makes a new one when needed)."""
        sb, self._standby = self._standby, None
        if sb is not None:
            self._end(sb)

    def _write_pidfile(self, pid: int, argv: list[str], **extra: Any) -> None:
        (self.pid_dir / f"{pid}.json").write_text(json.dumps({
            "pgid": pid, "argv": argv, "started": time.time(), "run_id": self.run_id, "owner_pid": os.getpid(),
        } | extra))

    def _popen_start(self, argv: list[str], full_env: dict[str, str], cwd: str | None, log_path: Path) -> Proc:
        with open(log_path, "ab") as log:
            try:
                p = subprocess.Popen(
                    argv, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                )
            except OSError as e:
                raise HostError(f"could not start {argv[0]!r}: {e}") from None
        proc = Proc(pid=p.pid, pgid=p.pid, argv=tuple(argv), log_path=str(log_path))
        self._popen = getattr(self, "_popen", {})
        self._popen[p.pid] = p
        self._write_pidfile(p.pid, argv)
        return proc

    def alive(self, proc: Proc) -> bool:
        p = getattr(self, "_popen", {}).get(proc.pid)
        if p is not None:
            return p.poll() is None
        try:
            os.kill(proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def stop(self, proc: Proc, grace_s: float = 10.0) -> None:
        p = getattr(self, "_popen", {}).pop(proc.pid, None)
        # Reap our child while waiting: a zombie leader still "exists" to killpg(pgid, 0).
        procs.kill_group(proc.pgid, grace_s, reap=p.poll if p is not None else None)
        if p is not None:
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        (self.pid_dir / f"{proc.pid}.json").unlink(missing_ok=True)

    def sweep_orphans(self, run_is_live: Callable[[int], bool] = lambda run_id: True) -> list[int]:
        """Kill process groups whose owning run is dead; return their pgids.

        A server is an orphan when the orchestrator process that started it is gone (pidfiles
        record its pid and run id). A pidfile without an owner pid falls back on the run's lease
        (`run_is_live`); one with neither is left alone. Servers of live runs are never touched.
        """
        killed = []
        for f in self.pid_dir.glob("*.json"):
            try:
                data = json.loads(f.read_text())
                pgid = int(data["pgid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            owner, run_id = data.get("owner_pid"), data.get("run_id")
            if owner is not None:
                dead = not pid_alive(int(owner))
            else:
                dead = run_id is not None and not run_is_live(int(run_id))
            if not dead:
                continue
            if procs.group_exists(pgid) and _is_our_server(pgid, data.get("argv")):
                procs.kill_group(pgid, 5.0)
                killed.append(pgid)
            f.unlink(missing_ok=True)
        return killed

    def wait_healthy(self, url: str, timeout_s: float, proc: Proc) -> float:
        t0 = time.monotonic()
        while True:
            interrupts.check()  # a SIGINT swallowed while the server was spawned (`orchestrator.core.interrupts`)
            if not self.alive(proc):
                raise ServerCrashed(f"server exited before it became healthy; last log lines:\n{procs.log_tail(proc.log_path)}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() - t0 > timeout_s:
                raise ServerTimeout(
                    f"server not healthy at {url} after {timeout_s:.0f}s; last log lines:\n{procs.log_tail(proc.log_path)}"
                )
            time.sleep(0.25)

    def listening_pids(self, port: int) -> set[int]:
        return procs.listening_pids(port)

    def group_pids(self, proc: Proc) -> set[int]:
        return procs.group_pids(proc.pgid)

    def fingerprint(self) -> dict:
        fp = {
            "host": "local",
            "hostname": socket.gethostname(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        }
        try:
            fp["cpu"] = next(
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            )
        except (OSError, StopIteration):
            pass
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            )
            if out.returncode == 0:
                fp["gpus"] = [g.strip() for g in out.stdout.strip().splitlines()]
        except (OSError, subprocess.TimeoutExpired):
            fp["gpus"] = []
        from importlib import metadata

        for pkg in ("torch", "transformers", "vllm"):
            try:
                fp[pkg] = metadata.version(pkg)
            except metadata.PackageNotFoundError:
                pass
        return fp

    def host_state(self, proc: Proc | None = None, *, gpus: bool = True) -> dict:
        return snapshot(self.group_pids(proc) if proc is not None else (), gpus=gpus)

    def free_port(self) -> int:
        return procs.free_port()

    def site(self) -> Any:
        """Measurement in this process (see orchestrator.hosts.site)."""
        return LocalSite(self.model_cache)


def _proc_state(pid: int) -> str:
    """The process's state letter (`T` stopped, `Z` zombie...), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _is_our_server(pgid: int, argv: list[str] | None) -> bool:
    """Guard against pid reuse: the group leader must still run the command we launched."""
    try:
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # leader gone, group still there: its members are ours
    return not argv or [c.decode(errors="replace") for c in cmdline if c] == list(argv)
