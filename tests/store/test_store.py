"""One store test case, run against every backend (see ``conftest.py``)."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

import orchestrator.store as store_pkg
from orchestrator.store import (
    DuplicateTrial,
    NotFound,
    RunRecord,
    SchemaTooNew,
    Store,
    StoreError,
    TrialRecord,
)
from orchestrator.store.database import Database, explain
from orchestrator.store.tables import SCHEMA_VERSION

if TYPE_CHECKING:
    from conftest import Backend  # tests/store/conftest.py; annotations only

REPO = Path(__file__).resolve().parents[2]


def make_run(store: Store, name: str = "run") -> RunRecord:
    return store.create_run(
        name=name,
        goal_text="/goal beat baseline by 20% on TTFT",
        goal_json={"objectives": [{"metric": "ttft_ms_p50", "improve": 0.2}]},
        goal_hash="abc123",
        target_json='{"name": "hfserve"}',
        config_json={"db": "sqlite"},
        host="local",
        proposer="search",
    )


def make_trial(store: Store, run_id: int, number: int, **kw: Any) -> TrialRecord:
    args: dict[str, Any] = {
        "commit": f"c{number}",
        "knobs": {"dtype": "bfloat16", "threads": number},
        "rationale": f"try {number}",
        "proposer": "search",
    }
    args.update(kw)
    return store.create_trial(run_id, number, **args)


class TestStore:
    # -- runs -------------------------------------------------------------------------------

    def test_create_and_get_run(self, store: Store) -> None:
        run = make_run(store)
        assert run.status == "running"
        assert run.goal == {"objectives": [{"metric": "ttft_ms_p50", "improve": 0.2}]}
        assert run.target == {"name": "hfserve"}  # JSON text in, decoded object out
        assert run.config == {"db": "sqlite"}
        assert run.stop_reason is None and run.best_trial_id is None
        assert run.created_at.tzinfo is not None
        assert store.get_run(run.id) == run
        got = store.get_run(run.id)
        assert got is not None and got.created_at.utcoffset() == timezone.utc.utcoffset(None)

    def test_the_target_keeps_its_knob_order(self, store: Store) -> None:
        # A knob's `when` names earlier knobs, and a resumed run proposes and probes in this order.
        knobs = {"zeta": {"type": "bool"}, "batching": {"type": "bool"}, "alpha": {"when": {"batching": True}}}
        run = store.create_run(name="r", goal_text="g", goal_json={}, goal_hash="h", target_json={"name": "t", "knobs": knobs},
                               config_json={}, host="local", proposer="search")
        assert list(store.get_run(run.id).target["knobs"]) == ["zeta", "batching", "alpha"]

    def test_long_proposer_and_host_fit_their_columns(self, store: Store) -> None:
        # A scripted proposer names its file: a deep workspace path overflowed VARCHAR(64) on PostgreSQL.
        long = "scripted:/tmp/pytest-of-root/pytest-99/" + "a-very-long-test-name/" * 4 + "steps.json"
        run = store.create_run(name="r", goal_text="g", goal_json={}, goal_hash="h", target_json={}, config_json={},
                               host="ssh://u@" + "h" * 300, proposer=long)
        assert len(run.proposer) == 64 and run.proposer.startswith("scripted:") and run.proposer.endswith("steps.json")
        assert len(run.host) == 255
        t = store.create_trial(run.id, 0, commit="c", knobs={}, rationale="", proposer=long)
        assert store.get_trial(t.id).proposer == run.proposer

    def test_missing_lookups_return_none(self, store: Store) -> None:
        assert store.get_run(999) is None
        assert store.latest_run() is None
        assert store.list_runs() == []
        assert store.get_trial(999) is None
        run = make_run(store)
        assert store.get_trial_by_number(run.id, 0) is None
        assert store.list_trials(run.id) == []

    def test_latest_and_list_runs(self, store: Store) -> None:
        runs = [make_run(store, f"r{i}") for i in range(3)]
        assert store.latest_run() == runs[-1]
        assert [r.name for r in store.list_runs()] == ["r0", "r1", "r2"]

    def test_set_run_status(self, store: Store) -> None:
        run = make_run(store)
        done = store.set_run_status(run.id, "finished", stop_reason="goal met")
        assert (done.status, done.stop_reason) == ("finished", "goal met")
        assert done.updated_at >= run.updated_at
        again = store.set_run_status(run.id, "failed")
        assert (again.status, again.stop_reason) == ("failed", "goal met")
        with pytest.raises(ValueError, match="run status"):
            store.set_run_status(run.id, "exploded")
        with pytest.raises(NotFound):
            store.set_run_status(999, "stopped")

    def test_set_best_trial(self, store: Store) -> None:
        run, other = make_run(store), make_run(store, "other")
        t = make_trial(store, run.id, 0)
        foreign = make_trial(store, other.id, 0)
        assert store.set_best_trial(run.id, t.id).best_trial_id == t.id
        assert store.get_run(run.id).best_trial_id == t.id  # type: ignore[union-attr]
        with pytest.raises(ValueError, match="belongs to run"):
            store.set_best_trial(run.id, foreign.id)
        with pytest.raises(NotFound):
            store.set_best_trial(run.id, 999)

    # -- trials -----------------------------------------------------------------------------

    def test_create_trial(self, store: Store) -> None:
        run = make_run(store)
        t = make_trial(store, run.id, 0, prediction="1.0x", optuna_trial_number=7)
        assert t.status == "pending" and t.number == 0 and t.run_id == run.id
        assert t.knobs == {"dtype": "bfloat16", "threads": 0}
        assert (t.prediction, t.optuna_trial_number) == ("1.0x", 7)
        assert t.started_at is None and t.score is None and t.timings is None
        assert store.get_trial(t.id) == t
        assert store.get_trial_by_number(run.id, 0) == t

    def test_duplicate_trial_number_rejected(self, store: Store) -> None:
        run, other = make_run(store), make_run(store, "other")
        make_trial(store, run.id, 3)
        with pytest.raises(DuplicateTrial, match="trial number 3"):
            make_trial(store, run.id, 3)
        assert issubclass(DuplicateTrial, StoreError)
        assert len(store.list_trials(run.id)) == 1
        make_trial(store, other.id, 3)  # numbers are per run
        make_trial(store, run.id, 4)  # the store still works after the refusal
        with pytest.raises(NotFound):
            make_trial(store, 999, 0)

    def test_trial_lifecycle(self, store: Store) -> None:
        run = make_run(store)
        t = make_trial(store, run.id, 0)
        started = store.start_trial(t.id, "python server.py --port 8000", "/tmp/t0.log")
        assert started.status == "running" and started.started_at is not None
        assert (started.launch_cmd, started.log_path) == ("python server.py --port 8000", "/tmp/t0.log")
        timings = {"deploy": 1.5, "gates": 2.0, "bench": 10.0, "record": 0.1, "total": 13.6}
        done = store.finish_trial(
            t.id, "needs_approval", score=1.25, objective={"ttft_ms_p50": 12.5}, timings=timings
        )
        assert (done.status, done.score, done.error) == ("needs_approval", 1.25, None)
        assert done.objective == {"ttft_ms_p50": 12.5} and done.timings == timings
        assert done.finished_at is not None and done.finished_at >= done.started_at  # type: ignore[operator]
        assert store.set_trial_status(t.id, "kept").status == "kept"
        assert store.get_trial(t.id).status == "kept"  # type: ignore[union-attr]

        failed = store.finish_trial(make_trial(store, run.id, 1).id, "failed", error="server died")
        assert (failed.status, failed.error, failed.score) == ("failed", "server died", None)

        with pytest.raises(ValueError, match="final status"):
            store.finish_trial(t.id, "running")
        with pytest.raises(ValueError, match="trial status"):
            store.set_trial_status(t.id, "great")
        with pytest.raises(NotFound):
            store.start_trial(999, "x", None)

    def test_list_trials_ordered_by_number(self, store: Store) -> None:
        run = make_run(store)
        for n in (2, 0, 10, 1):
            make_trial(store, run.id, n)
        assert [t.number for t in store.list_trials(run.id)] == [0, 1, 2, 10]

    def test_unfinished_trials(self, store: Store) -> None:
        run = make_run(store)
        done, running, pending = (make_trial(store, run.id, n) for n in (0, 1, 2))
        store.start_trial(running.id, "cmd", None)
        store.finish_trial(done.id, "kept", score=1.0)
        assert [t.number for t in store.unfinished_trials(run.id)] == [1, 2]
        assert [t.status for t in store.unfinished_trials(run.id)] == ["running", "pending"]
        assert store.unfinished_trials(make_run(store).id) == []

    def test_reset_trial(self, store: Store) -> None:
        run = make_run(store)
        t = make_trial(store, run.id, 0, prediction="faster")
        store.start_trial(t.id, "cmd", "/tmp/log")
        store.add_measurements(t.id, "decode", {"tpot_ms_p50": 5.0})
        store.add_gate_result(t.id, "integrity", "pass", "ok", {}, 0.1)
        event = store.add_event(run.id, "resume", "re-running #0", trial_id=t.id)
        reset = store.reset_trial(t.id)
        assert reset == dataclasses.replace(t)  # back to exactly the freshly created trial
        assert store.measurements(t.id) == [] and store.gate_results(t.id) == []
        assert store.events(run.id) == [event]  # the audit trail stays
        store.finish_trial(t.id, "kept", score=1.0)
        with pytest.raises(ValueError, match="already finished"):
            store.reset_trial(t.id)
        with pytest.raises(NotFound):
            store.reset_trial(999)

    # -- measurements, gates, events --------------------------------------------------------

    def test_measurements(self, store: Store) -> None:
        run = make_run(store)
        t = make_trial(store, run.id, 0)
        added = store.add_measurements(t.id, "decode", {"tpot_ms_p50": 5.0, "completed": 32})
        store.add_measurements(t.id, "decode", {"tpot_ms_p50": 5.5}, repeat=1)
        got = store.measurements(t.id)
        assert got[:2] == added
        assert [(m.scenario, m.metric, m.value, m.repeat) for m in got] == [
            ("decode", "tpot_ms_p50", 5.0, 0),
            ("decode", "completed", 32.0, 0),
            ("decode", "tpot_ms_p50", 5.5, 1),
        ]
        assert isinstance(got[1].value, float)
        assert store.measurements(make_trial(store, run.id, 1).id) == []
        with pytest.raises(NotFound):
            store.add_measurements(999, "decode", {"x": 1.0})

    def test_gate_results(self, store: Store) -> None:
        t = make_trial(store, make_run(store).id, 0)
        g = store.add_gate_result(t.id, "integrity", "pass", "all probes ok", {"probes": 6}, 0.5)
        store.add_gate_result(t.id, "accuracy", "drift", "kl above warn", {"kl": 0.02}, 3.0)
        got = store.gate_results(t.id)
        assert got[0] == g and g.details == {"probes": 6} and g.duration_s == 0.5
        assert [(r.gate, r.status) for r in got] == [("integrity", "pass"), ("accuracy", "drift")]
        assert got[0].created_at.tzinfo is not None
        with pytest.raises(ValueError, match="gate status"):
            store.add_gate_result(t.id, "accuracy", "ok", "", {}, 0.0)

    def test_events(self, store: Store) -> None:
        run, other = make_run(store), make_run(store, "other")
        t = make_trial(store, run.id, 0)
        e1 = store.add_event(run.id, "trial.start", "trial 0 started", trial_id=t.id)
        store.add_event(run.id, "approve", "approved by alice", {"who": "alice"}, trial_id=t.id)
        store.add_event(other.id, "resume", "resumed")
        relock = store.add_event(None, "gates.relock", "relocked by bob", {"files": ["a.py"]})
        assert e1.trial_id == t.id and e1.data is None and e1.ts.tzinfo is not None
        assert relock.run_id is None and relock.data == {"files": ["a.py"]}
        assert [e.kind for e in store.events()] == ["trial.start", "approve", "resume", "gates.relock"]
        assert [e.kind for e in store.events(run_id=run.id)] == ["trial.start", "approve"]
        assert [e.message for e in store.events(kind="approve")] == ["approved by alice"]
        assert store.events(run_id=other.id, kind="approve") == []
        assert [e.kind for e in store.events(run.id, trial_id=t.id)] == ["trial.start", "approve"]
        assert [e.kind for e in store.events(run.id, kind="approve", trial_id=t.id)] == ["approve"]
        assert store.events(other.id, trial_id=t.id) == []
        with pytest.raises(NotFound):
            store.add_event(999, "x", "y")
        with pytest.raises(NotFound):
            store.add_event(run.id, "x", "y", trial_id=999)

    # -- records ----------------------------------------------------------------------------

    def test_records_are_frozen_snapshots(self, store: Store) -> None:
        run = make_run(store)
        t = make_trial(store, run.id, 0)
        records = [
            run,
            t,
            store.add_measurements(t.id, "prefill", {"ttft_ms_p50": 1.0})[0],
            store.add_gate_result(t.id, "integrity", "pass", "ok", {}, 0.1),
            store.add_event(run.id, "note", "hello"),
        ]
        for record in records:
            assert dataclasses.is_dataclass(record)
            with pytest.raises(dataclasses.FrozenInstanceError):
                record.id = 42  # type: ignore[misc]
        store.set_run_status(run.id, "stopped")
        store.start_trial(t.id, "cmd", None)
        assert (run.status, t.status) == ("running", "pending")  # earlier snapshots unchanged

    # -- opening, persistence, failure ------------------------------------------------------

    def test_reopen_persists(self, backend: Backend) -> None:
        if not backend.persistent:
            pytest.skip("an in-memory database does not outlive its store")
        first = backend.open()
        run = make_run(first)
        t = make_trial(first, run.id, 0)
        first.add_event(run.id, "resume", "x")
        first.close()
        second = backend.open()
        assert second.get_run(run.id) == run
        assert second.list_trials(run.id) == [t]
        with pytest.raises(DuplicateTrial):
            make_trial(second, run.id, 0)

    def test_newer_schema_refused(self, backend: Backend) -> None:
        if not backend.persistent:
            pytest.skip("an in-memory database cannot be reopened")
        backend.open().close()
        engine = create_engine(backend.url)
        with engine.begin() as conn:
            conn.execute(text("UPDATE schema_version SET version = :v"), {"v": SCHEMA_VERSION + 1})
        engine.dispose()
        with pytest.raises(SchemaTooNew, match=rf"schema version {SCHEMA_VERSION + 1}.*upgrade infergoal"):
            Store(backend.url)

    def test_concurrent_writers(self, backend: Backend) -> None:
        if not backend.persistent:
            pytest.skip("one in-memory connection is not shared between threads")
        a, b = backend.open(), backend.open()
        run = make_run(a)
        outcomes: list[str] = []

        def claim(store: Store, numbers: range) -> None:
            # Both writers race for the same numbers: each must go to exactly one of them.
            for n in numbers:
                try:
                    make_trial(store, run.id, n)
                    outcomes.append("created")
                except DuplicateTrial:
                    outcomes.append("duplicate")

        threads = [threading.Thread(target=claim, args=(s, range(15))) for s in (a, b)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(outcomes) == ["created"] * 15 + ["duplicate"] * 15
        assert [t.number for t in a.list_trials(run.id)] == list(range(15))

    def test_processes_opening_a_fresh_database_at_once_all_succeed(self, backend: Backend, tmp_path: Path) -> None:
        # A run creating its store while `infergoal status` (or a second run) opens it: CI saw
        # "database is locked" from CREATE TABLE, raised at once instead of waiting its turn.
        if not backend.persistent:
            pytest.skip("an in-memory database is not shared between processes")
        go = tmp_path / "go"
        script = (
            "import pathlib, sys, time\n"
            "from orchestrator.store import Store\n"
            "go = pathlib.Path(sys.argv[2])\n"
            "while not go.exists(): time.sleep(0.001)\n"
            "s = Store(sys.argv[1])\n"
            "s.list_runs()\n"
            "s.close()\n"
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        procs = [subprocess.Popen([sys.executable, "-c", script, backend.url, str(go)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(8)]
        try:
            time.sleep(3.0)  # every process imported sqlalchemy and is polling for `go`
            go.touch()
            results = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                p.kill()
        failed = [err.decode()[-2000:] for p, (_, err) in zip(procs, results, strict=True) if p.returncode != 0]
        assert not failed, failed
        with backend.open() as store:
            assert store.list_runs() == []

    def test_kill_9_loses_nothing_returned(self, backend: Backend) -> None:
        if not backend.persistent:
            pytest.skip("an in-memory database dies with its process")
        backend.open().close()  # create the schema up front
        script = (
            "import os, signal, sys\n"
            "from orchestrator.store import Store\n"
            "s = Store(sys.argv[1])\n"
            "r = s.create_run('k', 'g', {}, 'h', {}, {}, 'local', 'search')\n"
            "t = s.create_trial(r.id, 0, commit='c', knobs={}, rationale='', proposer='search')\n"
            "s.finish_trial(t.id, 'kept', score=1.5)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n"
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-c", script, backend.url], env=env, capture_output=True)
        assert proc.returncode == -9, proc.stderr.decode()
        reopened = backend.open()
        run = reopened.latest_run()
        assert run is not None and run.name == "k"
        trial = reopened.get_trial_by_number(run.id, 0)
        assert trial is not None and (trial.status, trial.score) == ("kept", 1.5)


# -- backend-specific behaviour ---------------------------------------------------------------


def test_sqlite_file_creates_parent_dirs(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c.db"
    with Store(f"sqlite:///{path}") as store:
        make_run(store)
    assert path.is_file()


def test_sqlite_memory_shared_across_calls() -> None:
    with Store("sqlite://") as store:
        run = make_run(store)
        assert store.get_run(run.id) == run
    # A second memory store is a separate, empty database.
    with Store("sqlite://") as fresh:
        assert fresh.list_runs() == []


def test_sqlite_locked_database_explains(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    with Store(f"sqlite:///{path}", busy_timeout_s=0.2) as store:
        run = make_run(store)
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            with pytest.raises(StoreError, match="(?s)locked.*retry"):
                store.set_run_status(run.id, "stopped")
            assert store.get_run(run.id).status == "running"  # type: ignore[union-attr]  # reads still work
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert store.set_run_status(run.id, "stopped").status == "stopped"


def test_sqlite_open_waits_out_a_lock_that_skips_the_busy_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite answers "locked" at once, without its busy handler, where waiting could deadlock (several connections
    turning one fresh file into WAL): opening the store retries that until the busy timeout, each time on a new
    connection; any other error is raised at once, and a lock that outlasts the timeout is explained."""
    real = Database._init_schema
    calls: list[float] = []

    def flaky(self: Database, fail: int, err: str) -> None:
        calls.append(time.monotonic())
        if len(calls) <= fail:
            raise OperationalError("CREATE TABLE runs", {}, sqlite3.OperationalError(err))
        real(self)

    monkeypatch.setattr(Database, "_init_schema", lambda self: flaky(self, 2, "database is locked"))
    with Store(f"sqlite:///{tmp_path / 'a.db'}", busy_timeout_s=5) as store:
        assert store.list_runs() == [] and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(Database, "_init_schema", lambda self: flaky(self, 99, "no such table: runs"))
    with pytest.raises(StoreError, match="no such table"):
        Store(f"sqlite:///{tmp_path / 'b.db'}", busy_timeout_s=5)
    assert len(calls) == 1  # not a lock: no retry
    calls.clear()
    monkeypatch.setattr(Database, "_init_schema", lambda self: flaky(self, 10**6, "database is locked"))
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="(?s)locked.*busy timeout"):
        Store(f"sqlite:///{tmp_path / 'c.db'}", busy_timeout_s=0.4)
    assert 0.3 < time.monotonic() - t0 < 3 and len(calls) > 2  # retried until the timeout, then given up


