"""benchmarks/gpu/paste_tables.py: mm_bench's printed tables replace hfkernels.py's entries, winners only."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/gpu/paste_tables.py"
spec = importlib.util.spec_from_file_location("paste_tables", SCRIPT)
P = importlib.util.module_from_spec(spec)
sys.modules["paste_tables"] = P
spec.loader.exec_module(P)

KERNELS = ROOT / "examples/hfserve/hfkernels.py"


def _tables(src: str, name: str) -> list[str]:
    return [ln for ln in src.split(f"\n{name}")[1].split("\n}\n")[0].splitlines()[1:] if ln.strip()]


def test_the_measured_tables_replace_the_entries(tmp_path, capsys) -> None:
    """A --glu-only and a --fuse-only result pasted into a copy of hfkernels.py: their entries replace the tables'
    (an empty winners' table empties it), the declaring lines and everything else stay; --dry-run changes nothing;
    a missing file or table is one line and exit 2."""
    k = tmp_path / "hfkernels.py"
    src = KERNELS.read_text()
    k.write_text(src)
    fuse = ("MM_FUSE_CONFIGS: dict[tuple[str, int, int, int], MmCfg] = {\n"
            "    ('res', 64, 4096, 4096): MmCfg(64, 128, 4, 5, 1, False, ''),  # o 10.9 vs 14.0 us\n}")
    (tmp_path / "f.json").write_text(json.dumps({"fuse_configs_py": fuse}))
    (tmp_path / "g.json").write_text(json.dumps({"glu_configs_py": "MM_GLU_CONFIGS = {\n}"}))
    assert P.main([str(tmp_path / "f.json"), str(tmp_path / "g.json"), "--kernels", str(k), "--dry-run"]) == 0
    assert k.read_text() == src
    assert P.main([str(tmp_path / "f.json"), str(tmp_path / "g.json"), "--kernels", str(k)]) == 0
    out = k.read_text()
    assert _tables(out, "MM_FUSE_CONFIGS") == ["    ('res', 64, 4096, 4096): MmCfg(64, 128, 4, 5, 1, False, ''),  # o 10.9 vs 14.0 us"]
    assert _tables(out, "MM_GLU_CONFIGS") == []
    assert _tables(out, "MM_CONFIGS") == _tables(src, "MM_CONFIGS") and _tables(src, "MM_GLU_CONFIGS")
    assert "MM_FUSE_CONFIGS: dict[tuple[str, int, int, int], MmCfg] = {" in out and "MM_GLU_CONFIGS: dict[" in out
    rest = lambda s: [ln for ln in s.splitlines() if not ln.startswith("    (")]  # noqa: E731
    assert rest(out) == rest(src)  # only table entries changed
    capsys.readouterr()
    assert P.main([str(tmp_path / "missing.json"), "--kernels", str(k)]) == 2
    assert P.main([str(tmp_path / "f.json"), "--kernels", str(tmp_path / "nokernels.py")]) == 2
    (tmp_path / "nok.py").write_text("x = 1\n")
    assert P.main([str(tmp_path / "f.json"), "--kernels", str(tmp_path / "nok.py")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("paste_tables: ") for e in err) and "no MM_FUSE_CONFIGS table" in err[2]


def test_a_reader_that_stops_early_does_not_stop_the_paste(tmp_path) -> None:
    """The step scripts print only the first line (`paste_tables.py ... | head -1`): on the H100 (2026-12-05) a reader
    gone before the third printed line broke the pipe before the file was written, and the gate served unpasted
    tables. The file is written first; a closed pipe after that is no error."""
    import subprocess

    k = tmp_path / "hfkernels.py"
    k.write_text(KERNELS.read_text())
    entries = "".join(f"    ('res', {m}, 4096, {n}): MmCfg(64, 128, 4, 5, 1, False, ''),  # x\n"
                      for m in (16, 32, 64) for n in range(4096, 4096 + 64 * 400, 64))
    (tmp_path / "f.json").write_text(json.dumps(
        {"fuse_configs_py": "MM_FUSE_CONFIGS: dict[tuple[str, int, int, int], MmCfg] = {\n" + entries + "}"}))
    r = subprocess.run(f"{sys.executable} {SCRIPT} {tmp_path / 'f.json'} --kernels {k} | head -c 10; "
                       "echo \" rc=${PIPESTATUS[0]}\"", shell=True, executable="/bin/bash", capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.endswith(" rc=0\n") and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    assert len(_tables(k.read_text(), "MM_FUSE_CONFIGS")) == 1200
