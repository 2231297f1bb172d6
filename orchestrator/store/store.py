"""The SQL store: runs, trials, measurements, gate results and events.

Contract (what callers may rely on, on every backend):

* ``Store(url)`` takes any SQLAlchemy URL. SQLite (file or ``sqlite://`` memory) and PostgreSQL
  (``postgresql+psycopg://...``) are tested. Tables are created on open; a database written by a
  newer schema is refused with :class:`~orchestrator.store.database.SchemaTooNew`.
* Every write method is one transaction, committed before it returns: once a call has returned,
  a ``kill -9`` of the process loses nothing it wrote.
* Every method returns frozen records (:mod:`orchestrator.store.records`) or lists of them.
  ORM rows never leave the session scope.
* Lookups by id (``get_run``, ``get_trial``, ``get_trial_by_number``) return ``None`` when
  nothing matches; writes that name a missing run or trial raise :class:`NotFound`.
* Trial numbers are unique per run: :meth:`Store.create_trial` raises :class:`DuplicateTrial`
  for a taken number (resume relies on it).
* Invalid status values raise ``ValueError``; database failures (locked, disk full, server
  gone) raise :class:`~orchestrator.store.database.StoreError` whose message says what to do next.

The engine, the schema and the session scope are :mod:`orchestrator.store.database`'s; this module
holds the queries, each one session.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .database import Database, StoreError
from .records import (
    GATE_STATUSES,
    RUN_STATUSES,
    TRIAL_STATUSES,
    UNFINISHED_TRIAL_STATUSES,
    EventRecord,
    GateRecord,
    MeasurementRecord,
    RunRecord,
    TrialRecord,
)
from .tables import EventModel, GateResultModel, MeasurementModel, RunModel, TrialModel, utcnow

__all__ = ["DuplicateTrial", "NotFound", "Store"]

R = TypeVar("R")


class NotFound(StoreError, KeyError):
    """A write named a run or trial that does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DuplicateTrial(StoreError):
    """A trial with this number already exists in the run."""


def fit(text: str, limit: int) -> str:
    """`text` shortened to a VARCHAR column's width, keeping its head (the kind) and tail (the file).

    The run's full settings stay in `config_json`; PostgreSQL refuses an over-long VARCHAR outright
    (`scripted:/a/long/workspace/path/steps.json` overflowed the 64-character proposer column)."""
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head] + "…" + text[-(limit - head - 1):]


def _dumps(value: Any, sort_keys: bool = True) -> str:
    # sort_keys keeps stored JSON stable, so equal payloads compare equal as text too.
    return json.dumps(value, sort_keys=sort_keys)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _as_json_text(value: Any, sort_keys: bool = True) -> str:
    """Accept a JSON string (validated) or a JSON-able object, return canonical JSON text."""
    if isinstance(value, str):
        return _dumps(json.loads(value), sort_keys)
    return _dumps(value, sort_keys)


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"invalid {what} {value!r}; expected one of {', '.join(allowed)}")