@pytest.mark.parametrize(
    ("driver_message", "advice"),
    [
        ("database or disk is full", "free space"),
        ("database is locked", "wait for it"),
        ("attempt to write a readonly database", "permissions"),
        ('connection failed: connection to server at "127.0.0.1", port 1 failed', "server is running"),
    ],
)
def test_errors_say_what_to_do(driver_message: str, advice: str) -> None:
    exc = OperationalError("INSERT ...", {}, Exception(driver_message))
    err = explain(exc, "recording an event", "sqlite:///x.db")
    assert isinstance(err, StoreError)
    assert "recording an event failed on sqlite:///x.db" in str(err)
    assert driver_message in str(err) and advice in str(err)


def test_unreachable_postgres_raises_store_error() -> None:
    with pytest.raises(StoreError, match="server is running"):
        Store("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2")


def test_public_names() -> None:
    assert sorted(store_pkg.__all__) == sorted(
        [
            "DuplicateTrial",
            "EventRecord",
            "GATE_STATUSES",
            "GateRecord",
            "GateStatus",
            "MeasurementRecord",
            "NotFound",
            "RUN_STATUSES",
            "RunRecord",
            "RunStatus",
            "SchemaTooNew",
            "Store",
            "StoreError",
            "TRIAL_STATUSES",
            "TrialRecord",
            "TrialStatus",
            "UNFINISHED_TRIAL_STATUSES",
        ]
    )
    for name in store_pkg.__all__:
        assert hasattr(store_pkg, name)
