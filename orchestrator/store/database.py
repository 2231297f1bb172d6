"""The store's database: the engine and its connections, the schema, and what a driver error means.

`Database(url)` opens any SQLAlchemy URL (SQLite tuned for one writer and many readers, or
PostgreSQL), creates or upgrades the tables in one locked transaction, refuses a schema newer than
this code (:class:`SchemaTooNew`), and hands out the one session scope the queries use
(:meth:`Database.session`): commit on success, roll back and explain on failure. The queries
themselves are :class:`orchestrator.store.store.Store`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, select, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from .tables import SCHEMA_VERSION, Base, SchemaVersionModel

__all__ = ["Database", "SchemaTooNew", "StoreError", "explain"]


class StoreError(RuntimeError):
    """A database operation failed; the message says what happened and what to do next."""


class SchemaTooNew(StoreError):
    """The database was written by a newer infergoal whose schema this version cannot read."""


def _lock_held(text: str) -> bool:
    """A driver message saying another connection holds a lock (SQLite's "database is locked", "busy")."""
    text = text.lower()
    return "locked" in text or "busy" in text


def _locked(exc: BaseException) -> bool:
    """A lock that another connection holds (worth waiting for), not any other failure."""
    return isinstance(exc, SQLAlchemyError) and _lock_held(str(getattr(exc, "orig", None) or exc))


def explain(exc: SQLAlchemyError, action: str, where: str) -> StoreError:
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


class Database:
    """One database: its engine, its schema checked (and created) on open, and the session scope.

    Args:
        url: SQLAlchemy URL; parent directories of a SQLite file are created.
        busy_timeout_s: How long a SQLite writer waits for another process's lock.
        read_only: Never create or write (reading an archive, or a live run's store).

    Raises:
        SchemaTooNew: The database was created by a newer infergoal.
        StoreError: The database cannot be opened.
    """

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0, read_only: bool = False) -> None:
        self._read_only = read_only
        self._engine = self._make_engine(make_url(url), busy_timeout_s, read_only)
        self.where = self._engine.url.render_as_string(hide_password=True)
        """The URL, password hidden: how messages name the database."""
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        try:
            self._open_schema(busy_timeout_s)
        except SQLAlchemyError as exc:
            self._engine.dispose()
            raise explain(exc, "opening the store", self.where) from exc
        except BaseException:
            self._engine.dispose()
            raise

    def close(self) -> None:
        """Release all connections."""
        self._engine.dispose()

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
            raise StoreError(f"{self.where} holds no infergoal store; check the path or --db")
        if has_version:
            # Checked before create_all: a newer schema may have renamed tables that we would
            # otherwise recreate in their old shape.
            with self._sessions() as session:
                found = session.scalar(select(SchemaVersionModel.version).where(SchemaVersionModel.id == 1))
            if found is not None and found > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"the database at {self.where} has schema version {found}, but this infergoal "
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
    def session(self, action: str, *, write: bool = True) -> Iterator[Session]:
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
            raise explain(exc, action, self.where) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()


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
