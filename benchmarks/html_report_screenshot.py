"""Regenerate docs/report_html.png: the HTML report of the audit tests' run, shot in headless Chromium.

    PYTHONPATH=.:tests:tests/review:tests/report python benchmarks/html_report_screenshot.py [OUT.png]

The run is tests/review/review_runs.py's (every trial status, built through the store API, so its
numbers are illustrative), plus a sentinel and a paired A/B round of the best trial (measurements,
marked under the trial they measure) and speed-of-light floors,
so every section of the page has something to show.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from chromium import inspect_page
from review_runs import add_measurements, build_run

from orchestrator.report.html import write_html_report
from orchestrator.review import decide, record_action
from orchestrator.store import Store


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = Store(f"sqlite:///{d}/infergoal.db")
        rid = build_run(store, Path(d))
        add_measurements(store, rid)  # a sentinel and a paired round of #7: measurements, shown as such
        store.add_event(rid, "speed_of_light", "floors", data={"floors": {"decode_tpot_ms": 1.02, "prefill_ttft_ms": 3.0}})
        decide(store, rid, 9, "rejected", "alice")
        record_action(store, rid, "steer", "leave the dtype alone", who="bob")
        page = write_html_report(store, rid, Path(d) / "report")
        r = inspect_page(page, screenshot=out)
        store.close()
    print(f"{out}: console errors {r['errors']}, requests {r['requests']}, sections {len(r['sections'])}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/report_html.png"))
