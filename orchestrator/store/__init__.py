"""Persistence for infergoal: runs, trials, measurements, gate results and the audit log.

``Store(url)`` works on any SQLAlchemy URL (SQLite by default, PostgreSQL by URL) and hands
out frozen records; see :mod:`orchestrator.store.store` for the full contract.
"""

from .database import SchemaTooNew, StoreError
from .records import (
    GATE_STATUSES,
    RUN_STATUSES,
    TRIAL_STATUSES,
    UNFINISHED_TRIAL_STATUSES,
    EventRecord,
    GateRecord,
    GateStatus,
    MeasurementRecord,
    RunRecord,
    RunStatus,
    TrialRecord,
    TrialStatus,
)
from .store import DuplicateTrial, NotFound, Store

__all__ = [
    "GATE_STATUSES",
    "RUN_STATUSES",
    "TRIAL_STATUSES",
    "UNFINISHED_TRIAL_STATUSES",
    "DuplicateTrial",
    "EventRecord",
    "GateRecord",
    "GateStatus",
    "MeasurementRecord",
    "NotFound",
    "RunRecord",
    "RunStatus",
    "SchemaTooNew",
    "Store",
    "StoreError",
    "TrialRecord",
    "TrialStatus",
]
