"""benchmarks/gpu/prefill_card.py on the CPU (the tiny preset, Triton interpreted): every prefill choice timed or
refused in one line, the served setting first; and what a card's tables choose for a prefill (none of its GEMMs:
the tables' skinny GEMM serves a decode step's rows) against what they choose for a decode step's."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from triton_interp import patch_kernels  # tests/hfserve

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def kernels(monkeypatch):
    from triton_interp import import_interpreted

    K = import_interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in K.TABLE_KINDS:  # card_tables installs a card's tables, as the engine does: put back after
        patch_kernels(monkeypatch, K, name, getattr(K, name))
    return K


def test_every_choice_is_timed_or_refused_and_the_served_one_comes_first(kernels, tmp_path: Path, capsys) -> None:
    import prefill_card
    from hfserve.fast.model import _SDPA, PREFILL_ATTN

    out = tmp_path / "prefill.json"
    assert prefill_card.main(["--device", "cpu", "--preset", "tiny", "--tokens", "12", "--reps", "1",
                              "--budget-s", "600", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert (rows[0]["kernels"], rows[0]["prefill_attn"], rows[0]["sdpa"]) == prefill_card.SERVED and rows[0]["served"]
    assert sorted((r["kernels"], r["prefill_attn"], r["sdpa"]) for r in rows) == sorted(
        (k, a, s) for k in ("torch", "triton") for a in PREFILL_ATTN for s in _SDPA)
    by = {(r["kernels"], r["prefill_attn"], r["sdpa"]): r for r in rows}
    # the tiny model has 4 heads on 2 KV heads: the engine refuses efficient SDPA with fused attention, in one line
    assert "not supported" in by[("triton", "fused", "efficient")]["refused"]
    assert all(by[(k, a, s)]["ms"] > 0 for k in ("torch", "triton") for a in PREFILL_ATTN for s in ("auto", "math"))
    assert res["served"]["ms"] == rows[0]["ms"] and res["best"]["ms"] <= res["served"]["ms"]
    layer = res["layer"]
    assert set(layer["gemms"]) == {"qkv", "o", "gate_up", "down"} and all(g["ms"] > 0 for g in layer["gemms"].values())
    assert layer["attention"]["auto"]["ms"] > 0 and layer["attention"]["auto"]["picks"] != "?"
    assert set(layer["rope_store_ms_by_rows"]) == {"1", "4", "8", "16", "32"}
    assert res["tables"]["file"] is None  # no GPU: the defaults
    text = capsys.readouterr().out
    assert "<- served (step 14)" in text and "served (step 14)" in text.splitlines()[-1]


def test_a_cards_tables_choose_no_prefill_gemm_but_a_decode_steps(kernels) -> None:
    """On the H100's tables the 7B's GEMMs at A's 4096 rows are cuBLAS, and at a decode step's 16 rows the table's
    launch (the same lookup, both ways); the file says its numbers were tuned on the H200."""
    import prefill_card

    meta = {n: torch.empty(s, device="meta") for n, s in
            (("qkv", (6144, 4096)), ("o", (4096, 4096)), ("gu", (28672, 4096)), ("down", (4096, 14336)))}
    fm = types.SimpleNamespace(layers=[meta], device=torch.device("cuda"))
    prefill = prefill_card.card_tables(fm, 4096, H100)
    assert prefill["file_exists"] and prefill["file"] == "examples/hfserve/hfserve/tables/NVIDIA_H100_80GB_HBM3.json"
    assert all(v.startswith("cuBLAS") for v in prefill["prefill_gemms"].values())
    assert "tuned on the H200" in prefill["sources"]["MM_CONFIGS"]
    assert prefill["sdpa_auto_one_prompt"] == "torch's own choice" and "CUDNN_ATTENTION" not in prefill["sdpa_auto_batched"]
    decode = prefill_card.card_tables(fm, 16, H100)
    assert decode["prefill_gemms"]["qkv"] == kernels.MM_CONFIGS[(16, 6144, 4096)].label()
    other = prefill_card.card_tables(fm, 16, "NVIDIA A100-SXM4-80GB")
    assert not other["file_exists"] and all(v.startswith("cuBLAS") for v in other["prefill_gemms"].values())
