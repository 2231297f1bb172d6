"""The host side of SSHHost: `python -m orchestrator.remote.hostd OP ...`, one JSON line out.

Each call is a short process started over SSH. Servers are started detached, in their own session
(so the SSH channel closing does not take them down, and one killpg stops the whole group), with
their log in the host's work dir and a pidfile beside it: `clean` stops exactly the servers an
orchestrator started, and only those, even after that orchestrator was killed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import select
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from orchestrator.remote import hostlock
from orchestrator.remote.manifest import manifest, tree_digest
from orchestrator.remote.modelcache import cached_copy, manifest_key, resolve
from orchestrator.remote.procs import group_exists, group_pids, kill_group, listening_pids, log_tail

SYNC_META = ".infergoal-sync.json"
LEASE_CHECK_S = 2.0
"""How often a held `lease` looks at its lock files (one removed or replaced is a lost lease)."""


def _start_time(pid: int) -> str | None:
    """Kernel start time of `pid` (field 22 of /proc/PID/stat): tells a reused PID from ours."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def op_start(a: argparse.Namespace) -> dict:
    req = json.loads(sys.stdin.read())
    pid_dir = Path(a.workdir) / "servers"
    # A start retried after a dropped connection must not launch a second server.
    for f in pid_dir.glob("*.json"):
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if info.get("token") == req["token"]:
            return {"pid": info["pgid"], "pgid": info["pgid"]}
    log = Path(req["log_path"])
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        try:
            p = subprocess.Popen(req["argv"], cwd=req.get("cwd"), env=os.environ | req.get("env", {}),
                                 stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        except OSError as e:
            return {"error": f"could not start {req['argv'][0]!r}: {e}"}
    pid_dir.mkdir(parents=True, exist_ok=True)
    (pid_dir / f"{p.pid}.json").write_text(json.dumps({
        "pgid": p.pid, "argv": req["argv"], "owner": req["owner"], "token": req["token"], "started": time.time(),
        "start_time": _start_time(p.pid), "log_path": str(log),
    }))
    return {"pid": p.pid, "pgid": p.pid}


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
    its channel close, records the loss and takes the lease again (orchestrator/lease.py).
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return {"port": s.getsockname()[1]}


def op_clean(a: argparse.Namespace) -> dict:
    """Stop every server whose pidfile names `owner` (all owners with --all) and is still ours."""
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
            kill_group(pgid, 5.0)
            killed.append(pgid)
        else:
            stale.append(pgid)
        f.unlink(missing_ok=True)
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
    sub.add_parser("lease").add_argument("--dir", default="", help="lease folder (default: $INFERGOAL_LEASE_DIR or /tmp/infergoal-leases)")
    a = p.parse_args(argv)
    result = globals()["op_" + a.op.replace("-", "_")](a)
    if result is not None:  # `lease` has answered already, and its channel may be gone
        sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