class Store:
    """Persistent record of runs and their trials, in any SQLAlchemy-supported database.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:///.infergoal/infergoal.db``, ``sqlite://`` (memory,
            shared across calls of this instance) or ``postgresql+psycopg://user@host/db``.
            Parent directories of a SQLite file are created.
        busy_timeout_s: How long a SQLite writer waits for another process's lock before
            failing with :class:`StoreError`.

    Raises:
        SchemaTooNew: The database was created by a newer infergoal.
        StoreError: The database cannot be opened.
    """

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0, read_only: bool = False) -> None:
        self._db = Database(url, busy_timeout_s=busy_timeout_s, read_only=read_only)
        self._session = self._db.session

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._db.where

    def close(self) -> None:
        """Release all connections. The store must not be used afterwards."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self._db.where!r})"

    # -- runs -------------------------------------------------------------------------------

    def create_run(
        self,
        name: str,
        goal_text: str,
        goal_json: Any,
        goal_hash: str,
        target_json: Any,
        config_json: Any,
        host: str,
        proposer: str,
    ) -> RunRecord:
        """Create a run in status ``running``.

        ``goal_json``, ``target_json`` and ``config_json`` may be JSON text or JSON-able
        objects; the record returns them decoded as ``goal``, ``target`` and ``config``.
        """
        with self._session("creating a run") as session:
            now = utcnow()
            row = RunModel(
                name=name,
                created_at=now,
                updated_at=now,
                status="running",
                goal_text=goal_text,
                goal_json=_as_json_text(goal_json),
                goal_hash=goal_hash,
                # In declaration order: a knob's `when` names earlier knobs, and a resumed run
                # proposes (and probes) its knobs in the order the target declared them.
                target_json=_as_json_text(target_json, sort_keys=False),
                config_json=_as_json_text(config_json),
                host=fit(host, 255),
                proposer=fit(proposer, 64),
            )
            session.add(row)
            session.flush()
            return _record(RunRecord, row)

    def get_run(self, run_id: int) -> RunRecord | None:
        """Return the run, or ``None`` if there is none with this id."""
        with self._session("reading a run", write=False) as session:
            row = session.get(RunModel, run_id)
            return None if row is None else _record(RunRecord, row)

    def latest_run(self) -> RunRecord | None:
        """Return the most recently created run, or ``None`` if there are none."""
        with self._session("reading the latest run", write=False) as session:
            row = session.scalars(select(RunModel).order_by(RunModel.id.desc()).limit(1)).first()
            return None if row is None else _record(RunRecord, row)

    def list_runs(self) -> list[RunRecord]:
        """Return all runs, oldest first."""
        with self._session("listing runs", write=False) as session:
            return [_record(RunRecord, r) for r in session.scalars(select(RunModel).order_by(RunModel.id))]

    def set_run_status(self, run_id: int, status: str, stop_reason: str | None = None) -> RunRecord:
        """Set a run's status (and, when given, why it stopped)."""
        _check(status, RUN_STATUSES, "run status")
        with self._session("updating a run") as session:
            row = _get(session, RunModel, run_id, "run")
            row.status = status
            if stop_reason is not None:
                row.stop_reason = stop_reason
            row.updated_at = utcnow()
            session.flush()
            return _record(RunRecord, row)

    def set_best_trial(self, run_id: int, trial_id: int) -> RunRecord:
        """Point the run at its best trial so far; the trial must belong to the run."""
        with self._session("updating a run's best trial") as session:
            row = _get(session, RunModel, run_id, "run")
            trial = _get(session, TrialModel, trial_id, "trial")
            if trial.run_id != run_id:
                raise ValueError(f"trial {trial_id} belongs to run {trial.run_id}, not run {run_id}")
            row.best_trial_id = trial_id
            row.updated_at = utcnow()
            session.flush()
            return _record(RunRecord, row)

    # -- trials -----------------------------------------------------------------------------

    def create_trial(
        self,
        run_id: int,
        number: int,
        *,
        commit: str,
        knobs: Mapping[str, Any],
        rationale: str,
        proposer: str,
        prediction: str | None = None,
        optuna_trial_number: int | None = None,
    ) -> TrialRecord:
        """Create trial ``number`` of a run in status ``pending``.

        Raises:
            DuplicateTrial: The run already has a trial with this number.
            NotFound: There is no such run.
        """
        with self._session("creating a trial") as session:
            _get(session, RunModel, run_id, "run")
            taken = session.scalar(
                select(TrialModel.id).where(TrialModel.run_id == run_id, TrialModel.number == number)
            )
            if taken is not None:
                raise DuplicateTrial(f"run {run_id} already has trial number {number} (trial id {taken})")
            row = TrialModel(
                run_id=run_id,
                number=number,
                status="pending",
                commit=commit,
                knobs_json=_dumps(dict(knobs)),
                rationale=rationale,
                prediction=prediction,
                proposer=fit(proposer, 64),
                optuna_trial_number=optuna_trial_number,
            )
            session.add(row)
            try:
                session.flush()
            except IntegrityError as exc:
                # Lost a race with another writer between the check above and the insert.
                raise DuplicateTrial(f"run {run_id} already has trial number {number}") from exc
            return _record(TrialRecord, row)

    def start_trial(self, trial_id: int, launch_cmd: str, log_path: str | None) -> TrialRecord:
        """Mark a trial ``running``, with the launch command and server log path."""
        with self._session("starting a trial") as session:
            row = _get(session, TrialModel, trial_id, "trial")
            row.status = "running"
            row.launch_cmd = launch_cmd
            row.log_path = None if log_path is None else str(log_path)
            row.started_at = utcnow()
            session.flush()
            return _record(TrialRecord, row)

    def finish_trial(
        self,
        trial_id: int,
        status: str,
        *,
        score: float | None = None,
        objective: Mapping[str, float] | None = None,
        error: str | None = None,
        timings: Mapping[str, float] | None = None,
    ) -> TrialRecord:
        """Record a trial's verdict: status, score, objective values, error and step timings."""
        _check(status, TRIAL_STATUSES, "trial status")
        if status in UNFINISHED_TRIAL_STATUSES:
            raise ValueError(f"finish_trial needs a final status, not {status!r}")
        with self._session("finishing a trial") as session:
            row = _get(session, TrialModel, trial_id, "trial")
            row.status = status
            row.score = score
            row.objective_json = None if objective is None else _dumps(dict(objective))
            row.error = error
            row.timings_json = None if timings is None else _dumps(dict(timings))
            row.finished_at = utcnow()
            session.flush()
            return _record(TrialRecord, row)

    def set_trial_status(self, trial_id: int, status: str) -> TrialRecord:
        """Change only a trial's status (approve / reject of a ``needs_approval`` trial)."""
        _check(status, TRIAL_STATUSES, "trial status")
        with self._session("updating a trial's status") as session:
            row = _get(session, TrialModel, trial_id, "trial")
            row.status = status
            session.flush()
            return _record(TrialRecord, row)

    def reset_trial(self, trial_id: int) -> TrialRecord:
        """Return an interrupted (``pending`` or ``running``) trial to a clean ``pending`` state.

        Resume calls this before re-running the trial: the launch details, timestamps and the
        partial measurements and gate results of the killed attempt are removed so they cannot
        mix with the new attempt's. The trial keeps its id, number and candidate.

        Raises:
            ValueError: The trial already has a verdict; finished results are never erased.
            NotFound: There is no such trial.
        """
        with self._session("resetting a trial") as session:
            row = _get(session, TrialModel, trial_id, "trial")
            if row.status not in UNFINISHED_TRIAL_STATUSES:
                raise ValueError(
                    f"trial {trial_id} is already finished ({row.status}); only pending or running trials can be reset"
                )
            session.execute(delete(MeasurementModel).where(MeasurementModel.trial_id == trial_id))
            session.execute(delete(GateResultModel).where(GateResultModel.trial_id == trial_id))
            row.status = "pending"
            row.launch_cmd = row.log_path = row.error = None
            row.started_at = row.finished_at = None
            row.score = None
            row.objective_json = row.timings_json = None
            session.flush()
            return _record(TrialRecord, row)

    def get_trial(self, trial_id: int) -> TrialRecord | None:
        """Return the trial, or ``None`` if there is none with this id."""
        with self._session("reading a trial", write=False) as session:
            row = session.get(TrialModel, trial_id)
            return None if row is None else _record(TrialRecord, row)

    def get_trial_by_number(self, run_id: int, number: int) -> TrialRecord | None:
        """Return trial ``number`` of a run, or ``None``."""
        with self._session("reading a trial", write=False) as session:
            row = session.scalars(
                select(TrialModel).where(TrialModel.run_id == run_id, TrialModel.number == number)
            ).first()
            return None if row is None else _record(TrialRecord, row)

    def list_trials(self, run_id: int) -> list[TrialRecord]:
        """Return a run's trials ordered by number (baseline first)."""
        with self._session("listing trials", write=False) as session:
            rows = session.scalars(
                select(TrialModel).where(TrialModel.run_id == run_id).order_by(TrialModel.number)
            )
            return [_record(TrialRecord, r) for r in rows]

    def unfinished_trials(self, run_id: int) -> list[TrialRecord]:
        """Return a run's ``pending`` or ``running`` trials ordered by number (what resume redoes)."""
        with self._session("listing unfinished trials", write=False) as session:
            rows = session.scalars(
                select(TrialModel)
                .where(TrialModel.run_id == run_id, TrialModel.status.in_(UNFINISHED_TRIAL_STATUSES))
                .order_by(TrialModel.number)
            )
            return [_record(TrialRecord, r) for r in rows]

    # -- measurements, gates, events ----------------------------------------------------------

    def add_measurements(
        self, trial_id: int, scenario: str, metrics: Mapping[str, float], repeat: int = 0
    ) -> list[MeasurementRecord]:
        """Store one scenario's metrics (one row per metric) for a trial and repeat."""
        with self._session("recording measurements") as session:
            _get(session, TrialModel, trial_id, "trial")
            rows = [
                MeasurementModel(
                    trial_id=trial_id, scenario=scenario, metric=k, value=float(v), repeat=repeat
                )
                for k, v in metrics.items()
            ]
            session.add_all(rows)
            session.flush()
            return [_record(MeasurementRecord, r) for r in rows]

    def measurements(self, trial_id: int) -> list[MeasurementRecord]:
        """Return a trial's measurements in the order they were recorded."""
        return self._of_trial(MeasurementModel, MeasurementRecord, trial_id, "reading measurements")

    def add_gate_result(
        self,
        trial_id: int,
        gate: str,
        status: str,
        reason: str,
        details: Mapping[str, Any] | None = None,
        duration_s: float | None = None,
    ) -> GateRecord:
        """Store one gate's outcome (``pass``, ``fail`` or ``drift``) for a trial."""
        _check(status, GATE_STATUSES, "gate status")
        with self._session("recording a gate result") as session:
            _get(session, TrialModel, trial_id, "trial")
            row = GateResultModel(
                trial_id=trial_id,
                gate=gate,
                status=status,
                reason=reason,
                details_json=_dumps(dict(details or {})),
                duration_s=duration_s,
                created_at=utcnow(),
            )
            session.add(row)
            session.flush()
            return _record(GateRecord, row)

    def gate_results(self, trial_id: int) -> list[GateRecord]:
        """Return a trial's gate results in the order they were recorded."""
        return self._of_trial(GateResultModel, GateRecord, trial_id, "reading gate results")

    def _of_trial(self, model: Any, kind: type[R], trial_id: int, action: str) -> list[R]:
        """A trial's rows of one table (measurements, gate results), as records, in the order recorded."""
        with self._session(action, write=False) as session:
            rows = session.scalars(select(model).where(model.trial_id == trial_id).order_by(model.id))
            return [_record(kind, r) for r in rows]

    def add_event(
        self,
        run_id: int | None,
        kind: str,
        message: str,
        data: Any = None,
        trial_id: int | None = None,
    ) -> EventRecord:
        """Append an event (also the audit log: ``gates.relock``, ``approve``, ``reject``, ``resume``).

        ``run_id`` may be ``None`` for audit entries outside any run (a relock from the CLI).
        """
        with self._session("recording an event") as session:
            if run_id is not None:
                _get(session, RunModel, run_id, "run")
            if trial_id is not None:
                _get(session, TrialModel, trial_id, "trial")
            row = EventModel(
                run_id=run_id,
                trial_id=trial_id,
                ts=utcnow(),
                kind=kind,
                message=message,
                data_json=None if data is None else _dumps(data),
            )
            session.add(row)
            session.flush()
            return _record(EventRecord, row)

    def events(self, run_id: int | None = None, kind: str | None = None, *,
               trial_id: int | None = None) -> list[EventRecord]:
        """Return events oldest first, optionally only one run's, one kind's and/or one trial's."""
        with self._session("reading events", write=False) as session:
            query = select(EventModel)
            if run_id is not None:
                query = query.where(EventModel.run_id == run_id)
            if kind is not None:
                query = query.where(EventModel.kind == kind)
            if trial_id is not None:
                query = query.where(EventModel.trial_id == trial_id)
            return [_record(EventRecord, r) for r in session.scalars(query.order_by(EventModel.id))]

    # -- run lease (policy in orchestrator/hosts/runlease.py) ------------------------------------------

    def claim_run(
        self, run_id: int, *, owner_host: str, owner_pid: int,
        check: Callable[[RunRecord, list[RunRecord]], None],
    ) -> RunRecord:
        """Take the run's lease in one write transaction.

        ``check(run, others)`` sees the run and every other run in status ``running`` and raises
        to refuse; the claim and the check are one transaction, so two processes claiming at once
        are serialised (SQLite: ``BEGIN IMMEDIATE``).
        """
        with self._session("claiming a run") as session:
            row = _get(session, RunModel, run_id, "run")
            others = session.scalars(select(RunModel).where(RunModel.status == "running", RunModel.id != run_id))
            check(_record(RunRecord, row), [_record(RunRecord, o) for o in others])
            now = utcnow()
            row.owner_host, row.owner_pid, row.heartbeat_at = owner_host, owner_pid, now
            row.status, row.updated_at = "running", now
            session.flush()
            return _record(RunRecord, row)

    def heartbeat(self, run_id: int, owner_pid: int) -> bool:
        """Renew the lease; ``False`` if this process no longer holds it."""
        with self._session("renewing a run lease") as session:
            res = session.execute(
                update(RunModel).where(RunModel.id == run_id, RunModel.owner_pid == owner_pid)
                .values(heartbeat_at=utcnow())
            )
            return bool(res.rowcount)

    def release_run(self, run_id: int, owner_pid: int) -> None:
        """Give the lease up (owner host and pid stay, for the record)."""
        with self._session("releasing a run lease") as session:
            session.execute(
                update(RunModel).where(RunModel.id == run_id, RunModel.owner_pid == owner_pid).values(heartbeat_at=None)
            )


# -- row -> record (only ever called inside a session scope) ----------------------------------


def _get(session: Session, model: type[Any], key: int, what: str) -> Any:
    row = session.get(model, key)
    if row is None:
        raise NotFound(f"no {what} with id {key}")
    return row


def _record(kind: type[R], row: Any) -> R:
    """The frozen record of an ORM row: each field is the row's column of that name, or its
    `<name>_json` column decoded (``knobs`` from ``knobs_json``)."""
    return kind(**{f.name: _loads(getattr(row, f"{f.name}_json")) if hasattr(row, f"{f.name}_json")
                   else getattr(row, f.name) for f in fields(kind)})
