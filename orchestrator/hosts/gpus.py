"""The GPUs of one host as a pool: up to one trial per GPU at once, each GPU leased per trial.

Which GPUs a run may use is declared by the workspace's `gpus` (`auto`: found on the host with
`nvidia-smi -L`, or `CUDA_VISIBLE_DEVICES` where it is set; `gpus = 4`: ids 0-3; `gpus = [0, 2]`:
those ids, also for simulating GPUs on a machine without them). A trial takes as many GPUs as its
knobs need (`targets.parallel.gpus_needed`); its server sees them alone (`CUDA_VISIBLE_DEVICES`).

Each GPU is leased on the host for the trial that runs on it, the way a whole host is leased
(orchestrator/remote/hostlock.py: an `flock` on `gpu-N.lock`, `host.lock` shared): a run of another
workspace cannot take a GPU in use, one on the whole host waits for every GPU, and a process killed
-9 frees its GPUs at once (the kernel drops its locks). A GPU another run holds is skipped and tried
again at the next placement.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from orchestrator.hosts.base import Host, HostError
from orchestrator.hosts.local import LocalHost
from orchestrator.remote import hostlock

__all__ = ["GpuPlan", "GpuPool", "GpusBusy", "Slot", "detect_local", "gpu_memory_bytes", "gpu_names", "host_gpus", "plan_gpus",
           "resolve_gpus"]

_LINE = re.compile(r"^GPU (\d+): (.+?)(?: \(UUID: [^)]*\))?$")


class GpusBusy(HostError):
    """Every GPU a placement needs is held by other runs, for longer than the pool waits."""


def detect_local(run: Callable[[list[str]], str | None] | None = None) -> dict[str, str]:
    """GPU id -> model name on this machine (`nvidia-smi -L`), limited to `CUDA_VISIBLE_DEVICES` where
    it names ids; {} without nvidia-smi or a GPU."""
    out = (run or _nvidia_smi)(["nvidia-smi", "-L"]) or ""
    found = {m.group(1): m.group(2).strip() for line in out.splitlines() if (m := _LINE.match(line.strip()))}
    visible = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if visible and all(g.isdigit() for g in visible):
        return {g: found.get(g, "") for g in visible if not found or g in found}
    return found


def _nvidia_smi(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def gpu_memory_bytes(fingerprint: dict[str, Any]) -> int | None:
    """One card's memory from a host fingerprint's `gpus` lines (`name, 81559 MiB, driver`); None if unknown."""
    lines = fingerprint.get("gpus") or []
    m = re.search(r"(\d+)\s*MiB", lines[0]) if lines else None
    return int(m.group(1)) * 1024**2 if m else None


def gpu_names(fingerprint: dict[str, Any]) -> list[str]:
    """The GPU model of each of a host fingerprint's `gpus` lines (`NVIDIA H200, 143771 MiB, 580.159.04` ->
    `NVIDIA H200`), in the fingerprint's order."""
    return [str(line).split(",")[0].strip() for line in fingerprint.get("gpus") or []]


def resolve_gpus(setting: Any, found: dict[str, str]) -> dict[str, str]:
    """The GPUs a run uses, id -> model name ('' when not known): `auto` = `found` (the host's);
    an int N = ids 0..N-1; a list = those ids. Ids the host does not have, or a mix of GPU models
    (a speedup on one card against a baseline on another is no speedup), are refused in one line."""
    if setting in ("auto", "", None):
        chosen = dict(found)
    else:
        if isinstance(setting, bool) or not isinstance(setting, int | list | tuple):
            raise HostError(f"gpus = {setting!r}: write `auto`, a count (gpus = 4) or a list of ids (gpus = [0, 1])")
        ids = [str(i) for i in range(setting)] if isinstance(setting, int) else [str(g).strip() for g in setting]
        if not ids or not all(g.isdigit() for g in ids) or len(set(ids)) != len(ids):
            raise HostError(f"gpus = {setting!r}: give a count of at least 1 or distinct GPU ids such as [0, 1]")
        missing = [g for g in ids if found and g not in found]
        if missing:
            raise HostError(f"gpus = {setting!r}: the host has no GPU {', '.join(missing)} (it has {', '.join(found)}); "
                            "list only those `nvidia-smi -L` shows")
        chosen = {g: found.get(g, "") for g in ids}
    models = Counter(name for name in chosen.values() if name).most_common()
    if len(models) > 1:
        by = ", ".join(f"{g}: {n}" for g, n in chosen.items())
        raise HostError(f"the run's GPUs are of different models ({by}); list one model's ids, e.g. gpus = "
                        f"[{', '.join(g for g, n in chosen.items() if n == models[0][0])}]")
    return chosen


