"""RemoteSite: trees synced to an SSH host, gates and bench run there, results read back as JSON."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import paramiko

from gates import GateResult
from gates.lock import LOCK_NAME, GateTampered, verify
from orchestrator.bench import Scenario, ScenarioResult
from orchestrator.hosts.base import HostError
from orchestrator.hosts.sshconn import ConnectionLost, HostSpec, SSHConnection
from orchestrator.remote.hostd import SYNC_META
from orchestrator.remote.manifest import diff, manifest, tar_files, tree_digest
from orchestrator.remote.modelcache import manifest_key

__all__ = ["RemoteSite", "ShippedHost", "SyncStats"]

_GATES_DIR = Path(__file__).resolve().parents[2] / "gates"


class ShippedHost(Protocol):
    """What a RemoteSite needs of its host: `orchestrator.hosts.ssh.SSHHost` is the one, and builds it.

    A protocol, not an import: the host builds its site, so the site naming the host's class would
    tie the two modules in a circle.
    """

    name: str
    owner: str
    """Whose worker log and servers these are (`orchestrator.hosts.ssh.owner_id`)."""
    spec: HostSpec
    conn: SSHConnection
    model_cache: str
    """The workspace's `model_cache` setting, applied on the host (orchestrator.remote.modelcache)."""

    @property
    def workdir(self) -> str:
        """The host's work dir, an absolute path."""
        ...

    def ship_code(self) -> bool:
        """Send orchestrator/ and gates/ to `workdir/code` unless the host has this version."""
        ...

    def py_cmd(self, module: str, *args: str) -> str:
        """A shell command that runs `python -m module args` on the host with the shipped code."""
        ...

    def hostd(self, *args: str, stdin: bytes = b"", timeout_s: float = 600.0) -> dict:
        """Run one op of `orchestrator.remote.hostd` on the host; its JSON answer."""
        ...

    def fingerprint(self) -> dict:
        """The host's hardware and software facts."""
        ...


@dataclass
class SyncStats:
    """What the last `place` cost: the number the SSH overhead table in docs/results.md reports."""

    files_sent: int = 0
    bytes_sent: int = 0
    files_deleted: int = 0
    seconds: float = 0.0


class _Worker:
    """The host's measurement worker over one SSH channel; restarted (and the call retried) if it drops."""

    def __init__(self, host: ShippedHost) -> None:
        self.host = host
        self.chan: paramiko.Channel | None = None

    def _open(self) -> None:
        self.host.ship_code()
        w = self.host.workdir
        cmd = (f"mkdir -p {w}/logs && cd {w} && exec env "
               + self.host.py_cmd("orchestrator.remote.worker") + f" 2>>{w}/logs/worker-{self.host.owner}.log")
        self.chan = self.host.conn.open_stream(cmd)
        self.reader = self.chan.makefile("rb")
        self.chan.settimeout(300)  # the worker imports the bench and the gates before it says ready
        try:
            hello = self.reader.readline()
        except (OSError, paramiko.SSHException, EOFError) as e:
            hello = b""
            if self.chan.get_transport().is_active():
                raise HostError(f"{self.host.name}: the measurement worker did not answer: {e}") from None
        if not hello:
            lost = not self.chan.get_transport().is_active() or self.chan.recv_exit_status() == -1
            self.chan = None
            if lost:
                raise ConnectionLost(f"{self.host.name}: connection lost while the measurement worker started")
            raise HostError(f"{self.host.name}: the measurement worker did not start; see "
                            f"{w}/logs/worker-{self.host.owner}.log on the host (it needs aiohttp, numpy, pydantic, "
                            "and torch + transformers for the accuracy gate)")

    def call(self, op: str, *, wait_s: float = 3600.0, **req: Any) -> dict:
        try:
            return self._call(op, wait_s, req)
        except (paramiko.SSHException, OSError, EOFError) as e:  # still failing after every retry
            raise HostError(f"{self.host.name}: {op} on the host failed: {type(e).__name__}: {e}") from None

    def _call(self, op: str, wait_s: float, req: dict) -> dict:
        def once() -> dict:
            if self.chan is None or self.chan.closed or self.chan.exit_status_ready():
                self._open()
            assert self.chan is not None
            try:
                self.chan.settimeout(wait_s)
                self.chan.sendall((json.dumps({"op": op, **req}) + "\n").encode())
                line = self.reader.readline()
            except (TimeoutError, OSError, paramiko.SSHException, EOFError) as e:
                self.chan = None
                raise ConnectionLost(f"{self.host.name}: the measurement worker's connection broke ({type(e).__name__}: {e})") from None
            if not line:
                self.chan = None
                raise ConnectionLost(f"{self.host.name}: the measurement worker went away mid-{op}")
            answer = json.loads(line)
            if "tampered" in answer:
                t = answer["tampered"]
                raise GateTampered(t["changed"], t["added"], t["removed"], note=f"on host {self.host.name}")
            if "error" in answer:
                raise HostError(f"{self.host.name}: {op} failed on the host: {answer['error']}")
            return answer["ok"]

        return self.host.conn.retried(once)

    def close(self) -> None:
        if self.chan is not None:
            self.chan.close()
            self.chan = None


