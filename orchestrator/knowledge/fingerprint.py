"""Describe a run's setting (model, hardware, engine, workload) and score how alike two settings are.

A finding's `applies_to` keeps the exact names (`engine`, `model`, `hardware`, `workload`) and adds
descriptions (`model_desc`, `hardware_desc`, `engine_version`). Matching compares descriptions, so
a finding from model A reaches model B with a weight in [0, 1]: a prior, never a fact about B.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["describe_hardware", "describe_model", "hardware_key", "similarity", "workload_key", "workload_similarity"]

# Public spec-sheet numbers (SXM parts, dense): memory GB, HBM bandwidth GB/s. Used only to
# compare hardware classes; nothing here is a measurement.
GPU_SPECS: dict[str, tuple[float, float]] = {
    "A100": (80, 2039), "H100": (80, 3350), "H200": (141, 4800), "B200": (192, 8000), "L40S": (48, 864),
}


def workload_key(scenarios: list[str] | tuple[str, ...], scale: float) -> str:
    """`decode+throughput@1.0`: which scenarios, at which bench scale (order does not matter)."""
    return "+".join(sorted(scenarios)) + f"@{float(scale):g}"


def hardware_key(fp: dict[str, Any]) -> str:
    """The exact name a finding records: the first GPU's name, else `cpu-<arch>-<cores>c`."""
    gpus = fp.get("gpus") or []
    return gpus[0].split(",")[0].strip() if gpus else f"cpu-{fp.get('machine', '?')}-{fp.get('cpu_count', '?')}c"


def describe_hardware(fp: dict[str, Any]) -> dict[str, Any]:
    """Class (cpu | gpu), GPU class, memory and bandwidth, or CPU cores, from a host fingerprint."""
    gpus = fp.get("gpus") or []
    if not gpus:
        return {"class": "cpu", "machine": fp.get("machine"), "cpu_cores": fp.get("cpu_count")}
    name = gpus[0].split(",")[0].strip()
    gpu_class = next((c for c in GPU_SPECS if c in name.upper()), name)
    mem, bw = GPU_SPECS.get(gpu_class, (None, None))
    parts = gpus[0].split(",")
    if len(parts) > 1 and mem is None:  # nvidia-smi's "81559 MiB"
        try:
            mem = round(float(parts[1].split()[0]) / 1024, 1)
        except (ValueError, IndexError):
            pass
    return {"class": "gpu", "gpu": name, "gpu_class": gpu_class, "gpus": len(gpus), "memory_gb": mem, "bandwidth_gbs": bw}


def _param_count(c: dict[str, Any]) -> float | None:
    try:
        h, n, v, inter = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"]), int(c["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(c.get("num_attention_heads") or 1)
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or h // heads)
    attn = h * heads * hd * 2 + h * kv * hd * 2
    emb = v * h * (1 if c.get("tie_word_embeddings") else 2)
    return float(emb + n * (attn + 3 * h * inter))


