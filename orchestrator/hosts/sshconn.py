"""One SSH connection to a host, on paramiko: host keys checked, keepalives, reconnects.

Host keys: the workspace's `known_hosts` (`.infergoal/known_hosts`) and the user's
`~/.ssh/known_hosts` are both read. An unknown key is refused (`HostKeyUnknown`) and so is a
changed one (`HostKeyChanged`); `infergoal hosts trust NAME` is the one way to accept a new key.
Transient failures (a reset, a dropped session, a host rebooting) reconnect and retry with
tenacity; a refused key or a refused login never retries: retrying cannot fix it. A host that just
failed a whole retry cycle is down: for `down_s` after that, each call tries it once (no backoff),
so the clean-up calls after a lost host (stop, logs) fail at once instead of ~12 s each.
"""

from __future__ import annotations

import select
import shlex
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import paramiko
from pydantic import BaseModel, ConfigDict
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from orchestrator.hosts.base import HostError

__all__ = [
    "ConnectionLost", "HostAuthFailed", "HostKeyChanged", "HostKeyUnknown", "HostSpec", "SSHConnection", "parse_ssh_url",
    "remote_cmd", "trust_host",
]


T = TypeVar("T")


class HostKeyUnknown(HostError):
    """The host's key is in no known_hosts file."""


class HostKeyChanged(HostError):
    """The host's key differs from the one recorded: another machine, or a reinstalled one."""


class HostAuthFailed(HostError):
    """The host refused every key offered."""


