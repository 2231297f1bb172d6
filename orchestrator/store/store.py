"""The SQL store: runs, trials, measurements, gate results and events.

Contract (what callers may rely on, on every backend):

* ``Store(url)`` takes any SQLAlchemy URL. SQLite (file or ``sqlite://`` memory) and PostgreSQL
  (``postgresql+psycopg://...``) are tested. Tables are created on open; a database written by a
  newer schema is refused with :class:`SchemaTooNew`.
* Every write method is one transaction, committed before it returns: once a call has returned,
  a ``kill -9`` of the process loses nothing it wrote.
* Every method returns frozen records (:mod:`orchestrator.store.records`) or lists of them.
  ORM rows never leave the session scope.
* Lookups by id (``get_run``, ``get_trial``, ``get_trial_by_number``) return ``None`` when
  nothing matches; writes that name a missing run or trial raise :class:`NotFound`.
* Trial numbers are unique per run: :meth:`Store.create_trial` raises :class:`DuplicateTrial`
  for a taken number (resume relies on it).
* Invalid status values raise ``ValueError``; database failures (locked, disk full, server
  gone) raise :class:`StoreError` whose message says what to do next.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, delete, event, inspect, select, text, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

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
from .tables import (
    SCHEMA_VERSION,
    Base,
    EventModel,
    GateResultModel,
    MeasurementModel,
    RunModel,
    SchemaVersionModel,
    TrialModel,
    utcnow,
)

__all__ = ["DuplicateTrial", "NotFound", "SchemaTooNew", "Store", "StoreError"]


class StoreError(RuntimeError):
    """A database operation failed; the message says what happened and what to do next."""


class NotFound(StoreError, KeyError):
    """A write named a run or trial that does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DuplicateTrial(StoreError):
    """A trial with this number already exists in the run."""


class SchemaTooNew(StoreError):
    """The database was written by a newer infergoal whose schema this version cannot read."""


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


def _lock_held(text: str) -> bool:
    """A driver message saying another connection holds a lock (SQLite's "database is locked", "busy")."""
    text = text.lower()
    return "locked" in text or "busy" in text


def _locked(exc: BaseException) -> bool:
    """A lock that another connection holds (worth waiting for), not any other failure."""
    return isinstance(exc, SQLAlchemyError) and _lock_held(str(getattr(exc, "orig", None) or exc))


