"""One trial: deploy -> gates -> bench -> teardown, each step timed and recorded.

`run_trial` does the work and stores what it measures as it goes (gate results and
measurements are committed one by one, so a kill -9 loses at most the step in flight); the
verdict — kept or discarded — is the controller's, because it depends on the run's history.
"""

from __future__ import annotations

import errno
import random
import shlex
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.bench.counts import count_violation
from orchestrator.bench.passes import join
from orchestrator.bench.prompts import derived_seed, fresh_seed
from orchestrator.bench.rate import RatePolicy
from orchestrator.bench.slo import slo_measure
from orchestrator.config.goal import SLO_SCENARIO, GoalSpec
from orchestrator.core.candidate import Candidate
from orchestrator.core.oneline import plain_number
from orchestrator.core.roles import BASELINES
from orchestrator.hosts import Host, HostError, Proc, ServerTimeout
from orchestrator.hosts.measure import TrustPolicy, bench_trusted
from orchestrator.hosts.site import Site
from orchestrator.targets import TargetSpec
from orchestrator.targets.adapters import capability_verdict, record_engine
from orchestrator.targets.failures import classify as classify_startup
from orchestrator.targets.launch import placed_source
from orchestrator.targets.parallel import gpus_needed

__all__ = ["TrialContext", "TrialResult", "accuracy_reference", "objective_label", "reached_rate", "run_trial"]


def objective_label(scenario: str, key: str) -> str:
    """How an objective's value is named in `trials.objective_json`: `decode:tpot_ms_p50`."""
    return f"{scenario}:{key}"


@dataclass
class TrialContext:
    """What every trial of a run shares."""

    run_id: int
    goal: GoalSpec
    target: TargetSpec
    host: Host
    store: Any
    model_dir: Path
    reference_dir: Path
    scenarios: dict[str, Any]
    """Scenario name -> bench Scenario, already scaled."""
    run_dir: Path
    tokenizer: Any = None
    base_commit: str | None = None
    source_dir: Path = Path(".")
    accuracy_gate: bool = True
    integrity_gate: bool = True
    request_timeout_s: float = 120.0
    on_step: Callable[[str], None] = lambda step: None
    trust: TrustPolicy = TrustPolicy()
    """When a measurement is redone (client saturated, host busier) and the baseline re-measured."""
    rate: RatePolicy = RatePolicy()
    """How an SLO goal's request-rate search steps (`orchestrator.bench.rate`)."""
    fit: Callable[[dict[str, Any]], None] = lambda knobs: None
    """Raises `ConstraintViolated` for knobs this host or model cannot take (`targets.parallel.check_fit`:
    GPUs per trial, heads, memory); checked with the target's own constraints, before launch."""