def host_gpus(host: Host) -> dict[str, str]:
    """GPU id -> model name of a host: this machine's from `nvidia-smi -L` (and `CUDA_VISIBLE_DEVICES`),
    an SSH host's from its fingerprint (its `--gpus` where set); {} where there is none."""
    if isinstance(host, LocalHost):
        return detect_local()
    names = gpu_names(host.fingerprint())
    ids = [g.strip() for g in str(getattr(host, "gpus", "") or "").split(",") if g.strip()] or [str(i) for i in range(len(names))]
    return {g: names[int(g)] if g.isdigit() and int(g) < len(names) else "" for g in ids}


@dataclass(frozen=True)
class GpuPlan:
    """How a run uses its host's GPUs."""

    pool: dict[str, str]
    """GPU id -> model name of a GPU pool (trials at once, each on its own GPUs); {}: one trial at a
    time on the host as it is."""
    per_trial: int
    """The most GPUs one trial may take (`targets.parallel.check_fit`'s `gpus_on_host`)."""


def plan_gpus(setting: Any, hosts: Sequence[Host]) -> GpuPlan:
    """The workspace's `gpus` applied to the run's hosts (see the module doc); `HostError` in one line."""
    if len(hosts) > 1:
        if setting not in ("auto", "", None):
            raise HostError(f"gpus = {setting!r} applies to one host; a pool of hosts runs one trial per host (register "
                            "one entry per GPU set with `infergoal hosts add NAME ssh://... --gpus 0`)")
        return GpuPlan({}, max(len(str(getattr(h, "gpus", "") or "x").split(",")) for h in hosts))
    fixed = [g for g in str(getattr(hosts[0], "gpus", "") or "").split(",") if g.strip()]
    if setting in ("auto", "", None) and fixed:  # an SSH host registered with --gpus: that set, as one
        return GpuPlan({}, len(fixed))
    chosen = resolve_gpus(setting, host_gpus(hosts[0]))
    if setting in ("auto", "", None) and len(chosen) <= 1:  # one GPU or none: one trial at a time, as always
        return GpuPlan({}, 1)
    return GpuPlan(chosen, len(chosen))


@dataclass
class Slot:
    """GPUs taken for one trial: the host bound to them (its servers see only them) and their leases."""

    host: Host
    ids: list[str]
    leases: list[Any] = field(default_factory=list)

    @property
    def gpus(self) -> str:
        return ",".join(self.ids)

    def name_trial(self, number: int) -> None:
        """Say in the leases which trial holds the GPUs (a refused run names it)."""
        for lease in self.leases:
            try:
                lease.update(trial=number)
            except Exception:  # noqa: BLE001 - a lease is still held without the note
                pass