def _explain(exc: SQLAlchemyError, action: str, where: str) -> StoreError:
    """Turn a driver error into a StoreError that tells the user what to do next."""
    cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    text = cause.lower()
    if _lock_held(text):
        hint = (
            "another process held the SQLite write lock past the busy timeout; wait for it "
            "(another infergoal run on the same database?) and retry, or use PostgreSQL for concurrent runs"
        )
    elif "full" in text or "no space" in text:
        hint = (
            "the disk holding the database is full; free space (or point --db elsewhere) and "
            "retry — everything recorded before this call is safe"
        )
    elif "readonly" in text or "read-only" in text or "permission" in text:
        hint = "the database is not writable; fix the permissions of the file and its directory"
    elif "unable to open" in text:
        hint = "check that the database path exists and its directory is writable"
    elif "connect" in text or "connection" in text or "server closed" in text:
        hint = "check that the database server is running and that the URL (host, port, user) is right"
    else:
        hint = "check the database URL and that the database is reachable, then retry"
    return StoreError(f"{action} failed on {where}: {cause}. {hint}")


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
        parsed = make_url(url)
        self._read_only = read_only
        self._engine = self._make_engine(parsed, busy_timeout_s, read_only)
        self._where = self._engine.url.render_as_string(hide_password=True)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        try:
            self._open_schema(busy_timeout_s)
        except SQLAlchemyError as exc:
            self._engine.dispose()
            raise _explain(exc, "opening the store", self._where) from exc
        except BaseException:
            self._engine.dispose()
            raise

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._where

    def close(self) -> None:
        """Release all connections. The store must not be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self._where!r})"

    @staticmethod
    def _make_engine(url: URL, busy_timeout_s: float, read_only: bool = False) -> Engine:
        if url.get_backend_name() != "sqlite":
            # pre_ping: a long run outlives server-side idle timeouts between trials.
            return create_engine(url, pool_pre_ping=True)
        database = url.database or ""
        memory = database in ("", ":memory:") or "mode=memory" in database
        if memory:
            # One connection for the whole store, or every call would see a fresh empty DB.
            engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
        elif read_only:
            # Auditing an archive: never create, never write; `immutable` also works on a
            # read-only mount where SQLite could not create the WAL's shared-memory file.
            path = Path(database).expanduser().resolve()
            engine = create_engine("sqlite://", creator=_read_only_sqlite(path, busy_timeout_s))
        else:
            if not database.startswith("file:"):
                path = Path(database).expanduser()
                path.parent.mkdir(parents=True, exist_ok=True)
                url = url.set(database=str(path))
            engine = create_engine(url, connect_args={"timeout": busy_timeout_s})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let us issue BEGIN ourselves (below); pysqlite's implicit BEGIN is deferred,
            # which lets two writers deadlock instead of waiting on the busy timeout.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            if not memory and not read_only:
                # WAL: readers (reports, `infergoal show`) never block the running loop's writes.
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Writers take the lock up front so they queue on busy_timeout instead of failing
            # at their first write after a read.
            immediate = conn.get_execution_options().get("infergoal_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    def _open_schema(self, busy_timeout_s: float) -> None:
        """`_init_schema`, retried while SQLite answers "locked" or "busy", up to the busy timeout.

        SQLite skips its busy handler where waiting could deadlock: connections that each hold a
        shared lock and want the exclusive one, as when several turn one fresh file into WAL at once
        (CI saw 1 of 8 processes opening a new database fail in 0.5 s). Each attempt runs the whole
        open again (create_all and the version stamp are idempotent; a connection whose set-up
        failed is discarded by the pool); any other error is raised at once."""
        if self._engine.dialect.name != "sqlite":
            self._init_schema()
            return
        for attempt in Retrying(retry=retry_if_exception(_locked), stop=stop_after_delay(busy_timeout_s),
                                wait=wait_random_exponential(multiplier=0.02, max=0.25), reraise=True):
            with attempt:
                self._init_schema()

    def _init_schema(self) -> None:
        with self._engine.connect() as conn:
            has_version = inspect(conn).has_table(SchemaVersionModel.__tablename__)
        if self._read_only and not has_version:
            raise StoreError(f"{self._where} holds no infergoal store; check the path or --db")
        if has_version:
            # Checked before create_all: a newer schema may have renamed tables that we would
            # otherwise recreate in their old shape.
            with self._sessions() as session:
                found = session.scalar(select(SchemaVersionModel.version).where(SchemaVersionModel.id == 1))
            if found is not None and found > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"the database at {self._where} has schema version {found}, but this infergoal "
                    f"understands up to version {SCHEMA_VERSION}; upgrade infergoal "
                    "(pip install -U infergoal) or point --db at another database"
                )
        if self._read_only:
            return
        # One write transaction, one process at a time: a run creating its store while `infergoal
        # status` opens it, or two runs sharing a PostgreSQL database, must not both create tables
        # or both stamp the version. SQLite: BEGIN IMMEDIATE takes the write lock before
        # create_all reads the catalogue (in a deferred transaction the later upgrade deadlocks,
        # and SQLite answers "database is locked" at once, without waiting on the busy timeout).
        # PostgreSQL: a transaction-scoped advisory lock; its DDL is transactional.
        with self._writer() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY})
            Base.metadata.create_all(conn)
            _add_missing_columns(conn)
            stamped = conn.scalar(select(SchemaVersionModel.version).where(SchemaVersionModel.id == 1))
            if stamped is None:
                conn.execute(SchemaVersionModel.__table__.insert().values(id=1, version=SCHEMA_VERSION))

    @contextmanager
    def _writer(self) -> Iterator[Connection]:
        """A connection in a write transaction, committed on success."""
        with self._engine.connect() as conn:
            conn.execution_options(infergoal_write=True)
            with conn.begin():
                yield conn

    @contextmanager
    def _session(self, action: str, *, write: bool = True) -> Iterator[Session]:
        """The one session scope: commit on success, roll back and explain on failure."""
        session = self._sessions()
        try:
            if write:
                session.connection(execution_options={"infergoal_write": True})
            yield session
            session.commit()
        except StoreError:
            session.rollback()
            raise
        except SQLAlchemyError as exc:
            session.rollback()
            raise _explain(exc, action, self._where) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

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
            return _run_record(row)

    def get_run(self, run_id: int) -> RunRecord | None:
        """Return the run, or ``None`` if there is none with this id."""
        with self._session("reading a run", write=False) as session:
            row = session.get(RunModel, run_id)
            return None if row is None else _run_record(row)

    def latest_run(self) -> RunRecord | None:
        """Return the most recently created run, or ``None`` if there are none."""
        with self._session("reading the latest run", write=False) as session:
            row = session.scalars(select(RunModel).order_by(RunModel.id.desc()).limit(1)).first()
            return None if row is None else _run_record(row)

    def list_runs(self) -> list[RunRecord]:
        """Return all runs, oldest first."""
        with self._session("listing runs", write=False) as session:
            return [_run_record(r) for r in session.scalars(select(RunModel).order_by(RunModel.id))]

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
            return _run_record(row)

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
            return _run_record(row)

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
            return _trial_record(row)

    def start_trial(self, trial_id: int, launch_cmd: str, log_path: str | None) -> TrialRecord:
        """Mark a trial ``running``, with the launch command and server log path."""
        with self._session("starting a trial") as session:
            row = _get(session, TrialModel, trial_id, "trial")
            row.status = "running"
            row.launch_cmd = launch_cmd
            row.log_path = None if log_path is None else str(log_path)
            row.started_at = utcnow()
            session.flush()
            return _trial_record(row)

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
            return _trial_record(row)

    def set_trial_status(self, trial_id: int, status: str) -> TrialRecord:
        """Change only a trial's status (approve / reject of a ``needs_approval`` trial)."""
        _check(status, TRIAL_STATUSES, "trial status")
        with self._session("updating a trial's status") as session:
            row = _get(session, TrialModel, trial_id, "trial")
            row.status = status
            session.flush()
            return _trial_record(row)

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
            return _trial_record(row)

    def get_trial(self, trial_id: int) -> TrialRecord | None:
        """Return the trial, or ``None`` if there is none with this id."""
        with self._session("reading a trial", write=False) as session:
            row = session.get(TrialModel, trial_id)
            return None if row is None else _trial_record(row)

    def get_trial_by_number(self, run_id: int, number: int) -> TrialRecord | None:
        """Return trial ``number`` of a run, or ``None``."""
        with self._session("reading a trial", write=False) as session:
            row = session.scalars(
                select(TrialModel).where(TrialModel.run_id == run_id, TrialModel.number == number)
            ).first()
            return None if row is None else _trial_record(row)

    def list_trials(self, run_id: int) -> list[TrialRecord]:
        """Return a run's trials ordered by number (baseline first)."""
        with self._session("listing trials", write=False) as session:
            rows = session.scalars(
                select(TrialModel).where(TrialModel.run_id == run_id).order_by(TrialModel.number)
            )
            return [_trial_record(r) for r in rows]

    def unfinished_trials(self, run_id: int) -> list[TrialRecord]:
        """Return a run's ``pending`` or ``running`` trials ordered by number (what resume redoes)."""
        with self._session("listing unfinished trials", write=False) as session:
            rows = session.scalars(
                select(TrialModel)
                .where(TrialModel.run_id == run_id, TrialModel.status.in_(UNFINISHED_TRIAL_STATUSES))
                .order_by(TrialModel.number)
            )
            return [_trial_record(r) for r in rows]

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
            return [_measurement_record(r) for r in rows]

    def measurements(self, trial_id: int) -> list[MeasurementRecord]:
        """Return a trial's measurements in the order they were recorded."""
        with self._session("reading measurements", write=False) as session:
            rows = session.scalars(
                select(MeasurementModel)
                .where(MeasurementModel.trial_id == trial_id)
                .order_by(MeasurementModel.id)
            )
            return [_measurement_record(r) for r in rows]

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
            return _gate_record(row)

    def gate_results(self, trial_id: int) -> list[GateRecord]:
        """Return a trial's gate results in the order they were recorded."""
        with self._session("reading gate results", write=False) as session:
            rows = session.scalars(
                select(GateResultModel)
                .where(GateResultModel.trial_id == trial_id)
                .order_by(GateResultModel.id)
            )
            return [_gate_record(r) for r in rows]

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
            return _event_record(row)

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
            return [_event_record(r) for r in session.scalars(query.order_by(EventModel.id))]

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
            check(_run_record(row), [_run_record(o) for o in others])
            now = utcnow()
            row.owner_host, row.owner_pid, row.heartbeat_at = owner_host, owner_pid, now
            row.status, row.updated_at = "running", now
            session.flush()
            return _run_record(row)

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


