"""hfserve's fast model loading gives the same model as from_pretrained (tiny model, CPU)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "hfserve"))
from loading import checkpoint_files, load_model  # noqa: E402

IDS = torch.randint(4, 2000, (2, 37), generator=torch.Generator().manual_seed(0))


def _logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(IDS).logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_load_gives_from_pretrained_logits(tiny_model: Path, dtype: torch.dtype) -> None:
    fast, how = load_model(str(tiny_model), dtype=dtype, how="fast")
    ref, ref_how = load_model(str(tiny_model), dtype=dtype, how="hf")
    assert how == "safetensors" and ref_how == "from_pretrained"
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
    assert how == "safetensors"
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
