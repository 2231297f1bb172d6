"""Requests refused before anything runs (one error line, an exit code, no run left behind), and runs
that fail end failed: no traceback, no phantom pending trial, no run stuck failing the same way.

The cheap ones drive the CLI in-process and never launch a server; the ones that need a real run use
the torch-free fake target (tests/fake_target.py) and are `slow`."""

import json
import sys

import pytest
from cli_workspace import cli, db_path, no_run_left, seed_run
from fake_target import write_fake_target

from orchestrator.core.exitcodes import EXIT_CODES
from orchestrator.store import Store


def test_goal_toml_typo_keys_are_refused_with_did_you_mean(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('text = "x"\n[[objectives]]\nmetric = "tpot"\nstats = "p99"\nvalue = 0.2\n'
                 '[[constraint]]\nkind = "accuracy"\n[budget]\ntrails = 3\n')
    r = cli(tmp_path, "goal", str(f))
    assert r.exit_code == 2
    for hint in ("did you mean 'stat'", "did you mean 'trials'", "did you mean 'constraints'"):
        assert hint in r.output
    no_run_left(tmp_path)


def test_negative_trials_and_zero_stall_are_refused(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('[[objectives]]\nmetric = "tpot"\nvalue = 0.2\n[budget]\ntrials = -3\nstall_trials = 0\n')
    r = cli(tmp_path, "goal", str(f))
    assert r.exit_code == 2 and "budget.trials" in r.output and "budget.stall_trials" in r.output
    no_run_left(tmp_path)


def test_bad_launch_template_is_bad_input_before_any_run(tmp_path):
    t = write_fake_target(tmp_path / "t.toml", extra_launch="{{ not_a_knob }}")
    r = cli(tmp_path, "goal", "--target", str(t), "beat the baseline by 20% on TPOT")
    assert r.exit_code == 2 and "not_a_knob" in r.output
    no_run_left(tmp_path)


@pytest.mark.slow
def test_failed_baseline_exits_nonzero_and_leaves_no_pending_trial(tmp_path, tiny_model):
    # The server crashes at launch (an unknown --fault makes argparse exit): the baseline fails.
    t = write_fake_target(tmp_path / "t.toml", extra_launch="--fault crash")
    r = cli(tmp_path, "-o", "gates.accuracy=false", "-o", "gates.integrity=false", "goal", "--target", str(t),
             "--no-report", "--json", "beat the baseline by 20% on TPOT within 5 trials")
    out = json.loads(r.stdout)
    assert r.exit_code == EXIT_CODES["failed"] == 4 and out["outcome"] == "failed"
    assert "baseline trial failed" in out["stop_reason"]
    store = Store(f"sqlite:///{db_path(tmp_path)}")
    run = store.get_run(out["run"])
    assert run.status == "failed" and run.heartbeat_at is None
    trials = store.list_trials(run.id)
    assert [(t.number, t.status) for t in trials] == [(0, "failed")], "no phantom pending trial"
    # The one-line summary is the error at the end of the log, not traceback frames.
    status = json.loads(cli(tmp_path, "status", "--json").stdout)[0]
    assert "invalid choice" in status["stop_reason"] and "\n" not in status["stop_reason"]


def test_zero_threshold_goal_is_an_error_not_a_traceback(tmp_path):
    r = cli(tmp_path, "goal", "get TTFT under 0 ms")
    assert r.exit_code == 2 and "must be positive" in r.output


def test_binary_goal_file_is_an_error_not_a_traceback(tmp_path):
    f = tmp_path / "g.toml"
    f.write_bytes(bytes(range(256)) * 4)
    r = cli(tmp_path, "goal", str(f))
    assert r.exit_code == 2 and "not a UTF-8 text file" in r.output


def test_db_not_a_url_is_an_error_not_a_traceback(tmp_path):
    r = cli(tmp_path, "--db", "notaurl", "status")
    assert r.exit_code == 2 and "not a database URL" in r.output


def test_postgres_url_without_psycopg_hints_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg -> ModuleNotFoundError
    r = cli(tmp_path, "--db", "postgresql+psycopg://u@127.0.0.1:1/db", "status")
    assert r.exit_code != 0 and "infergoal[postgres]" in r.output


@pytest.mark.parametrize("goal", ["improve throughput by 2x within 0 trials", "improve throughput by 2x within 0s"])
def test_zero_budget_is_refused(tmp_path, goal):
    r = cli(tmp_path, "goal", goal)
    assert r.exit_code == 2
    no_run_left(tmp_path)


@pytest.mark.parametrize("override", ["bench.scale=0", "bench.repeats=0", "bench.baseline_repeats=0", "bench.scale=nan"])
def test_zero_scale_or_repeats_is_refused_before_a_run(tmp_path, override):
    r = cli(tmp_path, "-o", override, "goal", "beat the baseline by 20% on TPOT")
    assert r.exit_code == 2 and override.split("=")[0] in r.output
    no_run_left(tmp_path)


def test_throughput_in_ms_is_refused(tmp_path):
    r = cli(tmp_path, "goal", "get throughput above 500 ms")
    assert r.exit_code == 2 and "measured in tok/s, not ms" in r.output


@pytest.mark.parametrize("goal", ["improve throughput by 2x within 10 trials and 3 trials",
                                  "improve throughput by 2x within 10 trials within 3 trials",
                                  "improve tpot by 20% and improve tpot by 30%"])
def test_second_clause_is_refused_not_silently_winning(tmp_path, goal):
    r = cli(tmp_path, "goal", goal)
    assert r.exit_code == 2 and ("twice" in r.output or "more than one" in r.output or "duplicate" in r.output)




def test_run_stuck_with_a_zero_scale_config_is_closed_by_resume(tmp_path):
    # A run row written before bench.scale was checked: resume refuses it once, clearly, and
    # marks it failed, instead of failing the same way forever.
    from orchestrator.targets import load_target

    target = load_target(write_fake_target(tmp_path / "t.toml")).model_dump(mode="json")
    store, run = seed_run(tmp_path, config={"bench": {"scale": 0}}, target=target)
    r = cli(tmp_path, "resume", str(run.id))
    assert r.exit_code == 2 and "stored config is no longer valid" in r.output and "greater than 0" in r.output
    assert store.get_run(run.id).status == "failed"
    r = cli(tmp_path, "resume", str(run.id))
    assert r.exit_code == 2 and "Traceback" not in r.output