def _read_only_sqlite(path: Path, timeout_s: float) -> Callable[[], Any]:
    """Connect to a SQLite file without ever writing: `mode=ro` (sees a live run's WAL), and on
    media where even that fails (a read-only mount without the WAL's shared-memory file),
    `immutable=1`."""
    import sqlite3

    def connect() -> Any:
        if not path.is_file():
            raise sqlite3.OperationalError(f"unable to open database file {path} (it does not exist)")
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout_s, check_same_thread=False)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError:
            return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, timeout=timeout_s, check_same_thread=False)

    return connect


_SCHEMA_LOCK_KEY = 0x1F6E_60A1  # pg_advisory_xact_lock key: "infergoal schema"


def _add_missing_columns(conn: Connection) -> None:
    """Add nullable columns that newer code declares to tables an older version created."""
    insp = inspect(conn)
    for table in Base.metadata.sorted_tables:
        if not insp.has_table(table.name):
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        for col in table.columns:
            if col.name not in have and col.nullable:
                kind = col.type.compile(dialect=conn.dialect)
                conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}'))


# -- row -> record (only ever called inside a session scope) ----------------------------------


def _get(session: Session, model: type[Any], key: int, what: str) -> Any:
    row = session.get(model, key)
    if row is None:
        raise NotFound(f"no {what} with id {key}")
    return row