class RemoteSite:
    """The Site of an SSHHost: see orchestrator.hosts.site for the protocol."""

    def __init__(self, host: ShippedHost) -> None:
        self.host = host
        self.python = host.spec.python
        self.worker = _Worker(host)
        self._placed: dict[str, str] = {}
        self._digests: dict[str, str] = {}
        self._last_tree = ""
        self.last_sync = SyncStats()

    # --- trees -------------------------------------------------------------------------------
    def place(self, path: str | Path, *, kind: str = "tree") -> str:
        """Sync a local folder to the host by manifest (only changed files travel); return the host path.

        Models (kind "model", "reference", "tokenizer") are synced once per session: they do not
        change under a run. Where the host already has the same folder at the same path (same
        names, sizes and mtimes: the same machine, or a shared file system), it is used there and
        nothing travels or is hashed. A model (not a reference) is then read from the host's
        RAM-backed copy where the workspace's `model_cache` says so, as on a local host.
        Trees are synced every time,
        and a new tree starts on the host as a copy of the last one, so a commit sends its diff.
        """
        local = Path(path).resolve()
        key = str(local)
        if kind != "tree" and key in self._placed:
            return self._placed[key]
        t0 = time.perf_counter()
        cache = self.host.model_cache if kind == "model" else "off"
        if kind != "tree":
            stat_key = manifest_key(local)
            there = self.host.hostd("model", key, "--key", stat_key, "--cache", cache)["path"]
            if there:
                self.last_sync = SyncStats(seconds=time.perf_counter() - t0)
                self._digests[kind] = f"stat:{stat_key}"  # names, sizes and mtimes: the content was not hashed
                self._placed[key] = there
                return there
        folder = "trees" if kind == "tree" else "models"
        remote = f"{self.host.workdir}/{folder}/{local.name}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"
        mine = manifest(local)
        seed = self._last_tree if kind == "tree" and self._last_tree != remote else ""
        theirs = self.host.hostd("manifest", remote, "--seed", seed)["files"]
        send, delete = diff(mine, theirs)
        stats = SyncStats(files_sent=len(send), files_deleted=len(delete))
        if send or delete:
            blob = tar_files(local, send, {SYNC_META: json.dumps({"delete": delete}).encode()})
            stats.bytes_sent = len(blob)
            self.host.hostd("receive", remote, stdin=blob)
        stats.seconds = time.perf_counter() - t0
        self.last_sync = stats
        self._digests[kind] = tree_digest(mine)
        if kind == "tree":
            self._last_tree = remote
        elif cache != "off":
            remote = self.host.hostd("model", remote, "--cache", cache)["path"] or remote
        self._placed[key] = remote
        return remote

    # --- gates and bench, on the host ----------------------------------------------------------
    def verify_gates(self) -> None:
        """The orchestrator's own gate files first, then the host's copy against the same lock."""
        verify()
        locked = json.loads((_GATES_DIR / LOCK_NAME).read_text())["files"]
        self.host.ship_code()
        res = self.worker.call("verify", files=locked, gates_dir=f"{self.host.workdir}/code/gates")
        if res["changed"] or res["added"] or res["removed"]:
            raise GateTampered(res["changed"], res["added"], res["removed"], note=f"on host {self.host.name}")

    def integrity(self, base_url: str, **kw: Any) -> GateResult:
        if kw.get("tokenizer_dir"):
            kw["tokenizer_dir"] = self.place(kw["tokenizer_dir"], kind="tokenizer")
        for k in ("launched_pids", "listening_pids"):
            if kw.get(k) is not None:
                kw[k] = sorted(kw[k])
        return GateResult(**self.worker.call("integrity", base_url=base_url, **kw))

    def accuracy(self, base_url: str, **kw: Any) -> GateResult:
        kw["reference_model_dir"] = self.place(kw["reference_model_dir"], kind="reference")
        return GateResult(**self.worker.call("accuracy", base_url=base_url, **kw))

    def audit(self, **kw: Any) -> GateResult:
        kw["reference_model_dir"] = self.place(kw["reference_model_dir"], kind="reference")
        return GateResult(**self.worker.call("audit", **kw))

    def bench(self, base_url: str, model: str, scenario: Scenario, *, tokenizer: Any, tokenizer_dir: str,
              api: str, timeout_s: float, capabilities: dict[str, Any] | None = None) -> ScenarioResult:
        tok = self.place(tokenizer_dir, kind="tokenizer") if tokenizer_dir else None
        res = self.worker.call("bench", base_url=base_url, model=model, scenario=scenario.model_dump(mode="json"),
                               tokenizer=tok, api=api, timeout_s=timeout_s, capabilities=capabilities)
        return ScenarioResult.from_dict(res["result"])

    def facts(self) -> dict[str, Any]:
        return {**self.host.fingerprint(), "engine_tree": self._digests.get("tree"), "model_hash": self._digests.get("model"),
                "sync": self.last_sync.__dict__}

    def close(self) -> None:
        self.worker.close()

