"""A pool of hosts running trials at once, with the controller still the one place that judges.

Several hosts (or several GPUs of one host, each registered with its own `--gpus`) take trials
in parallel, the way Optuna's `n_jobs` and its distributed mode work: the workers only deploy,
gate and measure; every proposal, verdict and stop is made on the controller's thread, in the
order results arrive. The search proposer asks with the constant liar, so proposals made while
others are in flight spread out. A host that stops answering fails its trial with the reason,
leaves the pool, and the run goes on with the others.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.core.candidate import Candidate
from orchestrator.core.roles import StopRun
from orchestrator.hosts import Host, HostError
from orchestrator.loop.controller import Controller, _now
from orchestrator.trial.verdict import Baseline

__all__ = ["HostPool", "NoHostsLeft", "PoolController"]


class NoHostsLeft(StopRun):
    """Every host of the pool stopped answering."""


@dataclass
class _InFlight:
    trial: Any
    candidate: Candidate
    host: Host
    baseline: Baseline | None
    propose_s: float


class HostPool:
    """The hosts trials may run on; a host that stops answering is taken out."""

    def __init__(self, hosts: list[Host]) -> None:
        if not hosts:
            raise HostError("a host pool needs at least one host")
        self.hosts = list(hosts)
        self.free = list(hosts)
        self.lost: dict[str, str] = {}

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
    """The Controller's loop with trials spread over a HostPool; verdicts stay on this thread."""

    def __init__(self, ctx: Any, proposer: Any, *, pool: HostPool, **kw: Any) -> None:
        super().__init__(ctx, proposer, **kw)
        self.pool = pool

    def _loop(self) -> None:
        self._start()  # resumed trials and the baseline run alone: every later verdict is against the baseline
        running: dict[Future, _InFlight] = {}
        stop: StopRun | None = None
        with ThreadPoolExecutor(max_workers=len(self.pool.hosts), thread_name_prefix="trial") as workers:
            try:
                while True:
                    while stop is None and (host := self.pool.take()) is not None:
                        try:
                            candidate, propose_s = self._next()
                        except StopRun as s:
                            self.pool.give_back(host)
                            stop = s
                            break
                        trial = self._create(candidate)
                        job = _InFlight(trial, candidate, host, self._baseline(), propose_s)
                        running[workers.submit(self._run, trial, candidate, job.baseline, replace(self.ctx, host=host))] = job
                    if not running:
                        raise stop or NoHostsLeft(f"every host of the pool stopped answering: {self.pool.lost}")
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in done:
                        job = running.pop(fut)
                        result = fut.result()  # GateTampered stops the run from here
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

    def _next(self) -> tuple[Candidate, float]:
        self._check_budget()
        t0 = _now()
        return self._propose(), _now() - t0
