"""The CLI through typer's CliRunner: errors that say what to do, --json on data commands."""

import json

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.store import Store

runner = CliRunner()


def _invoke(ws, *args):
    return runner.invoke(app, ["-w", str(ws), *args])


def test_help_is_enough_to_start():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for cmd in ("goal", "resume", "status", "trials", "show", "report", "init", "approve", "bench", "model", "gates"):
        assert cmd in r.output
    r = runner.invoke(app, ["goal", "--help"])
    assert "beat the baseline by 20%" in r.output


def test_malformed_goal_is_refused_before_anything_runs(tmp_path):
    r = _invoke(tmp_path, "goal", "make it fast pls")
    assert r.exit_code == 2
    assert "could not understand" in r.output and "Accepted goal forms" in r.output
    assert not (tmp_path / ".infergoal").exists(), "nothing is created for a refused goal"


def test_probe_winner_is_documented_and_bounded(tmp_path):
    r = runner.invoke(app, ["goal", "--help"], env={"COLUMNS": "200"})
    assert "--probe-winner" in r.output and "one-knob neighbours" in r.output
    r = _invoke(tmp_path, "goal", "--probe-winner", "-1", "beat the baseline by 20% on TPOT")
    assert r.exit_code == 2 and "--probe-winner" in r.output
    assert not (tmp_path / ".infergoal").exists()
    r = _invoke(tmp_path, "-o", "probe_winner=500", "goal", "beat the baseline by 20% on TPOT")
    assert r.exit_code == 2 and "probe_winner" in r.output, r.output


def test_bad_override_and_missing_target(tmp_path):
    r = _invoke(tmp_path, "-o", "bench.scale", "status")
    assert r.exit_code == 2 and "key=value" in r.output
    r = _invoke(tmp_path, "goal", "--target", str(tmp_path / "nope.toml"), "beat the baseline by 20% on TPOT")
    assert r.exit_code == 2 and "does not exist" in r.output


def test_empty_workspace_commands(tmp_path):
    r = _invoke(tmp_path, "status")
    assert r.exit_code == 0 and "no runs yet" in r.output
    r = _invoke(tmp_path, "status", "--json")
    assert json.loads(r.output) == []
    for cmd in (["trials"], ["show", "0"], ["report"], ["resume"]):
        r = _invoke(tmp_path, *cmd)
        assert r.exit_code == 2, cmd
        assert "infergoal goal" in r.output, cmd
    assert not (tmp_path / ".infergoal").exists(), "refusals create nothing"


def _seed_run(tmp_path):
    from orchestrator.config.goal import parse_goal

    store = Store(f"sqlite:///{tmp_path / '.infergoal' / 'infergoal.db'}")
    g = parse_goal("beat the baseline by 20% on TPOT without accuracy loss")
    run = store.create_run("r", g.text, g.model_dump(mode="json"), g.digest, {"name": "t"}, {}, "local", "search")
    t0 = store.create_trial(run.id, 0, commit="", knobs={"batching": "off"}, rationale="baseline", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0, objective={"decode:tpot_ms_p50": 10.0}, timings={"total": 3.0})
    t1 = store.create_trial(run.id, 1, commit="", knobs={"batching": "on"}, rationale="tpe", proposer="search")
    store.add_gate_result(t1.id, "accuracy", "drift", "kl 0.01 above the drift line", {"kl": 0.01}, 0.5)
    store.add_measurements(t1.id, "decode", {"tpot_ms_p50": 5.0, "completed": 8})
    store.finish_trial(t1.id, "needs_approval", score=2.0, objective={"decode:tpot_ms_p50": 5.0}, timings={"total": 3.0})
    store.set_run_status(run.id, "stopped", "interrupted")
    return store, run.id


def test_review_commands_and_json(tmp_path):
    store, rid = _seed_run(tmp_path)
    r = _invoke(tmp_path, "trials", "--json")
    rows = json.loads(r.output)
    assert [t["number"] for t in rows] == [0, 1] and rows[1]["status"] == "needs_approval"
    r = _invoke(tmp_path, "show", "1", "--json")
    d = json.loads(r.output)
    assert d["gates"][0]["status"] == "drift" and d["measurements"][0]["metric"] in ("tpot_ms_p50", "completed")
    r = _invoke(tmp_path, "show", "1")
    assert "gate accuracy: drift" in r.output
    r = _invoke(tmp_path, "status", "--json")
    assert json.loads(r.output)[0]["status"] == "stopped"
    r = _invoke(tmp_path, "report", "--json")
    d = json.loads(r.output)
    assert d["report"].endswith("report.md") and d["objectives"][0]["label"] == "decode:tpot_ms_p50"


def test_approve_and_reject_are_audited(tmp_path):
    store, rid = _seed_run(tmp_path)
    r = _invoke(tmp_path, "approve", "0")
    assert r.exit_code == 2 and "not waiting for approval" in r.output
    r = _invoke(tmp_path, "approve", "1")
    assert r.exit_code == 0
    assert store.get_trial_by_number(rid, 1).status == "kept"
    assert store.get_run(rid).best_trial_id == store.get_trial_by_number(rid, 1).id
    assert [e.kind for e in store.events(rid, kind="approve")] == ["approve"]
    r = _invoke(tmp_path, "reject", "1")
    assert r.exit_code == 2


def test_init_writes_a_workspace(tmp_path):
    r = _invoke(tmp_path, "init", str(tmp_path / "ws"))
    assert r.exit_code == 0
    assert (tmp_path / "ws" / "infergoal.toml").is_file()
    assert (tmp_path / "ws" / "knowledge_base" / "contracts").is_dir()
    r = _invoke(tmp_path, "init", str(tmp_path / "ws"))
    assert r.exit_code == 2 and "already exists" in r.output


def test_gates_verify_passes_on_a_clean_tree(tmp_path):
    r = _invoke(tmp_path, "gates", "verify")
    assert r.exit_code == 0, r.output
