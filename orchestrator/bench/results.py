"""``ScenarioResult`` and its exports: our JSON, vLLM-style result JSON, AIPerf-style
``profile_export_aiperf.json`` and per-request JSONL."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .scenarios import Scenario
from .timeline import RequestRecord


def _clean(x: Any) -> Any:
    """JSON has no NaN/inf: map them to None."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclass
class ScenarioResult:
    """Outcome of one scenario run (measured requests only; warmup is never included)."""

    scenario: Scenario
    metrics: dict[str, float]
    requests: list[RequestRecord] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every measured request succeeded."""
        return self.metrics.get("failed", 0.0) == 0.0 and self.metrics.get("completed", 0.0) > 0

    def to_dict(self, *, with_requests: bool = True) -> dict[str, Any]:
        origin = int(self.meta.get("origin_ns", 0))
        d: dict[str, Any] = {
            "scenario": self.scenario.model_dump(),
            "metrics": {k: _clean(v) for k, v in self.metrics.items()},
            "failures": dict(self.failures),
            "meta": dict(self.meta),
        }
        if with_requests:
            d["requests"] = [r.to_dict(origin_ns=origin) for r in self.requests]
        return d

    def to_json(self, *, with_requests: bool = True, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(with_requests=with_requests), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScenarioResult:
        """Back from `to_dict`: request times, written relative to `meta.origin_ns`, absolute again (so a
        result read back, from a file or over SSH, exports and joins as the one measured)."""
        origin = int(d.get("meta", {}).get("origin_ns", 0) or 0)
        return cls(scenario=Scenario(**d["scenario"]),
                   metrics={k: (float("nan") if v is None else float(v)) for k, v in d["metrics"].items()},
                   requests=[RequestRecord.from_dict(r, origin_ns=origin) for r in d.get("requests", [])],
                   failures=dict(d.get("failures", {})), meta=dict(d.get("meta", {})))

    @classmethod
    def from_json(cls, s: str) -> ScenarioResult:
        return cls.from_dict(json.loads(s))


def to_vllm_json(res: ScenarioResult) -> dict[str, Any]:
    """Shape of ``vllm bench serve --save-result`` (times in seconds for lists, ms for stats)."""
    m, sc = res.metrics, res.scenario
    ok = [r for r in res.requests if r.success]
    out: dict[str, Any] = {
        "date": res.meta.get("date", ""),
        "backend": "openai-chat" if res.meta.get("api") == "chat" else "openai",
        "model_id": res.meta.get("model", ""),
        "num_prompts": sc.measured_requests,
        "request_rate": sc.rate if sc.rate is not None else "inf",
        "burstiness": sc.burstiness,
        "max_concurrency": sc.concurrency,
        "duration": m["duration_s"],
        "completed": int(m["completed"]),
        "failed": int(m["failed"]),
        "total_input_tokens": int(m["total_input_tokens"]),
        "total_output_tokens": int(m["total_output_tokens"]),
        "request_throughput": m["request_throughput"],
        "request_goodput": m["goodput"],
        "output_throughput": m["output_throughput"],
        "total_token_throughput": m["total_token_throughput"],
        "input_lens": [r.usage_prompt_tokens or r.prompt_tokens for r in ok],
        "output_lens": [r.osl for r in ok],
        "ttfts": [r.ttft_ns / 1e9 for r in ok if r.ttft_ns is not None],
        "itls": [[g / 1e9 for g in r.chunk_gaps_ns] for r in ok],
        "generated_texts": [r.text for r in ok],
        "errors": [r.error_detail or r.error for r in res.requests if not r.success],
    }
    for ours, theirs in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("itl_ms", "itl_ms"), ("e2e_ms", "e2el_ms")):
        out[f"mean_{theirs}"] = m[f"{ours}_mean"]
        out[f"median_{theirs}"] = m[f"{ours}_median"]
        out[f"std_{theirs}"] = m[f"{ours}_std"]
        for p in ("p90", "p95", "p99"):
            out[f"{p}_{theirs}"] = m[f"{ours}_{p}"]
    return out


_AIPERF = {  # AIPerf metric tag -> (our prefix, unit)
    "time_to_first_token": ("ttft_ms", "ms"),
    "time_to_first_output_token": ("ttft_ms", "ms"),
    "inter_token_latency": ("tpot_ms", "ms"),
    "inter_chunk_latency": ("itl_ms", "ms"),
    "request_latency": ("e2e_ms", "ms"),
}


def to_aiperf_json(res: ScenarioResult) -> dict[str, Any]:
    """Shape of AIPerf's ``profile_export_aiperf.json`` (metric tag → unit/avg/pXX/...)."""
    m = res.metrics
    d: dict[str, Any] = {}
    for tag, (pre, unit) in _AIPERF.items():
        d[tag] = {"unit": unit, "avg": m[f"{pre}_mean"], "min": m[f"{pre}_min"], "max": m[f"{pre}_max"],
                  "std": m[f"{pre}_std"], "p50": m[f"{pre}_p50"], "p90": m[f"{pre}_p90"],
                  "p95": m[f"{pre}_p95"], "p99": m[f"{pre}_p99"]}
    ok = [r for r in res.requests if r.success]
    osl = [float(r.osl) for r in ok]
    d["output_sequence_length"] = {"unit": "tokens", "avg": sum(osl) / len(osl) if osl else 0.0}
    d["output_token_throughput"] = {"unit": "tokens/sec", "avg": m["output_throughput_aiperf"]}
    d["request_throughput"] = {"unit": "requests/sec", "avg": m["request_throughput_aiperf"]}
    d["request_count"] = {"unit": "requests", "avg": m["completed"]}
    d["error_request_count"] = {"unit": "requests", "avg": m["failed"]}
    d["benchmark_duration"] = {"unit": "sec", "avg": m["duration_aiperf_s"]}
    d["error_summary"] = [{"error_details": {"type": k}, "count": v} for k, v in res.failures.items()]
    d["input_config"] = {"scenario": res.scenario.model_dump()}
    return d


def write_exports(res: ScenarioResult, out_dir: str | Path) -> dict[str, Path]:
    """Write all exports into ``out_dir``; returns name → path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = res.scenario.name
    paths = {
        "result": out / f"{name}.result.json",
        "vllm": out / f"{name}.vllm.json",
        "aiperf": out / name / "profile_export_aiperf.json",  # AIPerf's fixed file name, one dir per run
        "jsonl": out / f"{name}.requests.jsonl",
    }
    paths["aiperf"].parent.mkdir(parents=True, exist_ok=True)
    paths["result"].write_text(res.to_json(with_requests=False))
    paths["vllm"].write_text(json.dumps(to_vllm_json(res), indent=2))
    paths["aiperf"].write_text(json.dumps(to_aiperf_json(res), indent=2))
    origin = int(res.meta.get("origin_ns", 0))
    with paths["jsonl"].open("w") as f:
        for r in res.requests:
            f.write(json.dumps(r.to_dict(origin_ns=origin)) + "\n")
    return paths
