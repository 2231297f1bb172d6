"""Starting and resuming runs: wire workspace, goal, target, host, store and proposer together.

The CLI calls `start_run` / `resume_run`; tests call them directly. Everything a resume needs
(goal, target, config, seed) is read back from the run row, so a resumed run is the same run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from gates.plausible import record_of
from orchestrator.bench.rate import RatePolicy
from orchestrator.config.goal import GoalError, GoalSpec
from orchestrator.config.workspace import Config, ConfigError, Workspace
from orchestrator.core.exitcodes import classify_stop
from orchestrator.core.oneline import one_line
from orchestrator.core.tomlfile import validation_message
from orchestrator.hosts import HostError, LocalHost, get_hosts, on_gpus
from orchestrator.hosts.gpus import GpuPlan, GpuPool, gpu_memory_bytes, gpu_names, plan_gpus
from orchestrator.hosts.measure import TrustPolicy
from orchestrator.hosts.runlease import (
    SHARE_HINT,
    HostLeases,
    Lease,
    LeaseHeld,
    check_host_free,
    is_live,
    refuse_if_live,
    run_identity,
)
from orchestrator.loop.controller import Controller
from orchestrator.loop.pool import HostPool, PoolController
from orchestrator.proposers import RunBound, get_proposer
from orchestrator.review.study import StudyError, save_study
from orchestrator.store import Store, StoreError
from orchestrator.targets import TargetError, TargetSpec, load_target
from orchestrator.targets.parallel import ModelShape, check_fit
from orchestrator.targets.spec import check_paths
from orchestrator.trial.context import TrialContext

__all__ = ["RunOutcome", "open_store", "resolve_model", "resume_run", "start_run"]


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    stop_reason: str

    @property
    def outcome(self) -> str:
        """goal_met | stopped | failed | gates_tampered (see orchestrator.core.exitcodes)."""
        return classify_stop(self.stop_reason)


def open_store(ws: Workspace, *, read_only: bool = False) -> Store:
    """The workspace's store; `read_only` never creates or writes anything (auditing an archive)."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        return Store(ws.db_url, read_only=read_only)
    except ArgumentError as e:
        raise StoreError(f"--db {ws.db_url!r} is not a database URL ({e}); use e.g. postgresql+psycopg://user@host/db") from None
    except NoSuchModuleError:
        raise StoreError(f"--db {ws.db_url!r}: unknown database kind; use sqlite:///PATH or postgresql+psycopg://...") from None
    except ModuleNotFoundError as e:
        hint = "pip install 'infergoal[postgres]'" if "psycopg" in str(e) or "postgres" in ws.db_url else f"pip install {e.name}"
        raise StoreError(f"the database driver for {ws.db_url.split(':', 1)[0]} is not installed ({e.name}); {hint}") from None
    except OSError as e:
        raise StoreError(f"cannot open the store at {ws.db_url}: {e.strerror or e}; check the folder is writable or pass --db") from None


def resolve_model(model: str) -> Path:
    """`forge:<preset>` -> the model forge's cached model; anything else must be a model dir."""
    if model.startswith("forge:"):
        from orchestrator.models import forge

        preset = model.split(":", 1)[1] or "tiny"
        if preset == "tiny":
            return forge.default_model()
        return forge.cached_model(preset)
    path = Path(model)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model {model} is not a Hugging Face model folder (no config.json); "
            "make one with `infergoal model make DIR` or use model = \"forge:tiny\""
        )
    return path


def _base_commit(source: Path) -> str | None:
    try:
        import git

        repo = git.Repo(source, search_parent_directories=True)
        return repo.head.commit.hexsha
    except Exception:  # noqa: BLE001 - not a git repo, or no commit yet: code candidates are off
        return None


