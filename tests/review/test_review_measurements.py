"""Measurements are not trials; `why` is prose and a table; knobs as key=value.

The run is review_runs.py's ROWS run plus a sentinel (#10) and one paired round of #7 (#11, #12):
9 trials of a 12-trial budget, and 4 measurements (#8's legacy confirm among them).
"""

import io
import json
import re
from types import SimpleNamespace

import pytest
import typer
from review_runs import add_measurements, build_run
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.cli.common import STATE
from orchestrator.cli.live import finish
from orchestrator.cli.shell import Shell
from orchestrator.config.workspace import Workspace
from orchestrator.review.why import explain_run
from orchestrator.store import Store

runner = CliRunner()
LINE = "9 of 12 trials +4 measurements"
STOP = "GoalMet: #7 meets every objective, confirmed by a clean relaunch (#8)"


@pytest.fixture
def measured(finished_run):
    root, store, rid = finished_run
    add_measurements(store, rid)
    return root, store, rid


def _run(root, *args):
    r = runner.invoke(app, ["-w", str(root), *args])
    assert r.exit_code == 0, r.stdout
    return r.stdout


def _flat(text):
    """Table text with its borders and line breaks gone: what a wrapped cell says, joined again."""
    return " ".join(re.sub(r"[│┃┏┓┗┛┡┩└┘━─┳┻╇┼┬┴]", " ", text).split())


