"""Reuse at run start: rank prior findings by similarity, translate their knobs, avoid dead ends.

A finding measured on another model or host is a *prior* for this run, weighted by how alike the
two settings are (`fingerprint.similarity`). Only a few transferred knob sets are tried first, so a
wrong prior costs one or two trials before the search takes over.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.candidate import knob_key
from orchestrator.knowledge.entries import STATUS_RANK, Entry
from orchestrator.knowledge.fingerprint import similarity
from orchestrator.knowledge.slofindings import slo_findings

__all__ = ["MAX_TRANSFERRED", "MIN_SIMILARITY", "avoided", "for_goal", "prior_observations", "rank", "render_context",
           "translate", "warm_knobs", "weight_legend"]

# Below this a finding from another setting is not worth a trial; above it, at most
# MAX_TRANSFERRED transferred knob sets are enqueued (exact-setting findings are not capped).
MIN_SIMILARITY = 0.5
MAX_TRANSFERRED = 2
_STATUS_WEIGHT = {"confirmed": 1.0, "probable": 0.8, "hypothesis": 0.6, "refuted": 0.0}


def weight_legend() -> str:
    """What the weight `rank` gives an entry means, in one line (for `infergoal kb search`)."""
    trust = ", ".join(f"{k} {v:g}" for k, v in _STATUS_WEIGHT.items())
    return (f"[w] = fit of the entry's setting to this one (engine, model, hardware, workload; 1 = the same) "
            f"x trust in its status ({trust}); best first")


# Knobs whose good value grows with the KV-cache room per sequence (memory-bound engines on GPUs).
_MEMORY_SCALED = ("max_batch_size", "max_num_seqs", "max_running_requests", "max_batch_prefill_tokens")


def rank(entries: list[Entry], here: dict[str, Any], *, kind: str | None = None, min_sim: float = 0.0) -> list[tuple[float, Entry]]:
    """(weight, entry) best first: weight = similarity x status weight; refuted entries last."""
    out = []
    for e in entries:
        if kind and e.kind != kind:
            continue
        s = similarity(e.applies_to, here)
        if s < min_sim or s == 0.0:
            continue
        out.append((round(s * _STATUS_WEIGHT.get(e.status, 0.6), 4), s, e))
    out.sort(key=lambda x: (-x[0], -STATUS_RANK.get(x[2].status, 0), -float(x[2].meta.get("speedup", 1.0))))
    return [(w, e) for w, _, e in out]


def for_goal(findings: list[tuple[float, Entry]], slo: Any = None) -> list[tuple[float, Entry]]:
    """`findings` (from `rank`) ordered for the run's goal. For an SLO goal (`slo`: its `SloGoal`),
    the findings measured under a fitting SLO come first, weight x fit of their limits
    (`knowledge.slo.slo_findings`): what moved the rate under 300 ms TTFT is the best prior for a
    goal under 250 ms, better than a throughput winner at fixed concurrency. Other goals: unchanged."""
    if slo is None or slo.maximize is None:
        return findings
    picked = slo_findings(findings, slo)
    ids = {e.id for _, e in picked}
    return [*picked, *((w, e) for w, e in findings if e.id not in ids)]


def _kv_bytes_per_token(desc: dict[str, Any]) -> float | None:
    try:
        return float(desc["layers"]) * float(desc["kv_heads"]) * float(desc["head_dim"])
    except (KeyError, TypeError):
        return None


def translate(knobs: dict[str, Any], src: dict[str, Any], here: dict[str, Any]) -> dict[str, Any]:
    """Scale batch-size-like knobs by the KV-cache room ratio when both runs are on GPUs.

    On a CPU the forward pass, not memory, bounds the batch, so knobs transfer unchanged."""
    hs, hh = src.get("hardware_desc") or {}, here.get("hardware_desc") or {}
    if hs.get("class") != "gpu" or hh.get("class") != "gpu":
        return dict(knobs)
    ks, kh = _kv_bytes_per_token(src.get("model_desc") or {}), _kv_bytes_per_token(here.get("model_desc") or {})
    ms, mh = hs.get("memory_gb"), hh.get("memory_gb")
    if not (ks and kh and ms and mh):
        return dict(knobs)
    factor = (mh / ms) * (ks / kh)
    out = dict(knobs)
    for k in _MEMORY_SCALED:
        if isinstance(out.get(k), int) and not isinstance(out.get(k), bool):
            out[k] = max(1, int(round(out[k] * factor)))
    return out


def avoided(constraints: list[tuple[float, Entry]], min_weight: float = 0.5,
            won: list[tuple[float, Entry]] = ()) -> dict[str, list[Any]]:
    """knob -> values that failed or never paid off on a similar enough setting.

    A value that is part of a winning knob set on an at least as similar setting is not avoided:
    it failed alone (or with other knobs) but won in that combination."""
    out: dict[str, list[Any]] = {}
    for w, e in constraints:
        if w < min_weight:
            continue
        for a in e.meta.get("avoid") or []:
            if any(fw >= w and (f.meta.get("knobs") or {}).get(a["knob"]) == a["value"] and f.status != "refuted"
                   for fw, f in won):
                continue
            vals = out.setdefault(str(a["knob"]), [])
            if a["value"] not in vals:
                vals.append(a["value"])
    return out


def warm_knobs(findings: list[tuple[float, Entry]], here: dict[str, Any], avoid: dict[str, list[Any]]) -> list[tuple[float, Entry, dict[str, Any]]]:
    """Knob sets to try first: exact-setting findings, then up to MAX_TRANSFERRED translated priors."""
    out: list[tuple[float, Entry, dict[str, Any]]] = []
    seen: set[str] = set()
    transferred = 0
    for w, e in findings:
        sim = similarity(e.applies_to, here)
        if not e.meta.get("knobs") or e.status == "refuted" or sim < MIN_SIMILARITY:
            continue
        exact = sim >= 0.999
        if not exact and transferred >= MAX_TRANSFERRED:
            continue
        knobs = translate(dict(e.meta["knobs"]), e.applies_to, here)
        if any(knobs.get(k) in vals for k, vals in avoid.items()):
            continue
        if knob_key(knobs) in seen:
            continue
        seen.add(knob_key(knobs))
        transferred += 0 if exact else 1
        out.append((w, e, knobs))
    return out


def prior_observations(findings: list[tuple[float, Entry]], here: dict[str, Any]) -> list[dict[str, Any]]:
    """The knob sets a similar setting's run measured, with their scores, for the search's model.

    Not facts about this run: the search proposer uses them as pseudo-observations only until the
    run has enough of its own, and drops them once the transferred winner loses here
    (`SearchProposer`). Each carries the finding's weight; a knob set seen twice keeps the higher.
    A finding's probes (its winner's one-knob neighbours) come marked `probe`, with the winner
    itself marked `probe` and `winner` (an observation is listed under one source only, the most
    similar, and the swaps need each source's own winner): the proposer ranks swaps with them and
    keeps them out of its model."""
    out: dict[str, dict[str, Any]] = {}
    probes: list[dict[str, Any]] = []
    for w, e in findings:
        if e.status == "refuted" or similarity(e.applies_to, here) < MIN_SIMILARITY:
            continue
        for o in e.meta.get("observations") or []:
            knobs = translate(dict(o["knobs"]), e.applies_to, here)
            k = knob_key(knobs)
            if k not in out or out[k]["weight"] < w:
                out[k] = {"knobs": knobs, "score": float(o["score"]), "weight": w, "entry": e.id}
        if e.meta.get("probes") and e.meta.get("knobs"):  # the winner and its one-knob neighbours, measured in one run
            win = {knob_key(o["knobs"]): float(o["score"]) for o in e.meta.get("observations") or []}.get(
                knob_key(e.meta["knobs"]), float(e.meta.get("speedup") or 0.0))
            probes.append({"knobs": translate(dict(e.meta["knobs"]), e.applies_to, here), "score": win, "weight": w,
                           "entry": e.id, "probe": True, "winner": True})
            probes += [{"knobs": translate(dict(p["knobs"]), e.applies_to, here), "score": float(p["score"]), "weight": w,
                        "entry": e.id, "probe": True} for p in e.meta["probes"]]
    return [*out.values(), *probes]


def render_context(ranked: list[tuple[float, Entry]], here: dict[str, Any], limit: int) -> str:
    """Markdown digest for an agent: exact entries as they are, transferred ones marked as priors."""
    parts = []
    for _w, e in ranked[:limit]:
        s = similarity(e.applies_to, here)
        a = e.applies_to
        if s >= 0.999 or e.kind in ("contract", "playbook"):
            head = f"## {e.title} ({e.kind}, {e.status})"
        else:
            head = (f"## {e.title} ({e.kind}, {e.status}; PRIOR from model {a.get('model', '*')} on "
                    f"{a.get('hardware', '*')}, similarity {s:.2f}: verify here before relying on it)")
        parts.append(f"{head}\n{e.body.strip()}")
    return "\n\n".join(parts)
