"""The report's plots and tables tell trials from measurements, in the data and in Chromium.

The run is review_runs.py's ROWS run plus a sentinel (#10) and a paired round of #7 (#11, #12):
9 trials and 4 measurements (#8's legacy confirm among them).
"""

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest
from chromium import CHROMIUM
from review_runs import add_measurements

from orchestrator.report.html import build_html_data, write_html_report
from orchestrator.report.svg import best_so_far_svg, pareto_front, pareto_svg

SVG = "{http://www.w3.org/2000/svg}"


def _group(svg: str, prefix: str) -> list[ET.Element]:
    return [g for g in ET.fromstring(svg).iter(f"{SVG}g") if (g.get("id") or "").startswith(prefix)]


def _drawn(el) -> bool:
    """A drawn marker: a `use` of a marker shape, or a clipped path (an `x` marker is drawn as one)."""
    return el.tag.endswith("use") or (el.tag.endswith("path") and el.get("clip-path") is not None)


def _points(svg: str) -> int:
    return sum(1 for g in _group(svg, "trial-points") for el in g.iter() if _drawn(el))


def _xs(svg: str, gid: str) -> list[float]:
    d = next(p.get("d") for g in _group(svg, gid) for p in g.iter(f"{SVG}path") if p.get("d"))
    return [float(x) for x, _ in re.findall(r"[ML]\s*([-\d.]+)\s+([-\d.]+)", d)]


def test_measurements_are_off_the_trial_axis_and_out_of_the_pareto_points(full_run):
    store, rid, _ = full_run
    add_measurements(store, rid)
    d = build_html_data(store, rid)
    assert _points(d["plots"]["best_vs_trials"]) == 9 and _points(d["plots"]["best_vs_time"]) == 9  # not 13
    assert {p["number"] for p in d["pareto"]["points"]} == {0, 2, 3, 6, 7, 9}
    rows = {t["number"]: t for t in d["trials"]}
    assert [n for n, t in rows.items() if t["measurement"]] == [8, 10, 11, 12]
    assert (rows[11]["of"], rows[10]["of"], rows[7]["of"]) == (7, 0, None)


def test_the_time_axis_only_moves_forward():
    rows = [{"number": n, "minutes": m, "score": s, "status": "kept", "proposer": "search", "measurement": False}
            for n, m, s in ((0, 1.0, 1.0), (1, 5.0, 1.5), (2, 3.0, 1.2), (3, 4.0, 2.0))]  # #2 finished before #1
    xs = _xs(best_so_far_svg(rows, x="minutes", xlabel="minutes"), "best-so-far")
    assert len(xs) >= 4 and xs == sorted(xs)
    ordered = sorted(rows, key=lambda r: r["minutes"])
    assert _xs(best_so_far_svg(ordered, x="minutes", xlabel="minutes"), "best-so-far") == xs  # the same line


def test_the_pareto_front_the_legend_names_is_drawn_even_for_one_point():
    points = [{"number": 0, "status": "kept", "ttft": 20.0, "throughput": 100.0},
              {"number": 7, "status": "kept", "ttft": 18.0, "throughput": 200.0}]
    front = pareto_front(points)
    assert [p["number"] for p in front] == [7]
    svg = pareto_svg(points, front, "decode")
    assert "Pareto front" in svg
    assert sum(len(list(g.iter(f"{SVG}use"))) for g in _group(svg, "pareto-front")) == 1  # its one point, marked
    two = pareto_front([*points, {"number": 9, "status": "kept", "ttft": 10.0, "throughput": 150.0}])
    assert sum(len(list(g.iter(f"{SVG}use"))) for g in _group(pareto_svg(points, two, "decode"), "pareto-front")) == 2


def test_the_objective_table_marks_a_paired_ratio_as_paired(full_run, tmp_path):
    store, rid, _ = full_run
    plain = write_html_report(store, rid, tmp_path / "a").read_text()
    assert "paired-mark" not in plain.split('<section id="progress">')[0].split("</style>")[1]  # unpaired: no mark
    add_measurements(store, rid)
    html = write_html_report(store, rid, tmp_path / "b").read_text()
    goal = html.split('<section id="progress">')[0]
    assert re.search(r'2\.01×\s*<span class="paired-mark"[^>]*>paired</span>', goal)
    assert "unpaired best / baseline: 2.00×" in goal


class _Dom(HTMLParser):
    """Counts in a Chromium-dumped page: trial and measurement rows, paired marks, and the points
    drawn in the best-vs-trials plot."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, int] = {}
        self.marks, self.points = 0, 0
        self._figure, self._in_points = None, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure":
            self._figure = a.get("id")
        if tag == "tr" and a.get("class"):
            self.rows[a["class"]] = self.rows.get(a["class"], 0) + 1
        if tag == "span" and a.get("class") == "paired-mark":
            self.marks += 1
        if tag == "g":
            self._in_points.append((a.get("id") or "").startswith("trial-points"))
        drawn = tag == "use" or (tag == "path" and "clip-path" in a)
        if drawn and self._figure == "plot-best-vs-trials" and any(self._in_points):
            self.points += 1

    def handle_endtag(self, tag):
        if tag == "g" and self._in_points:
            self._in_points.pop()
        if tag == "figure":
            self._figure = None


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.environ.get("CI"), reason="chromium not installed")
def test_chromium_reads_trial_rows_the_paired_mark_and_the_points(full_run, tmp_path):
    store, rid, _ = full_run
    add_measurements(store, rid)
    page = write_html_report(store, rid, tmp_path / "r")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    facts = _Dom()
    facts.feed(dom)
    assert facts.rows == {"trial": 9, "measurement": 4}, facts.rows
    assert facts.marks == 1 and facts.points == 9
    text = re.sub(r"<[^>]+>", " ", dom)
    assert "9 of 12 trials +4 measurements" in " ".join(text.split())
    assert re.search(r"↳ 11\s*</td>.*?paired of #7", dom, re.S)
