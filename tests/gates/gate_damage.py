"""Damaged copies of a model folder: the accuracy gate's negative cases.

Each function writes a complete Hugging Face folder (weights + config + tokenizer) that the real
example server loads like any checkpoint, so the damage is served exactly as a broken candidate
would serve it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)


def _load(src: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)


def drop_layer(src: Path, dst: Path, index: int = 1) -> Path:
    """Remove decoder layer ``index`` (num_hidden_layers - 1), renumbering the rest."""
    import torch

    model = _load(src)
    layers = [layer for i, layer in enumerate(model.model.layers) if i != index]
    for new_idx, layer in enumerate(layers):
        layer.self_attn.layer_idx = new_idx  # the KV cache is indexed by layer
    model.model.layers = torch.nn.ModuleList(layers)
    model.config.num_hidden_layers = len(layers)
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[: len(layers)]
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    _copy_tokenizer(src, dst)
    return dst


def quantize(src: Path, dst: Path, bits: int = 3) -> Path:
    """Round every matrix weight to ``bits`` bits (symmetric, per output row), kept in float32."""
    import torch

    model = _load(src)
    levels = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                scale = p.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / levels
                p.copy_(torch.round(p / scale).clamp(-levels, levels) * scale)
            del name
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    _copy_tokenizer(src, dst)
    return dst


def wrong_rope(src: Path, dst: Path, theta: float) -> Path:
    """Same weights, ``rope_theta`` changed in config.json (both config layouts handled)."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    cfg_path = dst / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if "rope_theta" in cfg:
        cfg["rope_theta"] = theta
    if isinstance(cfg.get("rope_parameters"), dict):
        cfg["rope_parameters"]["rope_theta"] = theta
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return dst
