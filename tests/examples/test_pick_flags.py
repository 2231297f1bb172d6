"""benchmarks/gpu/pick_flags.py: the fastest candidate's flags beyond the reference server's, from a real C run."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("pick_flags", ROOT / "benchmarks/gpu/pick_flags.py")
P = importlib.util.module_from_spec(spec)
sys.modules["pick_flags"] = P
spec.loader.exec_module(P)

RUN = ROOT / "benchmarks/gpu/results/ib_c_h100_2026-12-05a.json"  # lp1, lpn, lpnp: C three launches each (H100)


def test_the_fastest_candidate_and_only_its_own_flags(tmp_path, capsys) -> None:
    """The H100 run: lpnp's median burst 1.725 s beats lpn's 1.733 s; its flags beyond lp1's are steps 11-13's (not its
    port). A candidate with a failed launch is not ranked; with none left: one line, exit 2."""
    assert P.main([str(RUN)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "--mm-glu on --mm-norm on --pdl on" and err.startswith("pick_flags: lpnp 1.725 s, lpn 1.733 s")
    report = json.loads(RUN.read_text())
    bad = copy.deepcopy(report)
    bad["servers"]["lpnp"]["scenarios"]["throughput_2"]["ok"] = False
    (tmp_path / "b.json").write_text(json.dumps(bad))
    assert P.main([str(tmp_path / "b.json")]) == 0
    assert capsys.readouterr().out.strip() == "--mm-glu on --mm-norm on"  # lpn's
    for s in bad["servers"]["lpn"]["scenarios"].values():
        s["ok"] = False
    (tmp_path / "b.json").write_text(json.dumps(bad))
    assert P.main([str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no server but lp1 has all its throughput launches ok" in err[0]
    assert P.main([str(tmp_path / "missing.json")]) == 2


def test_pairs_reads_flags_and_values() -> None:
    assert P.pairs("env X=1 python s.py --a 1 --flag --b 'two words'") == [("--a", "1"), ("--flag", ""), ("--b", "two words")]
