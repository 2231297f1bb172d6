"""A run nobody can corrupt by accident: one test per defect, named after it.

The cheap ones drive the CLI in-process (typer's CliRunner) and never launch a server; the
ones that need a real run use the torch-free fake target (tests/fake_target.py) and are `slow`.
"""

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fake_target import write_fake_target
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config.goal import parse_goal
from orchestrator.core.exitcodes import EXIT_CODES
from orchestrator.core.oneline import last_meaningful_line, summarize_failure
from orchestrator.hosts.runlease import Lease, LeaseHeld, display_status, is_live
from orchestrator.report import write_report
from orchestrator.store import Store

runner = CliRunner()


def _cli(ws, *args):
    r = runner.invoke(app, ["-w", str(ws), *args])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def _db(ws) -> Path:
    return Path(ws) / ".infergoal" / "infergoal.db"


def _no_run_left(ws) -> None:
    if _db(ws).exists():
        assert Store(f"sqlite:///{_db(ws)}").list_runs() == [], "a refused request must leave no run behind"


def _seed(ws, *, owner_pid=None, heartbeat_age_s=0.0, host="local", config=None, target=None):
    g = parse_goal("beat the baseline by 20% on TPOT within 3 trials")
    store = Store(f"sqlite:///{_db(ws)}")
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


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# --- 1. live-run safety ----------------------------------------------------------------------

def test_defect1_resume_of_a_live_run_is_refused_and_names_its_owner(tmp_path):
    store, run = _seed(tmp_path, owner_pid=os.getppid())  # a live process on this host
    assert is_live(run)
    r = _cli(tmp_path, "resume", str(run.id), "--json")
    assert r.exit_code == EXIT_CODES["busy"] == 5
    assert f"pid {os.getppid()}" in r.output and "is live" in r.output
    assert json.loads(r.stdout)["outcome"] == "busy"
    assert store.events(run.id, kind="resume") == [], "a refused resume does nothing to the run"


def test_defect1_status_shows_a_killed_run_as_interrupted(tmp_path):
    _, dead = _seed(tmp_path, owner_pid=_dead_pid())
    _, stale = _seed(tmp_path, owner_pid=os.getppid(), heartbeat_age_s=3600)  # hung, or its host is gone
    _, live = _seed(tmp_path, owner_pid=os.getppid())
    rows = {r["id"]: r for r in json.loads(_cli(tmp_path, "status", "--json").stdout)}
    assert rows[dead.id]["status"] == rows[stale.id]["status"] == "interrupted"
    assert rows[live.id]["status"] == "running"
    assert display_status(dead) == "interrupted"


def test_defect1_two_runs_cannot_share_a_host_unless_opted_in(tmp_path):
    store, live = _seed(tmp_path, owner_pid=os.getppid())
    _, other = _seed(tmp_path)
    with pytest.raises(LeaseHeld, match=f"run {live.id} is live on this host"):
        with Lease(store, other.id):
            pass
    with Lease(store, other.id, allow_concurrent=True):  # a pool: explicit opt-in
        assert store.get_run(other.id).owner_pid == os.getpid()
    assert store.get_run(other.id).heartbeat_at is None, "the lease is released on exit"
    # Through the CLI: refused before a run row exists, with the opt-in named.
    before = len(store.list_runs())
    r = _cli(tmp_path, "goal", "beat the baseline by 20% on TPOT within 3 trials")
    assert r.exit_code == 5 and "allow_concurrent_runs" in r.output
    assert len(store.list_runs()) == before


def test_defect1_lease_heartbeat_keeps_a_run_live(tmp_path):
    store, run = _seed(tmp_path)
    with Lease(store, run.id, interval_s=0.05) as lease:
        first = store.get_run(run.id).heartbeat_at
        import time

        time.sleep(0.3)
        assert store.get_run(run.id).heartbeat_at > first and not lease.lost
        assert is_live(store.get_run(run.id))
    assert not is_live(store.get_run(run.id))


# --- 2. goal TOML typos ----------------------------------------------------------------------

