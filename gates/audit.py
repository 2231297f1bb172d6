"""The bench audit: what the server generated under the measured load, scored by the reference.

The accuracy gate judges the server on its own probes, before the bench. A server can tell those
probes apart from the bench's requests (their prompts are 33 ids of held-out text, the bench's
are longer runs of random ids; they arrive before the load) and be honest only for them: it then
passes every gate and is measured on a broken or cheaper decode path. The audit closes that: after
the bench, a sample of the very requests that were measured, generated under the measured
concurrency, is scored teacher-forced by the float32 reference, exactly as the generation check
scores its probes (`gates.generation`), with the same off-top margin (the one the accuracy gate
derived from this server's own noise) and the same hard limits.

Only requests with at least ``min_output_tokens`` generated tokens are sampled (one off-top token
in a 4-token answer says nothing about a rate); the caller picks them evenly over the scenarios it
measured, concurrent ones first.

Calibrated on the forge's tiny model, the bench's random-id prompts (throughput 128/32 at c=8 and
decode 32/64, 16 prompts each): fp32, bf16, batched fp32 and bf16, and the manual sdpa loop in
bf16 left 0 off-top tokens at margin 0.05 (largest gap 0.033, `tests/gates/README.md`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gates.reference import score_many
from gates.result import GateResult
from gates.thresholds import section

__all__ = ["check"]


def check(
    samples: Sequence[Mapping[str, Any]],
    *,
    reference_model_dir: Path | str,
    margin: float,
    thresholds: Mapping[str, Any] | None = None,
) -> GateResult:
    """Score ``samples`` ({scenario, index, prompt_ids, output_ids}) against the reference.

    ``prompt_ids`` are the ids the server saw (sent as ids; no BOS added), ``output_ids`` the ids it
    returned. Returns ``fail`` over a hard limit of ``gen_offtop_rate`` / ``gen_offtop_worst``,
    else ``pass``; with no sample, ``pass`` saying nothing was audited.
    """
    from gates.accuracy import load_reference  # noqa: PLC0415 - the heavy import only when auditing

    start = time.perf_counter()
    cfg = section(dict(thresholds) if thresholds is not None else None, "accuracy")
    hard = cfg["hard"]
    details: dict[str, Any] = {"margin": margin, "requests": []}

    def done(status: str, reason: str) -> GateResult:
        return GateResult("audit", status, reason, details, time.perf_counter() - start)  # type: ignore[arg-type]

    if not samples:
        details["metrics"] = {"audit_requests": 0.0}
        return done("pass", "nothing to audit: no measured request returned enough token ids for an id prompt "
                            "(an engine without token ids, or outputs too short)")
    model, _ = load_reference(reference_model_dir)
    total = offtop = 0
    worst = 0.0
    # One batched forward per (prompt, output) length; a pair scored in an earlier trial (the bench's
    # prompts are the same every trial, an honest greedy server answers them the same) is not redone.
    scores = score_many(model, [(list(s["prompt_ids"]), list(s["output_ids"])) for s in samples])
    for s, (gaps, nll) in zip(samples, scores, strict=True):
        n_off = sum(g > margin for g in gaps)
        total, offtop, worst = total + len(gaps), offtop + n_off, max(worst, n_off / len(gaps))
        details["requests"].append({"scenario": s["scenario"], "index": s["index"], "tokens": len(gaps),
                                    "offtop": n_off, "gaps": sorted(round(g, 3) for g in gaps if g > margin),
                                    "nll": nll})
    metrics = {"audit_requests": float(len(samples)), "audit_offtop_rate": offtop / total,
               "audit_offtop_worst": worst, "audit_margin": margin}
    details["metrics"] = metrics
    over = [f"{m}={metrics[m]:.4g} > {hard[lim]:g}" for m, lim in
            (("audit_offtop_rate", "gen_offtop_rate"), ("audit_offtop_worst", "gen_offtop_worst")) if metrics[m] > hard[lim]]
    if over:
        return done("fail", "the measured requests' outputs left the reference: " + "; ".join(over)
                    + " (the gate's own probes passed: a server honest only for them)")
    return done("pass", f"{len(samples)} measured requests, off-top {metrics['audit_offtop_rate']:.3f}")
