"""A trial's checks of its server beside the speed: the integrity and accuracy gates (`run_gates`), the
bench audit of the measured requests (`bench_audit`, `audit_samples`), and the measured requests kept for
later launches' cross-launch probe (`remember_request`, `seen_requests`)."""

from __future__ import annotations

import random
from typing import Any

from orchestrator.core.candidate import Candidate
from orchestrator.core.roles import BASELINES
from orchestrator.hosts import Proc
from orchestrator.hosts.site import Site
from orchestrator.trial.context import TrialContext

__all__ = ["SEEN", "SEEN_MIN_OUTPUT", "accuracy_reference", "audit_samples", "bench_audit", "remember_request",
           "run_gates", "seen_requests"]


def run_gates(
    ctx: TrialContext, site: Site, trial: Any, candidate: Candidate, base_url: str, port: int, proc: Proc,
    caps: dict[str, Any] | None = None,
) -> tuple[str | None, bool, float | None]:
    """Integrity first (cheap), then accuracy. Return (rejection reason or None, accuracy drifted,
    the accuracy gate's off-top margin for this server, None when it did not run)."""
    if ctx.integrity_gate:
        diff_text = _diff(ctx, candidate.commit)
        r = site.integrity(
            base_url,
            served_model=ctx.target.served_model_name,
            tokenizer_dir=str(ctx.model_dir),
            launched_pids=ctx.host.group_pids(proc),
            listening_pids=ctx.host.listening_pids(port),
            diff_text=diff_text,
            capabilities=caps,
            seen=seen_requests(ctx.store, ctx.run_id, trial, capabilities=caps),
        )
        ctx.store.add_gate_result(trial.id, r.gate, r.status, r.reason, r.details, r.duration_s)
        if r.status == "fail":
            return f"integrity gate: {r.reason}", False, None
    if ctx.accuracy_gate:
        r = site.accuracy(base_url, served_model=ctx.target.served_model_name, reference_model_dir=str(ctx.reference_dir),
                          chat=ctx.target.api == "chat", capabilities=caps, **accuracy_reference(ctx.store, ctx.run_id, trial))
        ctx.store.add_gate_result(trial.id, r.gate, r.status, r.reason, r.details, r.duration_s)
        if r.status == "fail":
            return f"accuracy gate: {r.reason}", False, None
        margin = (r.details.get("metrics") or {}).get("gen_margin")
        return None, r.status == "drift", float(margin) if margin is not None else None
    return None, False, None


def accuracy_reference(store: Any, run_id: int, trial: Any) -> dict[str, Any]:
    """What the accuracy gate judges `trial`'s drift against (`gates.accuracy.judge`).

    A baseline measurement (trial #0, a sentinel) is the reference itself; any other trial is
    judged against the metrics every kept baseline measurement of the run recorded from its own
    accuracy gate (read back from the store: the gate's results are the one record of them)."""
    if trial.number == 0 or trial.proposer in BASELINES:
        return {"is_baseline": True}
    runs = [(g.details or {}).get("metrics") for t in store.list_trials(run_id)
            if (t.number == 0 or t.proposer in BASELINES) and t.status == "kept"
            for g in store.gate_results(t.id) if g.gate == "accuracy" and g.status != "fail"]
    return {"baseline": [m for m in runs if m]}