@dataclass
class TrialResult:
    """What a trial measured; `error` set means it produced no valid speed."""

    status_hint: str = "ok"
    """ok | failed (server/bench broke) | invalid (a gate rejected it)."""
    error: str | None = None
    gate_drift: bool = False
    samples: dict[str, list[float]] = field(default_factory=dict)
    """objective label -> one value per measurement repeat."""
    timings: dict[str, float] = field(default_factory=dict)
    launch_cmd: str = ""
    host: list[dict[str, Any]] = field(default_factory=list)
    """The host's state during each used measurement (`orchestrator.hosts.state.window`)."""
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    """Scenario -> the last used measurement's full metrics."""
    screened: bool = False
    """Ended on its short bench (`orchestrator.trial.fidelity`): samples and metrics are the short pass's, `error` says why."""

    def mean(self, label: str) -> float:
        values = self.samples.get(label, [])
        return sum(values) / len(values) if values else float("nan")


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
    None: a fresh one (`_Bench.prompt_seed` says how each measurement's follows from it)."""
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
                    verdict, result.gate_drift, margin = _run_gates(ctx, site, trial, candidate, base_url, port, proc,
                                                                    engine.capabilities.model_dump())
                if verdict is not None:
                    result.status_hint, result.error = "invalid", verdict
                    return True
            return False

        bench = _Bench(ctx, trial, base_url, trial_dir, proc, site, host_ref, engine.capabilities.model_dump(),
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
                err = _audit(ctx, site, trial, bench, margin)
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


def _run_gates(
    ctx: TrialContext, site: Site, trial: Any, candidate: Candidate, base_url: str, port: int, proc: Proc,
    caps: dict[str, Any] | None = None,
) -> tuple[str | None, bool, float | None]:
    """Integrity first (cheap), then accuracy. Return (rejection reason or None, accuracy drifted,
    the accuracy gate's off-top margin for this server, None when it did not run)."""
    if ctx.integrity_gate:
        diff_text = _diff(ctx, candidate.commit)
        r = site.integrity(
            base_url,
            served_model=ctx.target.served_model_name,
            tokenizer_dir=str(ctx.model_dir),
            launched_pids=ctx.host.group_pids(proc),
            listening_pids=ctx.host.listening_pids(port),
            diff_text=diff_text,
            capabilities=caps,
            seen=seen_requests(ctx.store, ctx.run_id, trial, capabilities=caps),
        )
        ctx.store.add_gate_result(trial.id, r.gate, r.status, r.reason, r.details, r.duration_s)
        if r.status == "fail":
            return f"integrity gate: {r.reason}", False, None
    if ctx.accuracy_gate:
        r = site.accuracy(base_url, served_model=ctx.target.served_model_name, reference_model_dir=str(ctx.reference_dir),
                          chat=ctx.target.api == "chat", capabilities=caps, **accuracy_reference(ctx.store, ctx.run_id, trial))
        ctx.store.add_gate_result(trial.id, r.gate, r.status, r.reason, r.details, r.duration_s)
        if r.status == "fail":
            return f"accuracy gate: {r.reason}", False, None
        margin = (r.details.get("metrics") or {}).get("gen_margin")
        return None, r.status == "drift", float(margin) if margin is not None else None
    return None, False, None


def accuracy_reference(store: Any, run_id: int, trial: Any) -> dict[str, Any]:
    """What the accuracy gate judges `trial`'s drift against (`gates.accuracy.judge`).

    A baseline measurement (trial #0, a sentinel) is the reference itself; any other trial is
    judged against the metrics every kept baseline measurement of the run recorded from its own
    accuracy gate (read back from the store: the gate's results are the one record of them)."""
    if trial.number == 0 or trial.proposer in BASELINES:
        return {"is_baseline": True}
    runs = [(g.details or {}).get("metrics") for t in store.list_trials(run_id)
            if (t.number == 0 or t.proposer in BASELINES) and t.status == "kept"
            for g in store.gate_results(t.id) if g.gate == "accuracy" and g.status != "fail"]
    return {"baseline": [m for m in runs if m]}


def reached_rate(store: Any, run_id: int, trial: Any, scenario: str) -> float | None:
    """The SLO rate (`slo_rate` of `scenario`) that `trial`'s knob set and commit reached in this run's
    newest finished trial of them (kept or discarded: a measurement the run used), or None.

    A paired round's half, a sentinel (the baseline's knobs), a retry or a re-run after a resume
    measures a server the run already searched: its rate search brackets around that rate instead
    of climbing from the scenario's start rate (`orchestrator.bench.rate.find_rate`'s `near`). Only
    where the steps go changes; each is measured and judged as before, so a server that moved is
    followed there."""
    for t in reversed(store.list_trials(run_id)):
        if t.id == trial.id or t.status not in ("kept", "discarded") or t.commit != trial.commit or t.knobs != trial.knobs:
            continue
        rates = [m.value for m in store.measurements(t.id) if m.scenario == scenario and m.metric == "slo_rate"]
        if rates and rates[-1] > 0:
            return rates[-1]
    return None


def audit_samples(outputs: list[tuple[Any, list[Any]]], tokenizer: Any, n: int, min_tokens: int) -> list[dict[str, Any]]:
    """Up to `n` measured requests to audit, drawn at random, concurrent scenarios first.

    `outputs`: (scenario, its measured requests) per measurement. A request qualifies when it
    returned at least `min_tokens` token ids, one for every token counted, and its prompt went out as ids, which the scenario's
    seeded prompt factory gives back exactly (a text or trace prompt does not qualify)."""
    from orchestrator.bench.prompts import PromptFactory, load_tokenizer

    tok = load_tokenizer(tokenizer)
    if tok is None:
        return []
    pools: list[tuple[int, list[dict[str, Any]]]] = []
    for scenario, requests in outputs:
        if scenario.arrival == "trace":
            continue
        factory = PromptFactory(scenario, tok)
        pool = []
        for rec in requests:
            # Every counted token came back as an id (an event without ids leaves the list short).
            if not rec.success or len(rec.output_ids) < min_tokens or len(rec.output_ids) != rec.client_tokens:
                continue
            prompt = factory.make(rec.index).prompt
            if not isinstance(prompt, list) or rec.usage_prompt_tokens not in (None, len(prompt)):
                continue
            pool.append({"scenario": scenario.name, "index": rec.index, "prompt_ids": prompt, "output_ids": list(rec.output_ids)})
        if pool:
            pools.append((scenario.concurrency, pool))
    pools.sort(key=lambda p: -p[0])  # the batched path first: that is where a server can differ
    # Drawn with a secret seed: a fixed choice (the first requests, say) would tell a server which
    # prompts to answer honestly.
    rng = random.SystemRandom()
    picked: list[dict[str, Any]] = []
    for i, (_, pool) in enumerate(pools):
        share = -(-(n - len(picked)) // (len(pools) - i))  # what is left, split over the pools left
        picked += rng.sample(pool, min(share, len(pool)))
    return picked[:n]


SEEN = "integrity.seen"
"""The event kind of a measured request kept for later launches' cross-launch probe (`remember_request`)."""
SEEN_MIN_OUTPUT = 8
"""Fewest output tokens of a request kept for the cross-launch probe: decode must dominate its time, so an
honest prefix cache kept across launches (it saves the prefill) stays inside the probe's ratio."""


def remember_request(ctx: TrialContext, trial: Any, outputs: list[tuple[Any, list[Any]]], caps: dict[str, Any] | None) -> None:
    """Keep one of `trial`'s measured requests in the store (a `SEEN` event): the body the bench sent, as
    the bench sent it, for a later launch's integrity gate to send again (`seen_requests`). The most
    decode-heavy one of at least `SEEN_MIN_OUTPUT` output tokens; none when no request qualifies."""
    from gates.api import ApiMode
    from orchestrator.bench.loadgen import build_payload
    from orchestrator.bench.prompts import PromptFactory, load_tokenizer

    mode = ApiMode.of(caps)
    best = max(((sc, r) for sc, reqs in outputs if sc.arrival != "trace" for r in reqs
                if r.success and r.output_tokens >= SEEN_MIN_OUTPUT),
               key=lambda x: x[1].output_tokens / max(x[1].prompt_tokens, 1), default=None)
    if best is None:
        return
    sc, rec = best
    prompt = PromptFactory(sc, load_tokenizer(ctx.tokenizer), text=ctx.target.api == "chat" or not mode.prompt_ids).make(rec.index)
    # Every field the bench may send: a later launch's engine (an engine knob) gets the ones it takes (`seen_requests`).
    body = build_payload(ctx.target.api, ctx.target.served_model_name, prompt)
    e2e = rec.e2e_ns / 1e9 if rec.e2e_ns is not None else None
    ctx.store.add_event(ctx.run_id, SEEN, f"#{trial.number}: request {rec.index} of {sc.name} kept for later launches' cross-launch probe",
                        data={"trial": trial.number, "scenario": sc.name, "index": rec.index, "e2e_s": e2e, "body": body},
                        trial_id=trial.id)


def seen_requests(store: Any, run_id: int, trial: Any, n: int = 4, capabilities: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Up to `n` requests earlier launches of the run answered (`remember_request`), one per launch, those of
    the launches most like `trial`'s first (its commit, then the most knobs alike, then the newest): a cache
    kept across launches is most likely shared by launches of the same code and knobs. Each body is sent as
    the bench would send it to `trial`'s engine (`capabilities`: the fields it refuses left out); a prompt of
    ids to an engine that takes only text is not sent."""
    from gates.api import ApiMode

    mode = ApiMode.of(capabilities)
    kept = {e.trial_id: e.data for e in store.events(run_id, kind=SEEN) if e.trial_id != trial.id and isinstance(e.data, dict)
            and (mode.prompt_ids or not isinstance(e.data["body"].get("prompt"), list))}
    knobs = trial.knobs or {}

    def alike(tid: int) -> tuple[bool, int, int]:
        t = store.get_trial(tid)
        return (t.commit == trial.commit, sum(1 for k, v in (t.knobs or {}).items() if knobs.get(k) == v), t.number)

    return [{"body": mode.body(kept[tid]["body"]), "trial": kept[tid]["trial"]} for tid in sorted(kept, key=alike, reverse=True)[:n]]


def _audit(ctx: TrialContext, site: Site, trial: Any, bench: _Bench, margin: float) -> str | None:
    """Score a sample of the measured requests' outputs with the reference; a rejection or None."""
    from gates.thresholds import load_thresholds

    cfg = load_thresholds()["accuracy"]["audit"]
    samples = audit_samples(bench.outputs, ctx.tokenizer, int(cfg["requests"]), int(cfg["min_output_tokens"]))
    r = site.audit(samples=samples, reference_model_dir=str(ctx.reference_dir), margin=margin)
    ctx.store.add_gate_result(trial.id, r.gate, r.status, r.reason, r.details, r.duration_s)
    return f"bench audit: {r.reason}" if r.status == "fail" else None


def _diff(ctx: TrialContext, commit: str | None) -> str | None:
    if not commit or commit == ctx.base_commit or not ctx.base_commit:
        return None
    import git

    return git.Repo(ctx.source_dir, search_parent_directories=True).git.diff(ctx.base_commit, commit)


@dataclass
class _Bench:
    """The bench step of one trial: every scenario, each measurement redone until it can be trusted."""

    ctx: TrialContext
    trial: Any
    base_url: str
    trial_dir: Path
    proc: Proc
    site: Site
    host_ref: dict[str, Any] | None
    caps: dict[str, Any] | None = None
    outputs: list[tuple[Any, list[Any]]] = field(default_factory=list)
    """(scenario, measured requests) of every measurement used: what the bench audit samples."""
    draw: int = 0
    """This trial's draw of prompts: every measurement's `Scenario.prompt_seed` follows from it (`prompt_seed`)."""
    firsts: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    """Goal scenario -> (result, host window) of its short pass's first requests (`Scenario.part`), which
    the full bench continues (`orchestrator.bench.passes`)."""
    gpus: int = 1
    """GPUs the trial's server took: `output_throughput_per_gpu` is the host's tok/s over them."""

    def prompt_seed(self, rep: int, attempt: int) -> int:
        """The prompts of measurement `rep`'s `attempt` (0 = first): the trial's draw for the first attempt of
        the first, one derived from it otherwise. Every measurement asks prompts no earlier one asked (each
        scenario has its own `seed` too), and two trials handed one draw ask alike, redone attempts included."""
        if rep == 0 and attempt == 0:
            return self.draw
        return derived_seed(self.draw, rep) if attempt == 0 else derived_seed(self.draw, rep, attempt)

    def screen(self, screen: Any, result: TrialResult) -> str | None:
        """The short pass of `screen`; an error, or None. Screened out: `result` holds the short pass."""
        short, t0 = TrialResult(), time.perf_counter()
        err = self.run(1, short, scenarios=screen.scenarios, tag=f"@{screen.fraction:g}", plan=screen.plan,
                       order=screen.order or None)
        if err:
            result.status_hint = short.status_hint
            return err
        why = screen.judge(short, time.perf_counter() - t0)
        if why:
            result.samples, result.metrics, result.host = short.samples, short.metrics, short.host
            result.screened, result.status_hint, result.error = True, "discarded", why
        return None

    def run(self, repeats: int, result: TrialResult, first_repeat: int = 0, scenarios: dict[str, Any] | None = None,
            tag: str = "", plan: Callable[..., tuple[Any, dict[str, float] | None]] | None = None,
            order: Sequence[str] | None = None) -> str | None:
        """Measure each goal scenario `repeats` times; return an error, or None. `scenarios` replaces the
        run's (a screen's short pass, stored as `NAME{tag}`), `order` the goal's order of them;
        `plan(goal scenario, the objectives measured so far, after_stop=a scenario before was stopped early)`:
        (the `StopRule` that scenario is stopped early by on the host (`Scenario.stop`), or None; None, or
        objective label -> value where it is not run at all and those values stand for it), a screen's
        (`orchestrator.trial.fidelity.Screen.plan`)."""
        ctx, store = self.ctx, self.ctx.store
        stopped = False
        for goal_name in order or ctx.goal.scenarios:
            name = goal_name + tag
            for rep in range(first_repeat, first_repeat + repeats):
                scenario = (scenarios or ctx.scenarios)[goal_name]
                # A continuation (the rest of a short pass) is the first repeat; any later one is whole and fresh.
                first = self.firsts.get(goal_name) if scenario.part is not None and scenario.part[0] > 0 else None
                if scenario.part is not None and scenario.part[0] > 0 and (first is None or rep != first_repeat):
                    scenario, first = ctx.scenarios[goal_name], None
                rule, skip = plan(goal_name, result.samples, after_stop=stopped) if plan is not None and first is None else (None, None)
                if skip is not None:  # certain to score under the bar: not run, its objectives at the values given
                    ctx.on_step(f"bench {name}: not run (out of reach of the screen's bar)")
                    for label, value in skip.items():
                        result.samples.setdefault(label, []).append(float(value))
                    stopped = True
                    break
                if rule is not None:  # travels with the scenario to the host's bench, which stops it there
                    scenario = scenario.model_copy(update={"stop": rule})
                label = f"bench {name}" + (f" #{rep + 1}" if repeats > 1 or rep else "")
                if rule is not None:
                    label += " (stopped once out of reach of the screen's bar)"
                if first is not None:
                    lo, hi = scenario.part
                    label += f" (requests {lo + 1}-{hi} of {hi}, after the short pass's {lo})" if hi > lo else \
                        f" (all {hi} requests measured in the short pass)"
                ctx.on_step(label)

                def bench_one(scenario: Any) -> Any:
                    return self.site.bench(self.base_url, ctx.target.served_model_name, scenario, tokenizer=ctx.tokenizer,
                                           tokenizer_dir=str(ctx.model_dir), api=ctx.target.api,
                                           timeout_s=ctx.request_timeout_s, capabilities=self.caps)

                slo = goal_name == SLO_SCENARIO and ctx.goal.slo is not None
                near = reached_rate(store, ctx.run_id, self.trial, name) if slo else None

                tries: list[int] = []

                def once(scenario: Any = scenario, label: str = label, slo: bool = slo, near: float | None = near,
                         tries: list[int] = tries, rep: int = rep, first: Any = first) -> Any:
                    # A fresh draw per attempt; a continuation asks the rest of its short pass's draw.
                    drawn = first[0].scenario.prompt_seed if first is not None else self.prompt_seed(rep, len(tries))
                    tries.append(drawn)
                    scenario = scenario.model_copy(update={"prompt_seed": drawn})
                    if slo:  # the rate search, every step a bench; near the rate this knob set already reached
                        return slo_measure(ctx.goal.slo, scenario, bench_one, ctx.rate, near=near,
                                           on_step=lambda st: ctx.on_step(f"{label}: {plain_number(st.rate)} req/s "
                                                                          f"{'ok' if st.passed else 'broke'}"))
                    return bench_one(scenario)

                def redo(attempt: int, reasons: list[str], name: str = name, label: str = label) -> None:
                    ctx.on_step(f"{label}: redo")
                    store.add_event(ctx.run_id, "measure.redo", f"{name}: redone ({'; '.join(reasons)})",
                                    data={"scenario": name, "attempt": attempt, "reasons": reasons}, trial_id=self.trial.id)

                if first is not None and scenario.measured_requests == 0:
                    # Nothing left: a one-wave scenario was measured whole by the short pass, once.
                    res, win, untrusted, attempts = None, first[1], [], 0
                else:
                    res, win, untrusted, attempts = bench_trusted(once, ctx.host, self.proc, ref=self.host_ref,
                                                                  policy=ctx.trust, on_redo=redo)
                    store.add_event(ctx.run_id, "measure.host", f"{name} #{rep}: load {win['load1']:.2f}, others' runnable "
                                    f"{win.get('foreign_load', float('nan')):.2f}/CPU, steal {win['steal']:.0%}, "
                                    f"client {win['client_cpu']:.0%}",
                                    data={"scenario": name, "repeat": rep, "attempts": attempts, "window": win,
                                          "untrusted": untrusted, **({"part": list(scenario.part)} if scenario.part else {}),
                                          "prompts": {"seed": scenario.seed, "prompt_seed": res.scenario.prompt_seed,
                                                      **({"redone_with": tries[:-1]} if len(tries) > 1 else {})}},
                                    trial_id=self.trial.id)
                if first is not None and not untrusted and (res is None or res.metrics.get("failed", 0) == 0):
                    # One measurement of the whole scenario: the short pass's requests and these, over both
                    # passes' records, as a single full bench computes it; meta["passes"] says which came from which.
                    lo = scenario.part[0]
                    res = join(ctx.scenarios[goal_name], [first[0]] + ([res] if res is not None else []),
                               labels=(f"short pass (requests 1-{lo}, before the gates)",
                                       f"continued (requests {lo + 1}-{scenario.part[1]}, after the gates)")[:1 if res is None else 2],
                               capabilities=self.caps)
                    scenario = res.scenario  # the whole scenario, with the draw its passes asked
                (self.trial_dir / f"bench-{name}-{rep}.json").write_text(res.to_json())
                if res.meta.get("slo_error"):  # no rate met the SLO: nothing to score, the trial does not count
                    store.add_measurements(self.trial.id, name, res.metrics, repeat=rep)
                    return res.meta["slo_error"]
                if res.metrics.get("failed", 0) > 0:
                    store.add_measurements(self.trial.id, name, res.metrics, repeat=rep)
                    reasons = ", ".join(f"{k}: {v}" for k, v in (res.failures or {}).items())
                    return f"{int(res.metrics['failed'])} of {scenario.measured_requests} requests failed in {name} ({reasons})"
                bad_counts = count_violation(res.metrics, goal_name)
                if bad_counts:  # outputs shorter/longer than asked, or usage that disagrees with the ids
                    store.add_measurements(self.trial.id, name, res.metrics, repeat=rep)
                    result.status_hint = "invalid"
                    return bad_counts
                if untrusted:  # never judged on: not stored as a measurement
                    return f"untrusted measurement in {name} after {attempts} attempts: {'; '.join(untrusted)}"
                if "output_throughput" in res.metrics:  # per host and per GPU, for goals and the report
                    res.metrics["output_throughput_per_gpu"] = res.metrics["output_throughput"] / self.gpus
                metrics = dict(res.metrics)
                if first is not None:  # which requests came from which pass, beside the numbers
                    metrics.update(short_pass_requests=float(first[0].scenario.measured_requests),
                                   continued_requests=float(len(res.requests) - first[0].scenario.measured_requests))
                store.add_measurements(self.trial.id, name, metrics, repeat=rep)
                if scenario.part is not None and scenario.part[0] == 0:
                    self.firsts[goal_name] = (res, win)  # the full bench may continue it; audited with it then
                else:
                    self.outputs.append((res.scenario, res.requests))  # with its draw: the audit asks its prompts
                result.host.append(win)
                result.metrics[goal_name] = dict(res.metrics)
                stopped = stopped or bool(res.metrics.get("stopped_early"))
                for o in ctx.goal.objectives:
                    if o.scenario == goal_name:
                        result.samples.setdefault(objective_label(goal_name, o.key), []).append(float(res.metrics[o.key]))
        return None
