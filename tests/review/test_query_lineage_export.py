"""Trial filters and sorting, lineage back to the baseline, and the export files read back."""

import csv
import json

import pytest

from orchestrator.review import export_run, lineage, select_trials
from orchestrator.review.query import QueryError


def _numbers(ts):
    return [t.number for t in ts]


def test_filters_and_sorting(finished_run):
    _, store, rid = finished_run
    ts = store.list_trials(rid)
    assert _numbers(select_trials(ts, status=["invalid", "failed"])) == [1, 4, 5]
    assert _numbers(select_trials(ts, proposer="agent")) == [6, 9]
    assert _numbers(select_trials(ts, where=["score>=1.9"], sort="score", descending=True)) == [7, 8, 6]
    # bare metric keys match the objective label; trials without the value are left out
    assert _numbers(select_trials(ts, where=["tpot_ms_p50<6", "decode:tpot_ms_p50>5.2"])) == [6]
    # sorting puts trials without a value last, whichever the direction
    assert _numbers(select_trials(ts, sort="score"))[-3:] == [1, 4, 5]
    for bad, msg in ((dict(status=["won"]), "unknown status won"), (dict(where=["ttft<3"]), "unknown metric 'ttft'"),
                     (dict(where=["score is big"]), "METRIC OP NUMBER"), (dict(sort="colour"), "unknown metric")):
        with pytest.raises(QueryError, match=msg):
            select_trials(ts, **bad)


def test_lineage_runs_back_through_the_incumbents(finished_run):
    _, store, rid = finished_run
    steps = lineage(store, rid, 8)
    assert [(s.number, s.parent) for s in steps] == [(8, 7), (7, 2), (2, 0), (0, None)]
    assert steps[0].changed == {} and steps[1].changed == {"tpot_ms": [6.0, 4.0]}
    assert steps[2].changed == {"tpot_ms": [8.0, 6.0]}
    # #3 was proposed when #2 was the best: that is what it had to beat
    assert lineage(store, rid, 3)[0].parent == 2


def test_lineage_lists_the_commits_between_parent_and_child(finished_run, tmp_path):
    import git

    _, store, rid = finished_run
    repo = git.Repo.init(tmp_path / "engine")
    (tmp_path / "engine" / "a.py").write_text("x = 1\n")
    repo.index.add(["a.py"])
    base = repo.index.commit("engine as shipped").hexsha
    (tmp_path / "engine" / "a.py").write_text("x = 2\n")
    repo.index.add(["a.py"])
    child = repo.index.commit("fuse the decode loop").hexsha
    run = store.create_run("code", "beat the baseline by 10% on TPOT", store.get_run(rid).goal, "h",
                           {**store.get_run(rid).target, "source": str(tmp_path / "engine")}, {}, "local", "agent")
    for n, commit in ((0, base), (1, child)):
        t = store.create_trial(run.id, n, commit=commit, knobs={"tpot_ms": 8.0}, rationale="", proposer="agent")
        store.finish_trial(t.id, "kept", score=1.0 + n)
    steps = lineage(store, run.id, 1)
    assert steps[0].parent == 0 and steps[0].commits == [f"{child[:12]} fuse the decode loop"]


def test_export_files_parse_back(finished_run, tmp_path):
    root, store, rid = finished_run
    out = tmp_path / "export"
    manifest = export_run(store, rid, out, run_dir=root / ".infergoal" / "runs" / str(rid))
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert [r["status"] for r in rows] == ["kept", "failed", "kept", "discarded", "invalid", "invalid",
                                           "needs_approval", "kept", "kept", "needs_approval"]
    assert rows[3]["decided_by"] == "threshold" and "did not beat" in rows[3]["why"]
    assert json.loads(rows[2]["changed"]) == {"tpot_ms": 6.0} and float(rows[7]["decode:tpot_ms_p50"]) == 5.1
    meas = list(csv.DictReader((out / "measurements.csv").open()))
    assert {(m["trial"], m["repeat"]) for m in meas if m["metric"] == "tpot_ms_p50"} >= {("0", "0"), ("0", "1")}
    gates = list(csv.DictReader((out / "gates.csv").open()))
    assert ("4", "integrity", "fail") in {(g["trial"], g["gate"], g["status"]) for g in gates}
    full = json.loads((out / "run.json").read_text())
    assert full["run"]["id"] == rid and len(full["trials"]) == 10
    assert full["trials"][5]["why"]["decided_by"] == "gate:accuracy"
    # vLLM- and AIPerf-shaped files for every trial that has bench results (failed/invalid have none)
    assert sorted(manifest["bench_exports"], key=int) == ["0", "2", "3", "6", "7", "8", "9"]
    vllm = json.loads((out / "trial-7" / "repeat-0" / "decode.vllm.json").read_text())
    assert vllm["median_tpot_ms"] == pytest.approx(5.1, rel=1e-6) and vllm["completed"] == 4
    aiperf = json.loads((out / "trial-7" / "repeat-0" / "decode" / "profile_export_aiperf.json").read_text())
    assert aiperf["inter_token_latency"]["p50"] == pytest.approx(5.1, rel=1e-6) and aiperf["request_count"]["avg"] == 4
    jsonl = (out / "trial-0" / "repeat-1" / "decode.requests.jsonl").read_text().splitlines()
    assert len(jsonl) == 4 and all(json.loads(line)["success"] for line in jsonl)


def test_export_without_the_run_folder_still_has_the_tables(finished_run, tmp_path):
    _, store, rid = finished_run
    manifest = export_run(store, rid, tmp_path / "x", run_dir=tmp_path / "gone")
    assert manifest["bench_exports"] == {} and (tmp_path / "x" / "trials.csv").is_file()
