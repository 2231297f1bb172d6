"""Speed of light: a measurement faster than the hardware allows is a measurement error or a cheat.

`benchmarks/gpu/sol.py` measures the host's ceilings (copy bandwidth, bf16 matrix rate) and the
model's shape (`model_numbers`), and floors InferenceBench A-C; `infergoal floors FILE` (or
`bench.floors`) stores that JSON on a run. Each trial is then held against floors recomputed here
from those ceilings for *its* scenarios' sizes (a scaled scenario gets its own floor), and only
when the recorded shape is the trial's model's (a 7B's floors never judge a tiny model):

* TTFT >= one prefill of the prompt (its FLOPs, and the weights read once);
* TPOT >= one decode step (the weights and the sequence's KV read once per token);
* output tok/s <= the burst ceiling (all prefills' FLOPs; one weight read per decode step).

The floors assume one token per weight read and every prompt token computed: speculative decoding
or prefix-cache hits on repeated prompts can legitimately cross them (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gates.result import GateResult
from gates.thresholds import section

__all__ = ["MODEL_KEYS", "REASON", "check", "floors", "limits", "model_numbers", "record_of", "throughput_ceiling",
           "tpot_floor_ms", "ttft_floor_ms"]

REASON = "faster than the hardware allows: measurement or cheat"
MODEL_KEYS = ("matmul_params", "weight_bytes", "layers", "d_attn", "kv_bytes_per_token")
"""The shape numbers `sol.py` records under `model`; all must equal the trial's model's."""


def model_numbers(cfg: Mapping[str, Any]) -> dict[str, float]:
    """Parameter count and per-token sizes of a Llama-family config (16-bit weights)."""
    d, f, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    h, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or d // h
    per_layer = d * (h * hd) + 2 * d * (kv * hd) + (h * hd) * d + 3 * d * f
    matmul_params = L * per_layer + v * d  # the LM head is a matmul; the embedding is a lookup
    weights = (matmul_params + v * d) * 2  # bf16/fp16 bytes, embedding included
    return {"matmul_params": matmul_params, "weight_bytes": weights, "layers": L, "d_attn": h * hd,
            "kv_bytes_per_token": 2 * L * kv * hd * 2}


def record_of(data: Any, source: str) -> dict[str, Any]:
    """What a run stores (`speed_of_light` event) from a sol.py JSON: its floors for the report, and the
    ceilings and model shape the check recomputes floors from. ValueError when it has no `floors`."""
    if not isinstance(data, Mapping) or not isinstance(data.get("floors"), Mapping):
        raise ValueError("no `floors` object; give the JSON benchmarks/gpu/sol.py --out wrote")
    return {"floors": dict(data["floors"]), "source": source,
            **{k: dict(data[k]) for k in ("ceilings", "model") if isinstance(data.get(k), Mapping)}}


def _prefill_flops(m: Mapping[str, float], prompt_tokens: int) -> float:
    P = prompt_tokens
    return 2 * m["matmul_params"] * P + 2 * m["layers"] * P * P * m["d_attn"]  # QK^T and PV: causal half of 4*L*P^2*d


def ttft_floor_ms(m: Mapping[str, float], ceil: Mapping[str, float], prompt_tokens: int) -> float:
    """One prefill of `prompt_tokens`: its FLOPs at the matrix rate, or the weights read once."""
    return 1000 * max(_prefill_flops(m, prompt_tokens) / ceil["bf16_flops_per_s"], m["weight_bytes"] / ceil["copy_bytes_per_s"])


def tpot_floor_ms(m: Mapping[str, float], ceil: Mapping[str, float], prompt_tokens: int, output_tokens: int) -> float:
    """One decode step at batch 1: the weights plus the sequence's KV (at its mid length) read once."""
    ctx = prompt_tokens + output_tokens / 2
    return 1000 * max((m["weight_bytes"] + ctx * m["kv_bytes_per_token"]) / ceil["copy_bytes_per_s"],
                      2 * m["matmul_params"] / ceil["bf16_flops_per_s"])


def throughput_ceiling(m: Mapping[str, float], ceil: Mapping[str, float], num_requests: int, prompt_tokens: int,
                       output_tokens: int) -> float:
    """Output tok/s of `num_requests` at once: every prefill's FLOPs, and `output_tokens` sequential
    decode steps that each read the weights (fewer at a time only takes longer)."""
    t = max(num_requests * _prefill_flops(m, prompt_tokens) / ceil["bf16_flops_per_s"],
            output_tokens * m["weight_bytes"] / ceil["copy_bytes_per_s"])
    return num_requests * output_tokens / t


