"""GPU-only checks of the fast engine: CUDA-graph decode equals eager decode and tracks prefill.

Opt-in: runs only with INFERGOAL_GPU_TESTS=1 on a machine with CUDA (never in CI). On the H200
the same checks ran on the 7B model through benchmarks/gpu/check_engine.py (docs/results.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(os.environ.get("INFERGOAL_GPU_TESTS") != "1" or not torch.cuda.is_available(),
                       reason="GPU tests are opt-in: INFERGOAL_GPU_TESTS=1 on a CUDA machine"),
]

from hfserve.fast import FastModel, GraphDecoder  # noqa: E402


@torch.inference_mode()
def test_graph_decode_equals_eager_and_prefill(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16, device_map="cuda").eval()
    fm = FastModel(hf, slots=6, capacity=600)
    graphs, eager = GraphDecoder(fm, 4, use_graphs=True), GraphDecoder(fm, 4, use_graphs=False)
    graphs.capture_all()
    ids = torch.randint(4, 2000, (300,), device="cuda")
    full = torch.log_softmax(fm.prefill(ids, 5, 0, all_logits=True), -1)
    for n in (3, 4):  # a padded bucket and a full one
        for slot in range(n):
            fm.prefill(ids[:200 + slot], slot, 0)
        toks, pos = [int(ids[200 + s]) for s in range(n)], [200 + s for s in range(n)]
        lg, _ = graphs.step(toks, pos)
        lg = lg[:n].clone()
        for slot in range(n):
            fm.prefill(ids[:200 + slot], slot, 0)
        le, _ = eager.step(toks, pos)
        assert torch.equal(lg, le[:n])
        for s in range(n):
            lp = torch.log_softmax(lg[s], -1)
            assert float((lp - full[200 + s]).abs().max()) < 0.1  # bf16 prefill vs decode kernels


@pytest.mark.parametrize("layout", ["tensor", "file"])
def test_pread_reader_on_cuda_equals_load_file(tmp_path: Path, layout: str) -> None:
    # The CUDA path of loading.read_safetensors (pinned double-buffered staging, a stream per thread): many small
    # chunks and few threads, so each thread reuses its staging buffers many times (a missed wait shows as a diff).
    from hfserve.loading import read_safetensors
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(0)
    st = {f"w{i}": torch.randn(257 + i, 1031, generator=g).bfloat16() for i in range(24)}
    st |= {"ids": torch.arange(1001, dtype=torch.int64), "scalar": torch.tensor(1.5), "empty": torch.empty(0, 3)}
    f = tmp_path / "m.safetensors"
    save_file(st, f)
    want = load_file(f, device="cuda")
    for threads, chunk, pin in [(1, 1 << 20, True), (3, 777_777, True), (8, 4 << 20, True), (2, 999_999, False)]:
        got = read_safetensors(str(f), "cuda", threads=threads, chunk_bytes=chunk, layout=layout, pin=pin)
        assert list(got) == list(want)
        for k, w in want.items():
            assert (got[k].dtype, got[k].shape, got[k].device) == (w.dtype, w.shape, w.device), k
            assert torch.equal(got[k].reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)), k


def test_fast_load_on_cuda_gives_load_file_logits(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hfserve.loading import load_model

    monkeypatch.setenv("HFSERVE_LOAD_CHUNK_MIB", "1")
    ids = torch.randint(4, 2000, (2, 37), generator=torch.Generator().manual_seed(0)).cuda()
    new, how = load_model(str(tiny_model), dtype=torch.bfloat16, device="cuda", how="fast")
    old, old_how = load_model(str(tiny_model), dtype=torch.bfloat16, device="cuda", how="safetensors")
    assert how == "safetensors-pread x4 1MiB" and old_how == "safetensors"
    with torch.inference_mode():
        assert torch.equal(new(ids).logits, old(ids).logits)
