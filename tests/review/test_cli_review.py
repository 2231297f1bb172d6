"""The review commands through typer's CliRunner, and once as a real subprocess."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from orchestrator.cli import app

runner = CliRunner()


def _run(root, *args):
    return runner.invoke(app, ["-w", str(root), *args])


def test_why_lineage_trials_and_log(finished_run):
    root, _, _ = finished_run
    r = _run(root, "why", "3", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["decided_by"] == "threshold"
    r = _run(root, "why")
    assert r.exit_code == 0 and "GoalMet" in r.stdout and "9 of 12 trials +1 measurement" in r.stdout
    r = _run(root, "lineage", "8", "--json")
    assert [s["number"] for s in json.loads(r.stdout)] == [8, 7, 2, 0]
    r = _run(root, "trials", "--status", "kept", "--where", "score>1.2", "--sort", "score", "--desc", "--json")
    assert [t["number"] for t in json.loads(r.stdout)] == [7, 8, 2]
    r = _run(root, "approve", "6")
    assert r.exit_code == 0
    r = _run(root, "log", "--json")
    assert [(a["kind"], a["message"]) for a in json.loads(r.stdout)] == [("approve", "trial #6 kept by " + json.loads(r.stdout)[0]["who"])]


def test_bad_input_is_one_error_line(finished_run):
    root, _, _ = finished_run
    for args, msg in ((["why", "42"], "no trial #42"), (["trials", "--where", "speed>3"], "unknown metric 'speed'"),
                      (["trials", "--status", "won"], "unknown status won"), (["lineage", "42", "--run", "9"], "no run 9 in this workspace; its runs are 1")):
        r = _run(root, *args)
        assert r.exit_code == 2 and msg in r.stderr and "Traceback" not in r.output, (args, r.output)


def test_export_study_and_html_report(finished_run):
    root, _, rid = finished_run
    r = _run(root, "export", "--json")
    manifest = json.loads(r.stdout)
    assert r.exit_code == 0 and set(manifest["files"]) == {"run.json", "trials.csv", "measurements.csv", "gates.csv", "events.csv"}
    assert (root / ".infergoal" / "runs" / str(rid) / "export" / "trial-7" / "repeat-0" / "decode.vllm.json").is_file()
    r = _run(root, "study", "--json")
    assert json.loads(r.stdout)["storage"].endswith("infergoal.optuna.db")
    r = _run(root, "report", "--html")
    assert r.exit_code == 0 and r.stdout.strip().endswith("report.html")
    out = root / ".infergoal" / "runs" / str(rid) / "report"
    assert (out / "report.md").is_file() and "<svg" in (out / "report.html").read_text()


def test_why_as_a_real_subprocess(finished_run):
    root, _, _ = finished_run
    p = subprocess.run([sys.executable, "-m", "orchestrator.cli", "-w", str(root), "why", "4"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "decided by gate:integrity" in p.stdout and "no_cache" in p.stdout


def test_floors_are_recorded_for_the_report(finished_run, tmp_path):
    root, store, rid = finished_run
    sol = tmp_path / "sol.json"
    sol.write_text(json.dumps({"ceilings": {}, "floors": {"decode_tpot_ms": 1.02}}))
    r = _run(root, "floors", str(sol))
    assert r.exit_code == 0 and "floors recorded (decode_tpot_ms)" in r.stdout
    assert store.events(rid, kind="speed_of_light")[-1].data["floors"] == {"decode_tpot_ms": 1.02}
    (tmp_path / "bad.json").write_text("{}")
    r = _run(root, "floors", str(tmp_path / "bad.json"))
    assert r.exit_code == 2 and "no `floors` object" in r.stderr
