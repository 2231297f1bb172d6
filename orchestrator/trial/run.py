"""One trial: deploy -> gates -> bench -> teardown, each step timed and recorded.

`run_trial` does the work and stores what it measures as it goes (gate results and
measurements are committed one by one, so a kill -9 loses at most the step in flight); the
verdict — kept or discarded — is the controller's, because it depends on the run's history. Its parts:
`orchestrator.trial.context` (what a trial is handed and hands back), `orchestrator.trial.gating` (the
gates, the bench audit, the requests kept for the cross-launch probe), `orchestrator.trial.bench` (the
measurements).
"""

from __future__ import annotations

import errno
import shlex
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.bench.prompts import fresh_seed
from orchestrator.core.candidate import Candidate
from orchestrator.hosts import HostError, Proc, ServerTimeout
from orchestrator.targets.adapters import capability_verdict, record_engine
from orchestrator.targets.failures import classify as classify_startup
from orchestrator.targets.launch import placed_source
from orchestrator.targets.parallel import gpus_needed
from orchestrator.trial.bench import TrialBench
from orchestrator.trial.context import TrialContext, TrialResult
from orchestrator.trial.gating import bench_audit, remember_request, run_gates

__all__ = ["run_trial"]


@contextmanager
def _timed(timings: dict[str, float], step: str, on_step: Callable[[str], None]):
    on_step(step)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[step] = timings.get(step, 0.0) + time.perf_counter() - t0


