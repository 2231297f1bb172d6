"""A failure said in one line: the last meaningful line of a log, kept whole in the report's table."""



from cli_workspace import seed_run

from orchestrator.core.oneline import last_meaningful_line, summarize_failure
from orchestrator.report import write_report

LOG_ERROR = """ServerCrashed: server exited before it became healthy; last log lines:
Traceback (most recent call last):
  File "/srv/server.py", line 12, in <module>
    main()
  File "/srv/server.py", line 9, in main
    raise ValueError("bad dtype 'float8'\\nuse float32 | bfloat16")
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ValueError: bad dtype 'float8' | use float32 or bfloat16
"""


def test_failure_summary_is_the_last_meaningful_line():
    assert last_meaningful_line(LOG_ERROR) == "ValueError: bad dtype 'float8' | use float32 or bfloat16"
    s = summarize_failure(LOG_ERROR)
    assert s.startswith("ServerCrashed: server exited") and s.endswith("use float32 or bfloat16") and "\n" not in s


def test_multiline_error_does_not_break_the_report_table(tmp_path):
    store, run = seed_run(tmp_path)
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