def floors(scen: Mapping[str, Any], m: Mapping[str, float], ceil: Mapping[str, float]) -> dict[str, float]:
    """`sol.py`'s table: A's TTFT, B's TPOT, C's output tok/s, from its `[prefill]`, `[decode]`, `[throughput]`."""
    a, b, c = scen["prefill"], scen["decode"], scen["throughput"]
    return {"prefill_ttft_ms": ttft_floor_ms(m, ceil, a["prompt_tokens"]),
            "decode_tpot_ms": tpot_floor_ms(m, ceil, b["prompt_tokens"], b["output_tokens"]),
            "throughput_tok_s": throughput_ceiling(m, ceil, c["num_requests"], c["prompt_tokens"], c["output_tokens"])}


def limits(record: Any, model_cfg: Mapping[str, Any] | None, scenarios: Mapping[str, Any]) -> dict[str, dict[str, tuple[float, bool]]]:
    """scenario -> measured metric -> (floor, higher is better), for the trial's model and scenarios.

    `record`: what `infergoal floors` stored (`ceilings` and `model` as sol.py writes them).
    Empty when the record has no ceilings, or is for another model shape, or the model's config
    cannot be read: then nothing is checked. `scenarios`: name -> bench scenario (attributes or keys)."""
    if not isinstance(record, Mapping) or not model_cfg:
        return {}
    ceil, shape = record.get("ceilings"), record.get("model")
    if not isinstance(ceil, Mapping) or not isinstance(shape, Mapping):
        return {}
    try:
        m = model_numbers(model_cfg)
        if any(float(shape[k]) != float(m[k]) for k in MODEL_KEYS):
            return {}
        if float(ceil["copy_bytes_per_s"]) <= 0 or float(ceil["bf16_flops_per_s"]) <= 0:
            return {}
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return {}

    def get(s: Any, k: str) -> Any:
        return s.get(k) if isinstance(s, Mapping) else getattr(s, k, None)

    out: dict[str, dict[str, tuple[float, bool]]] = {}
    for name, s in scenarios.items():
        if get(s, "arrival") == "trace":  # prompt sizes come from the trace: no one shape to floor
            continue
        prompt, output, n = get(s, "prompt_tokens"), get(s, "output_tokens"), get(s, "num_requests")
        if not all(isinstance(x, int) and x > 0 for x in (prompt, output, n)):
            continue
        out[name] = {"ttft_ms_p50": (ttft_floor_ms(m, ceil, prompt), False),
                     "output_throughput": (throughput_ceiling(m, ceil, n, prompt, output), True)}
        if output > 1:  # one output token has no time per output token
            out[name]["tpot_ms_p50"] = (tpot_floor_ms(m, ceil, prompt, output), False)
    return out


def check(measured: Mapping[str, Mapping[str, float]], lims: Mapping[str, Mapping[str, tuple[float, bool]]], *,
          noise: float = 0.0, thresholds: dict[str, Any] | None = None) -> GateResult | None:
    """Fail when a measured value beats its floor by more than the margin; None when nothing had a floor.

    The margin is the measured noise (the baseline's relative spread between repeats) plus
    `[speed_of_light] slack` from the locked thresholds. "Beats by" is the speed-of-light ratio:
    floor / value for a latency, value / ceiling for a throughput; over 1 + margin fails."""
    slack = float(section(thresholds, "speed_of_light")["slack"])
    margin = max(0.0, noise) + slack
    rows, worst = [], None
    for scenario, metrics in lims.items():
        for metric, (floor, higher) in metrics.items():
            v = (measured.get(scenario) or {}).get(metric)
            if not isinstance(v, (int, float)) or v != v or floor <= 0:
                continue
            ratio = (v / floor) if higher else (floor / v if v > 0 else float("inf"))
            row = {"scenario": scenario, "metric": metric, "value": v, "floor": floor, "ratio": ratio}
            rows.append(row)
            if worst is None or ratio > worst["ratio"]:
                worst = row
    if worst is None:
        return None
    details = {"margin": margin, "noise": noise, "slack": slack, "checked": rows}
    unit = "tok/s" if worst["metric"] == "output_throughput" else "ms"
    # Short enough to survive `infergoal why`'s one line; the noise / slack split is in the details.
    said = (f"{worst['scenario']} {worst['metric']} {worst['value']:.4g} {unit}, floor {worst['floor']:.4g} {unit} "
            f"({worst['ratio']:.3g}x the speed of light; margin {margin:.1%})")
    if worst["ratio"] > 1 + margin:
        return GateResult("speed_of_light", "fail", f"{REASON}: {said}", details, 0.0)
    return GateResult("speed_of_light", "pass", f"within the hardware's floors; closest: {said}", details, 0.0)