def _run_record(row: RunModel) -> RunRecord:
    return RunRecord(
        id=row.id,
        name=row.name,
        created_at=row.created_at,
        updated_at=row.updated_at,
        status=row.status,
        goal_text=row.goal_text,
        goal=_loads(row.goal_json),
        goal_hash=row.goal_hash,
        target=_loads(row.target_json),
        config=_loads(row.config_json),
        host=row.host,
        proposer=row.proposer,
        stop_reason=row.stop_reason,
        best_trial_id=row.best_trial_id,
        owner_host=row.owner_host,
        owner_pid=row.owner_pid,
        heartbeat_at=row.heartbeat_at,
    )


def _trial_record(row: TrialModel) -> TrialRecord:
    return TrialRecord(
        id=row.id,
        run_id=row.run_id,
        number=row.number,
        status=row.status,
        commit=row.commit,
        knobs=_loads(row.knobs_json),
        rationale=row.rationale,
        prediction=row.prediction,
        proposer=row.proposer,
        launch_cmd=row.launch_cmd,
        score=row.score,
        objective=_loads(row.objective_json),
        error=row.error,
        started_at=row.started_at,
        finished_at=row.finished_at,
        timings=_loads(row.timings_json),
        log_path=row.log_path,
        optuna_trial_number=row.optuna_trial_number,
    )


def _measurement_record(row: MeasurementModel) -> MeasurementRecord:
    return MeasurementRecord(
        id=row.id,
        trial_id=row.trial_id,
        scenario=row.scenario,
        metric=row.metric,
        value=row.value,
        repeat=row.repeat,
    )


def _gate_record(row: GateResultModel) -> GateRecord:
    return GateRecord(
        id=row.id,
        trial_id=row.trial_id,
        gate=row.gate,
        status=row.status,
        reason=row.reason,
        details=_loads(row.details_json),
        duration_s=row.duration_s,
        created_at=row.created_at,
    )


def _event_record(row: EventModel) -> EventRecord:
    return EventRecord(
        id=row.id,
        run_id=row.run_id,
        trial_id=row.trial_id,
        ts=row.ts,
        kind=row.kind,
        message=row.message,
        data=_loads(row.data_json),
    )
