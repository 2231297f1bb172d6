"""A two-objective goal's Pareto front: one query (`audit.pareto`), shown in `trials`, its --json, the reports."""

import json
import xml.etree.ElementTree as ET

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config.goal import parse_goal
from orchestrator.report.html import build_html_data, write_html_report
from orchestrator.report.render import build_report_data, write_report
from orchestrator.review.pareto import front_of, non_dominated, run_front
from orchestrator.store import Store

GOAL = parse_goal("maximize throughput and minimize p90 TPOT within 10 trials")
TPUT, TPOT = "throughput:output_throughput", "decode:tpot_ms_p90"
SVG = "{http://www.w3.org/2000/svg}"
# number -> (status, proposer, throughput tok/s, p90 TPOT ms)
ROWS = {
    0: ("kept", "baseline", 100.0, 40.0),
    1: ("kept", "search", 180.0, 60.0),    # on the front: more throughput for more TPOT
    2: ("kept", "search", 120.0, 30.0),    # on the front: dominates the baseline
    3: ("kept", "search", 150.0, 70.0),    # dominated by #1
    4: ("discarded", "search", 110.0, 20.0),  # discarded by the keep rule, yet the lowest TPOT: on the front
    5: ("failed", "search", None, None),
    6: ("kept", "paired", 400.0, 5.0),     # a measurement of a trial, not a trial
    7: ("discarded", "search", 500.0, 1.0),  # screened out on a short bench (error set): not a full measurement
    8: ("discarded", "probe", 600.0, 1.0),   # a probe of the winner for the knowledge base
}
ERRORS = {7: "screened out at 1/8 of the bench: 0.40x, not promising"}


def seeded(tmp_path, goal=GOAL):
    store = Store(f"sqlite:///{tmp_path / '.infergoal' / 'infergoal.db'}")
    run = store.create_run("r", goal.text, goal.model_dump(mode="json"), goal.digest, {"name": "t"}, {}, "local", "search")
    for n, (status, who, tput, tpot) in ROWS.items():
        t = store.create_trial(run.id, n, commit="", knobs={"batch": n}, rationale=f"of #{n - 5}", proposer=who)
        obj = {TPUT: tput, TPOT: tpot} if tput else None
        store.finish_trial(t.id, status, score=1.0 if tput else None, objective=obj, timings={"total": 1.0},
                           error=ERRORS.get(n))
    store.set_run_status(run.id, "finished", "budget")
    return store, run.id


def test_non_dominated_on_mixed_directions():
    pts = [{"a": 1, "b": 5}, {"a": 2, "b": 6}, {"a": 2, "b": 4}, {"a": 2, "b": 4}, {"a": 0, "b": 9}]
    front = non_dominated(pts, {"a": "maximize", "b": "minimize"})
    assert front == [{"a": 2, "b": 4}, {"a": 2, "b": 4}]  # equal points both stay
    assert non_dominated(pts, {"a": "maximize", "b": "maximize"}) == [{"a": 2, "b": 6}, {"a": 0, "b": 9}]


def test_the_front_is_the_measured_trials_no_other_measured_trial_beats(tmp_path):
    store, rid = seeded(tmp_path)
    front = run_front(store, rid)
    assert [p["number"] for p in front.members] == [4, 2, 1]  # by the first objective (throughput)
    assert {p["number"] for p in front.points} == {0, 1, 2, 3, 4}  # not the failure, screen, probe, paired round
    assert front.to_dict()["front"] == [4, 2, 1] and front.to_dict()["objectives"][1]["direction"] == "minimize"
    assert front_of(store.list_trials(rid), GOAL.objectives).numbers == {1, 2, 4}


def test_a_goal_without_two_objectives_has_no_front(tmp_path):
    store, rid = seeded(tmp_path, parse_goal("improve throughput by 2x"))
    assert run_front(store, rid) is None
    assert build_report_data(store, rid).pareto is None


def test_trials_marks_the_front_and_its_json_says_it(tmp_path):
    seeded(tmp_path)
    r = CliRunner().invoke(app, ["-w", str(tmp_path), "trials"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    marked = [line.split("│")[1].strip() for line in r.output.splitlines() if "◆" in line and "│" in line]
    assert marked == ["1 ◆", "2 ◆", "4 ◆"]
    assert "on the Pareto front of highest throughput and lowest p90 TPOT (3 of 5 measured trials)" in r.output
    rows = json.loads(CliRunner().invoke(app, ["-w", str(tmp_path), "trials", "--json"]).output)
    assert [t["number"] for t in rows if t["on_front"]] == [1, 2, 4]


def test_the_reports_draw_the_front_as_a_line_through_its_members(tmp_path):
    store, rid = seeded(tmp_path)
    d = build_report_data(store, rid)
    assert d.pareto["front"] == [4, 2, 1] and [t["number"] for t in d.trials if t["on_front"]] == [1, 2, 4]
    md = write_report(store, rid, tmp_path / "out").read_text()
    assert "## Pareto front" in md and "3 of 5 measured trials are on the front" in md and "| 1 ◆ |" in md
    html = build_html_data(store, rid)["pareto"]
    assert html["goal"] and (html["x"], html["y"]) == (TPOT, TPUT)  # the latency across, throughput up
    svg = ET.fromstring(html["svg"])
    line = [g for g in svg.iter(f"{SVG}g") if (g.get("id") or "").startswith("pareto-front")]
    assert sum(len(list(g.iter(f"{SVG}use"))) for g in line) == 3  # the members marked on one line
    page = write_html_report(store, rid, tmp_path / "html").read_text()
    assert "Pareto front of the goal" in page and "#4 (20.0 ms, 110.0 tok/s), #2 (30.0 ms, 120.0 tok/s), #1 (60.0 ms, 180.0 tok/s)" in page


def test_trials_says_nothing_of_a_front_before_anything_is_measured(tmp_path):
    store = Store(f"sqlite:///{tmp_path / '.infergoal' / 'infergoal.db'}")
    run = store.create_run("r", GOAL.text, GOAL.model_dump(mode="json"), GOAL.digest, {"name": "t"}, {}, "local", "search")
    store.create_trial(run.id, 0, commit="", knobs={"batch": 0}, rationale="baseline", proposer="baseline")  # running
    r = CliRunner().invoke(app, ["-w", str(tmp_path), "trials"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "Pareto front" not in r.output and "◆" not in r.output
