"""What a trial is handed and what it hands back: `TrialContext` (what every trial of a run shares),
`TrialResult` (what one trial measured) and `objective_label` (how an objective's value is named)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.bench.rate import RatePolicy
from orchestrator.config.goal import GoalSpec
from orchestrator.hosts import Host
from orchestrator.hosts.measure import TrustPolicy
from orchestrator.targets import TargetSpec

__all__ = ["TrialContext", "TrialResult", "objective_label"]


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

