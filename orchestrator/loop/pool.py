"""A pool of hosts, or of one host's GPUs, running trials at once, with the controller still the one place that judges.

Several hosts (`HostPool`: a comma-separated `host`), or the GPUs of one host (`GpuPool`:
orchestrator/hosts/gpus.py, each trial on as many GPUs as its knobs need), take trials in
parallel, the way Optuna's `n_jobs` and its distributed mode work: the workers only deploy, gate
and measure; every proposal, verdict and stop is made on the controller's thread, in the order
results arrive. The search proposer asks with the constant liar, so proposals made while others are
in flight spread out. A host that stops answering fails its trial with the reason, leaves the pool,
and the run goes on with the others.

On GPUs, the trials the controller runs itself (the baseline, sentinels, re-runs, probes and the
paired A/B rounds) take GPUs from the same pool, A and B of a paired round on the same ones, and
each trial records which GPUs it ran on (`trial.gpus`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.core.candidate import Candidate
from orchestrator.core.roles import StopRun
from orchestrator.hosts import Host, HostError
from orchestrator.hosts.gpus import GpuPool, GpusBusy, Slot
from orchestrator.loop.controller import Controller, _now
from orchestrator.targets.parallel import gpus_needed
from orchestrator.trial.context import TrialResult
from orchestrator.trial.verdict import Baseline

__all__ = ["GpusHeld", "HostPool", "NoHostsLeft", "PoolController"]


class NoHostsLeft(StopRun):
    """Every host of the pool stopped answering."""


class GpusHeld(StopRun):
    """The GPUs a trial needs stayed held by other runs for longer than the pool waits."""


@dataclass
class _InFlight:
    trial: Any
    candidate: Candidate
    host: Host
    baseline: Baseline | None
    propose_s: float
    slot: Slot | None = None


class HostPool:
    """The hosts trials may run on; a host that stops answering is taken out."""

    def __init__(self, hosts: list[Host]) -> None:
        if not hosts:
            raise HostError("a host pool needs at least one host")
        self.hosts = list(hosts)
        self.free = list(hosts)
        self.lost: dict[str, str] = {}

    @property
    def size(self) -> int:
        return len(self.hosts)

    def could_take(self) -> bool:
        return bool(self.free)

    def take(self) -> Host | None:
        return self.free.pop(0) if self.free else None

    def give_back(self, host: Host) -> None:
        if host.name not in self.lost:
            self.free.append(host)

    def probe(self, host: Host) -> str | None:
        """None if `host` still answers, else why not (it then leaves the pool)."""
        try:
            host.free_port()
            return None
        except HostError as e:
            self.lost[host.name] = str(e)
            return str(e)

    @property
    def alive(self) -> int:
        return len(self.hosts) - len(self.lost)


class PoolController(Controller):
    """The Controller's loop with trials spread over a HostPool or a GpuPool; verdicts stay on this thread."""

    def __init__(self, ctx: Any, proposer: Any, *, pool: HostPool | GpuPool, **kw: Any) -> None:
        super().__init__(ctx, proposer, **kw)
        self.pool = pool
        self._holding: Slot | None = None
        """The GPUs the trial this thread runs itself is on (GpuPool)."""

    def _loop(self) -> None:
        self._start()  # resumed trials and the baseline run alone: every later verdict is against the baseline
        running: dict[Future, _InFlight] = {}
        stop: StopRun | None = None
        pending: tuple[Candidate, float] | None = None  # proposed, waiting for enough free GPUs
        stuck_since: float | None = None  # nothing of ours runs and the GPUs wanted are other runs'
        gpus = isinstance(self.pool, GpuPool)
        with ThreadPoolExecutor(max_workers=self.pool.size, thread_name_prefix="trial") as workers:
            try:
                while True:
                    while stop is None:
                        if pending is None:
                            if not self.pool.could_take():
                                break
                            try:
                                pending = self._next()
                            except StopRun as s:
                                stop = s
                                break
                        job = self._place(*pending)
                        if job is None:
                            break
                        pending, stuck_since = None, None
                        running[workers.submit(self._run_job, job, replace(self.ctx, host=job.host))] = job
                    if not running:
                        if stop is not None:
                            raise stop
                        if gpus and pending is not None:
                            stuck_since = stuck_since or time.monotonic()
                            if time.monotonic() - stuck_since > self.pool.wait_s:
                                raise GpusHeld(f"no {gpus_needed(self.ctx.target, pending[0].knobs)} GPU(s) free for "
                                               f"{self.pool.wait_s:.0f}s: held by {self.pool.held_by_others()}")
                            self.pool.wait(self.pool.poll_s)
                            continue
                        raise NoHostsLeft(f"every host of the pool stopped answering: {self.pool.lost}")
                    # With a proposal waiting on GPUs other runs hold, look again now and then.
                    timeout = self.pool.poll_s if gpus and pending is not None else None
                    done, _ = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
                    for fut in done:
                        job = running.pop(fut)
                        result = fut.result()  # GateTampered stops the run from here
                        if job.slot is None:  # a HostPool's host (GPUs went back when the trial ended)
                            if result.status_hint == "failed" and (why := self.pool.probe(job.host)):
                                self.store.add_event(self.ctx.run_id, "host.lost", f"{job.host.name} left the pool: {why}",
                                                     trial_id=job.trial.id, data={"host": job.host.name})
                            self.pool.give_back(job.host)
                        try:
                            self._settle(job.trial, job.candidate, result, job.baseline, job.propose_s)
                        except StopRun as s:
                            stop = stop or s
            except BaseException:
                for fut in running:
                    fut.cancel()
                raise
            finally:
                # Trials already on a host finish and are recorded before the run stops: none is lost.
                for fut, job in list(running.items()):
                    try:
                        self._settle(job.trial, job.candidate, fut.result(), job.baseline, job.propose_s)
                    except StopRun:
                        pass
                    except Exception:  # noqa: BLE001 - the first error is the one that is raised
                        pass

    def _place(self, candidate: Candidate, propose_s: float) -> _InFlight | None:
        """The trial for `candidate` on a free host or on the GPUs it needs; None while there are none."""
        slot = None
        if isinstance(self.pool, GpuPool):
            slot = self.pool.take(gpus_needed(self.ctx.target, candidate.knobs))
            host = slot.host if slot is not None else None
        else:
            host = self.pool.take()
        if host is None:
            return None
        trial = self._create(candidate)
        if slot is not None:
            slot.name_trial(trial.number)
        return _InFlight(trial, candidate, host, self._baseline(), propose_s, slot)

    def _run_job(self, job: _InFlight, ctx: Any) -> TrialResult:
        """A worker's trial; its GPUs go back to the pool as soon as its server is down."""
        try:
            return self._run(job.trial, job.candidate, job.baseline, ctx)
        finally:
            if job.slot is not None:
                self.pool.release(job.slot)  # type: ignore[union-attr]

    def _next(self) -> tuple[Candidate, float]:
        self._check_budget()
        t0 = _now()
        return self._propose(), _now() - t0

    # --- trials this thread runs itself: on GPUs of the pool --------------------------------
    def _need(self, candidate: Candidate) -> int:
        """GPUs for `candidate` and the baseline it is compared with on the same GPUs (paired rounds)."""
        return max(gpus_needed(self.ctx.target, candidate.knobs), gpus_needed(self.ctx.target, self.ctx.target.baseline_knobs()))

    def _execute(self, trial: Any, candidate: Candidate, propose_s: float = 0.0) -> None:
        with self._on_gpus(self._need(candidate)):
            super()._execute(trial, candidate, propose_s)

    def _confirm_paired(self, trial: Any, candidate: Candidate) -> dict[str, Any]:
        with self._on_gpus(self._need(candidate)):
            return super()._confirm_paired(trial, candidate)

    @contextmanager
    def _on_gpus(self, n: int) -> Iterator[None]:
        """Run this thread's trial on `n` GPUs held from the pool (a HostPool: on the run's first host, as before)."""
        if not isinstance(self.pool, GpuPool) or (self._holding is not None and len(self._holding.ids) >= n):
            yield
            return
        outer, held = self.ctx, self._holding
        try:
            slot = self.pool.acquire(n)
        except GpusBusy as e:
            raise GpusHeld(str(e)) from None
        try:
            self._holding, self.ctx = slot, replace(outer, host=slot.host)
            yield
        finally:
            self._holding, self.ctx = held, outer
            self.pool.release(slot)