class HostSpec(BaseModel):
    """A remote GPU host reached over SSH (`infergoal hosts add NAME ssh://user@host:port`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    """Short name used on the command line (`--host NAME`)."""
    hostname: str
    port: int = 22
    user: str = ""
    """Login name; empty = the local user name."""
    key: str = ""
    """Private key file; empty = the SSH agent and ~/.ssh/id_* keys."""
    python: str = "python3"
    """Python on the host that runs the servers' tooling, the bench and the gates."""
    gpus: str = ""
    """CUDA_VISIBLE_DEVICES for servers started there, e.g. "0,1"; empty = all."""
    workdir: str = ".infergoal-host"
    """Folder on the host (relative to the login's home) for code, trees, logs and pidfiles."""
    keepalive_s: int = 15
    connect_timeout_s: float = 15.0

    @property
    def known_as(self) -> str:
        """The name a known_hosts line uses for this host."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def parse_ssh_url(url: str, *, name: str = "", **fields: str) -> HostSpec:
    """`ssh://user@host:port` -> HostSpec (extra fields: key, python, gpus, workdir)."""
    parts = urlsplit(url)
    if parts.scheme != "ssh" or not parts.hostname:
        raise HostError(f"host {url!r} is not an ssh:// URL; write it as ssh://user@host:port")
    try:
        port = parts.port or 22
    except ValueError:
        raise HostError(f"host {url!r}: the port is not a number") from None
    clean = {k: v for k, v in fields.items() if v not in ("", None)}
    return HostSpec(name=name or parts.hostname, hostname=parts.hostname, port=port, user=parts.username or "", **clean)


def _transient(e: BaseException) -> bool:
    if isinstance(e, HostError) and not isinstance(e, ConnectionLost):
        return False
    return isinstance(e, (ConnectionLost, paramiko.SSHException, OSError, EOFError)) and not isinstance(
        e, (paramiko.AuthenticationException, paramiko.BadHostKeyException))


class ConnectionLost(HostError):
    """The connection went away mid-command (retried after a reconnect)."""


class _Refuse(paramiko.MissingHostKeyPolicy):
    def __init__(self, spec: HostSpec, known_hosts: Path) -> None:
        self.spec, self.known_hosts = spec, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyUnknown(
            f"host {self.spec.name} ({self.spec.known_as}) is not in {self.known_hosts} or ~/.ssh/known_hosts "
            f"(its {key.get_name()} key is {key.fingerprint}); if that is the right machine, run "
            f"`infergoal hosts trust {self.spec.name}`"
        )


class SSHConnection:
    """A paramiko client that reconnects on demand; `exec` runs one command and returns its output."""

    def __init__(self, spec: HostSpec, known_hosts: str | Path, *, attempts: int = 6, down_s: float = 60.0) -> None:
        self.spec, self.known_hosts, self.attempts, self.down_s = spec, Path(known_hosts), attempts, down_s
        self._client: paramiko.SSHClient | None = None
        self.reconnects = 0
        self._down_at: float | None = None  # when a whole retry cycle last failed on a transient error
        self.tried = 0  # attempts the last failed call made

    @property
    def down(self) -> bool:
        """The host failed a whole retry cycle less than `down_s` ago and has not answered since."""
        return self._down_at is not None and time.monotonic() - self._down_at < self.down_s

    # --- connecting --------------------------------------------------------------------------
    def client(self) -> paramiko.SSHClient:
        if self._client is not None and self._client.get_transport() and self._client.get_transport().is_active():
            return self._client
        self.close()
        c = paramiko.SSHClient()
        c.load_system_host_keys()
        if self.known_hosts.is_file():
            c.load_host_keys(str(self.known_hosts))
        c.set_missing_host_key_policy(_Refuse(self.spec, self.known_hosts))
        s = self.spec
        try:
            c.connect(s.hostname, port=s.port, username=s.user or None, key_filename=s.key or None,
                      timeout=s.connect_timeout_s, banner_timeout=s.connect_timeout_s, auth_timeout=s.connect_timeout_s,
                      allow_agent=True, look_for_keys=not s.key)
        except paramiko.BadHostKeyException as e:
            raise HostKeyChanged(
                f"the host key of {s.name} ({s.known_as}) changed: expected {e.expected_key.fingerprint}, got "
                f"{e.key.fingerprint}. Either someone is in the middle or the machine was reinstalled; if you "
                f"know it was reinstalled, run `infergoal hosts trust {s.name}` (it replaces the old key)"
            ) from None
        except paramiko.AuthenticationException as e:
            raise HostAuthFailed(
                f"{s.user or 'this user'}@{s.known_as} refused the login ({e}); add your public key to the host's "
                f"~/.ssh/authorized_keys, or pass the right one with `infergoal hosts add {s.name} ... --key PATH`"
            ) from None
        c.get_transport().set_keepalive(s.keepalive_s)
        self._client = c
        return c

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _drop(self) -> None:
        self.reconnects += 1
        self.close()

    def retrying(self) -> Retrying:
        """Tenacity policy for transient failures: drop the connection, wait, reconnect, retry.
        A host that is `down` gets one try: a dead host's every call would otherwise wait out the cycle."""
        return Retrying(retry=retry_if_exception(_transient), stop=stop_after_attempt(1 if self.down else self.attempts),
                        wait=wait_exponential(multiplier=0.5, max=5), reraise=True,
                        before_sleep=lambda state: self._drop())

    def retried(self, fn: Callable[[], T]) -> T:
        """fn() under `retrying()` (every host call goes through here); marks the host down when the retries run out on a transient failure,
        up again when a call goes through."""
        policy = self.retrying()
        try:
            for attempt in policy:
                with attempt:
                    result = fn()
        except BaseException as e:
            if _transient(e):
                self._down_at = time.monotonic()
                self.tried = policy.statistics.get("attempt_number", 1)
            raise
        self._down_at = None
        return result

    # --- commands ----------------------------------------------------------------------------
    def exec(self, cmd: str, *, stdin: bytes = b"", timeout_s: float = 600.0) -> tuple[int, bytes, bytes]:
        """Run `cmd` in a shell on the host, retrying on transient failures. Returns (rc, stdout, stderr)."""
        try:
            return self.retried(lambda: self._exec_once(cmd, stdin, timeout_s))
        except (paramiko.SSHException, OSError, EOFError) as e:
            n = self.tried
            raise HostError(f"{self.spec.name}: {type(e).__name__}: {e} (after {n} attempt{'s' * (n != 1)})") from None

    def _exec_once(self, cmd: str, stdin: bytes, timeout_s: float) -> tuple[int, bytes, bytes]:
        transport = self.client().get_transport()
        chan = transport.open_session(timeout=self.spec.connect_timeout_s)
        try:
            chan.exec_command(cmd)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout_s
            while True:
                select.select([chan], [], [], 0.5)
                while chan.recv_ready():
                    out += chan.recv(1 << 16)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not transport.is_active():
                    raise ConnectionLost(f"connection to {self.spec.name} lost while running a command")
                if time.monotonic() > deadline:
                    raise HostError(f"{self.spec.name}: command did not finish in {timeout_s:.0f}s: {cmd[:120]}")
            rc = chan.recv_exit_status()
            if rc == -1:  # the session ended without an exit status: the connection went away
                raise ConnectionLost(f"connection to {self.spec.name} lost while running a command")
            return rc, bytes(out), bytes(err)
        finally:
            chan.close()

    def open_stream(self, cmd: str) -> paramiko.Channel:
        """A long-lived command whose stdin/stdout the caller speaks to (the measurement worker)."""
        def start() -> paramiko.Channel:
            chan = self.client().get_transport().open_session(timeout=self.spec.connect_timeout_s)
            chan.exec_command(cmd)
            return chan

        return self.retried(start)


def trust_host(spec: HostSpec, known_hosts: str | Path) -> tuple[str, str | None]:
    """Record the key `spec`'s host presents now; return (new fingerprint, the replaced one or None)."""
    known_hosts = Path(known_hosts)
    try:
        sock = socket.create_connection((spec.hostname, spec.port), timeout=spec.connect_timeout_s)
    except OSError as e:
        raise HostError(f"cannot reach {spec.known_as}: {e}") from None
    t = paramiko.Transport(sock)
    try:
        t.start_client(timeout=spec.connect_timeout_s)
        key = t.get_remote_server_key()
    except paramiko.SSHException as e:
        raise HostError(f"{spec.known_as} did not complete the SSH handshake: {e}") from None
    finally:
        t.close()
    keys = paramiko.HostKeys()
    if known_hosts.is_file():
        keys.load(str(known_hosts))
    old = keys.lookup(spec.known_as)
    replaced = old[key.get_name()].fingerprint if old and key.get_name() in old else None
    if old is not None:
        del keys[spec.known_as]  # a reinstalled host: its other key types are stale too
    keys.add(spec.known_as, key.get_name(), key)
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    keys.save(str(known_hosts))
    return key.fingerprint, (replaced if replaced != key.fingerprint else None)


def remote_cmd(*parts: str, env: dict[str, str] | None = None) -> str:
    """A shell command line with every part quoted."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return (prefix + " " if prefix else "") + shlex.join(parts)
