"""GPUs per trial: which knobs spread one server over several GPUs, and the rules that refuse a
knob set the hardware or the model cannot take, before it is launched.

A target file's `[parallel]` table names the engine's knobs:

    [parallel]
    tensor = "tensor_parallel_size"      # GPUs one replica's weights are split over
    data = "data_parallel_size"          # replicas, each on its own GPUs
    memory_fraction = "gpu_memory_utilization"   # share of each card the engine may take
    context_tokens = 8192                # the launch's max model length: KV one sequence needs

A trial then needs tensor x data GPUs (one without `[parallel]`: one GPU, as the example engine
serves). `check_fit` refuses, each in one line naming the knobs: more GPUs than the host has; a
tensor size that does not split the model's attention heads or its KV heads (vLLM's and SGLang's
rule: the KV heads divided by it, or a multiple of them, each replicated); weights plus the KV of
one full-context sequence over the card's memory share.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.targets.base import ConstraintViolated, Target, TargetError

__all__ = ["ModelShape", "Parallel", "check_fit", "check_parallel", "gpus_needed"]

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
GIB = 1024**3


class Parallel(BaseModel):
    """A target file's `[parallel]`: the knobs that spread a server over GPUs (see the module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tensor: str = ""
    """The knob splitting one replica's weights and heads over GPUs (`--tensor-parallel-size`, `--tp-size`)."""
    data: str = ""
    """The knob running replicas, each on its own GPUs (`--data-parallel-size`, `--dp-size`)."""
    memory_fraction: str = ""
    """The knob giving the share of each card's memory the engine may take (`--gpu-memory-utilization`)."""
    context_tokens: int = Field(0, ge=0)
    """Tokens one sequence's KV must hold (the launch's max model length); 0: the KV is not counted."""


def check_parallel(target: Target, parallel: Parallel, where: str) -> None:
    """Load-time: the knobs `[parallel]` names exist and are numbers."""
    for field in ("tensor", "data", "memory_fraction"):
        name = getattr(parallel, field)
        if not name:
            continue
        knob = target.knobs.get(name)
        if knob is None:
            raise TargetError(f"{where}: parallel.{field} names {name!r}, which is not a knob of this target")
        values = knob.choices if knob.type == "categorical" else (knob.low, knob.high)
        if knob.type == "bool" or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values or ()):
            raise TargetError(f"{where}: parallel.{field}: knob {name!r} must take numbers")


def _size(knobs: dict[str, Any], name: str) -> int:
    v = knobs.get(name) if name else None
    return int(v) if v is not None else 1


def gpus_needed(target: Any, knobs: dict[str, Any]) -> int:
    """GPUs one trial of these knobs needs: tensor x data (1 for an engine without `[parallel]`)."""
    sub, own = target.resolve(knobs)
    p: Parallel = sub.parallel
    return max(_size(own, p.tensor) * _size(own, p.data), 1)


@dataclass(frozen=True)
class ModelShape:
    """What the rules read of a model: heads, KV heads, layers, head size, weight bytes."""

    heads: int
    kv_heads: int
    layers: int
    head_dim: int
    weight_bytes: int

    @classmethod
    def read(cls, model_dir: str | Path) -> ModelShape | None:
        """From the model folder's config.json and weight files; None when there is no config.json."""
        d = Path(model_dir)
        try:
            c = json.loads((d / "config.json").read_text())
        except (OSError, ValueError):
            return None
        c = c.get("text_config") or c  # a multimodal model: its language model's shape
        try:
            heads = int(c["num_attention_heads"])
            layers = int(c["num_hidden_layers"])
            hidden = int(c.get("hidden_size") or 0)
        except (KeyError, TypeError, ValueError):
            return None
        kv = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or (hidden // heads if heads else 0))
        weights = sum(f.stat().st_size for f in d.iterdir() if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES))
        return cls(heads=heads, kv_heads=kv, layers=layers, head_dim=head_dim, weight_bytes=weights)

    def kv_bytes(self, tokens: int, tensor: int, dtype_bytes: int = 2) -> int:
        """KV cache bytes one GPU holds for `tokens` tokens at tensor size `tensor` (KV heads split, or replicated)."""
        per_gpu = max(math.ceil(self.kv_heads / tensor), 1)
        return 2 * self.layers * per_gpu * self.head_dim * dtype_bytes * tokens


def check_fit(target: Any, knobs: dict[str, Any], *, gpus_on_host: int, shape: ModelShape | None = None,
              gpu_memory_bytes: int | None = None) -> None:
    """Raise `ConstraintViolated` (one line) when these knobs cannot start on this host with this model.

    `gpus_on_host`: the GPUs the run may use (at least 1: a CPU host serves one replica);
    `shape` None skips the model's rules; `gpu_memory_bytes` None (unknown, or simulated GPUs)
    skips the memory rule, as does a target without `[parallel]`."""
    sub, own = target.resolve(knobs)
    p: Parallel = sub.parallel
    tp, dp = _size(own, p.tensor), _size(own, p.data)
    named = " x ".join(f"{k}={own[k]}" for k in (p.tensor, p.data) if k and k in own) or "one replica"
    if tp * dp > max(gpus_on_host, 1):
        raise ConstraintViolated(f"{named} needs {tp * dp} GPUs; the host has {max(gpus_on_host, 1)} for this run")
    if shape is None:
        return
    if shape.heads % tp:
        raise ConstraintViolated(f"{p.tensor}={tp} does not divide the model's {shape.heads} attention heads")
    if shape.kv_heads % tp and tp % shape.kv_heads:
        raise ConstraintViolated(f"{p.tensor}={tp} neither divides the model's {shape.kv_heads} KV heads nor is a "
                                 f"multiple of them")
    if gpu_memory_bytes is None or not (p.tensor or p.data or p.memory_fraction):
        return  # the card unknown, or an engine that did not say how it spreads over GPUs
    fraction = float(own.get(p.memory_fraction) or 0.9) if p.memory_fraction else 0.9
    dtype = str(own.get("dtype", "auto"))
    kv = shape.kv_bytes(p.context_tokens, tp, _DTYPE_BYTES.get(dtype, 2)) if p.context_tokens else 0
    need = shape.weight_bytes / tp + kv
    room = gpu_memory_bytes * fraction
    if need > room:
        kv_words = f" + KV of one {p.context_tokens}-token sequence {kv / GIB:.1f} GiB" if kv else ""
        raise ConstraintViolated(f"{named} needs {need / GIB:.1f} GiB per GPU (weights {shape.weight_bytes / tp / GIB:.1f} "
                                 f"GiB{kv_words}); {fraction:g} of a {gpu_memory_bytes / GIB:.0f} GiB card is {room / GIB:.1f} GiB")