def start_run(
    ws: Workspace, goal: GoalSpec, *, name: str = "", on_step: Callable[[str], None] | None = None,
    on_trial: Callable[[Any], None] | None = None, on_run: Callable[[int], None] | None = None,
) -> RunOutcome:
    """Check every input, then create a run row and drive it to a stop.

    Anything refused (a bad target, host, proposer, model, a host busy with another live run)
    is refused before the run row exists, so an invalid request leaves nothing behind.
    """
    target = load_target(ws.target_path)
    # Its files before anything slow (a model build, a host probe): on a local host its commands too.
    check_paths(target, local=ws.config.host in ("", "local"))
    # Refuses an unknown proposer, a missing script file, or (for the agent) a missing key.
    get_proposer(ws.config.proposer, seed=ws.config.seed, agent=ws.config.agent)
    resolve_model(target.model)
    store = open_store(ws)
    check_host_free(store, ws.config.host, ws.config.allow_concurrent_runs)
    hosts = get_hosts(ws.config.host, state_dir=ws.state_dir, model_cache=ws.config.model_cache,
                      standby=ws.config.standby, standby_idle_s=ws.config.standby_idle_s)
    # Before the run row: an unreachable host (any of a pool) leaves no empty run behind.
    fingerprint, *others = [h.fingerprint() for h in hosts]
    floors = _floors(ws)  # a floors file that cannot be used is refused here, before the run row
    gpus = _gpu_plan(ws.config, hosts)
    # The baseline must fit this host (GPUs per trial, the model's heads, the card's memory).
    _fit(target, gpus, fingerprint)(target.baseline_knobs())
    # The host's own lease, for runs of other workspaces and users; refused before the run row too.
    # A GPU pool leases each GPU per trial instead (orchestrator.hosts.gpus); one at least must be free.
    _gpu_free(ws, ws.config, gpus, hosts, ws.config.allow_concurrent_runs)
    with HostLeases([] if gpus.pool else hosts, run_identity(ws.root), share=ws.config.allow_concurrent_runs) as host_leases:
        run = store.create_run(
            name=name or f"{target.name}: {goal.describe()}"[:200],
            goal_text=goal.text, goal_json=goal.model_dump(mode="json"), goal_hash=goal.digest,
            target_json=target.model_dump(mode="json"), config_json=ws.config.model_dump(mode="json"),
            host=ws.config.host, proposer=ws.config.proposer,
        )
        host_leases.name_run(run.id)
        with _held(store, run.id, ws.config, hosts, new=True):
            store.add_event(run.id, "run.start", f"run {run.id} started",
                            data={"fingerprint": fingerprint, **({"pool": others} if others else {})})
            if floors:
                store.add_event(run.id, "speed_of_light", f"floors from {Path(floors['source']).name}", data=floors)
            _note_leases(store, run.id, host_leases)
            if on_run:
                on_run(run.id)
            return _drive(ws, store, run.id, goal, target, ws.config, hosts, on_step, on_trial)


def resume_run(
    ws: Workspace, run_id: int | None = None, *, on_step: Callable[[str], None] | None = None,
    on_trial: Callable[[Any], None] | None = None, on_run: Callable[[int], None] | None = None,
    share_host: bool = False,
) -> RunOutcome:
    """Continue a stopped or killed run from the store: interrupted trials are re-run, none lost.

    A run still driven by a live process is refused (`LeaseHeld` names its owner); only servers
    whose owning run is dead are swept. `share_host` measures beside another run holding the host
    (as the run's own `allow_concurrent_runs` does).
    """
    store = open_store(ws)
    run = store.get_run(run_id) if run_id is not None else store.latest_run()
    if run is None:
        raise LookupError("no run to resume" + (f" with id {run_id}" if run_id is not None else "") + "; start one with `infergoal goal`")
    if run.status == "finished":
        raise LookupError(f"run {run.id} already finished ({run.stop_reason}); start a new one with `infergoal goal`")
    refuse_if_live(run)  # before anything else: a live run's state is not ours to judge
    try:
        goal, target, config = _stored_inputs(run)
    except (GoalError, TargetError, ConfigError) as e:
        # A run started before today's checks with an input they refuse can never continue:
        # say so in its row instead of leaving it `interrupted` forever.
        store.set_run_status(run.id, "failed", stop_reason=f"Failed: {e}")
        raise
    hosts = get_hosts(config.host, state_dir=ws.state_dir, model_cache=config.model_cache, standby=config.standby,
                      standby_idle_s=config.standby_idle_s)
    _same_gpus(store, run.id, hosts[0].fingerprint())
    share = share_host or config.allow_concurrent_runs
    gpus = _gpu_plan(config, hosts)
    _gpu_free(ws, config, gpus, hosts, share, run.id)
    with HostLeases([] if gpus.pool else hosts, run_identity(ws.root, run.id), share=share) as host_leases, _held(store, run.id, config, hosts, share=share):
        def run_is_live(rid: int) -> bool:
            r = store.get_run(rid)
            return r is not None and is_live(r)

        swept = _sweep_orphans(store, run.id, hosts, run_is_live)
        store.add_event(run.id, "resume", f"run {run.id} resumed", data={"orphans_killed": swept})
        _note_leases(store, run.id, host_leases)
        if on_run:
            on_run(run.id)
        return _drive(ws, store, run.id, goal, target, config, hosts, on_step, on_trial)


