"""The run's Optuna study lives beside the store: optuna-dashboard reads it with no export step."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from orchestrator.remote.procs import free_port
from orchestrator.review import save_study, study_name, study_storage_url
from orchestrator.review.study import StudyError


def test_storage_url_sits_next_to_the_store():
    assert study_storage_url("sqlite:////data/x/infergoal.db") == "sqlite:////data/x/infergoal.optuna.db"
    pg = study_storage_url("postgresql+psycopg://u:secret@db:5432/infergoal")
    assert pg.startswith("postgresql+psycopg://u:secret@db:5432/infergoal?") and "search_path%3Doptuna" in pg
    with pytest.raises(StudyError, match="in-memory"):
        study_storage_url("sqlite://")


def test_study_holds_every_scored_and_failed_trial(finished_run):
    _, store, rid = finished_run
    url = save_study(store, rid)
    study = optuna.load_study(study_name=study_name(rid), storage=url)
    by_number = {t.user_attrs["infergoal_number"]: t for t in study.trials}
    assert sorted(by_number) == [0, 1, 2, 3, 4, 5, 6, 7, 9]  # the confirm relaunch (#8) repeats #7
    assert by_number[7].value == 2.0 and by_number[7].params == {"tpot_ms": 4.0}
    assert by_number[1].state == optuna.trial.TrialState.FAIL and "ServerCrashed" in by_number[1].user_attrs["error"]
    assert study.best_trial.user_attrs["infergoal_number"] == 7
    # rewriting is idempotent, and a study someone else keeps live under the name is left alone
    save_study(store, rid)
    assert len(optuna.load_study(study_name=study_name(rid), storage=url).trials) == 9
    optuna.delete_study(study_name=study_name(rid), storage=url)
    live = optuna.create_study(study_name=study_name(rid), storage=url)
    live.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.5))
    save_study(store, rid)
    assert [t.value for t in optuna.load_study(study_name=study_name(rid), storage=url).trials] == [0.5]


def _free_port() -> int:
    return free_port()  # never one this process handed out before


@pytest.mark.slow  # starts a server
def test_optuna_dashboard_reads_the_finished_run(finished_run):
    _, store, rid = finished_run
    url = save_study(store, rid)
    port = _free_port()
    dash = Path(sys.executable).with_name("optuna-dashboard")
    proc = subprocess.Popen([str(dash), url, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    summaries = json.load(r)["study_summaries"]
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.3)
        mine = next(s for s in summaries if s["study_name"] == study_name(rid))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{mine['study_id']}?after=0", timeout=10) as r:
            detail = json.load(r)
        states = [t["state"] for t in detail["trials"]]
        assert states.count("Complete") == 6 and states.count("Fail") == 3  # #1 crashed, #4 and #5 invalid
        best = max((t for t in detail["trials"] if t["state"] == "Complete"), key=lambda t: t["values"][0])
        assert best["values"] == [2.0] and best["params"][0]["param_external_value"] == "4.0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.postgres
def test_postgres_keeps_the_study_in_the_same_database_in_its_own_schema(tmp_path):
    import os

    from review_runs import build_run
    from sqlalchemy import create_engine, inspect, text

    from orchestrator.store import Store
    from orchestrator.store.tables import Base

    url = os.environ.get("INFERGOAL_TEST_PG_URL")
    if not url:
        pytest.skip("INFERGOAL_TEST_PG_URL not set (.ci/start_postgres.sh starts a PostgreSQL)")
    engine = create_engine(url)
    with engine.begin() as conn:  # start empty: the database outlives tests
        conn.execute(text("DROP SCHEMA IF EXISTS optuna CASCADE"))
        Base.metadata.drop_all(conn)
    store = Store(url)
    try:
        rid = build_run(store, tmp_path)
        storage = save_study(store, rid, url)
        study = optuna.load_study(study_name=study_name(rid), storage=storage)
        assert len(study.trials) == 9 and study.best_value == 2.0
        assert len(store.list_trials(rid)) == 10, "the store's own trials table is untouched"
        insp = inspect(engine)
        assert "trials" in insp.get_table_names(schema="optuna") and "studies" in insp.get_table_names(schema="optuna")
        assert "studies" not in insp.get_table_names()  # nothing of Optuna's in the store's schema
    finally:
        store.close()
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA IF EXISTS optuna CASCADE"))
            Base.metadata.drop_all(conn)
        engine.dispose()


def test_a_conditional_space_keeps_every_trial_with_only_its_active_knobs(tmp_path):
    # The H200 run (benchmarks/gpu/results/h200_cond_run.db): the batch size exists only with
    # batching on, the SDPA backend only for the fast engine. Trials carry only their active knobs;
    # the study used to drop every trial that lacked one of the space's knobs (9 of 11).
    import shutil

    from orchestrator.store import Store

    db = tmp_path / "h200.db"
    shutil.copy(Path(__file__).resolve().parents[2] / "benchmarks/gpu/results/h200_cond_run.db", db)
    store = Store(f"sqlite:///{db}")
    rid = store.list_runs()[0].id
    url = save_study(store, rid)
    study = optuna.load_study(study_name=study_name(rid), storage=url)
    by_number = {t.user_attrs["infergoal_number"]: t for t in study.trials}
    assert sorted(by_number) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 11, 12]  # 5 and 10 are baseline sentinels
    assert by_number[0].params == {"engine": "hf-generate", "batching": "off"}
    assert by_number[11].params == {"engine": "hf-manual", "batching": "on", "max_batch_size": 24}
    assert by_number[4].state == optuna.trial.TrialState.FAIL and "accuracy" in by_number[4].user_attrs["error"]
    assert study.best_trial.user_attrs["infergoal_number"] == 11
