"""benchmarks/gpu/paste_tables.py: mm_bench's printed tables become the measured GPU's tables file, winners only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import paste_tables as P  # noqa: E402  (benchmarks/gpu)
from hfserve import hfkernels as K  # noqa: E402
from hfserve.tables import TABLES_DIR, read_tables, table_path  # noqa: E402

SCRIPT = Path(P.__file__).resolve()
GPU = "NVIDIA H100 80GB HBM3"


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "tables"
    shutil.copytree(TABLES_DIR, d)
    return d


def test_the_measured_tables_replace_the_gpus_tables(tmp_path, capsys) -> None:
    """A --fuse-only and a --glu-only result written into a copy of the H100's file: their tables replace the file's
    (an empty winners' table empties it), its other tables stay; --dry-run changes nothing; a missing file, a result
    naming no GPU and a broken table are one line each and exit 2."""
    d = _copy(tmp_path)
    path = table_path(GPU, d)
    before = read_tables(path, K.TABLE_KINDS)
    fuse = ("MM_FUSE_CONFIGS: dict[tuple[str, int, int, int], MmCfg] = {\n"
            "    ('res', 64, 4096, 4096): MmCfg(64, 128, 4, 5, 1, False, ''),  # o 10.9 vs 14.0 us\n}")
    (tmp_path / "f.json").write_text(json.dumps({"meta": {"device": GPU}, "fuse_configs_py": fuse}))
    (tmp_path / "g.json").write_text(json.dumps({"meta": {"device": GPU}, "glu_configs_py": "MM_GLU_CONFIGS = {\n}"}))
    text = path.read_text()
    assert P.main([str(tmp_path / "f.json"), str(tmp_path / "g.json"), "--tables", str(d), "--dry-run"]) == 0
    assert path.read_text() == text
    assert P.main([str(tmp_path / "f.json"), str(tmp_path / "g.json"), "--tables", str(d)]) == 0
    after = read_tables(path, K.TABLE_KINDS)
    assert after["MM_FUSE_CONFIGS"] == {("res", 64, 4096, 4096): K.MmCfg(64, 128, 4, 5, 1, False, "")}
    assert after["MM_GLU_CONFIGS"] == {} != before["MM_GLU_CONFIGS"]
    assert {n: t for n, t in after.items() if n not in ("MM_FUSE_CONFIGS", "MM_GLU_CONFIGS")} == \
        {n: t for n, t in before.items() if n not in ("MM_FUSE_CONFIGS", "MM_GLU_CONFIGS")}
    entry = json.loads(path.read_text())["tables"]["MM_FUSE_CONFIGS"]["entries"][0]
    assert entry["note"] == "o 10.9 vs 14.0 us"
    assert read_tables(table_path("NVIDIA H200", d), K.TABLE_KINDS) == K.tables_for("NVIDIA H200")  # another GPU's: untouched
    capsys.readouterr()
    assert P.main([str(tmp_path / "missing.json"), "--tables", str(d)]) == 2
    (tmp_path / "nogpu.json").write_text(json.dumps({"fuse_configs_py": fuse}))
    assert P.main([str(tmp_path / "nogpu.json"), "--tables", str(d)]) == 2
    (tmp_path / "bad.json").write_text(json.dumps({"meta": {"device": GPU}, "fuse_configs_py": "MM_CONFIGS = {\n}"}))
    assert P.main([str(tmp_path / "bad.json"), "--tables", str(d)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("paste_tables: ") for e in err), err
    assert "pass --gpu" in err[1] and "prints MM_CONFIGS, not MM_FUSE_CONFIGS" in err[2]
    assert P.main([str(tmp_path / "nogpu.json"), "--tables", str(d), "--gpu", "Other GPU"]) == 0  # named by hand
    assert read_tables(table_path("Other GPU", d), K.TABLE_KINDS)["MM_FUSE_CONFIGS"] == after["MM_FUSE_CONFIGS"]


def test_a_reader_that_stops_early_does_not_stop_the_write(tmp_path) -> None:
    """The step scripts print only the first line (`paste_tables.py ... | head -1`): the file is written before
    anything is printed, and a closed pipe after that is no error."""
    d = _copy(tmp_path)
    entries = "".join(f"    ('res', {m}, 4096, {n}): MmCfg(64, 128, 4, 5, 1, False, ''),  # x\n"
                      for m in (16, 32, 64) for n in range(4096, 4096 + 64 * 400, 64))
    (tmp_path / "f.json").write_text(json.dumps({"meta": {"device": GPU}, "fuse_configs_py":
                                                 "MM_FUSE_CONFIGS: dict[tuple[str, int, int, int], MmCfg] = {\n" + entries + "}"}))
    tree = Path(K.__file__).resolve().parents[2]  # examples/hfserve: hfserve/hfkernels/__init__.py's
    r = subprocess.run(f"PYTHONPATH={tree} {sys.executable} {SCRIPT} {tmp_path / 'f.json'} --tables {d} | head -c 10; "
                       "echo \" rc=${PIPESTATUS[0]}\"", shell=True, executable="/bin/bash", capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.endswith(" rc=0\n") and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    assert len(read_tables(table_path(GPU, d), K.TABLE_KINDS)["MM_FUSE_CONFIGS"]) == 1200