def _same_gpus(store: Store, run_id: int, now: dict[str, Any]) -> None:
    """A run continues only on the GPU models it started on: its baseline, trials and paired rounds measured
    there do not compare with another card's (the 7B's best known setting: 3.99 ms TPOT on an H200, 5.27 ms on an
    H100). A run whose start recorded no fingerprint continues as before."""
    started = store.events(run_id, kind="run.start")
    fp = (started[0].data or {}).get("fingerprint") if started else None
    if not isinstance(fp, dict):
        return
    before, after = sorted(gpu_names(fp)), sorted(gpu_names(now))
    if before != after:
        said = lambda names: ", ".join(names) or "no GPU"  # noqa: E731
        raise HostError(f"run {run_id} was measured on {said(before)}; this host has {said(after)}, so what it measures "
                        "would not compare with the run's baseline and trials: resume it on a host with the same GPUs, "
                        "or start a new run here with `infergoal goal`")


def _note_leases(store: Store, run_id: int, leases: HostLeases) -> None:
    """Record a host shared on request, or a lease taken over from a dead holder, in the run's events;
    from now on a lease lost mid-run (and taken again) goes there as it happens."""
    leases.on_event = lambda kind, message, data: store.add_event(run_id, kind, message, data=data)
    for kind, message, data in list(leases.notes):  # after on_event: a note the watcher adds meanwhile is in here
        store.add_event(run_id, kind, message, data=data)


def _stored_inputs(run: Any) -> tuple[GoalSpec, TargetSpec, Config]:
    """A run's goal, target and config as stored, validated by today's rules."""
    try:
        goal = GoalSpec.model_validate(run.goal)
    except ValidationError as e:
        raise GoalError(f"run {run.id}'s stored goal is no longer valid ({validation_message(e)}); start a new run") from None
    try:
        target = TargetSpec.model_validate(run.target)
    except ValidationError as e:
        raise TargetError(f"run {run.id}'s stored target is no longer valid ({validation_message(e)}); start a new run") from None
    try:
        config = Config.model_validate(run.config)
    except ValidationError as e:
        raise ConfigError(f"run {run.id}'s stored config is no longer valid ({validation_message(e)}); start a new run") from None
    return goal, target, config


@contextmanager
def _held(store: Store, run_id: int, config: Config, hosts: list[Any], *, new: bool = False, share: bool = False) -> Iterator[None]:
    """Hold the run's lease; a run that ends by an error is marked failed, never left `running`."""
    lease = Lease(store, run_id, allow_concurrent=config.allow_concurrent_runs or share)
    try:
        lease.__enter__()
    except LeaseHeld as e:
        if new:  # another run took the host between our check and our claim: this run never ran
            store.set_run_status(run_id, "failed", stop_reason=f"Refused: {e}")
        raise
    try:
        for host in hosts:
            if hasattr(host, "run_id"):
                host.run_id = run_id  # pidfiles name their run, for the orphan sweep
        yield
    except Exception as e:
        run = store.get_run(run_id)
        if run is not None and run.status == "running":
            reason = f"Failed: {one_line(e)}"
            store.set_run_status(run_id, "failed", stop_reason=reason)
            store.add_event(run_id, "run.failed", reason)
        raise
    finally:
        lease.__exit__(None, None, None)


def _sweep_orphans(store: Store, run_id: int, hosts: list[Any], run_is_live: Callable[[int], bool]) -> list[int]:
    """Stop servers left behind by dead orchestrators; never a live run's.

    The local host knows each server's owning run and orchestrator pid. An SSH host's sweep stops
    every server this workspace started there, so it runs only while no other run of the workspace is live.
    """
    swept: list[int] = []
    others_live = any(is_live(r) for r in store.list_runs() if r.id != run_id)  # this run's lease is ours now
    for host in hosts:
        if isinstance(host, LocalHost):
            swept += host.sweep_orphans(run_is_live)
        elif hasattr(host, "sweep_orphans") and not others_live:
            swept += host.sweep_orphans()
    return swept


