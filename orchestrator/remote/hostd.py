"""The host side of SSHHost: `python -m orchestrator.remote.hostd OP ...`, one JSON line out.

Each call is a short process started over SSH. Servers are started detached, in their own session
(so the SSH channel closing does not take them down, and one killpg stops the whole group), with
their log in the host's work dir and a pidfile beside it: `clean` stops exactly the servers an
orchestrator started, and only those, even after that orchestrator was killed.

Standby interpreters (orchestrator/remote/standbyd.py) live here too, one per slot (an SSHHost: a
workspace's host entry): `start` with a `standby` request hands the launch to the slot's standby where
it fits (same interpreter, module list, environment and standby program, still alive) and starts the
next one, detached like a server, waiting on a named pipe in `standby/`; a record beside it (`SLOT.json`)
says what it was started for, and its pidfile in `servers/` lets `clean` end it as it ends servers.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import io
import json
import os
import platform
import select
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.remote import hostlock
from orchestrator.remote import standbyd as standby_program
from orchestrator.remote.manifest import manifest, tree_digest
from orchestrator.remote.modelcache import cached_copy, manifest_key, resolve
from orchestrator.remote.procs import (
    free_port,
    group_exists,
    group_pids,
    kill_group,
    listening_pids,
    log_tail,
)

SYNC_META = ".infergoal-sync.json"
LEASE_CHECK_S = 2.0
"""How often a held `lease` looks at its lock files (one removed or replaced is a lost lease)."""


def _start_time(pid: int) -> str | None:
    """Kernel start time of `pid` (field 22 of /proc/PID/stat): tells a reused PID from ours."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _state(pid: int) -> str:
    """The process's state letter (`T` stopped, `Z` zombie...), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _alive(pid: int) -> bool:
    return _state(pid) not in ("Z", "X", "")


def op_start(a: argparse.Namespace) -> dict:
    req = json.loads(sys.stdin.read())
    pid_dir = Path(a.workdir) / "servers"
    sb = req.get("standby")  # {"slot": ..., "preload": [...]}: launch on (and keep) a standby where eligible
    # A start retried after a dropped connection must not launch a second server.
    for f in pid_dir.glob("*.json"):
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if info.get("token") == req["token"]:
            res = {"pid": info["pgid"], "pgid": info["pgid"], "standby": bool(info.get("serves"))}
            if sb is not None and (rec := _standby_record(a.workdir, sb["slot"])) is not None and _standby_alive(rec):
                res |= {"next_standby": rec["pid"], "cores": _usable_cores()}
            return res
    log = Path(req["log_path"])
    log.parent.mkdir(parents=True, exist_ok=True)
    env = os.environ | req.get("env", {})
    if sb is None:
        return _start_cold(a.workdir, req, env, log)
    use = standby_program.eligible(req["argv"], sb.get("preload", ()), req.get("cwd"))
    with _slot_lock(a.workdir, sb["slot"]):  # one launch at a time takes the slot's standby
        res = None
        rec = _standby_record(a.workdir, sb["slot"])
        if rec is not None and use and _standby_fits(rec, req["argv"][0], sb["preload"], env) and _standby_alive(rec):
            res = _start_on_standby(a.workdir, rec, req, env, log)
        if res is None and rec is not None:
            _end_standby(a.workdir, sb["slot"], rec)  # gone, or of no use to this kind of launch
        if res is None:
            res = _start_cold(a.workdir, req, env, log)
        if use and "error" not in res:
            # The next launch's interpreter imports now, beside this server's start-up (as LocalHost's does).
            nxt = _spawn_standby(a.workdir, sb["slot"], req["owner"], req["argv"][0], sb["preload"], env,
                                 req.get("cwd") or os.getcwd(), sb.get("idle_s"))
            res |= {"next_standby": nxt and nxt["pid"], "cores": _usable_cores()}
    return res


def _start_cold(workdir: str, req: dict, env: dict[str, str], log: Path) -> dict:
    with open(log, "ab") as fh:
        try:
            p = subprocess.Popen(req["argv"], cwd=req.get("cwd"), env=env,
                                 stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        except OSError as e:
            return {"error": f"could not start {req['argv'][0]!r}: {e}"}
    _write_pidfile(workdir, p.pid, argv=req["argv"], owner=req["owner"], token=req["token"], log_path=str(log))
    return {"pid": p.pid, "pgid": p.pid}


def _write_pidfile(workdir: str, pid: int, **info: object) -> None:
    pid_dir = Path(workdir) / "servers"
    pid_dir.mkdir(parents=True, exist_ok=True)
    (pid_dir / f"{pid}.json").write_text(json.dumps(
        {"pgid": pid, "started": time.time(), "start_time": _start_time(pid)} | info))


# --- standby interpreters ------------------------------------------------------------------------
def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextmanager
def _slot_lock(workdir: str, slot: str) -> Iterator[None]:
    d = Path(workdir) / "standby"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{slot}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released as the file closes
        yield


def _env_key(env: dict[str, str]) -> str:
    """The environment's digest: the record says which one the standby has without writing it out."""
    return hashlib.sha256(json.dumps(sorted(env.items())).encode()).hexdigest()


