"""benchmarks/gpu/results/index.toml: every evidence file in the folder is in exactly one entry (its claim, card and
command), every listed file is there, and every `tool run NAME` names an experiment of the GPU tool's manifest."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import tomllib

from benchmarks.gpu.tool import manifest as mf

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "results"


def entries(path: Path = RESULTS / "index.toml") -> list[dict]:
    return tomllib.loads(path.read_text())["entry"]


def problems(folder: Path, index: list[dict], experiments: set[str]) -> list[str]:
    """What does not hold between ``folder`` and its index (empty: all holds)."""
    out = []
    listed = Counter(f for e in index for f in e["files"])
    present = {p.name for p in folder.iterdir()} - {"index.toml"}
    out += [f"{f}: in the folder, in no entry" for f in sorted(present - set(listed))]
    out += [f"{f}: listed, not in the folder" for f in sorted(set(listed) - present)]
    out += [f"{f}: in {n} entries" for f, n in sorted(listed.items()) if n > 1]
    for e in index:
        out += [f"{e['files'][:1]}: no {k}" for k in ("claim", "card", "command") if not e.get(k)]
        out += [f"{e['files'][:1]}: no experiment {n!r}" for n in re.findall(r"tool run ([\w-]+)", e.get("command", ""))
                if n not in experiments]
    return out


def test_the_index_lists_every_evidence_file_once() -> None:
    assert problems(RESULTS, entries(), set(mf.load().experiments)) == []


def test_the_index_check_finds_what_is_off(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.db").write_text("")
    index = [{"files": ["a.json", "gone.json"], "claim": "x", "card": "H200", "command": "tool run nope"},
             {"files": ["a.json"], "claim": "", "card": "H200", "command": "tool run floors"}]
    assert problems(tmp_path, index, {"floors"}) == [
        "b.db: in the folder, in no entry", "gone.json: listed, not in the folder", "a.json: in 2 entries",
        "['a.json']: no experiment 'nope'", "['a.json']: no claim"]