def _drive(
    ws: Workspace, store: Store, run_id: int, goal: GoalSpec, target: TargetSpec, config: Config,
    hosts: list[Any], on_step: Callable[[str], None] | None, on_trial: Callable[[Any], None] | None,
) -> RunOutcome:
    from orchestrator.knowledge import KnowledgeBase, workload_key

    on_step = on_step or (lambda s: None)
    host = hosts[0]
    on_step("model")
    model_dir = resolve_model(target.model)
    t_session = time.perf_counter()
    reference = model_dir if target.reference_model == "same" else Path(target.reference_model)
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the accuracy gate loads the reference in-process; keep the live view clean

    gpus = _gpu_plan(config, hosts)
    ctx = TrialContext(
        run_id=run_id, goal=goal, target=target, host=host, store=store,
        model_dir=model_dir, reference_dir=reference,
        scenarios=_scenarios(ws, config), run_dir=ws.run_dir(run_id),
        tokenizer=AutoTokenizer.from_pretrained(str(model_dir)),
        base_commit=_base_commit(Path(target.source)), source_dir=Path(target.source),
        accuracy_gate=config.gates.accuracy, integrity_gate=config.gates.integrity,
        request_timeout_s=config.bench.timeout_s, on_step=on_step,
        trust=TrustPolicy(settle_s=config.bench.settle_s),
        rate=RatePolicy(precision=config.bench.slo_precision, min_requests=config.bench.slo_min_requests,
                        min_seconds=config.bench.slo_min_seconds, confirmations=config.bench.slo_confirmations,
                        max_step_seconds=config.bench.slo_max_step_s),
    )
    kb = KnowledgeBase(ws.kb_read_dirs, write_dir=ws.kb_write_dir)
    fingerprint = host.fingerprint()
    ctx.fit = _fit(target, gpus, fingerprint, model_dir)
    workload = workload_key(goal.scenarios, config.bench.scale)
    plan = kb.priors(engine=target.engine, model=target.model, hardware=fingerprint, workload=workload, slo=goal.slo)
    warm, warm_from = [p["knobs"] for p in plan], [p["entry"] for p in plan]
    if warm and not store.list_trials(run_id):
        store.add_event(run_id, "kb.warm_start", f"{len(warm)} prior knob set(s) from the knowledge base: "
                        + ", ".join(f"{p['entry']} (similarity {p['similarity']:.2f})" for p in plan),
                        data={"knobs": warm, "entries": warm_from})
    priors = kb.prior_observations(engine=target.engine, model=target.model, hardware=fingerprint, workload=workload)
    if priors and not store.list_trials(run_id):
        from orchestrator.proposers.priors import prior_weight

        own = [p for p in priors if not p.get("probe")]
        store.add_event(run_id, "kb.priors", f"{len(own)} knob set(s) measured on similar settings steer the search"
                        + (f"; {len(priors) - len(own)} probe(s) of their winners rank the swaps" if len(own) < len(priors) else ""),
                        data={"entries": sorted({p["entry"] for p in priors}), "weight": round(prior_weight(own), 4),
                              "probes": len(priors) - len(own)})
    proposer = get_proposer(config.proposer, seed=config.seed, warm_start=warm, warm_from=warm_from, agent=config.agent, priors=priors,
                            objectives=goal.objectives if goal.multi_objective else ())
    if isinstance(proposer, RunBound):  # the code agent needs the run's worktree, store and KB
        proposer.bind(ctx, kb)
    knobs = dict(repeats=config.bench.repeats, baseline_repeats=config.bench.baseline_repeats,
                 min_gain=config.min_gain, on_trial=on_trial, probe=config.probe_winner,
                 screen_fraction=config.bench.screen_fraction)
    pool: Any = None
    if gpus.pool:
        make = on_gpus(config.host, state_dir=ws.state_dir, model_cache=config.model_cache, standby=config.standby,
                       standby_idle_s=config.standby_idle_s)

        def bind(ids: str) -> Any:
            h = make(ids)
            h.run_id = run_id  # pidfiles name their run, for the orphan sweep
            return h

        pool = GpuPool(bind, list(gpus.pool), run_identity(ws.root, run_id), models=gpus.pool)
        store.add_event(run_id, "gpus", f"trials on GPUs {', '.join(gpus.pool)} of {host.name}, one trial per GPU set "
                        "at once", data={"gpus": gpus.pool})
    elif len(hosts) > 1:
        pool = HostPool(hosts)
    controller = Controller(ctx, proposer, **knobs) if pool is None else PoolController(ctx, proposer, pool=pool, **knobs)
    try:
        reason = controller.run()
    except KeyboardInterrupt:
        # Stopped from outside (Ctrl-C, the shell's /stop, SIGTERM, a command's `timeout -s INT`), often
        # in the paired rounds at the stop: what the run learned still goes to the knowledge base, its
        # best kept trial as an unconfirmed winner, so a run on another model starts warm.
        _write_back(kb, store, run_id, target, fingerprint, workload,
                    interrupted="the run was interrupted (SIGINT/SIGTERM) before its stop; `infergoal resume` continues it")
        raise
    finally:
        # Wall time of this invocation (after the model is ready): the report compares it with the
        # engine's own time to show what the orchestrator itself costs.
        store.add_event(run_id, "session", "session ended", data={"wall_s": time.perf_counter() - t_session})
        for h in [*hosts, *(pool.hosts if isinstance(pool, GpuPool) else ())]:  # SSH: end the worker and the connection
            getattr(h, "close", lambda: None)()
    if classify_stop(reason) == "failed":  # e.g. the baseline could not be served: not a finished run
        store.set_run_status(run_id, "failed", stop_reason=reason)
    _write_back(kb, store, run_id, target, fingerprint, workload)
    try:  # the run's Optuna study beside the store, for `optuna-dashboard` (orchestrator/review/study.py)
        save_study(store, run_id, ws.db_url)
    except StudyError:
        pass  # an in-memory store: nowhere to keep a study
    except (SQLAlchemyError, OSError) as e:  # the run is recorded; only the dashboard view is missing
        store.add_event(run_id, "study.error", f"Optuna study not written: {e}"[:500])
    return RunOutcome(run_id=run_id, stop_reason=reason)


