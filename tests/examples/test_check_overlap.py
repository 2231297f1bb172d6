"""benchmarks/gpu/check_overlap.py runs (CPU smoke, tiny model): both schedules, same tokens, its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def test_check_overlap_smoke(tiny_model: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import check_overlap

    out = tmp_path / "ovl.json"
    check_overlap.main([str(tiny_model), "--device", "cpu", "--n", "4", "--prompt", "8", "--out-tokens", "6",
                        "--reps", "1", "--stream-us", "0", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["tokens_equal"] and [r["overlap"] for r in res["runs"]] == [False, True]
    assert all(r["steps"] == 5 for r in res["runs"])  # 6 tokens: the prefill's and 5 decode steps at batch 4