class GpuPool:
    """The GPUs `ids` of one host, each leased by the trial on it (see the module doc).

    `bind(gpus)` makes the host bound to a GPU set ("0" or "0,1"); the pool keeps one per set.
    `take(n)` places without waiting (None: not enough free now), `hold(n)` waits; `release`
    is called by whoever ran the trial, any thread, as soon as its server is down."""

    def __init__(self, bind: Callable[[str], Host], ids: Sequence[str], identity: dict[str, Any], *,
                 models: dict[str, str] | None = None, wait_s: float = 300.0, poll_s: float = 2.0) -> None:
        if not ids:
            raise HostError("a GPU pool needs at least one GPU")
        self.ids, self.identity, self.wait_s, self.poll_s = list(ids), identity, wait_s, poll_s
        self.models = dict(models or {})
        self._bind = bind
        self._hosts: dict[str, Host] = {}
        self.in_use: set[str] = set()
        self.foreign: dict[str, list[dict[str, Any]]] = {}
        """GPU id -> who held it when its lease was last refused (another run)."""
        self._cond = threading.Condition()

    @property
    def size(self) -> int:
        return len(self.ids)

    def host_for(self, gpus: str) -> Host:
        if gpus not in self._hosts:
            h = self._bind(gpus)
            h.gpu_model = self.models.get(gpus.split(",")[0], "")  # type: ignore[attr-defined]
            self._hosts[gpus] = h
        return self._hosts[gpus]

    @property
    def hosts(self) -> list[Host]:
        """The hosts made so far (one per GPU set), for setting their run and closing them."""
        return list(self._hosts.values())

    def could_take(self) -> bool:
        """Whether some GPU is not running one of this run's trials (another run may still hold it)."""
        with self._cond:
            return len(self.in_use) < len(self.ids)

    def take(self, n: int) -> Slot | None:
        """`n` GPUs leased for a trial now, or None (fewer free: ours busy, or held by other runs)."""
        with self._cond:
            got: list[tuple[str, Any]] = []
            for g in self.ids:
                if len(got) == n:
                    break
                if g in self.in_use:
                    continue
                try:
                    lease = self.host_for(g).take_lease(self.identity)  # type: ignore[attr-defined]
                except hostlock.Busy as e:  # every lease held on the host is listed: keep this GPU's
                    self.foreign[g] = [h for h in e.holders if h.get("lock") in (f"gpu-{g}", "host")] or e.holders
                    continue
                self.foreign.pop(g, None)
                got.append((g, lease))
            if len(got) < n:
                for _, lease in got:
                    lease.release()
                return None
            ids = [g for g, _ in got]
            self.in_use.update(ids)
            return Slot(self.host_for(",".join(ids)), ids, [lease for _, lease in got])

    def release(self, slot: Slot) -> None:
        with self._cond:
            for lease in slot.leases:
                try:
                    lease.release()
                except Exception:  # noqa: BLE001 - an unreachable host frees it when the channel dies
                    pass
            slot.leases = []
            self.in_use.difference_update(slot.ids)
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> None:
        """Until a GPU is released, or `timeout_s` (GPUs of other runs are only seen by trying)."""
        with self._cond:
            self._cond.wait(timeout_s)

    def held_by_others(self) -> str:
        who = {hostlock_text(h) for hs in self.foreign.values() for h in hs}
        return "; ".join(sorted(who)) or "another run"

    def acquire(self, n: int) -> Slot:
        """`n` GPUs for a trial run on this thread, waited for: ours as they finish, other runs' for up to
        `wait_s` (then `GpusBusy` naming them). Give them back with `release`."""
        deadline = time.monotonic() + self.wait_s
        while (slot := self.take(n)) is None:
            with self._cond:
                ours = bool(self.in_use)
            if not ours and time.monotonic() > deadline:
                raise GpusBusy(f"{n} GPU(s) of {', '.join(self.ids)} not free for {self.wait_s:.0f}s: held by "
                               f"{self.held_by_others()}")
            self.wait(self.poll_s)
        return slot

    @contextmanager
    def hold(self, n: int) -> Iterator[Slot]:
        """`acquire(n)` for a `with` block."""
        slot = self.acquire(n)
        try:
            yield slot
        finally:
            self.release(slot)


def hostlock_text(h: dict[str, Any]) -> str:
    """A lease holder in a few words: `run 3 of /path/ws (pid 123 on box)`."""
    who = f"run {h['run']}" if h.get("run") is not None else "a run being started"
    trial = f" trial #{h['trial']}" if h.get("trial") is not None else ""
    return f"{who}{trial} of {h.get('workspace', '?')} (pid {h.get('pid', '?')} on {h.get('host', '?')})"