def _rows(text):
    """A rich table's body as logical rows of cells, wrapped cells joined again (a row starts
    where its first cell has text)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
    return rows


def _shell(root):
    out = io.StringIO()
    sh = Shell(Workspace(root), stdout=out)
    return sh, out


def test_the_budget_line_is_the_same_everywhere(measured, tmp_path):
    root, store, rid = measured
    assert explain_run(store, rid)["budget_line"] == LINE
    assert explain_run(store, rid)["used"] | {} == {**explain_run(store, rid)["used"], "trials": 9, "measurements": 4}
    assert LINE in _run(root, "why")
    assert _rows(_run(root, "status"))[0][2].replace(" ", "") == LINE.replace(" ", "")  # folded, not cut
    assert LINE in _run(root, "trials")
    rows = json.loads(_run(root, "status", "--json"))
    assert (rows[0]["trials"], rows[0]["measurements"]) == (9, 4)  # not 13 rows counted as trials
    sh, out = _shell(root)
    sh.onecmd(sh.precmd("/why"))
    sh.onecmd(sh.precmd("/status"))
    said = out.getvalue().splitlines()
    assert LINE in said[0] and LINE in said[1]
    from orchestrator.report import write_report
    from orchestrator.report.html import write_html_report

    assert f"Budget: {LINE}." in write_html_report(store, rid, tmp_path / "h").read_text()
    assert LINE in write_report(store, rid, tmp_path / "m").read_text()


def test_measurements_are_marked_under_the_trial_they_measure(measured):
    root, _, _ = measured
    out = _run(root, "trials")
    rows = {r[0]: r for r in _rows(out)}
    for n, of in (("↳ 8", "confirm of #7"), ("↳ 10", "sentinel of #0"), ("↳ 11", "paired of #7"), ("↳ 12", "paired of #7")):
        assert rows[n][-1] == of, rows
    assert {"0", "1", "2", "3", "4", "5", "6", "7", "9"} <= set(rows) and "↳ 7" not in rows and "8" not in rows
    assert "measurements of the trial they name" in out
    sh, said = _shell(root)
    sh.run_id = 1
    sh.onecmd(sh.precmd("/trials"))
    lines = said.getvalue().splitlines()
    assert lines[7].startswith("#7 ") and lines[11].startswith("↳#11 (paired of #7)")


def test_why_is_prose_and_a_rounded_table_and_json_keeps_the_record(measured):
    root, _, _ = measured
    out = _run(root, "why", "7")
    assert "\\u" not in out and "{" not in out and '"' not in out  # no JSON, no escaped unicode
    assert not re.search(r"\d\.\d{4,}", out), out  # rounded
    flat = _flat(out)
    # the score against #0 is the screening score; the paired ratio says it is paired
    assert "screening score 2.00x against baseline #0" in flat
    assert "paired ratio 2.01x [1.93, 2.09] (90%, 1 paired rounds) against a fresh baseline each round; goal met" in flat
    assert "noise 3.9% (baseline #0)" in flat and "keep line 1.299x = best 1.250x (#2) x (1 + 3.9%)" in flat
    assert "changed from the baseline tpot_ms=4.0" in flat
    raw = json.loads(_run(root, "why", "7", "--json"))
    assert raw["evidence"]["noise"] == 0.0392156862745098 and raw["evidence"]["paired"]["score"] == 2.01
    unpaired = _flat(_run(root, "why", "2"))  # no paired outcome: a plain score, no paired row
    assert "paired" not in unpaired and "score 1.25x" in unpaired


def test_a_sentinel_shows_the_noise_it_set_not_the_one_it_was_judged_with(measured, tmp_path):
    root, _, _ = measured
    flat = _flat(_run(root, "why", "10"))
    assert "noise 77.3%" in flat and "noise 0.0%" not in flat
    assert json.loads(_run(root, "why", "10", "--json"))["evidence"]["noise"] == 0.773
    # without a candidate judged against it, the noise is its own repeats' spread (10.0 vs 17.7 ms)
    other = tmp_path / "other"
    (other / ".infergoal").mkdir(parents=True)
    store = Store(f"sqlite:///{other / '.infergoal' / 'infergoal.db'}")
    add_measurements(store, build_run(store, other / ".infergoal"), judged_after_sentinel=False)
    store.close()
    assert json.loads(_run(other, "why", "10", "--json"))["evidence"]["noise"] == pytest.approx(7.7 / 13.85)


def test_tables_wrap_what_a_user_needs_instead_of_cutting_it(measured):
    root, store, rid = measured
    long_knobs = {"tpot_ms": 4.0, "max_num_batched_tokens": 16384, "enable_chunked_prefill": True, "scheduler_delay": 0.25}
    t = store.create_trial(rid, 13, commit="c", knobs=long_knobs, rationale="long", proposer="search")
    store.finish_trial(t.id, "discarded", score=1.1, objective={"decode:tpot_ms_p50": 9.27}, timings={"total": 1.0})
    status = _rows(_run(root, "status"))[0]
    assert status[5].replace(" ", "") == STOP.replace(" ", "") and status[6] == "audit demo"  # whole, at 80 columns
    row = {r[0]: r for r in _rows(_run(root, "trials"))}["13"]
    assert row[3].replace(" ", "") == "tpot_ms_p50=9.27"
    assert row[4].replace(" ", "") == "".join(f"{k}={v}" for k, v in sorted(long_knobs.items()))  # whole, key=value


def test_knobs_print_as_key_value_in_show_trials_the_shell_and_the_final_line(measured, capsys):
    root, _, rid = measured
    assert "knobs: tpot_ms=4.0" in _run(root, "show", "7") and "{'" not in _run(root, "show", "7")
    assert "tpot_ms=4.0" in _run(root, "trials") and "{'" not in _run(root, "trials")
    sh, out = _shell(root)
    sh.run_id = rid
    sh.onecmd(sh.precmd("/trials"))
    sh.onecmd(sh.precmd("/show 7"))
    assert "tpot_ms=4.0" in out.getvalue() and "{'" not in out.getvalue()
    STATE.workspace = root
    try:
        finish(SimpleNamespace(run_id=rid, outcome="goal_met", stop_reason=STOP), False, False)
    except typer.Exit as e:  # goal met: exit code 0, nothing raised
        raise AssertionError(e) from None
    said = capsys.readouterr().out
    assert "best: trial #7, score 2.000x — knobs tpot_ms=4.0" in said and "{'" not in said


def test_a_score_that_is_the_paired_ratio_says_paired_everywhere(measured, capsys, tmp_path):
    """The loop replaces a confirmed candidate's screening score by its paired A/B ratio; a face
    printing that number bare read as the screening score ("6.63x" beside best/baseline).
    Here #7's newest paired outcome is its stored score (2.000): every face marks it `paired`."""
    root, store, rid = measured
    t7 = store.get_trial_by_number(rid, 7)
    store.add_event(rid, "paired", "#7: 2.00x [1.95, 2.05]", trial_id=t7.id,
                    data={"score": 2.0, "lo": 1.95, "hi": 2.05, "confidence": 0.9, "rounds": 2, "met": True})
    rows = {r[0]: r for r in _rows(_run(root, "trials"))}
    assert rows["7"][2] == "2.000 paired" and rows["2"][2] == "1.250"  # only the paired ratio is marked
    assert "best: #7, paired A/B 2.00x [1.95, 2.05] (90%, 2 paired rounds)" in _run(root, "why")
    assert _run(root, "show", "7").splitlines()[0] == f"run {rid} trial #7 — kept, score 2.000x paired"
    assert {r[0]: r[2] for r in _rows(_run(root, "lineage", "7"))} == {"7": "2.000 paired", "2": "1.250", "0": "1.000"}
    # A measurement's own header says what it measures (show and why), a trial's does not.
    assert _run(root, "show", "12").splitlines()[0] == f"run {rid} trial #12 — measured; a measurement (paired of #7), not a trial"
    assert _run(root, "why", "10").splitlines()[0].endswith("(decided by sentinel); a measurement (sentinel of #0), not a trial")
    assert "measurement" not in _run(root, "why", "7").splitlines()[0]
    sh, out = _shell(root)
    sh.run_id = rid
    sh.onecmd(sh.precmd("/trials"))
    sh.onecmd(sh.precmd("/status"))
    said = out.getvalue()
    assert re.search(r"^#7 +kept +2\.000x paired ", said, re.M) and re.search(r"^#2 +kept +1\.250x +search", said, re.M)
    assert ", best #7 2.000x paired" in said
    _run(root, "report", "--html", "--out", str(tmp_path / "r"))
    assert "| 7 | kept | 2.000 paired |" in (tmp_path / "r" / "report.md").read_text()
    assert "Best: trial #7, paired speedup <b>2.000×</b>" in (tmp_path / "r" / "report.html").read_text()
    STATE.workspace = root
    finish(SimpleNamespace(run_id=rid, outcome="goal_met", stop_reason=STOP), False, False)
    assert "best: trial #7, score 2.000x paired — knobs tpot_ms=4.0" in capsys.readouterr().out


def test_the_live_view_marks_measurements(monkeypatch):
    from rich.console import Console

    from orchestrator.cli import live

    monkeypatch.setattr(live, "err", Console(file=io.StringIO(), width=200))  # where `goal` draws its lines
    view = live._Progress(3, quiet=True)
    row = dict(status="kept", score=None, objective={"decode:tpot_ms_p50": 9.5}, error=None, knobs={})
    view.trial(SimpleNamespace(number=6, proposer="paired", rationale="paired A/B of #5, round 1: baseline", **row))
    view.trial(SimpleNamespace(number=5, proposer="scripted", rationale="step", **row | {"score": 1.9}))
    lines = view.progress.console.file.getvalue().splitlines()
    assert lines[0].startswith("↳6   measured") and lines[0].endswith("paired of #5")
    assert lines[1].startswith("#5   kept") and lines[1].endswith("scripted")
    assert view.progress.tasks[0].completed == 1  # the bar counts the trial, not the measurement