def _program_key() -> str:
    """The standby program's digest: one shipped by another version of the code may read another job."""
    return hashlib.sha256(Path(standby_program.__file__).read_bytes()).hexdigest()[:16]


def _standby_record(workdir: str, slot: str) -> dict | None:
    try:
        return json.loads((Path(workdir) / "standby" / f"{slot}.json").read_text())
    except (OSError, ValueError):
        return None


def _standby_fits(rec: dict, python: str, preload: list[str], env: dict[str, str]) -> bool:
    """`orchestrator.hosts.standby.Standby.fits`, for a standby known by its record."""
    return (rec.get("python") == python and rec.get("preload") == list(preload) and rec.get("env") == _env_key(env)
            and rec.get("program") == _program_key())


def _standby_alive(rec: dict) -> bool:
    """Whether the recorded standby still runs: its pid, with the kernel start time it had (not a reused pid)."""
    pid = rec.get("pid")
    return isinstance(pid, int) and _alive(pid) and _start_time(pid) == rec.get("start_time")


def _forget_standby(workdir: str, slot: str, rec: dict) -> None:
    """Remove the slot's record and named pipe (if they are still this standby's)."""
    if (_standby_record(workdir, slot) or {}).get("pid") == rec.get("pid"):
        (Path(workdir) / "standby" / f"{slot}.json").unlink(missing_ok=True)
    if rec.get("fifo"):
        Path(rec["fifo"]).unlink(missing_ok=True)


def _end_standby(workdir: str, slot: str, rec: dict | None = None) -> int | None:
    """End the slot's waiting standby (if still the process recorded) and forget it; its pid, if it ran."""
    rec = rec if rec is not None else _standby_record(workdir, slot)
    if rec is None:
        return None
    pid = rec["pid"] if _standby_alive(rec) else None
    if pid is not None:
        try:
            os.kill(pid, signal.SIGCONT)  # a paused one (`standby-signal STOP`) would not act on the TERM
        except ProcessLookupError:
            pass
        kill_group(pid, 2.0)
    pidfile = Path(workdir) / "servers" / f"{rec['pid']}.json"
    try:
        if json.loads(pidfile.read_text()).get("standby") == slot:  # not yet a server's
            pidfile.unlink()
    except (OSError, ValueError):
        pass
    _forget_standby(workdir, slot, rec)
    return pid


def _spawn_standby(workdir: str, slot: str, owner: str, python: str, preload: list[str], env: dict[str, str],
                   cwd: str, idle_s: float | None = None) -> dict | None:
    """Start the slot's next standby, detached (its own session: it outlives this call and the SSH
    channel), with exactly the launch's environment; None if it could not start (launches start cold).
    With `idle_s` it exits by itself, removing its named pipe, after that long without a launch."""
    d = Path(workdir) / "standby"
    d.mkdir(parents=True, exist_ok=True)
    fifo = d / f"{slot}-{uuid.uuid4().hex[:8]}.fifo"
    program = Path(standby_program.__file__).resolve()
    argv = [python, str(program), "--fifo", str(fifo), *standby_program.idle_args(idle_s), "--", *preload]
    log = d / f"{slot}.log"
    try:
        os.mkfifo(fifo, 0o600)
        with open(log, "ab") as fh:
            p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        fifo.unlink(missing_ok=True)
        return None
    rec = {"slot": slot, "pid": p.pid, "start_time": _start_time(p.pid), "argv": argv, "python": python, "preload": list(preload),
           "env": _env_key(env), "program": _program_key(), "cwd": cwd, "fifo": str(fifo), "owner": owner,
           "log": str(log), "started": time.time()}
    _write_pidfile(workdir, p.pid, argv=argv, owner=owner, token=None, log_path=str(log), standby=slot)
    tmp = d / f"{slot}.json.tmp"
    tmp.write_text(json.dumps(rec))
    tmp.replace(d / f"{slot}.json")
    return rec