def run_trial(
    ctx: TrialContext,
    trial: Any,
    candidate: Candidate,
    *,
    repeats: int = 1,
    remeasure: Callable[[TrialResult], bool] = lambda r: False,
    max_remeasure: int = 2,
    host_ref: dict[str, Any] | None = None,
    gates: bool = True,
    screen: Any = None,
    prompts: int | None = None,
) -> TrialResult:
    """Deploy `candidate`, gate it, bench it, tear it down. Raises only `GateTampered`.

    `host_ref`: the host's state during the reference baseline; a measurement taken while other
    tenants used clearly more of the host is redone. `gates=False` skips integrity/accuracy (a
    paired re-measurement of a candidate already gated; the lock is still verified). `screen`: an
    `orchestrator.trial.fidelity.Screen`, a short bench first that may end the trial there. `prompts`: the draw of
    prompts its measurements ask (`Scenario.prompt_seed`; the two halves of a paired round are handed one),
    None: a fresh one (`TrialBench.prompt_seed` says how each measurement's follows from it)."""
    result = TrialResult()
    t_start = time.perf_counter()
    trial_dir = ctx.run_dir / f"trial-{trial.number}"
    trial_dir.mkdir(parents=True, exist_ok=True)
    proc: Proc | None = None
    healthy = False
    # The engine serving this candidate: the target itself, or the one its `engine` knob picks.
    engine = ctx.target.resolve(candidate.knobs)[0]
    try:
        with _timed(result.timings, "deploy", ctx.on_step):
            site = ctx.host.site()  # where the server runs and is measured (this process, or next to it over SSH)
            with _timed(result.timings, "sync", ctx.on_step):
                source = site.place(_checkout(ctx, candidate.commit))
                model = site.place(ctx.model_dir, kind="model")
            port = ctx.host.free_port()
            argv = ctx.target.render(candidate.knobs, port=port, model=model, source=source, python=site.python)
            result.launch_cmd = shlex.join(argv)
            log_path = trial_dir / "server.log"
            env = ctx.target.launch_env(candidate.knobs)
            # The server runs in its engine's tree as placed, so a launch may name it relatively (`python -m pkg`).
            cwd = placed_source(ctx.target, engine, str(source)) if ctx.target.variants else str(source)
            proc = ctx.host.start(argv, env=env, cwd=cwd, log_path=log_path, preload=engine.preload)
            ctx.store.start_trial(trial.id, result.launch_cmd, str(log_path))
            if gpus := getattr(ctx.host, "gpus", ""):  # which GPUs: a pool's trials, and paired A/B, say so
                model = getattr(ctx.host, "gpu_model", "") or ""
                ctx.store.add_event(ctx.run_id, "trial.gpus", f"#{trial.number} on GPU {gpus}"
                                    f"{f' ({model})' if model else ''} of {ctx.host.name.split(':gpu')[0]}",
                                    trial_id=trial.id, data={"host": ctx.host.name, "gpus": gpus, "gpu_model": model})
            if proc.standby:  # the record says this deploy skipped the imports
                ctx.store.add_event(ctx.run_id, "trial.standby",
                                    f"#{trial.number} launched in a standby interpreter (preloaded {' '.join(engine.preload)})",
                                    trial_id=trial.id, data={"pid": proc.pid, "preload": list(engine.preload)})
            record_engine(ctx.store, ctx.run_id, trial.id, engine, argv, env, trial_dir)
            base_url = f"http://127.0.0.1:{port}"
            ctx.host.wait_healthy(base_url + engine.health_path, engine.ready_timeout_s, proc)
            healthy = True
            if facts := site.facts():
                ctx.store.add_event(ctx.run_id, "trial.host", f"#{trial.number} on {ctx.host.name}", trial_id=trial.id, data=facts)

        margin = None  # the accuracy gate's off-top margin for this server; the bench audit uses it

        def gated_out() -> bool:
            """Run the gates; True when they end the trial (`result` then says why)."""
            nonlocal margin
            # quiet: a standby importing beside the gates took a core from the server's OpenMP threads
            # (2-core CPU: the e2e run's gates 1.1-2.7 s a trial without it, 6.1-8.8 s with it).
            with _timed(result.timings, "gates", ctx.on_step), ctx.host.quiet(server=True):
                # The gate files are re-hashed before every trial: a proposer that edited them
                # (or anything else that did) stops the run here, before its numbers can count.
                site.verify_gates()
                verdict = capability_verdict(ctx.store, trial.id, engine.capabilities, ctx.integrity_gate, ctx.accuracy_gate) if gates else None
                if verdict is None and gates:
                    verdict, result.gate_drift, margin = run_gates(ctx, site, trial, candidate, base_url, port, proc,
                                                                   engine.capabilities.model_dump())
                if verdict is not None:
                    result.status_hint, result.error = "invalid", verdict
                    return True
            return False

        bench = TrialBench(ctx, trial, base_url, trial_dir, proc, site, host_ref, engine.capabilities.model_dump(),
                       draw=fresh_seed() if prompts is None else prompts, gpus=gpus_needed(ctx.target, candidate.knobs))
        err, full = None, None
        if screen is None:
            if gated_out():
                return result
        else:
            # Multi-fidelity: the short pass first, then the gates only for a candidate it passes. A
            # screened-out candidate is never kept nor claimed, so gating it bought nothing (on the H200,
            # 13-28 s of a 57-116 s trial); the gate files are still verified before its number is stored.
            site.verify_gates()
            with _timed(result.timings, "bench", ctx.on_step), _timed(result.timings, "screen", ctx.on_step), ctx.host.quiet(server=True):
                err = bench.screen(screen, result)
            if err is None and result.screened:
                result.error = f"{result.error} (gates not run: a screened-out candidate is never kept)"
                return result
            if err is None and gated_out():
                return result
            # The full bench continues the short pass (each scenario's remaining requests, joined with it).
            full = {name: screen.full(name, ctx.scenarios[name]) for name in ctx.goal.scenarios}

        # quiet: nothing of the host's own (a standby importing) runs beside the server while it is measured.
        with _timed(result.timings, "bench", ctx.on_step), ctx.host.quiet(server=True):
            err = err or bench.run(repeats, result, scenarios=full)
            n = repeats
            # Borderline results are measured again (noise-aware judging), a bounded number of times.
            while err is None and n < repeats + max_remeasure and remeasure(result):
                ctx.on_step("re-measure")
                err = bench.run(1, result, first_repeat=n)
                n += 1
            if err is None and not ctx.host.alive(proc):
                err = "the server died during the benchmark"
        if err is None and margin is not None:
            # What the server generated under the measured load, scored by the reference: a server
            # honest only for the gate's own probes is caught here (gates/audit.py).
            with _timed(result.timings, "audit", ctx.on_step):
                err = bench_audit(ctx, site, trial, bench.outputs, margin)
            if err:
                result.status_hint = "invalid"
        if err is None:  # one of its requests, for the next launches' cross-launch probe (gates/integrity.py)
            remember_request(ctx, trial, bench.outputs, engine.capabilities.model_dump())
        if err:
            # A count violation, an untrusted measurement or a failed audit makes the trial invalid;
            # anything else is a failure.
            invalid = result.status_hint == "invalid" or err.startswith("untrusted")
            result.status_hint, result.error = ("invalid" if invalid else "failed"), err
    except HostError as e:
        result.status_hint, result.error = "failed", f"{type(e).__name__}: {e}"
        if not healthy and proc is not None:  # say why it did not start, from its own log
            why = classify_startup(proc.log_path, timed_out=isinstance(e, ServerTimeout))
            result.error = f"{why.message(str(e))} [{result.error}]"
    except Exception as e:  # noqa: BLE001 - a broken candidate must not kill the run
        # A tampered gate or a full disk is the run's problem, not this candidate's.
        if type(e).__name__ == "GateTampered" or (isinstance(e, OSError) and e.errno == errno.ENOSPC):
            raise
        result.status_hint, result.error = "failed", f"{type(e).__name__}: {e}"
    finally:
        if proc is not None:
            with _timed(result.timings, "teardown", ctx.on_step):
                ctx.host.stop(proc)
        result.timings["trial"] = time.perf_counter() - t_start
    return result


def _checkout(ctx: TrialContext, commit: str | None) -> Path:
    """The engine's source at `commit`: the run's tree itself, or a git worktree of the commit."""
    if not commit or commit == ctx.base_commit:
        return ctx.source_dir
    import git

    repo = git.Repo(ctx.source_dir, search_parent_directories=True)
    dest = ctx.run_dir / "worktrees" / commit[:12]
    if not dest.exists():
        repo.git.worktree("add", "--detach", str(dest), commit)
    rel = ctx.source_dir.resolve().relative_to(Path(repo.working_tree_dir).resolve())
    return dest / rel

