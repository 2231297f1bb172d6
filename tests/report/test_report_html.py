"""The HTML report: self-contained, every section filled from the store, and rendered in Chromium."""

import os
import re
import shutil

import pytest
from chromium import CHROMIUM, inspect_page

from orchestrator.report.html import build_html_data, write_html_report

SECTIONS = ["goal", "progress", "pareto", "gates", "sol", "importance", "kb", "cost", "actions", "trials"]


def test_page_is_self_contained_and_holds_every_section(full_run, tmp_path):
    store, rid, _ = full_run
    html = write_html_report(store, rid, tmp_path / "r").read_text()
    assert not re.search(r"""(src|href|url)\s*[=(]\s*["']?(https?:)?//""", html), "nothing may be fetched"
    assert "default-src 'none'" in html
    assert re.findall(r'<section id="(\w+)"', html) == SECTIONS
    assert html.count("<svg") == 4  # best vs trials, best vs time, trial timeline, Pareto
    assert "Goal met" in html and "did not beat the threshold 1.299x" in html
    assert "fake on cpu: knobs giving 2.00x" in html  # the KB entry the run wrote
    assert "Agent: 1500 tokens, $0.0081" in html


def test_trial_timeline_splits_each_trial_into_its_steps(full_run):
    store, rid, _ = full_run
    d = build_html_data(store, rid)
    trials = store.list_trials(rid)
    assert [r["number"] for r in d["timeline"]] == [t.number for t in trials]
    for row, t in zip(d["timeline"], trials, strict=True):
        tm = t.timings or {}
        assert all(row[s] >= 0 for s in ("deploy", "gates", "bench", "other", "idle"))
        assert row["deploy"] == tm.get("deploy", 0.0) and row["bench"] == tm.get("bench", 0.0)
        # the steps of the trial add up to its own time (the rest is "other"), idle is outside it
        assert row["deploy"] + row["gates"] + row["bench"] + row["other"] == pytest.approx(max(
            tm.get("trial", 0.0), tm.get("deploy", 0.0) + tm.get("gates", 0.0) + tm.get("bench", 0.0)))
    assert any(r["deploy"] > 0 for r in d["timeline"])
    assert d["plots"]["timeline"].startswith("<svg") and "idle" in d["plots"]["timeline"]


def test_data_pareto_gates_importance_interval_and_speed_of_light(full_run, tmp_path):
    store, rid, _ = full_run
    d = build_html_data(store, rid)
    assert [p["number"] for p in d["pareto"]["front"]] == [7]  # 18 ms and 200 tok/s dominate the rest
    # failed/invalid have no speed; #8 re-measures #7 (a measurement, not a trial): not plotted as one
    assert {p["number"] for p in d["pareto"]["points"]} == {0, 2, 3, 6, 7, 9}
    gates = {t["number"]: t["gates"] for t in d["trials"]}
    assert gates[4]["integrity"]["status"] == "fail" and gates[6]["accuracy"]["status"] == "drift"
    assert d["gate_names"] == ["integrity", "accuracy", "performance"]
    assert d["importance"] == {"tpot_ms": 1.0}
    assert d["verdict"]["interval"] is None and d["sol"] == []
    best = store.get_trial_by_number(rid, 7)
    store.add_gate_result(best.id, "performance", "pass", "paired A/B", {"interval": [1.85, 2.12]}, 0.1)
    store.add_measurements(best.id, "decode", {"tpot_sol_pct": 34.5}, repeat=0)
    d = build_html_data(store, rid)
    assert d["verdict"]["interval"] == {"low": 1.85, "high": 2.12, "source": "interval"}
    assert d["sol"] == [{"trial": 7, "label": "decode:tpot_sol_pct", "pct": 34.5}]
    # the controller's paired A/B outcome on the best trial is the verdict's interval
    store.add_event(rid, "paired", "2.01x [1.93, 2.09]", trial_id=best.id,
                    data={"score": 2.01, "lo": 1.93, "hi": 2.09, "confidence": 0.9, "rounds": 3, "met": True})
    # floors as benchmarks/gpu/sol.py writes them: TPOT floor 1.02 ms -> the best (5.1 ms) is at 20%
    store.add_event(rid, "speed_of_light", "floors", data={"floors": {"decode_tpot_ms": 1.02, "prefill_ttft_ms": 3.0}})
    d = build_html_data(store, rid)
    assert d["verdict"]["interval"]["low"] == 1.93 and d["verdict"]["interval"]["rounds"] == 3
    sol = {(r["trial"], r["label"].split(" ")[0]): r["pct"] for r in d["sol"]}
    assert sol[(0, "decode:tpot_ms_p50")] == pytest.approx(100 * 1.02 / 10.2)
    assert sol[(7, "decode:tpot_ms_p50")] == pytest.approx(20.0)
    (tmp_path / "broken.md").write_text("---\ntitle: a: b: c\n---\n")  # hand-edited into invalid YAML
    store.add_event(rid, "kb.write_back", "finding written", data={"path": str(tmp_path / "broken.md")})
    assert build_html_data(store, rid)["kb"][-1]["body"] == "(entry no longer readable)"
    html = write_html_report(store, rid, tmp_path / "r2").read_text()
    assert "[1.930, 2.090] around 2.010× (90%, 3 A/B rounds on fresh servers)" in html and "width: 20.0%" in html


needs_chromium = pytest.mark.skipif(
    not shutil.which(CHROMIUM) and not os.environ.get("CI"),
    reason="chromium not installed (apt-get install -y chromium; .ci/run installs it)",
)


@needs_chromium
def test_chromium_renders_it_with_no_console_error_and_no_request(full_run, tmp_path):
    store, rid, _ = full_run
    page = write_html_report(store, rid, tmp_path / "r")
    r = inspect_page(page, screenshot=tmp_path / "shot.png")
    assert r["errors"] == [] and r["requests"] == []
    assert r["title"] == f"infergoal run {rid} — fake" and r["sections"] == SECTIONS
    for fig in ("plot-best-vs-trials", "plot-best-vs-time", "plot-timeline", "plot-pareto"):
        assert r["figures"][fig]["width"] > 300 and r["figures"][fig]["height"] > 150, fig
        assert r["figures"][fig]["paths"] > 10, f"{fig} drew nothing"
    assert r["rows"] == 10 and "Goal met" in r["text"]
    assert (tmp_path / "shot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_chromium
def test_the_browser_check_catches_a_page_that_fetches(tmp_path):
    # The same page with one remote image: the CSP blocks it and the check must say so.
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="default-src \'none\'">'
                   '<title>x</title></head><body><img src="http://192.0.2.1/x.png"><script>oops()</script></body></html>')
    r = inspect_page(bad)
    assert any("Content Security Policy" in e or "192.0.2.1" in e for e in r["errors"]), r["errors"]
    unsafe = tmp_path / "unsafe.html"
    unsafe.write_text('<!DOCTYPE html><html><head><title>y</title></head><body><img src="http://192.0.2.1/y.png">'
                      "<script>console.error('boom')</script></body></html>")
    r = inspect_page(unsafe)
    assert "http://192.0.2.1/y.png" in r["requests"] and "boom" in r["errors"]
