"""hfserve's fast model loading gives the same model as from_pretrained (tiny model, CPU), and its safetensors
reader the same tensors as safetensors' load_file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hfserve import loading  # noqa: E402
from hfserve.loading import CheckpointError, checkpoint_files, load_model, read_safetensors  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

IDS = torch.randint(4, 2000, (2, 37), generator=torch.Generator().manual_seed(0))


def _logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(IDS).logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_load_gives_from_pretrained_logits(tiny_model: Path, dtype: torch.dtype) -> None:
    fast, how = load_model(str(tiny_model), dtype=dtype, how="fast")
    ref, ref_how = load_model(str(tiny_model), dtype=dtype, how="hf")
    assert how == "safetensors-pread x4 64MiB" and ref_how == "from_pretrained"
    assert torch.equal(_logits(fast), _logits(ref))
    assert {k: v.dtype for k, v in fast.state_dict().items()} == {k: v.dtype for k, v in ref.state_dict().items()}
    assert fast.generation_config.to_dict() == ref.generation_config.to_dict()
    assert not fast.training


def test_sharded_and_tied_checkpoints(tiny_model: Path, tmp_path: Path) -> None:
    # A tied-embedding model saved in shards: the index is read and lm_head is tied, not left empty.
    cfg = transformers.AutoConfig.from_pretrained(tiny_model)
    cfg.tie_word_embeddings = True
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(tmp_path, max_shard_size="300KB")
    assert len(checkpoint_files(str(tmp_path)) or []) > 1
    fast, how = load_model(str(tmp_path), dtype=torch.float32, how="fast")
    ref, _ = load_model(str(tmp_path), dtype=torch.float32, how="hf")
    assert how.startswith("safetensors-pread")
    assert fast.lm_head.weight.data_ptr() == fast.model.embed_tokens.weight.data_ptr()
    assert torch.equal(_logits(fast), _logits(ref))


def test_falls_back_where_fast_does_not_apply(tiny_model: Path, tmp_path: Path) -> None:
    # A checkpoint with a name the model does not have: from_pretrained's rules decide, and it says why.
    from safetensors.torch import load_file, save_file

    for f in tiny_model.iterdir():
        shutil.copy(f, tmp_path / f.name)
    state = load_file(tmp_path / "model.safetensors")
    save_file({**state, "model.extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model, how = load_model(str(tmp_path), dtype=torch.float32, how="fast")
    assert how.startswith("from_pretrained (fast load does not apply: checkpoint names")
    ref, _ = load_model(str(tiny_model), dtype=torch.float32, how="hf")
    assert torch.equal(_logits(model), _logits(ref))
    # No safetensors at all: nothing to load fast.
    assert checkpoint_files(str(tmp_path / "nowhere")) is None


@pytest.mark.parametrize("layout", ["tensor", "file"])
def test_pread_reader_gives_load_file_logits(tiny_model: Path, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 MiB chunks over the 5 MB checkpoint, 3 threads: chunk boundaries inside tensors, reads out of order.
    monkeypatch.setenv("HFSERVE_LOAD_THREADS", "3")
    monkeypatch.setenv("HFSERVE_LOAD_CHUNK_MIB", "1")
    monkeypatch.setenv("HFSERVE_LOAD_LAYOUT", layout)
    new, how = load_model(str(tiny_model), dtype=torch.bfloat16, how="fast")
    old, old_how = load_model(str(tiny_model), dtype=torch.bfloat16, how="safetensors")
    assert how == "safetensors-pread x3 1MiB" + ("" if layout == "tensor" else " file") and old_how == "safetensors"
    assert torch.equal(_logits(new), _logits(old))
    a, b = new.state_dict(), old.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    monkeypatch.setenv("HFSERVE_LOAD_THREADS", "0")
    with pytest.raises(ValueError, match="HFSERVE_LOAD_"):
        load_model(str(tiny_model), dtype=torch.bfloat16, how="fast")


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = {
        "bf16": torch.randn(37, 53, generator=g).bfloat16(), "f16": torch.randn(3, 5, 7, generator=g).half(),
        "f32": torch.randn(101, generator=g), "f64": torch.randn(2, 3, generator=g, dtype=torch.float64),
        "i64": torch.randint(-2**62, 2**62, (13,), generator=g, dtype=torch.int64),
        "i32": torch.randint(-2**31, 2**31 - 1, (9,), generator=g, dtype=torch.int32),
        "i16": torch.randint(-2**15, 2**15 - 1, (5,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-128, 127, (11,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (3, 7), generator=g, dtype=torch.uint8), "bool": torch.rand(19, generator=g) > 0.5,
        "scalar": torch.tensor(2.5, dtype=torch.float32), "empty": torch.empty(0, 4, dtype=torch.bfloat16),
        "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
    }
    if hasattr(torch, "float8_e4m3fn"):
        t["f8"] = torch.randn(17, generator=g).to(torch.float8_e4m3fn)
    return t


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for k, w in want.items():
        g = got[k]
        assert (g.dtype, g.shape, g.device) == (w.dtype, w.shape, w.device), k
        assert torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)), k  # bytes: NaN, -0.0


@pytest.mark.parametrize("layout", ["tensor", "file"])
def test_reader_equals_load_file_bit_for_bit(tmp_path: Path, layout: str) -> None:
    f = tmp_path / "m.safetensors"
    save_file(_tensors(), f, metadata={"format": "pt"})
    want = load_file(f)
    for threads, chunk in [(1, 1 << 20), (1, 7), (3, 13), (4, 64), (8, 1000)]:
        stats: dict = {}
        got = read_safetensors(str(f), "cpu", threads=threads, chunk_bytes=chunk, layout=layout, stats=stats)
        _same(got, want)
        assert stats["bytes"] == sum(t.numel() * t.element_size() for t in want.values())
    # Each tensor its own storage (as load_file's), or views of one buffer per file.
    ptrs = {t.untyped_storage().data_ptr() for t in got.values() if t.numel()}
    assert len(ptrs) == (sum(1 for t in want.values() if t.numel()) if layout == "tensor" else 1)


def test_reader_reads_shards_as_load_file(tiny_model: Path, tmp_path: Path) -> None:
    cfg = transformers.AutoConfig.from_pretrained(tiny_model)
    torch.manual_seed(2)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path, max_shard_size="300KB")
    files = checkpoint_files(str(tmp_path)) or []
    assert len(files) > 2
    want: dict[str, torch.Tensor] = {}
    for x in files:
        want.update(load_file(x))
    _same(read_safetensors(files, "cpu", threads=3, chunk_bytes=100_000), want)


def _write_raw(path: Path, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + data)


def test_misaligned_tensor_is_copied_not_viewed(tmp_path: Path) -> None:
    # A hand-written file whose float32 starts at data byte 3: no float view of a byte buffer can start there.
    f = tmp_path / "m.safetensors"
    vals = torch.tensor([1.5, -2.0, 3.25])
    _write_raw(f, {"u8": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
                   "f32": {"dtype": "F32", "shape": [3], "data_offsets": [3, 15]}},
               bytes([7, 8, 9]) + vals.numpy().tobytes())
    want = load_file(f)
    assert torch.equal(want["f32"], vals)
    for layout in ("file", "tensor"):
        _same(read_safetensors(str(f), "cpu", threads=2, chunk_bytes=5, layout=layout), want)


def test_truncated_or_inconsistent_files_are_errors(tiny_model: Path, tmp_path: Path) -> None:
    f = tmp_path / "m.safetensors"
    save_file({"a": torch.arange(10.0), "b": torch.ones(3, dtype=torch.int64)}, f)
    whole = f.read_bytes()
    f.write_bytes(whole[:-5])  # the last tensor's bytes cut short
    with pytest.raises(CheckpointError, match="truncated: its tensors need 64 bytes of data, the file has 59"):
        read_safetensors(str(f), "cpu")
    f.write_bytes((10**6).to_bytes(8, "little") + whole[8:])  # a header length past the end
    with pytest.raises(CheckpointError, match="header of 1000000 bytes runs past the end"):
        read_safetensors(str(f), "cpu")
    _write_raw(f, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                   "b": {"dtype": "F32", "shape": [4], "data_offsets": [20, 36]}}, bytes(36))
    with pytest.raises(CheckpointError, match="b starts at data byte 20, the tensor before it ends at 16"):
        read_safetensors(str(f), "cpu")
    _write_raw(f, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, bytes(12))
    with pytest.raises(CheckpointError, match="hold 12 bytes, F32 \\[4\\] needs 16"):
        read_safetensors(str(f), "cpu")
    # A file that ends while being read (it shrank after its header was checked): an error, not a hang.
    f.write_bytes(bytes(5))
    fd = os.open(f, os.O_RDONLY)
    try:
        with pytest.raises(CheckpointError, match="ended at byte 5 while 5 more were to be read"):
            loading._pread_into(fd, bytearray(10), 0, str(f))
    finally:
        os.close(fd)
    # In a model folder the error stops the load (load_file would refuse the file too), no silent fallback.
    for x in tiny_model.iterdir():
        shutil.copy(x, tmp_path / x.name)
    (tmp_path / "model.safetensors").write_bytes((tiny_model / "model.safetensors").read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="truncated"):
        load_model(str(tmp_path), dtype=torch.float32, how="fast")


def test_reader_falls_back_to_load_file(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref, _ = load_model(str(tiny_model), dtype=torch.float32, how="hf")
    with monkeypatch.context() as m:
        # A dtype the reader does not know (here: float32, taken out of its table) is read by load_file, which says so.
        m.delitem(loading._ST_DTYPES, "F32")
        model, how = load_model(str(tiny_model), dtype=torch.float32, how="fast")
        assert how.startswith("safetensors (pread reader does not apply: ") and how.endswith(" has dtype F32)")
        assert torch.equal(_logits(model), _logits(ref))

    def refused(*a: object) -> int:
        raise OSError(14, "Bad address")

    # A read the system refuses (a read into pinned memory, say): load_file instead, and the reason.
    monkeypatch.setattr(loading.os, "preadv", refused)
    model, how = load_model(str(tiny_model), dtype=torch.float32, how="fast")
    assert how == "safetensors (pread reader failed: OSError: [Errno 14] Bad address)"
    assert torch.equal(_logits(model), _logits(ref))


def test_load_bench_smoke_on_cpu(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import load_bench

    out = tmp_path / "bench.json"
    load_bench.main([str(tiny_model), "--device", "cpu", "--threads", "1,3", "--chunk-mib", "1", "--repeats", "2",
                     "--unpinned", "--out", str(out)])
    stdout = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["equal"] is True and doc["bytes"] == (tiny_model / "model.safetensors").stat().st_size - doc["header_bytes"]
    rows = {(x["reader"], x.get("threads"), x.get("chunk_mib"), x.get("layout")): x for x in doc["rows"]}
    assert set(rows) == {("load_file", None, None, None), ("read", 1, 1, None), ("read", 3, 1, None),
                         *((r, t, 1, lay) for r, lay in [("pread", "tensor"), ("pread", "file"), ("pageable", "tensor")]
                           for t in (1, 3))}
    assert all(len(x["seconds"]) == 2 and x["gb_s"] > 0 for x in doc["rows"])
    assert all(x["equal"] for x in doc["rows"] if "equal" in x)
    assert "load_file" in stdout and "pread" in stdout and "DIFFERS" not in stdout
