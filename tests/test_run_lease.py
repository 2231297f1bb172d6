"""The run lease: a live run is never taken over, a killed one reads as interrupted, one live run per host
unless opted in, and a store made before the lease columns gets them."""

import json
import os

import pytest
from cli_workspace import cli, dead_pid, seed_run

from orchestrator.config.goal import parse_goal
from orchestrator.core.exitcodes import EXIT_CODES
from orchestrator.hosts.runlease import Lease, LeaseHeld, display_status, is_live
from orchestrator.store import Store


def test_resume_of_a_live_run_is_refused_and_names_its_owner(tmp_path):
    store, run = seed_run(tmp_path, owner_pid=os.getppid())  # a live process on this host
    assert is_live(run)
    r = cli(tmp_path, "resume", str(run.id), "--json")
    assert r.exit_code == EXIT_CODES["busy"] == 5
    assert f"pid {os.getppid()}" in r.output and "is live" in r.output
    assert json.loads(r.stdout)["outcome"] == "busy"
    assert store.events(run.id, kind="resume") == [], "a refused resume does nothing to the run"


def test_status_shows_a_killed_run_as_interrupted(tmp_path):
    _, dead = seed_run(tmp_path, owner_pid=dead_pid())
    _, stale = seed_run(tmp_path, owner_pid=os.getppid(), heartbeat_age_s=3600)  # hung, or its host is gone
    _, live = seed_run(tmp_path, owner_pid=os.getppid())
    rows = {r["id"]: r for r in json.loads(cli(tmp_path, "status", "--json").stdout)}
    assert rows[dead.id]["status"] == rows[stale.id]["status"] == "interrupted"
    assert rows[live.id]["status"] == "running"
    assert display_status(dead) == "interrupted"


def test_two_runs_cannot_share_a_host_unless_opted_in(tmp_path):
    store, live = seed_run(tmp_path, owner_pid=os.getppid())
    _, other = seed_run(tmp_path)
    with pytest.raises(LeaseHeld, match=f"run {live.id} is live on this host"):
        with Lease(store, other.id):
            pass
    with Lease(store, other.id, allow_concurrent=True):  # a pool: explicit opt-in
        assert store.get_run(other.id).owner_pid == os.getpid()
    assert store.get_run(other.id).heartbeat_at is None, "the lease is released on exit"
    # Through the CLI: refused before a run row exists, with the opt-in named.
    before = len(store.list_runs())
    r = cli(tmp_path, "goal", "beat the baseline by 20% on TPOT within 3 trials")
    assert r.exit_code == 5 and "allow_concurrent_runs" in r.output
    assert len(store.list_runs()) == before


def test_lease_heartbeat_keeps_a_run_live(tmp_path):
    store, run = seed_run(tmp_path)
    with Lease(store, run.id, interval_s=0.05) as lease:
        first = store.get_run(run.id).heartbeat_at
        import time

        time.sleep(0.3)
        assert store.get_run(run.id).heartbeat_at > first and not lease.lost
        assert is_live(store.get_run(run.id))
    assert not is_live(store.get_run(run.id))




def test_lease_columns_are_added_to_a_database_made_before_them(tmp_path):
    import sqlite3

    db = tmp_path / "old.db"
    Store(f"sqlite:///{db}").close()
    con = sqlite3.connect(db)
    for col in ("owner_host", "owner_pid", "heartbeat_at"):
        con.execute(f"ALTER TABLE runs DROP COLUMN {col}")
    con.commit()
    con.close()
    store = Store(f"sqlite:///{db}")
    _, run = _seed_in(store)
    assert run.owner_pid is None and display_status(run) == "interrupted"


def _seed_in(store):
    g = parse_goal("improve throughput by 2x")
    run = store.create_run("r", g.text, g.model_dump(mode="json"), g.digest, {"name": "t"}, {}, "local", "search")
    return store, run
