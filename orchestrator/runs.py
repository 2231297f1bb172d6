"""Starting and resuming runs: wire workspace, goal, target, host, store and proposer together.

The CLI calls `start_run` / `resume_run`; tests call them directly. Everything a resume needs
(goal, target, config, seed) is read back from the run row, so a resumed run is the same run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.controller import Controller
from orchestrator.goal import GoalSpec
from orchestrator.hosts import get_host
from orchestrator.proposers import get_proposer
from orchestrator.store import Store
from orchestrator.targets import TargetSpec, load_target
from orchestrator.trial import TrialContext
from orchestrator.workspace import Config, Workspace

__all__ = ["RunOutcome", "open_store", "resolve_model", "resume_run", "start_run"]


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    stop_reason: str


def open_store(ws: Workspace) -> Store:
    return Store(ws.db_url)


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
    """Create a run row and drive it to a stop."""
    target = load_target(ws.target_path)
    store = open_store(ws)
    host = get_host(ws.config.host, state_dir=ws.state_dir)
    run = store.create_run(
        name=name or f"{target.name}: {goal.describe()}"[:200],
        goal_text=goal.text, goal_json=goal.model_dump(mode="json"), goal_hash=goal.digest,
        target_json=target.model_dump(mode="json"), config_json=ws.config.model_dump(mode="json"),
        host=ws.config.host, proposer=ws.config.proposer,
    )
    store.add_event(run.id, "run.start", f"run {run.id} started", data={"fingerprint": host.fingerprint()})
    if on_run:
        on_run(run.id)
    return _drive(ws, store, run.id, goal, target, ws.config, host, on_step, on_trial)


def resume_run(
    ws: Workspace, run_id: int | None = None, *, on_step: Callable[[str], None] | None = None,
    on_trial: Callable[[Any], None] | None = None,
) -> RunOutcome:
    """Continue a stopped or killed run from the store: interrupted trials are re-run, none lost."""
    store = open_store(ws)
    run = store.get_run(run_id) if run_id is not None else store.latest_run()
    if run is None:
        raise LookupError("no run to resume" + (f" with id {run_id}" if run_id is not None else "") + "; start one with `infergoal goal`")
    if run.status == "finished":
        raise LookupError(f"run {run.id} already finished ({run.stop_reason}); start a new one with `infergoal goal`")
    goal = GoalSpec(**run.goal)
    target = TargetSpec(**run.target)
    config = Config(**run.config)
    host = get_host(config.host, state_dir=ws.state_dir)
    swept = host.sweep_orphans() if hasattr(host, "sweep_orphans") else []
    store.add_event(run.id, "resume", f"run {run.id} resumed", data={"orphans_killed": swept})
    return _drive(ws, store, run.id, goal, target, config, host, on_step, on_trial)


def _drive(
    ws: Workspace, store: Store, run_id: int, goal: GoalSpec, target: TargetSpec, config: Config,
    host: Any, on_step: Callable[[str], None] | None, on_trial: Callable[[Any], None] | None,
) -> RunOutcome:
    from orchestrator.bench import builtin_scenarios
    from orchestrator.knowledge import KnowledgeBase, workload_key

    on_step = on_step or (lambda s: None)
    on_step("model")
    model_dir = resolve_model(target.model)
    t_session = time.perf_counter()
    reference = model_dir if target.reference_model == "same" else Path(target.reference_model)
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the accuracy gate loads the reference in-process; keep the live view clean

    ctx = TrialContext(
        run_id=run_id, goal=goal, target=target, host=host, store=store,
        model_dir=model_dir, reference_dir=reference,
        scenarios=builtin_scenarios(config.bench.scale), run_dir=ws.run_dir(run_id),
        tokenizer=AutoTokenizer.from_pretrained(str(model_dir)),
        base_commit=_base_commit(Path(target.source)), source_dir=Path(target.source),
        accuracy_gate=config.gates.accuracy, integrity_gate=config.gates.integrity,
        request_timeout_s=config.bench.timeout_s, on_step=on_step,
    )
    kb = KnowledgeBase(ws.kb_read_dirs, write_dir=ws.kb_write_dir)
    fingerprint = host.fingerprint()
    workload = workload_key(goal.scenarios, config.bench.scale)
    warm = kb.warm_start(engine=target.engine, model=target.model, hardware=fingerprint, workload=workload)
    if warm and not store.list_trials(run_id):
        store.add_event(run_id, "kb.warm_start", f"{len(warm)} prior knob set(s) from the knowledge base", data={"knobs": warm})
    proposer = get_proposer(config.proposer, seed=config.seed, warm_start=warm)
    controller = Controller(
        ctx, proposer, repeats=config.bench.repeats, baseline_repeats=config.bench.baseline_repeats,
        min_gain=config.min_gain, on_trial=on_trial,
    )
    try:
        reason = controller.run()
    finally:
        # Wall time of this session (after the model is ready): the report compares it with the
        # engine's own time to show what the orchestrator itself costs.
        store.add_event(run_id, "session", "session ended", data={"wall_s": time.perf_counter() - t_session})
    written = kb.write_back(store, run_id, engine=target.engine, model=target.model, hardware=fingerprint, workload=workload)
    if written:
        store.add_event(run_id, "kb.write_back", f"finding written: {written}", data={"path": str(written)})
    return RunOutcome(run_id=run_id, stop_reason=reason)


def config_json(config: Config) -> str:
    return json.dumps(config.model_dump(mode="json"), sort_keys=True)
