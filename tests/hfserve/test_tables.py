"""The kernels' launch tables are data per GPU (hfserve/tables/<GPU name>.json), read at run time: the running
GPU's file, else the defaults (every table empty); a broken file is refused with its path; paste_tables.py writes
a sweep's winners into a GPU's file and leaves its other tables as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from triton_interp import patch_kernels  # tests/hfserve

pytest.importorskip("torch")

from hfserve import hfkernels as K  # noqa: E402
from hfserve.tables import TABLES_DIR, TableError, read_tables, table_path, write_tables  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_each_shipped_gpu_has_its_tables_and_another_gpu_gets_the_defaults() -> None:
    assert table_path("NVIDIA H200") == TABLES_DIR / "NVIDIA_H200.json"
    assert table_path("NVIDIA H100 80GB HBM3").name == "NVIDIA_H100_80GB_HBM3.json"
    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        t = K.tables_for(gpu)
        assert set(t) == set(K.TABLE_KINDS)
        assert len(t["MV_CONFIGS"]) == 5 and t["MV_CONFIGS"][(6144, 4096)] == K.MvCfg(16, 1024, 8, 1, True, "evict_first")
        assert t["MM_CONFIGS"][(64, 4096, 14336)].split_k == 2 and t["MM_FUSE_CONFIGS"][("res", 64, 4096, 4096)]
        assert t["ATTN_LOWP"][(4, 1024)].lowp and t["ATTN_CONFIGS"] == {}
        assert json.loads(table_path(gpu).read_text())["device"] == gpu
    for other in ("NVIDIA A100-SXM4-80GB", None):
        assert K.tables_for(other) == {name: {} for name in K.TABLE_KINDS}


def test_load_tables_installs_them_where_the_launches_read_them(monkeypatch) -> None:
    for name in K.TABLE_KINDS:
        patch_kernels(monkeypatch, K, name, getattr(K, name))  # restored after the test
    K.load_tables("NVIDIA H200")
    assert K.mv_config(6144, 4096) == K.MvCfg(16, 1024, 8, 1, True, "evict_first")
    assert K.decode_attn_config("lowp", 4, 1024) == K.ATTN_LOWP[(4, 1024)] != K.ATTN_LOWP_DEFAULT
    K.load_tables("NVIDIA A100-SXM4-80GB")
    assert K.mv_config(6144, 4096) == K.MV_DEFAULT and K.decode_attn_config("lowp", 4, 1024) == K.ATTN_LOWP_DEFAULT


def test_a_broken_tables_file_is_refused_with_its_path(tmp_path: Path) -> None:
    kinds = {"MM_CONFIGS": K.MmCfg}
    for text, why in [('{"tables": {"MX": {"entries": []}}}', "unknown table 'MX'"),
                      ('{"tables": {"MM_CONFIGS": {"entries": [{"key": [16, 1, 1], "cfg": {"block": 1}}]}}}', "not a tables file"),
                      ("{", "not a tables file")]:
        f = tmp_path / "G.json"
        f.write_text(text)
        with pytest.raises(TableError, match=why) as e:
            read_tables(f, kinds)
        assert str(f) in str(e.value)
    good = '{"tables": {"MM_CONFIGS": {"entries": [{"key": [16, 8, 8], "cfg": {"block_n": 16, "block_k": 32, "warps": 4, "stages": 2}}]}}}'
    f.write_text(good)
    assert read_tables(f, kinds) == {"MM_CONFIGS": {(16, 8, 8): K.MmCfg(16, 32, 4, 2)}}


def test_write_tables_replaces_the_named_tables_and_keeps_the_others(tmp_path: Path) -> None:
    f = table_path("Some GPU", tmp_path)
    a, b = K.MmCfg(16, 32, 4, 2), K.MmCfg(64, 128, 4, 5, 2, True, "")
    write_tables(f, "Some GPU", {"MM_CONFIGS": {(16, 8, 8): a}, "MM_GLU_CONFIGS": {(16, 8, 8): a}}, {"MM_CONFIGS": "sweep 1"})
    write_tables(f, "Some GPU", {"MM_CONFIGS": {(64, 8, 8): b}}, notes={"MM_CONFIGS": {(64, 8, 8): "1.0 vs 2.0 us"}})
    got = read_tables(f, {"MM_CONFIGS": K.MmCfg, "MM_GLU_CONFIGS": K.MmCfg})
    assert got == {"MM_CONFIGS": {(64, 8, 8): b}, "MM_GLU_CONFIGS": {(16, 8, 8): a}}
    data = json.loads(f.read_text())
    assert data["device"] == "Some GPU" and data["tables"]["MM_CONFIGS"]["source"] == "sweep 1"
    assert data["tables"]["MM_CONFIGS"]["entries"][0]["note"] == "1.0 vs 2.0 us"