def _from_config(name: str, c: dict[str, Any]) -> dict[str, Any]:
    heads = int(c.get("num_attention_heads") or 0) or None
    kv = int(c.get("num_key_value_heads") or heads or 0) or None
    attention = None if not (heads and kv) else ("mha" if kv == heads else "mqa" if kv == 1 else "gqa")
    params = _param_count(c)
    return {
        "name": name, "family": c.get("model_type"), "attention": attention, "kv_heads": kv,
        "head_dim": c.get("head_dim") or (int(c["hidden_size"]) // heads if heads and c.get("hidden_size") else None),
        "vocab": c.get("vocab_size"), "layers": c.get("num_hidden_layers"), "hidden": c.get("hidden_size"),
        "params_m": round(params / 1e6, 3) if params else None,
        "dtype": str(c.get("dtype") or c.get("torch_dtype") or "float32"),
    }


def describe_model(model: str, model_dir: Path | None = None) -> dict[str, Any]:
    """Family, architecture features, size and dtype from the model's config.json.

    `forge:<preset>` is described from the forge's preset table, so nothing is built here."""
    if model.startswith("forge:"):
        from orchestrator.models.forge import PRESETS

        p = PRESETS.get(model.split(":", 1)[1] or "tiny")
        if p is not None:
            return _from_config(model, {
                "model_type": "llama", "hidden_size": p.hidden_size, "num_hidden_layers": p.num_hidden_layers,
                "num_attention_heads": p.num_attention_heads, "num_key_value_heads": p.num_key_value_heads,
                "intermediate_size": p.intermediate_size, "vocab_size": p.vocab_size,
                # the dtype its weights are saved in: a GPU preset is built and trained in its gpu_dtype
                "dtype": p.gpu_dtype or "float32",
            })
    for d in (model_dir, Path(model)):
        if d is not None and (Path(d) / "config.json").is_file():
            try:
                return _from_config(model, json.loads((Path(d) / "config.json").read_text()))
            except (OSError, ValueError):
                break
    return {"name": model}


def _ratio_sim(a: float | None, b: float | None, decade: float = 0.5) -> float:
    """1 for equal values, `decade` for a factor of 10 apart (log scale), unknown -> 0.75."""
    if not a or not b:
        return 0.75
    return decade ** abs(math.log10(float(a) / float(b)))


def model_similarity(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float:
    if not a or not b:
        return 1.0 if a == b or not a else 0.5
    if a.get("name") and a.get("name") == b.get("name"):
        return 1.0
    if a.get("family") is None or b.get("family") is None:
        return 0.3  # a bare name we cannot describe: another model, nothing more is known
    family = 1.0 if a.get("family") == b.get("family") else 0.5
    attention = 1.0 if a.get("attention") == b.get("attention") else 0.7
    size = _ratio_sim(a.get("params_m"), b.get("params_m"))
    dtype = 1.0 if a.get("dtype") == b.get("dtype") else 0.8
    return round(0.3 * family + 0.2 * attention + 0.3 * size + 0.2 * dtype, 4)


def hardware_similarity(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float:
    if not a or not b:
        return 1.0 if not a else 0.5
    if a.get("class") != b.get("class"):
        return 0.1  # CPU findings say little about GPUs and the reverse
    if set(a) == {"class"} or set(b) == {"class"}:
        return 1.0  # "any GPU" / "any CPU": a class-wide entry
    if a.get("class") == "cpu":
        arch = 1.0 if a.get("machine") == b.get("machine") else 0.6
        return round(arch * _ratio_sim(a.get("cpu_cores"), b.get("cpu_cores"), decade=0.4), 4)
    if a.get("gpu_class") == b.get("gpu_class"):
        return 1.0
    mem = _ratio_sim(a.get("memory_gb"), b.get("memory_gb"), decade=0.3)
    bw = _ratio_sim(a.get("bandwidth_gbs"), b.get("bandwidth_gbs"), decade=0.3)
    return round(0.8 * (mem + bw) / 2, 4)


def workload_similarity(a: str | None, b: str | None) -> float:
    """Same key 1; same scenarios at another scale 0.8; otherwise the scenario overlap, discounted."""
    if not a or not b or a == "*" or a == b:
        return 1.0
    sa, _, ka = a.partition("@")
    sb, _, kb = b.partition("@")
    set_a, set_b = set(sa.split("+")), set(sb.split("+"))
    overlap = len(set_a & set_b) / len(set_a | set_b)
    scale = 1.0 if ka == kb else 0.8
    return round(scale * (1.0 if overlap == 1 else 0.6 * overlap), 4)


def similarity(applies_to: dict[str, Any], here: dict[str, Any]) -> float:
    """How well an entry's `applies_to` fits this run's setting `here` (same keys), in [0, 1].

    A product of per-part scores, so one strong mismatch (another engine, CPU vs GPU) dominates.
    A part the entry leaves unset or sets to `*` applies everywhere; a part `here` leaves unset
    (an agent asking without a model) is not compared."""
    eng = applies_to.get("engine")
    if eng not in (None, "*") and here.get("engine") and eng != here.get("engine"):
        return 0.0
    s = 1.0
    va, vb = applies_to.get("engine_version"), here.get("engine_version")
    if va and vb and va != vb:
        s *= 0.9
    if applies_to.get("model") not in (None, "*") and here.get("model"):
        if applies_to.get("model") != here.get("model"):
            # Findings written before descriptions existed name the model only: describe it now.
            s *= model_similarity(applies_to.get("model_desc") or describe_model(str(applies_to["model"])),
                                  here.get("model_desc") or describe_model(str(here["model"])))
    names_hw = applies_to.get("hardware") not in (None, "*") or bool(applies_to.get("hardware_desc"))
    if names_hw and here.get("hardware") and applies_to.get("hardware") != here.get("hardware"):
        s *= hardware_similarity(applies_to.get("hardware_desc") or {"class": _class_of(applies_to["hardware"])},
                                 here.get("hardware_desc") or {"class": _class_of(here.get("hardware"))})
    s *= workload_similarity(applies_to.get("workload"), here.get("workload"))
    return round(s, 4)


def _class_of(key: Any) -> str:
    return "cpu" if str(key or "").startswith("cpu-") else "gpu"