def _write_back(kb: Any, store: Store, run_id: int, target: TargetSpec, fingerprint: dict[str, Any], workload: str,
                interrupted: str | None = None) -> None:
    """The run's findings and constraints into the knowledge base (`KnowledgeBase.write_back`).
    `interrupted`: why the run was stopped early; a failure to write is then recorded, never raised
    (the interrupt is what the caller must see)."""
    try:
        written = kb.write_back(store, run_id, engine=target.engine, model=target.model, hardware=fingerprint,
                                workload=workload, interrupted=interrupted)
    except Exception as e:  # noqa: BLE001
        if interrupted is None:
            raise
        store.add_event(run_id, "kb.error", f"knowledge not written at the interrupt: {e}"[:500])
        return
    if written:
        store.add_event(run_id, "kb.write_back", f"finding written{' (run interrupted, unconfirmed)' if interrupted else ''}: "
                        f"{written}", data={"path": str(written), "interrupted": bool(interrupted)})


def _gpu_plan(config: Config, hosts: list[Any]) -> GpuPlan:
    try:
        return plan_gpus(config.gpus, hosts)
    except HostError as e:
        raise ConfigError(str(e)) from None


def _gpu_free(ws: Workspace, config: Config, gpus: GpuPlan, hosts: list[Any], share: bool, run_id: int | None = None) -> None:
    """A GPU pool's run starts only while one of its GPUs is free (each is leased per trial later)."""
    if not gpus.pool or share:
        return
    pool = GpuPool(on_gpus(config.host, state_dir=ws.state_dir, standby=False), list(gpus.pool), run_identity(ws.root, run_id))
    slot = pool.take(1)
    for h in pool.hosts:
        getattr(h, "close", lambda: None)()
    if slot is None:
        raise LeaseHeld(f"every GPU of the run ({', '.join(gpus.pool)}) on {hosts[0].name} is in use by "
                        f"{pool.held_by_others()}; {SHARE_HINT}")
    pool.release(slot)


def _fit(target: TargetSpec, gpus: GpuPlan, fingerprint: dict[str, Any], model_dir: Path | None = None) -> Callable[[dict[str, Any]], None]:
    """The check of a knob set against this host and model (`targets.parallel.check_fit`)."""
    shape = ModelShape.read(model_dir or resolve_model(target.model))
    memory = None if gpus.pool and not any(gpus.pool.values()) else gpu_memory_bytes(fingerprint)  # simulated GPUs: unknown
    return lambda knobs: check_fit(target, knobs, gpus_on_host=gpus.per_trial, shape=shape, gpu_memory_bytes=memory)


def _floors(ws: Workspace) -> dict[str, Any] | None:
    """`bench.floors` read as the run will store it (`gates.plausible.record_of`), or None when not set."""
    if not ws.config.bench.floors:
        return None
    path = ws.root / ws.config.bench.floors
    try:
        return record_of(json.loads(path.read_text()), str(path))
    except (OSError, ValueError) as e:
        raise ConfigError(f"bench.floors: cannot use {path}: {e}") from None


def _scenarios(ws: Workspace, config: Config) -> dict[str, Any]:
    """Built-in scenarios at the configured scale, with those named in `bench.scenarios` replaced."""
    from orchestrator.bench import builtin_scenarios
    from orchestrator.bench.scenarios import load_scenarios_file

    table = builtin_scenarios(config.bench.scale)
    if config.bench.scenarios:
        table.update(load_scenarios_file(ws.root / config.bench.scenarios))
    return table


def config_json(config: Config) -> str:
    return json.dumps(config.model_dump(mode="json"), sort_keys=True)