def _start_on_standby(workdir: str, rec: dict, req: dict, env: dict[str, str], log: Path) -> dict | None:
    """Hand the launch to the waiting standby: one JSON line down its named pipe. None where it cannot
    take it (not reading: dead, or never got to open the pipe); the caller then starts the launch cold."""
    pid = rec["pid"]
    try:
        os.kill(pid, signal.SIGCONT)  # paused by an orchestrator that died inside `quiet`: it would never read
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + 2.0
    while True:
        try:
            # Non-blocking: with no reader (a dead standby) the open fails at once (ENXIO) instead of hanging.
            fd = os.open(rec["fifo"], os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            # Alive but not reading yet: it opens the pipe first thing, before its imports.
            if e.errno != errno.ENXIO or time.monotonic() > deadline or not _standby_alive(rec):
                return None
            time.sleep(0.02)
    waited = time.time() - rec["started"]
    cwd = req.get("cwd") or os.getcwd()
    try:
        standby_program.lock_pipe(fd)  # not while it gives up, idle: then the write below fails (EPIPE)
        with open(log, "ab") as fh:  # first in the log, so even a standby dying at once leaves a trace
            fh.write(f"infergoal: standby pid={pid} runs this launch (preloaded {' '.join(rec['preload'])}, "
                     f"started {waited:.1f}s before)\n".encode())
        job = json.dumps({"argv": req["argv"][1:], "env": env, "cwd": cwd, "log": str(log), "sent": time.time()})
        os.set_blocking(fd, True)  # a job longer than the pipe's buffer waits for the reader
        data = memoryview((job + "\n").encode())
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # EPIPE: it died (or gave up, idle) meanwhile
        try:
            with open(log, "ab") as fh:
                fh.write(f"infergoal: standby pid={pid} could not take the launch; it starts cold\n".encode())
        except OSError:
            pass
        return None
    finally:
        os.close(fd)
    _forget_standby(workdir, rec["slot"], rec)
    # Its pidfile is now the server's: `stop` returns this log, `clean` ends it as a server.
    _write_pidfile(workdir, pid, argv=rec["argv"], owner=req["owner"], token=req["token"], log_path=str(log),
                   serves=req["argv"])
    return {"pid": pid, "pgid": pid, "standby": True}


def op_standby_signal(a: argparse.Namespace) -> dict:
    """Pause (STOP) or resume (CONT) the slot's waiting standby (`SSHHost.quiet`); its pid, or None."""
    rec = _standby_record(a.workdir, a.slot)
    if rec is None or not _standby_alive(rec):
        return {"pid": None}
    pid = rec["pid"]
    try:
        os.kill(pid, signal.SIGSTOP if a.sig == "STOP" else signal.SIGCONT)
    except ProcessLookupError:
        return {"pid": None}
    deadline = time.monotonic() + 1.0  # the stop lands when it is next scheduled: wait for it
    while a.sig == "STOP" and _state(pid) not in ("T", "t", "Z", "X", "") and time.monotonic() < deadline:
        time.sleep(0.005)
    return {"pid": pid}


def op_standby_end(a: argparse.Namespace) -> dict:
    """End the slot's waiting standby (`SSHHost.close`)."""
    with _slot_lock(a.workdir, a.slot):
        return {"ended": _end_standby(a.workdir, a.slot)}


def op_stop(a: argparse.Namespace) -> dict:
    """Stop the group; answer with the end of its log (one round trip instead of two)."""
    kill_group(a.pgid, a.grace)
    pidfile = Path(a.workdir) / "servers" / f"{a.pgid}.json"
    log = ""
    try:
        with open(json.loads(pidfile.read_text())["log_path"], "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - 4_000_000))
            log = fh.read().decode(errors="replace")
    except (OSError, ValueError, KeyError):
        pass
    pidfile.unlink(missing_ok=True)
    return {"stopped": a.pgid, "log": log}


def op_lease(a: argparse.Namespace) -> dict | None:
    """Hold the host lease while stdin stays open (see orchestrator/remote/hostlock.py).

    The first stdin line is the run's identity; the answer is one line, `held` (with any stale
    holder taken over) or `busy` (with who holds it). Held, each further line adds to the identity
    (the run id, once known); end of input releases it. The orchestrator keeps this process's SSH
    channel open for the whole run: when it exits, is killed -9 or its machine drops the connection,
    sshd closes the channel, this process reads end of input or dies, and the kernel frees the lock.
    A lock file removed or replaced on the host ends it with one `lost` line: the orchestrator sees
    its channel close, records the loss and takes the lease again (orchestrator/hosts/runlease.py).
    """
    fd, buf = sys.stdin.fileno(), b""  # raw reads: select() must not miss lines a buffer holds

    def lines(wait_s: float | None) -> list[bytes] | None:
        """Whole lines read within `wait_s` ([] if none came), None at end of input."""
        nonlocal buf
        if not select.select([fd], [], [], wait_s)[0]:
            return []
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        *done, buf = (buf + chunk).split(b"\n")
        return done

    first: list[bytes] | None = []
    while first == []:
        first = lines(None)
    req = json.loads(first[0] if first else b"{}")
    try:
        lock = hostlock.acquire(req.get("identity", {}), req.get("gpus", ""), a.dir or None)
    except hostlock.Busy as e:
        return {"busy": e.holders}
    except OSError as e:
        return {"error": f"cannot take the host lease in {hostlock.lease_dir(a.dir or None)}: {e}"}
    sys.stdout.write(json.dumps({"held": True, "stale": lock.stale, "holder_pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    got: list[bytes] | None = (first or [])[1:]  # anything sent after the identity already
    try:
        while got is not None:
            for line in got:
                if line.strip():
                    lock.update(**json.loads(line))
            reason = lock.lost_reason()
            if reason:
                sys.stdout.write(json.dumps({"lost": reason}) + "\n")
                sys.stdout.flush()
                break
            got = lines(LEASE_CHECK_S)
    finally:
        lock.release()
    return None


def op_alive(a: argparse.Namespace) -> dict:
    return {"alive": _alive(a.pid)}


def op_health(a: argparse.Namespace) -> dict:
    t0 = time.monotonic()
    while True:
        if not _alive(a.pid):
            return {"error": "crashed", "tail": log_tail(a.log)}
        try:
            with urllib.request.urlopen(a.url, timeout=2) as r:
                if r.status == 200:
                    return {"waited": time.monotonic() - t0}
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() - t0 > a.timeout:
            return {"error": "timeout", "tail": log_tail(a.log)}
        time.sleep(0.25)


def op_group_pids(a: argparse.Namespace) -> dict:
    return {"pids": sorted(group_pids(a.pgid))}


def op_listening_pids(a: argparse.Namespace) -> dict:
    return {"pids": sorted(listening_pids(a.port))}


def op_free_port(a: argparse.Namespace) -> dict:
    return {"port": free_port()}


def op_clean(a: argparse.Namespace) -> dict:
    """Stop every server (and waiting standby) whose pidfile names `owner` (all owners with --all) and is still ours."""
    killed, stale = [], []
    for f in sorted((Path(a.workdir) / "servers").glob("*.json")):
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            f.unlink(missing_ok=True)
            continue
        if not a.all and info.get("owner") != a.owner:
            continue
        pgid = int(info["pgid"])
        # A PID the kernel has since given to someone else is not ours to kill.
        if group_exists(pgid) and _start_time(pgid) == info.get("start_time"):
            if info.get("standby"):
                try:
                    os.kill(pgid, signal.SIGCONT)  # one paused by a dead orchestrator's `quiet` acts on the TERM
                except ProcessLookupError:
                    pass
            kill_group(pgid, 5.0)
            killed.append(pgid)
        else:
            stale.append(pgid)
        f.unlink(missing_ok=True)
    for f in sorted((Path(a.workdir) / "standby").glob("*.json")):  # the records of standbys now gone
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if (a.all or rec.get("owner") == a.owner) and not _standby_alive(rec):
            _forget_standby(a.workdir, rec.get("slot", f.stem), rec)
    return {"killed": killed, "stale": stale}


def op_tail(a: argparse.Namespace) -> dict:
    return {"tail": log_tail(a.path, a.lines)}


def op_manifest(a: argparse.Namespace) -> dict:
    root = Path(a.dir)
    if not root.exists() and a.seed and Path(a.seed).is_dir():
        # A new commit's tree starts as a copy of one already here: only its diff then travels.
        shutil.copytree(a.seed, root, symlinks=True)
    if not root.exists():
        return {"files": {}}
    return {"files": manifest(root, persist=True)}


def op_receive(a: argparse.Namespace) -> dict:
    """Unpack a tar from stdin into `dir`, then delete what its sync note lists."""
    root = Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    data = sys.stdin.buffer.read()
    deleted = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for m in tar.getmembers():
            if m.name == SYNC_META:
                deleted = json.loads(tar.extractfile(m).read())["delete"]
        tar.extractall(root, members=[m for m in tar.getmembers() if m.name != SYNC_META], filter="tar")
    for rel in deleted:
        (root / rel).unlink(missing_ok=True)
    files = manifest(root, persist=True)
    return {"received": len(data), "deleted": len(deleted), "digest": tree_digest(files)}


def op_model(a: argparse.Namespace) -> dict:
    """The folder a trial reads its model from here: `dir` itself, or its RAM-backed copy where
    `--cache` (the workspace's `model_cache`) says so. With `--key`, `dir` counts only if its files'
    names, sizes and mtimes give that key (orchestrator.remote.modelcache.manifest_key): then the
    orchestrator's own folder is here as it is there (the same machine, or a shared file system)
    and nothing needs to travel. {"path": null} where it is not."""
    src = Path(a.dir)
    if not src.is_dir() or (a.key and manifest_key(src) != a.key):
        return {"path": None}
    cache = resolve(a.cache)
    return {"path": str(cached_copy(src, cache) if cache is not None else src)}


def op_fingerprint(a: argparse.Namespace) -> dict:
    fp: dict = {"hostname": socket.gethostname(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
                "python": platform.python_version(), "python_path": sys.executable}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
        fp["gpus"] = gpus
        fp["gpu_count"] = len(gpus)
        if gpus:
            name, mem, driver = (x.strip() for x in gpus[0].split(","))
            fp.update(gpu_model=name, gpu_memory=mem, driver=driver)
        head = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
        if "CUDA Version:" in head:
            fp["cuda"] = head.split("CUDA Version:")[1].split()[0]
    except (OSError, subprocess.TimeoutExpired):
        fp.update(gpus=[], gpu_count=0)
    from importlib import metadata

    for pkg in ("torch", "transformers", "vllm", "sglang"):
        try:
            fp[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    try:
        fp["disk_free_gb"] = round(shutil.disk_usage(a.workdir).free / 2**30, 1)
    except OSError:
        pass
    return fp


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.remote.hostd")
    p.add_argument("--workdir", required=True)
    sub = p.add_subparsers(dest="op", required=True)
    sub.add_parser("start")
    s = sub.add_parser("stop")
    s.add_argument("pgid", type=int)
    s.add_argument("--grace", type=float, default=10.0)
    sub.add_parser("alive").add_argument("pid", type=int)
    s = sub.add_parser("health")
    for name, typ in (("url", str), ("timeout", float), ("pid", int), ("log", str)):
        s.add_argument(name, type=typ)
    sub.add_parser("group-pids").add_argument("pgid", type=int)
    sub.add_parser("listening-pids").add_argument("port", type=int)
    sub.add_parser("free-port")
    s = sub.add_parser("clean")
    s.add_argument("--owner", default="")
    s.add_argument("--all", action="store_true")
    s = sub.add_parser("tail")
    s.add_argument("path")
    s.add_argument("--lines", type=int, default=30)
    s = sub.add_parser("manifest")
    s.add_argument("dir")
    s.add_argument("--seed", default="")
    sub.add_parser("receive").add_argument("dir")
    s = sub.add_parser("model")
    s.add_argument("dir")
    s.add_argument("--key", default="")
    s.add_argument("--cache", default="off")
    sub.add_parser("fingerprint")
    s = sub.add_parser("standby-signal")
    s.add_argument("sig", choices=("STOP", "CONT"))
    s.add_argument("--slot", required=True)
    sub.add_parser("standby-end").add_argument("--slot", required=True)
    sub.add_parser("lease").add_argument("--dir", default="", help="lease folder (default: $INFERGOAL_LEASE_DIR or /tmp/infergoal-leases)")
    a = p.parse_args(argv)
    result = globals()["op_" + a.op.replace("-", "_")](a)
    if result is not None:  # `lease` has answered already, and its channel may be gone
        sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
