"""Report: markdown with the trial table, the best launch command, time breakdown and a PNG plot."""

from pathlib import Path

from orchestrator.config.goal import parse_goal
from orchestrator.report import build_report_data, write_report
from orchestrator.store import Store


def _run(store):
    goal = parse_goal("beat the baseline by 20% on TPOT and throughput within 5 trials")
    run = store.create_run("demo", goal.text, goal.model_dump(mode="json"), goal.digest, {"name": "hfserve-tiny"}, {}, "local", "search")
    rows = [
        (0, "kept", 1.0, {"batching": "off"}, {"decode:tpot_ms_p50": 10.0, "throughput:output_throughput": 100.0}, None),
        (1, "failed", None, {"batching": "on", "max_batch_size": 64}, {}, "ServerCrashed: out of memory"),
        (2, "kept", 2.0, {"batching": "on"}, {"decode:tpot_ms_p50": 5.0, "throughput:output_throughput": 200.0}, None),
        (3, "invalid", None, {"batching": "on", "dtype": "int2"}, {}, "accuracy gate: kl 3.1 > 0.05"),
    ]
    for n, status, score, knobs, obj, error in rows:
        t = store.create_trial(run.id, n, commit="abc", knobs=knobs, rationale="", proposer="search")
        store.start_trial(t.id, f"python server.py --port 80{n} --batching {knobs['batching']}", None)
        timings = {"propose": 0.1, "deploy": 5.0, "gates": 2.0, "bench": 10.0, "teardown": 0.5, "record": 0.05}
        timings["total"] = sum(timings.values()) + 0.2
        store.finish_trial(t.id, status, score=score, objective=obj, error=error, timings=timings)
        if n == 2:
            store.set_best_trial(run.id, t.id)
        if n == 3:
            store.add_gate_result(t.id, "accuracy", "fail", "kl 3.1 > 0.05", {}, 1.0)
    store.set_run_status(run.id, "finished", "BudgetExhausted: 4 trials")
    return run.id


def test_report_data_and_overhead():
    store = Store("sqlite://")
    d = build_report_data(store, _run(store))
    assert d.best["number"] == 2 and d.baseline["number"] == 0
    tpot, thr = d.objectives
    assert tpot["speedup"] == 2.0 and tpot["met"] and thr["speedup"] == 2.0 and thr["met"]
    assert tpot["target"] == 8.0 and thr["target"] == 120.0
    # overhead = total - (deploy + gates + bench + teardown) = propose + record + unaccounted
    assert abs(d.overhead_s - 4 * (0.1 + 0.05 + 0.2)) < 1e-9
    assert 0 < d.overhead_pct < 5
    assert d.gate_rejections == [{"trial": 3, "gate": "accuracy", "status": "fail", "reason": "kl 3.1 > 0.05"}]


def test_report_files(tmp_path: Path):
    store = Store("sqlite://")
    md = write_report(store, _run(store), tmp_path).read_text()
    png = tmp_path / "speedup.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "python server.py --port 802 --batching on" in md  # the best launch command, runnable
    assert "| 1 | failed |" in md and "ServerCrashed: out of memory" in md
    assert "| 3 | invalid |" in md and "Gate findings" in md
    assert "Orchestrator overhead" in md and "![speedup per trial](speedup.png)" in md


def test_overhead_uses_session_wall_time_when_recorded():
    store = Store("sqlite://")
    rid = _run(store)
    engine = 4 * (5.0 + 2.0 + 10.0 + 0.5)
    store.add_event(rid, "session", "session ended", data={"wall_s": 50.0})
    store.add_event(rid, "session", "resumed session", data={"wall_s": 30.0})
    d = build_report_data(store, rid)
    assert d.total_s == 80.0
    assert abs(d.overhead_s - (80.0 - engine)) < 1e-9


def _paired(store, rid, lo, hi, score):
    """The best trial's paired A/B outcome (as the controller records it), its score replaced by the ratio."""
    best = store.get_trial(store.get_run(rid).best_trial_id)
    objectives = {"decode:tpot_ms_p50": {"ratio": score, "lo": lo, "hi": hi, "verdict": "fail"},
                  "throughput:output_throughput": {"ratio": score, "lo": lo, "hi": hi, "verdict": "fail"}}
    store.add_event(rid, "paired", "#2: paired", trial_id=best.id,
                    data={"score": score, "lo": lo, "hi": hi, "confidence": 0.9, "rounds": 3, "met": False,
                          "objectives": objectives})
    store.finish_trial(best.id, "kept", score=score, objective=best.objective, timings=best.timings)


def test_a_best_whose_paired_interval_holds_one_is_no_best_candidate(tmp_path: Path):
    """`1.11x [0.79, 1.49]`: nothing beat the baseline; no "Best candidate", no command to run it."""
    store = Store("sqlite://")
    rid = _run(store)
    _paired(store, rid, 0.79, 1.49, 1.11)
    md = write_report(store, rid, tmp_path / "md").read_text()
    assert "Best candidate" not in md and "Run the best candidate" not in md and "--port 802" not in md
    assert "No candidate beat the baseline: the best, trial #2, measured a paired speedup of 1.11× [0.79, 1.49]" in md
    from orchestrator.report.html import write_html_report

    html = write_html_report(store, rid, tmp_path / "html").read_text()
    assert "Run the best candidate" not in html and "No candidate beat the baseline" in html


def test_a_best_whose_paired_interval_clears_one_is_the_best_candidate(tmp_path: Path):
    store = Store("sqlite://")
    rid = _run(store)
    _paired(store, rid, 1.2, 1.5, 1.35)
    md = write_report(store, rid, tmp_path).read_text()
    assert "Best candidate: trial #2, paired speedup **1.35× [1.20, 1.50]**" in md and "Run the best candidate" in md
    assert "No candidate beat the baseline" not in md


def test_the_markdown_says_which_speedup_is_the_paired_ratio(tmp_path: Path):
    """2.98x beside tok/s whose own ratio is 2.00x: the first is labelled paired, the second given."""
    store = Store("sqlite://")
    rid = _run(store)
    _paired(store, rid, 2.5, 3.3, 2.98)
    md = write_report(store, rid, tmp_path).read_text()
    row = next(line for line in md.splitlines() if line.startswith("| throughput"))
    assert "| 100.00 | 200.00 |" in row and "2.98× paired [2.50, 3.30]; best / baseline 2.00×" in row
    assert '"paired" marks a paired A/B ratio' in md


def test_reports_link_the_glossary_and_call_the_baseline_measured(tmp_path: Path):
    store = Store("sqlite://")
    rid = _run(store)
    md = write_report(store, rid, tmp_path).read_text()
    assert "docs/glossary.md" in md
    assert "| 0 | measured |" in md and "| 2 | kept |" in md  # the baseline was measured; a candidate is kept
    from orchestrator.report.html import write_html_report

    assert "docs/glossary.md" in write_html_report(store, rid, tmp_path / "h").read_text()