def audit_samples(outputs: list[tuple[Any, list[Any]]], tokenizer: Any, n: int, min_tokens: int) -> list[dict[str, Any]]:
    """Up to `n` measured requests to audit, drawn at random, concurrent scenarios first.

    `outputs`: (scenario, its measured requests) per measurement. A request qualifies when it
    returned at least `min_tokens` token ids, one for every token counted, and its prompt went out as ids, which the scenario's
    seeded prompt factory gives back exactly (a text or trace prompt does not qualify)."""
    from orchestrator.bench.prompts import PromptFactory, load_tokenizer

    tok = load_tokenizer(tokenizer)
    if tok is None:
        return []
    pools: list[tuple[int, list[dict[str, Any]]]] = []
    for scenario, requests in outputs:
        if scenario.arrival == "trace":
            continue
        factory = PromptFactory(scenario, tok)
        pool = []
        for rec in requests:
            # Every counted token came back as an id (an event without ids leaves the list short).
            if not rec.success or len(rec.output_ids) < min_tokens or len(rec.output_ids) != rec.client_tokens:
                continue
            prompt = factory.make(rec.index).prompt
            if not isinstance(prompt, list) or rec.usage_prompt_tokens not in (None, len(prompt)):
                continue
            pool.append({"scenario": scenario.name, "index": rec.index, "prompt_ids": prompt, "output_ids": list(rec.output_ids)})
        if pool:
            pools.append((scenario.concurrency, pool))
    pools.sort(key=lambda p: -p[0])  # the batched path first: that is where a server can differ
    # Drawn with a secret seed: a fixed choice (the first requests, say) would tell a server which
    # prompts to answer honestly.
    rng = random.SystemRandom()
    picked: list[dict[str, Any]] = []
    for i, (_, pool) in enumerate(pools):
        share = -(-(n - len(picked)) // (len(pools) - i))  # what is left, split over the pools left
        picked += rng.sample(pool, min(share, len(pool)))
    return picked[:n]


SEEN = "integrity.seen"
"""The event kind of a measured request kept for later launches' cross-launch probe (`remember_request`)."""
SEEN_MIN_OUTPUT = 8
"""Fewest output tokens of a request kept for the cross-launch probe: decode must dominate its time, so an
honest prefix cache kept across launches (it saves the prefill) stays inside the probe's ratio."""


def remember_request(ctx: TrialContext, trial: Any, outputs: list[tuple[Any, list[Any]]], caps: dict[str, Any] | None) -> None:
    """Keep one of `trial`'s measured requests in the store (a `SEEN` event): the body the bench sent, as
    the bench sent it, for a later launch's integrity gate to send again (`seen_requests`). The most
    decode-heavy one of at least `SEEN_MIN_OUTPUT` output tokens; none when no request qualifies."""
    from gates.api import ApiMode
    from orchestrator.bench.loadgen import build_payload
    from orchestrator.bench.prompts import PromptFactory, load_tokenizer

    mode = ApiMode.of(caps)
    best = max(((sc, r) for sc, reqs in outputs if sc.arrival != "trace" for r in reqs
                if r.success and r.output_tokens >= SEEN_MIN_OUTPUT),
               key=lambda x: x[1].output_tokens / max(x[1].prompt_tokens, 1), default=None)
    if best is None:
        return
    sc, rec = best
    prompt = PromptFactory(sc, load_tokenizer(ctx.tokenizer), text=ctx.target.api == "chat" or not mode.prompt_ids).make(rec.index)
    # Every field the bench may send: a later launch's engine (an engine knob) gets the ones it takes (`seen_requests`).
    body = build_payload(ctx.target.api, ctx.target.served_model_name, prompt)
    e2e = rec.e2e_ns / 1e9 if rec.e2e_ns is not None else None
    ctx.store.add_event(ctx.run_id, SEEN, f"#{trial.number}: request {rec.index} of {sc.name} kept for later launches' cross-launch probe",
                        data={"trial": trial.number, "scenario": sc.name, "index": rec.index, "e2e_s": e2e, "body": body},
                        trial_id=trial.id)


def seen_requests(store: Any, run_id: int, trial: Any, n: int = 4, capabilities: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Up to `n` requests earlier launches of the run answered (`remember_request`), one per launch, those of
    the launches most like `trial`'s first (its commit, then the most knobs alike, then the newest): a cache
    kept across launches is most likely shared by launches of the same code and knobs. Each body is sent as
    the bench would send it to `trial`'s engine (`capabilities`: the fields it refuses left out); a prompt of
    ids to an engine that takes only text is not sent."""
    from gates.api import ApiMode

    mode = ApiMode.of(capabilities)
    kept = {e.trial_id: e.data for e in store.events(run_id, kind=SEEN) if e.trial_id != trial.id and isinstance(e.data, dict)
            and (mode.prompt_ids or not isinstance(e.data["body"].get("prompt"), list))}
    knobs = trial.knobs or {}

    def alike(tid: int) -> tuple[bool, int, int]:
        t = store.get_trial(tid)
        return (t.commit == trial.commit, sum(1 for k, v in (t.knobs or {}).items() if knobs.get(k) == v), t.number)

    return [{"body": mode.body(kept[tid]["body"]), "trial": kept[tid]["trial"]} for tid in sorted(kept, key=alike, reverse=True)[:n]]


def bench_audit(ctx: TrialContext, site: Site, trial: Any, outputs: list[tuple[Any, list[Any]]], margin: float) -> str | None:
    """Score a sample of the measured requests' outputs (`TrialBench.outputs`) with the reference; a rejection or None."""
    from gates.thresholds import load_thresholds

    cfg = load_thresholds()["accuracy"]["audit"]
    samples = audit_samples(outputs, ctx.tokenizer, int(cfg["requests"]), int(cfg["min_output_tokens"]))
    r = site.audit(samples=samples, reference_model_dir=str(ctx.reference_dir), margin=margin)
    ctx.store.add_gate_result(trial.id, r.gate, r.status, r.reason, r.details, r.duration_s)
    return f"bench audit: {r.reason}" if r.status == "fail" else None


def _diff(ctx: TrialContext, commit: str | None) -> str | None:
    if not commit or commit == ctx.base_commit or not ctx.base_commit:
        return None
    import git

    return git.Repo(ctx.source_dir, search_parent_directories=True).git.diff(ctx.base_commit, commit)

