"""SQLAlchemy 2.0 ORM rows for the store (the tables; ``orchestrator.models`` is the model forge).

These classes are private to :mod:`orchestrator.store`: :class:`~orchestrator.store.store.Store`
reads and writes them inside one session scope and hands out frozen records
(:mod:`orchestrator.store.records`) instead. JSON payloads are ``Text`` columns holding
``json.dumps`` output so the same schema works on SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

__all__ = [
    "SCHEMA_VERSION",
    "Base",
    "EventModel",
    "GateResultModel",
    "MeasurementModel",
    "RunModel",
    "SchemaVersionModel",
    "TrialModel",
    "utcnow",
]

#: Version of the schema this code writes. Bump it with every incompatible change; a database
#: stamped with a larger number was written by newer code and is refused.
SCHEMA_VERSION = 1


def utcnow() -> datetime:
    """Return the current time as a timezone-aware UTC datetime."""
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    SQLite has no timezone type and returns naive datetimes; normalising on both sides keeps
    records identical whichever backend wrote them.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of every store table."""


class SchemaVersionModel(Base):
    """One row holding the schema version the database was created with."""

    __tablename__ = "schema_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False)


class RunModel(Base):
    """One optimization run: a goal pursued against one target."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    status: Mapped[str] = mapped_column(String(32), nullable=False, default="running")
    goal_text: Mapped[str] = mapped_column(Text, nullable=False)
    goal_json: Mapped[str] = mapped_column(Text, nullable=False)
    goal_hash: Mapped[str] = mapped_column(String(128), nullable=False)
    target_json: Mapped[str] = mapped_column(Text, nullable=False)
    config_json: Mapped[str] = mapped_column(Text, nullable=False)
    host: Mapped[str] = mapped_column(String(255), nullable=False)
    proposer: Mapped[str] = mapped_column(String(64), nullable=False)
    stop_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # No FK: trials already point at runs, and a cycle would complicate inserts and drops.
    best_trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The run lease (see orchestrator/hosts/runlease.py): which orchestrator process drives the run, and
    # when it last said so. Nullable: older rows and runs nobody holds have none.
    owner_host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    owner_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    trials: Mapped[list[TrialModel]] = relationship(back_populates="run")


class TrialModel(Base):
    """One candidate (commit + knobs) deployed, gated, benchmarked and judged."""

    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("run_id", "number", name="uq_trials_run_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    number: Mapped[int] = mapped_column(Integer, nullable=False)
    status: Mapped[str] = mapped_column(String(32), nullable=False, default="pending")
    commit: Mapped[str] = mapped_column(String(64), nullable=False)
    knobs_json: Mapped[str] = mapped_column(Text, nullable=False)
    rationale: Mapped[str] = mapped_column(Text, nullable=False)
    prediction: Mapped[str | None] = mapped_column(Text, nullable=True)
    proposer: Mapped[str] = mapped_column(String(64), nullable=False)
    launch_cmd: Mapped[str | None] = mapped_column(Text, nullable=True)
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    objective_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    timings_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    optuna_trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)

    run: Mapped[RunModel] = relationship(back_populates="trials")


class _OfATrial:
    """A row of one trial: its own id first, then the trial's (deleted with the trial), indexed as
    ``ix_<table>_trial``."""

    # sort_order: before the table's own columns (a mixin's come after them by default).
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True, sort_order=-1)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), nullable=False, sort_order=-1)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Index, ...]:
        return (Index(f"ix_{cls.__tablename__}_trial", "trial_id"),)


class MeasurementModel(_OfATrial, Base):
    """One metric value of one bench scenario in one trial (one row per repeat)."""

    __tablename__ = "measurements"

    scenario: Mapped[str] = mapped_column(String(128), nullable=False)
    metric: Mapped[str] = mapped_column(String(128), nullable=False)
    value: Mapped[float] = mapped_column(Float, nullable=False)
    repeat: Mapped[int] = mapped_column(Integer, nullable=False, default=0)


class GateResultModel(_OfATrial, Base):
    """The outcome of one gate (integrity, accuracy, performance, ...) in one trial."""

    __tablename__ = "gate_results"

    gate: Mapped[str] = mapped_column(String(64), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    details_json: Mapped[str] = mapped_column(Text, nullable=False)
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)


class EventModel(Base):
    """A timestamped event of a run; doubles as the audit log (relocks, approvals, resumes)."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_run_kind", "run_id", "kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # Nullable: some audit entries (a `gates relock` outside any run) belong to no run.
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=True)
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), nullable=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    kind: Mapped[str] = mapped_column(String(64), nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False)
    data_json: Mapped[str | None] = mapped_column(Text, nullable=True)
