"""Frozen records the store hands out, and the status vocabularies they use.

Records are plain snapshots: reading one never touches the database, and changing the database
never changes a record already returned. JSON columns come back decoded (``knobs``,
``objective``, ``timings``, ...); timestamps are timezone-aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "GATE_STATUSES",
    "RUN_STATUSES",
    "TRIAL_STATUSES",
    "UNFINISHED_TRIAL_STATUSES",
    "EventRecord",
    "GateRecord",
    "GateStatus",
    "MeasurementRecord",
    "RunRecord",
    "RunStatus",
    "TrialRecord",
    "TrialStatus",
]

RunStatus = Literal["running", "finished", "stopped", "failed"]
TrialStatus = Literal[
    "pending", "running", "kept", "discarded", "failed", "invalid", "needs_approval", "rejected"
]
GateStatus = Literal["pass", "fail", "drift", "remeasure"]

RUN_STATUSES: tuple[str, ...] = ("running", "finished", "stopped", "failed")
TRIAL_STATUSES: tuple[str, ...] = (
    "pending",
    "running",
    "kept",
    "discarded",
    "failed",
    "invalid",
    "needs_approval",
    "rejected",
)
#: Trials in these states were interrupted if their run is not running any more; resume redoes them.
UNFINISHED_TRIAL_STATUSES: tuple[str, ...] = ("pending", "running")
GATE_STATUSES: tuple[str, ...] = ("pass", "fail", "drift", "remeasure")


@dataclass(frozen=True)
class RunRecord:
    """One optimization run.

    Attributes:
        id: Primary key.
        name: Human-readable run name.
        created_at: When the run was created (UTC).
        updated_at: Last change to the run or its trials' status (UTC).
        status: ``running``, ``finished``, ``stopped`` or ``failed``.
        goal_text: The goal as the user wrote it.
        goal: The parsed goal (``GoalSpec`` as JSON).
        goal_hash: Hash of the parsed goal; runs with equal hashes pursue the same goal.
        target: The target spec used (JSON object).
        config: The workspace config in effect (JSON object).
        host: Where trials ran (``local``, ``ssh://...``).
        proposer: Which proposer produced candidates (``search``, ``agent``, ...).
        stop_reason: Why the run ended, once it has.
        best_trial_id: Id of the best kept trial so far, if any.
        owner_host: Hostname of the orchestrator that holds (or last held) the run's lease.
        owner_pid: Its process id.
        heartbeat_at: Its last heartbeat (UTC); ``None`` once the lease is released.
    """

    id: int
    name: str
    created_at: datetime
    updated_at: datetime
    status: str
    goal_text: str
    goal: Any
    goal_hash: str
    target: Any
    config: Any
    host: str
    proposer: str
    stop_reason: str | None
    best_trial_id: int | None
    owner_host: str | None = None
    owner_pid: int | None = None
    heartbeat_at: datetime | None = None


@dataclass(frozen=True)
class TrialRecord:
    """One trial: a candidate (commit + knobs) and what became of it.

    Attributes:
        id: Primary key.
        run_id: The run it belongs to.
        number: Position in the run; ``0`` is the baseline. Unique per run.
        status: One of :data:`TRIAL_STATUSES`.
        commit: Code commit of the candidate.
        knobs: Engine knob values (name -> value).
        rationale: Why the proposer chose this candidate.
        prediction: The proposer's expected outcome, if it stated one.
        proposer: Which proposer produced it (``search``, ``agent``, ...), or, for a trial the loop
            added itself, its role (``baseline``, ``sentinel``, ``paired``, ``retry``, ``probe``;
            ``confirm`` in runs from before paired confirmation). Readers tell the two apart by role.
        launch_cmd: The command that launched the server, once started.
        score: Geometric-mean speedup over the baseline, once finished.
        objective: Objective metric -> value, once finished.
        error: What went wrong, for failed or invalid trials.
        started_at: When deployment began (UTC).
        finished_at: When the verdict was recorded (UTC).
        timings: Step -> seconds (``deploy``, ``gates``, ``bench``, ``record``, ``total``).
        log_path: Where the server log of this trial lives.
        optuna_trial_number: The matching Optuna trial, for search proposers.
    """

    id: int
    run_id: int
    number: int
    status: str
    commit: str
    knobs: dict[str, Any]
    rationale: str
    prediction: str | None
    proposer: str
    launch_cmd: str | None
    score: float | None
    objective: dict[str, float] | None
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    timings: dict[str, float] | None
    log_path: str | None
    optuna_trial_number: int | None


@dataclass(frozen=True)
class MeasurementRecord:
    """One metric of one bench scenario in one trial and repeat."""

    id: int
    trial_id: int
    scenario: str
    metric: str
    value: float
    repeat: int


@dataclass(frozen=True)
class GateRecord:
    """The stored outcome of one gate run in one trial."""

    id: int
    trial_id: int
    gate: str
    status: str
    reason: str
    details: dict[str, Any]
    duration_s: float | None
    created_at: datetime


@dataclass(frozen=True)
class EventRecord:
    """One event of a run; also the audit log (``gates.relock``, ``approve``, ``reject``, ``resume``)."""

    id: int
    run_id: int | None
    trial_id: int | None
    ts: datetime
    kind: str
    message: str
    data: Any