def test_defect2_goal_toml_typo_keys_are_refused_with_did_you_mean(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('text = "x"\n[[objectives]]\nmetric = "tpot"\nstats = "p99"\nvalue = 0.2\n'
                 '[[constraint]]\nkind = "accuracy"\n[budget]\ntrails = 3\n')
    r = _cli(tmp_path, "goal", str(f))
    assert r.exit_code == 2
    for hint in ("did you mean 'stat'", "did you mean 'trials'", "did you mean 'constraints'"):
        assert hint in r.output
    _no_run_left(tmp_path)


def test_defect2_negative_trials_and_zero_stall_are_refused(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('[[objectives]]\nmetric = "tpot"\nvalue = 0.2\n[budget]\ntrials = -3\nstall_trials = 0\n')
    r = _cli(tmp_path, "goal", str(f))
    assert r.exit_code == 2 and "budget.trials" in r.output and "budget.stall_trials" in r.output
    _no_run_left(tmp_path)


# --- 3. failed runs exit 0, phantom pending trial --------------------------------------------

def test_defect3_bad_launch_template_is_bad_input_before_any_run(tmp_path):
    t = write_fake_target(tmp_path / "t.toml", extra_launch="{{ not_a_knob }}")
    r = _cli(tmp_path, "goal", "--target", str(t), "beat the baseline by 20% on TPOT")
    assert r.exit_code == 2 and "not_a_knob" in r.output
    _no_run_left(tmp_path)


@pytest.mark.slow
def test_defect3_failed_baseline_exits_nonzero_and_leaves_no_pending_trial(tmp_path, tiny_model):
    # The server crashes at launch (an unknown --fault makes argparse exit): the baseline fails.
    t = write_fake_target(tmp_path / "t.toml", extra_launch="--fault crash")
    r = _cli(tmp_path, "-o", "gates.accuracy=false", "-o", "gates.integrity=false", "goal", "--target", str(t),
             "--no-report", "--json", "beat the baseline by 20% on TPOT within 5 trials")
    out = json.loads(r.stdout)
    assert r.exit_code == EXIT_CODES["failed"] == 4 and out["outcome"] == "failed"
    assert "baseline trial failed" in out["stop_reason"]
    store = Store(f"sqlite:///{_db(tmp_path)}")
    run = store.get_run(out["run"])
    assert run.status == "failed" and run.heartbeat_at is None
    trials = store.list_trials(run.id)
    assert [(t.number, t.status) for t in trials] == [(0, "failed")], "no phantom pending trial"
    # The one-line summary is the error at the end of the log, not traceback frames.
    status = json.loads(_cli(tmp_path, "status", "--json").stdout)[0]
    assert "invalid choice" in status["stop_reason"] and "\n" not in status["stop_reason"]


# --- 4. tracebacks instead of errors ---------------------------------------------------------

def test_defect4_zero_threshold_goal_is_an_error_not_a_traceback(tmp_path):
    r = _cli(tmp_path, "goal", "get TTFT under 0 ms")
    assert r.exit_code == 2 and "must be positive" in r.output


def test_defect4_binary_goal_file_is_an_error_not_a_traceback(tmp_path):
    f = tmp_path / "g.toml"
    f.write_bytes(bytes(range(256)) * 4)
    r = _cli(tmp_path, "goal", str(f))
    assert r.exit_code == 2 and "not a UTF-8 text file" in r.output


def test_defect4_db_not_a_url_is_an_error_not_a_traceback(tmp_path):
    r = _cli(tmp_path, "--db", "notaurl", "status")
    assert r.exit_code == 2 and "not a database URL" in r.output


def test_defect4_postgres_url_without_psycopg_hints_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg -> ModuleNotFoundError
    r = _cli(tmp_path, "--db", "postgresql+psycopg://u@127.0.0.1:1/db", "status")
    assert r.exit_code != 0 and "infergoal[postgres]" in r.output


def test_defect4_status_in_an_empty_read_only_folder_is_not_an_error(tmp_path):
    r = _ro_cli(tmp_path, "status")
    assert r.returncode == 0 and "no runs yet" in r.stdout, r.stderr
    assert not (tmp_path / ".infergoal").exists()


# --- 5. late failures and stuck state --------------------------------------------------------

@pytest.mark.parametrize("goal", ["improve throughput by 2x within 0 trials", "improve throughput by 2x within 0s"])
def test_defect5_zero_budget_is_refused(tmp_path, goal):
    r = _cli(tmp_path, "goal", goal)
    assert r.exit_code == 2
    _no_run_left(tmp_path)


@pytest.mark.parametrize("override", ["bench.scale=0", "bench.repeats=0", "bench.baseline_repeats=0", "bench.scale=nan"])
def test_defect5_zero_scale_or_repeats_is_refused_before_a_run(tmp_path, override):
    r = _cli(tmp_path, "-o", override, "goal", "beat the baseline by 20% on TPOT")
    assert r.exit_code == 2 and override.split("=")[0] in r.output
    _no_run_left(tmp_path)


def test_defect5_throughput_in_ms_is_refused(tmp_path):
    r = _cli(tmp_path, "goal", "get throughput above 500 ms")
    assert r.exit_code == 2 and "measured in tok/s, not ms" in r.output


@pytest.mark.parametrize("goal", ["improve throughput by 2x within 10 trials and 3 trials",
                                  "improve throughput by 2x within 10 trials within 3 trials",
                                  "improve tpot by 20% and improve tpot by 30%"])
def test_defect5_second_clause_is_refused_not_silently_winning(tmp_path, goal):
    r = _cli(tmp_path, "goal", goal)
    assert r.exit_code == 2 and ("twice" in r.output or "more than one" in r.output or "duplicate" in r.output)


# --- 6. auditing from read-only media --------------------------------------------------------

def _ro_cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the CLI with `folder` bind-mounted read-only (a user+mount namespace; nothing outside changes)."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1)")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip("user namespaces are not available here")
    cmd = (f'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}" && '
           f'exec "{sys.executable}" -m orchestrator.cli -w "{folder}" "$@"')
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run(["unshare", "-rm", "sh", "-c", cmd, "sh", *args], capture_output=True, text=True, env=env)


def test_defect6_archived_workspace_on_a_read_only_mount_can_be_audited(tmp_path):
    store, run = _seed(tmp_path)
    t0 = store.create_trial(run.id, 0, commit="", knobs={"k": 1}, rationale="baseline", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0, objective={"decode:tpot_ms_p50": 10.0}, timings={"total": 1.0})
    store.close()
    before = sorted(p.name for p in _db(tmp_path).parent.iterdir())
    assert _ro_cli(tmp_path, "status").returncode == 0
    r = _ro_cli(tmp_path, "trials", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["status"] == "kept", r.stderr
    assert _ro_cli(tmp_path, "show", "0").returncode == 0
    for cmd in (["why", "0"], ["log"]):  # the audit commands read, never write (cli/review.py opens read-only)
        r = _ro_cli(tmp_path, *cmd, "--json")
        assert r.returncode == 0 and json.loads(r.stdout) is not None, (cmd, r.stderr)
    out = tmp_path.parent / f"{tmp_path.name}-report"
    r = _ro_cli(tmp_path, "report", "--out", str(out))
    assert r.returncode == 0 and (out / "report.md").is_file(), r.stderr
    r = _ro_cli(tmp_path, "report")  # the default folder is on the read-only mount: one clear line
    assert r.returncode == 4 and "pass --out" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in _db(tmp_path).parent.iterdir()) == before


# --- 7. failure summaries and report tables --------------------------------------------------

LOG_ERROR = """ServerCrashed: server exited before it became healthy; last log lines:
Traceback (most recent call last):
  File "/srv/server.py", line 12, in <module>
    main()
  File "/srv/server.py", line 9, in main
    raise ValueError("bad dtype 'float8'\\nuse float32 | bfloat16")
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ValueError: bad dtype 'float8' | use float32 or bfloat16
"""


def test_defect7_failure_summary_is_the_last_meaningful_line():
    assert last_meaningful_line(LOG_ERROR) == "ValueError: bad dtype 'float8' | use float32 or bfloat16"
    s = summarize_failure(LOG_ERROR)
    assert s.startswith("ServerCrashed: server exited") and s.endswith("use float32 or bfloat16") and "\n" not in s


def test_defect7_multiline_error_does_not_break_the_report_table(tmp_path):
    store, run = _seed(tmp_path)
    t0 = store.create_trial(run.id, 0, commit="", knobs={"k": "a|b"}, rationale="baseline", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0, objective={"decode:tpot_ms_p50": 10.0}, timings={"total": 1.0})
    t1 = store.create_trial(run.id, 1, commit="", knobs={"k": "c|d"}, rationale="x", proposer="search")
    store.finish_trial(t1.id, "failed", error=LOG_ERROR, timings={"total": 1.0})
    md = write_report(store, run.id, tmp_path / "rep").read_text()
    section = md.split("## Trials", 1)[1].split("\n## ", 1)[0]
    table = [ln for ln in section.splitlines() if ln.startswith("|")]  # the budget line precedes it
    header_cells = table[0].count("|") - table[0].count("\\|")
    assert len(table) == 4, table  # header, rule, two rows: the error stayed on one line
    for row in table[2:]:
        assert row.count("|") - row.count("\\|") == header_cells, row
    assert "ValueError: bad dtype" in table[3] and "Traceback" not in table[3]


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


def test_defect5_run_stuck_with_a_zero_scale_config_is_closed_by_resume(tmp_path):
    # A run row written before bench.scale was checked: resume refuses it once, clearly, and
    # marks it failed, instead of failing the same way forever.
    from orchestrator.targets import load_target

    target = load_target(write_fake_target(tmp_path / "t.toml")).model_dump(mode="json")
    store, run = _seed(tmp_path, config={"bench": {"scale": 0}}, target=target)
    r = _cli(tmp_path, "resume", str(run.id))
    assert r.exit_code == 2 and "stored config is no longer valid" in r.output and "greater than 0" in r.output
    assert store.get_run(run.id).status == "failed"
    r = _cli(tmp_path, "resume", str(run.id))
    assert r.exit_code == 2 and "Traceback" not in r.output
