"""A workspace driven through the CLI in-process (typer's CliRunner), and runs seeded straight into its store."""

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config.goal import parse_goal
from orchestrator.store import Store

runner = CliRunner()


def cli(ws, *args):
    """`infergoal -w ws ARGS` in-process; never a traceback, never an exception other than its exit."""
    r = runner.invoke(app, ["-w", str(ws), *args])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def db_path(ws) -> Path:
    """The workspace's SQLite store."""
    return Path(ws) / ".infergoal" / "infergoal.db"


def no_run_left(ws) -> None:
    """A refused request created no run."""
    if db_path(ws).exists():
        assert Store(f"sqlite:///{db_path(ws)}").list_runs() == [], "a refused request must leave no run behind"


def seed_run(ws, *, owner_pid=None, heartbeat_age_s=0.0, host="local", config=None, target=None):
    g = parse_goal("beat the baseline by 20% on TPOT within 3 trials")
    store = Store(f"sqlite:///{db_path(ws)}")
    run = store.create_run("r", g.text, g.model_dump(mode="json"), g.digest, target or {"name": "t"}, config or {}, host, "search")
    if owner_pid is not None:
        store.claim_run(run.id, owner_host=os.uname().nodename, owner_pid=owner_pid, check=lambda r, o: None)
        if heartbeat_age_s:
            from sqlalchemy import update

            from orchestrator.store.tables import RunModel

            with store._session("test: age the heartbeat") as s:  # noqa: SLF001 - test-only clock shift
                s.execute(update(RunModel).where(RunModel.id == run.id).values(
                    heartbeat_at=datetime.now(timezone.utc) - timedelta(seconds=heartbeat_age_s)))
    return store, store.get_run(run.id)


def dead_pid() -> int:
    """The pid of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


