"""Accuracy gate: teacher-forced log-probabilities of the served model vs a float32 reference.

For each gate run a secret seed (``secrets.randbits``; only its hash is recorded) draws fresh
windows of held-out text from ``gates/data/``. Each window's token ids are sent as a list (so the
server cannot tokenize differently) to ``/v1/completions`` with ``echo: true, logprobs: K,
max_tokens: 0, return_tokens_as_token_ids: true``; the server returns, for every prompt position,
the log-probability of the actual token and its top-K alternatives. The same ids go through the
reference model (the same weights in float32, loaded locally with transformers). Metrics:

* ``kl_mean`` / ``kl_max`` - per-position KL(reference || served), coarse-grained (see :func:`coarse_kl`).
* ``containment_fail_rate`` - positions where the greedy tokens differ and either greedy token is
  missing from the other side's top-K (the check vLLM's ``check_logprobs_close`` makes); a
  rounding-level difference swaps near-ties *inside* the top-K, real damage does not.
* ``greedy_mismatch_rate`` - positions whose greedy tokens differ at all (soft signal only).
* ``mean_abs_dlogprob`` - mean |served - reference| log-probability of the actual tokens.
* ``ppl_log_ratio`` - |ln(perplexity served / perplexity reference)| on the windows.

Then the generation check (:mod:`gates.generation`) judges what the server generates: greedy
continuations of fresh equal-length prompts, sent concurrently and one at a time, each scored by
the reference; its ``gen_*`` metrics join the ones above.

An engine that returns no ``echo`` prompt logprobs (``transformers serve``) is judged by the
generation check alone, which needs only the text it generates (:mod:`gates.api`); the metrics
that check cannot measure are listed in ``details["not_measured"]`` and the reason says so.

Any metric above its hard limit -> ``fail``; above its soft limit only -> ``drift`` (the controller
marks the trial needs_approval); else ``pass``. Limits live in ``gates/thresholds.toml``.

The soft limits say "measurably different from the reference", and the baseline engine itself may
be that already: a bf16 7B on a GPU errs ~0.02 nats against the float32 reference, above limits
calibrated on the tiny model. "Without accuracy loss" means no worse than the baseline, so a
candidate's soft limits are raised to what the baseline itself measured (``baseline``: its gate
runs' metrics, the worst of them, times ``1 + [accuracy.baseline] tolerance`` for the window draw's
noise); a baseline measurement is the reference for that, never drift against itself. The hard
limits stay absolute.
"""

from __future__ import annotations

import hashlib
import math
import random
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gates._http import GateHTTPError, post_json
from gates.api import ApiMode
from gates.generation import GenerationError, check_generation, draw_probes
from gates.result import GateResult
from gates.thresholds import section

__all__ = ["DATA_DIR", "check", "coarse_kl", "draw_windows", "judge", "load_reference", "soft_limits"]

DATA_DIR = Path(__file__).with_name("data")
_REF_LOCK = threading.Lock()
_REF_CACHE: dict[str, tuple[Any, Any]] = {}
_HELDOUT_CACHE: dict[int, list[int]] = {}
_EPS = 1e-9
_BATCH = 8  # windows per batched reference forward (8 x 97 positions x a 32 k vocab: ~100 MB of fp32 logits)


def load_reference(model_dir: Path | str) -> tuple[Any, Any]:
    """(model, tokenizer) for ``model_dir`` in float32, loaded once per process and dir.

    On the first CUDA GPU when there is one (a 7B reference would take minutes per window on a
    CPU), else on the CPU; float32 either way, TF32 off (torch's default for matmuls)."""
    key = str(Path(model_dir).resolve())
    with _REF_LOCK:
        if key not in _REF_CACHE:
            import torch  # heavy imports only when the gate actually runs
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(key)
            extra = {"device_map": "cuda"} if torch.cuda.is_available() else {}
            model = AutoModelForCausalLM.from_pretrained(key, dtype=torch.float32, **extra)
            model.eval()
            _REF_CACHE[key] = (model, tok)
        return _REF_CACHE[key]


def _heldout_ids(tokenizer: Any) -> list[int]:
    """The held-out text's ids, tokenized once per tokenizer object (the data is locked)."""
    key = id(tokenizer)
    if key not in _HELDOUT_CACHE:
        text = "\n\n".join(p.read_text() for p in sorted(DATA_DIR.glob("*.txt")))
        _HELDOUT_CACHE[key] = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return _HELDOUT_CACHE[key]


def draw_windows(ids: list[int], rng: random.Random, count: int, length: int) -> list[list[int]]:
    """``count`` windows of ``length`` consecutive ids at random offsets (overlap allowed)."""
    if len(ids) <= length:
        raise ValueError(f"held-out text has {len(ids)} tokens, fewer than the window of {length}")
    return [ids[s:s + length] for s in (rng.randrange(0, len(ids) - length) for _ in range(count))]


def coarse_kl(ref_logprobs: Any, served: Mapping[int, float]) -> float:
    """KL(reference || served) over the coarse-grained outcome space S + {other}.

    The server gives only its top-K log-probabilities (plus the actual token's), not the full
    distribution. So the vocabulary is partitioned into the ids S the server reported, each its own
    outcome, and one "other" bucket holding the remaining mass (1 - sum over S) on each side. The
    KL between these coarse distributions is exact, and by the data-processing inequality it is a
    *lower bound* on the full-vocabulary KL: it can miss differences hidden inside the tail, never
    invent them. With a peaked model the top-K carry almost all the mass, so the bound is tight
    where it matters; ``ref_logprobs`` is the reference's full log-softmax row (a torch tensor).
    """
    kl = 0.0
    ref_mass = served_mass = 0.0
    for tid, lp_s in served.items():
        lp_r = float(ref_logprobs[tid])
        p_r = math.exp(lp_r)
        kl += p_r * (lp_r - lp_s)
        ref_mass += p_r
        served_mass += math.exp(lp_s)
    rest_r, rest_s = max(1.0 - ref_mass, _EPS), max(1.0 - served_mass, _EPS)
    kl += rest_r * math.log(rest_r / rest_s)
    return max(kl, 0.0)


def _reference_rows(model: Any, windows: Sequence[list[int]], timing: dict[str, float], t0: float) -> list[Any]:
    """The reference's logits (float32, on the CPU) for every window; windows of one length go
    through the model together (no padding: each row sees only its own window)."""
    import torch

    rows: list[Any] = [None] * len(windows)
    by_len: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        by_len.setdefault(len(w), []).append(i)
    for idx in by_len.values():
        for at in range(0, len(idx), _BATCH):
            part = idx[at:at + _BATCH]
            with torch.no_grad():
                logits = model(torch.tensor([windows[i] for i in part], device=model.device)).logits.float().cpu()
            for row, i in enumerate(part):
                rows[i] = logits[row]
    timing["reference_teacher_forced"] = time.perf_counter() - t0
    return rows


def _parse_id(token: str) -> int:
    if token.startswith("token_id:"):
        return int(token.split(":", 1)[1])
    raise ValueError(f"server returned token {token!r} instead of 'token_id:N'")


def _served_logprobs(base_url: str, model: str, ids: list[int], k: int, timeout: float) -> tuple[list[float | None], list[dict[int, float] | None]]:
    body = {"model": model, "prompt": ids, "echo": True, "logprobs": k, "max_tokens": 0,
            "temperature": 0.0, "return_tokens_as_token_ids": True}
    try:
        reply, _ = post_json(base_url, "/v1/completions", body, timeout=timeout)
    except GateHTTPError as exc:
        if "HTTP 400" not in str(exc):
            raise
        # Some engines refuse max_tokens=0; one generated token is harmless (sliced off below).
        reply, _ = post_json(base_url, "/v1/completions", {**body, "max_tokens": 1}, timeout=timeout)
    lp = reply["choices"][0]["logprobs"]
    tokens = [_parse_id(t) for t in lp["tokens"][: len(ids)]]
    if tokens != ids:
        raise ValueError("echoed prompt tokens differ from the ids sent (server re-tokenized or altered the prompt)")
    tops = [None if t is None else {_parse_id(key): float(v) for key, v in t.items()}
            for t in lp["top_logprobs"][: len(ids)]]
    token_lps = [None if v is None else float(v) for v in lp["token_logprobs"][: len(ids)]]
    return token_lps, tops


def _score(ref_rows: Any, ids: list[int], token_lps: list[float | None],
           tops: list[dict[int, float] | None], k: int, acc: dict[str, list[float]]) -> None:
    """Append per-position measurements for one window to ``acc``."""
    import torch

    for i in range(1, len(ids)):
        row = ref_rows[i - 1]  # the reference's distribution for position i given ids[:i]
        top, lp_s = tops[i], token_lps[i]
        if top is None or lp_s is None:
            raise ValueError(f"server gave no logprobs for prompt position {i}")
        served = dict(top)
        served.setdefault(ids[i], lp_s)
        acc["kl"].append(coarse_kl(row, served))
        lp_r = float(row[ids[i]])
        acc["dlp"].append(abs(lp_s - lp_r))
        acc["nll_ref"].append(-lp_r)
        acc["nll_srv"].append(-lp_s)
        ref_top = set(torch.topk(row, k).indices.tolist())
        g_ref, g_srv = int(torch.argmax(row)), max(top, key=top.__getitem__)
        differ = g_ref != g_srv
        acc["mismatch"].append(float(differ))
        acc["uncontained"].append(float(differ and (g_ref not in top or g_srv not in ref_top)))


def summarize(acc: dict[str, list[float]]) -> dict[str, float]:
    """Turn per-position lists into the gate's metrics."""
    n = len(acc["kl"])
    ppl_ref = math.exp(sum(acc["nll_ref"]) / n)
    ppl_srv = math.exp(sum(acc["nll_srv"]) / n)
    return {
        "positions": float(n),
        "kl_mean": sum(acc["kl"]) / n,
        "kl_max": max(acc["kl"]),
        "greedy_mismatch_rate": sum(acc["mismatch"]) / n,
        "containment_fail_rate": sum(acc["uncontained"]) / n,
        "mean_abs_dlogprob": sum(acc["dlp"]) / n,
        "max_abs_dlogprob": max(acc["dlp"]),
        "p99_abs_dlogprob": _quantile(acc["dlp"], 0.99),
        "ppl_reference": ppl_ref,
        "ppl_served": ppl_srv,
        "ppl_log_ratio": abs(math.log(ppl_srv / ppl_ref)),
    }


def _quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank): a few outlying positions do not move it."""
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def generation_margin(gcfg: Mapping[str, Any], metrics: Mapping[str, float]) -> float:
    """The off-top margin for this server: the configured one, widened to its own precision noise.

    A served token that the reference ranks ``gap`` below its top-1 can be an honest flip only if
    the server's log-probs err by about ``gap`` (the two candidates' errors differ by more than the
    gap). The teacher-forced windows measure that error on this very server: honest bf16 on a 7B
    errs up to ~0.1 nats (H200, 2026-11-30), where the tiny model's bf16 errs ~0.02, so one fixed
    margin rejected honest batched bf16 on the 7B. The margin is ``margin_noise_factor`` x the
    99th percentile of |dlogprob|, never below ``margin`` and never above ``margin_cap``: a server
    that scores prompts exactly (every decode-path flaw and cheat we know) keeps ``margin``, and one
    that adds noise to its scoring to hide a broken decode buys at most the cap.
    """
    base = float(gcfg["margin"])
    noise = float(metrics.get("p99_abs_dlogprob", 0.0))
    return min(float(gcfg["margin_cap"]), max(base, float(gcfg["margin_noise_factor"]) * noise))


def check(
    base_url: str,
    *,
    served_model: str,
    reference_model_dir: Path | str,
    seed: int | None = None,
    thresholds: Mapping[str, Any] | None = None,
    chat: bool = False,
    capabilities: Mapping[str, Any] | None = None,
    baseline: Sequence[Mapping[str, float]] | None = None,
    is_baseline: bool = False,
) -> GateResult:
    """Compare the server at ``base_url`` with the float32 reference on fresh held-out windows.

    Args:
        served_model: the ``model`` name to put in requests.
        reference_model_dir: HF folder with the same weights (and tokenizer) the candidate serves.
        seed: window-drawing seed; None draws a secret one (recorded only as a sha256 prefix).
        thresholds: parsed thresholds dict (default ``gates/thresholds.toml``).
        chat: the target serves ``/v1/chat/completions`` too; generation probes then use it as well.
        capabilities: what the engine's API lacks (a target's ``[capabilities]``): see :mod:`gates.api`.
        baseline: the ``details["metrics"]`` of the baseline's earlier gate runs; soft drift is judged
            against them (:func:`soft_limits`). None or empty: the absolute soft limits.
        is_baseline: this server *is* the baseline: its drift is the reference candidates are judged
            against, recorded and never drift itself (hard limits still fail it).

    Returns:
        ``pass``, ``drift`` or ``fail``; ``details["metrics"]`` holds every measured number.
        A server error or malformed reply is a ``fail`` (the candidate's fault); a reference folder
        that cannot be loaded raises (the harness's fault, not the candidate's).
    """
    start = time.perf_counter()
    cfg = section(dict(thresholds) if thresholds is not None else None, "accuracy")
    seed = secrets.randbits(64) if seed is None else seed
    details: dict[str, Any] = {"seed_sha256": hashlib.sha256(str(seed).encode()).hexdigest()[:16],
                               "windows": int(cfg["windows"]), "window_tokens": int(cfg["window_tokens"]),
                               "top_k": int(cfg["top_k"])}

    mode = ApiMode.of(capabilities)
    details["api"] = mode.describe()

    def done(status: str, reason: str) -> GateResult:
        return GateResult("accuracy", status, reason + mode.note(), details, time.perf_counter() - start)  # type: ignore[arg-type]

    import torch

    model, tok = load_reference(reference_model_dir)
    k = int(cfg["top_k"])
    rng = random.Random(seed)
    windows = draw_windows(_heldout_ids(tok), rng, int(cfg["windows"]), int(cfg["window_tokens"]))
    bos = getattr(tok, "bos_token_id", None)
    acc: dict[str, list[float]] = {key: [] for key in ("kl", "dlp", "nll_ref", "nll_srv", "mismatch", "uncontained")}
    timing: dict[str, float] = {}
    details["timing_s"] = timing
    t0 = time.perf_counter()
    # Without echo logprobs there is no teacher-forced score to read; the windows are still drawn
    # (the generation probes come after them from the same seeded stream).
    sent = [([bos] if bos is not None else []) + w for w in windows] if mode.echo_logprobs else []
    with ThreadPoolExecutor(max_workers=1) as ref_pool:
        # The reference's rows depend on the windows alone: one batched forward on its own thread
        # while the server is asked window by window, exactly as before.
        ref_rows = ref_pool.submit(_reference_rows, model, sent, timing, t0) if sent else None
        for i, ids in enumerate(sent):
            try:
                token_lps, tops = _served_logprobs(base_url, served_model, ids, k, float(cfg["timeout_s"]))
            except (GateHTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
                return done("fail", f"echo logprobs request failed: {exc}")
            rows = ref_rows.result()[i]  # a reference that fails raises here: the harness's fault, not a verdict
            try:
                _score(torch.log_softmax(rows, dim=-1), ids, token_lps, tops, k, acc)
            except ValueError as exc:
                return done("fail", str(exc))
    timing["teacher_forced"] = time.perf_counter() - t0
    metrics = summarize(acc) if mode.echo_logprobs else {}
    details["metrics"] = metrics
    gcfg = {**cfg["generation"], "timeout_s": cfg["timeout_s"]}
    gcfg["margin"] = generation_margin(gcfg, metrics)
    probes = draw_probes(_heldout_ids(tok), rng, pairs=int(gcfg["pairs"]), length=int(gcfg["prompt_tokens"]),
                         tail=int(gcfg["tail_tokens"]), chat=chat)
    gen_timing: dict[str, float] = {}
    timing["generation"] = gen_timing
    try:
        gen_metrics, details["generation"] = check_generation(base_url, served_model, model, tok, probes, gcfg, mode,
                                                              timing=gen_timing)
    except GenerationError as exc:
        return done("fail", f"generation: {exc}")
    except (GateHTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        return done("fail", f"generation request failed: {exc}")
    metrics.update(gen_metrics)
    metrics["gen_margin"] = float(gcfg["margin"])
    if not mode.echo_logprobs:  # judged on what could be measured; the rest is named, not dropped silently
        limits = set(cfg["hard"]) | set(cfg["soft"])
        details["not_measured"] = sorted(limits - set(metrics))
        cfg = {**cfg, "hard": {m: v for m, v in cfg["hard"].items() if m in metrics},
               "soft": {m: v for m, v in cfg["soft"].items() if m in metrics}}
    status, reason = judge(metrics, cfg, baseline=baseline, is_baseline=is_baseline)
    if baseline:
        details["baseline_runs"] = len(baseline)
    return done(status, reason)


def soft_limits(cfg: Mapping[str, Any], baseline: Sequence[Mapping[str, float]] | None = None) -> dict[str, tuple[float, str]]:
    """Metric -> (soft limit, where it comes from) for a candidate of a baseline measured as ``baseline``.

    Each limit is the configured soft limit, or the baseline's own worst measured value times
    ``1 + [accuracy.baseline] tolerance`` when that is higher: a candidate as close to the
    reference as the baseline is not drift, whatever the model's precision; one clearly further
    away still is (``tolerance`` covers the fresh window draw of each gate run; the configured
    limit stays the floor, so a baseline that matches the reference exactly keeps today's limits).
    """
    tol = float(cfg.get("baseline", {}).get("tolerance", 0.0))
    out: dict[str, tuple[float, str]] = {}
    for m, lim in cfg["soft"].items():
        seen = [float(b[m]) for b in baseline or () if b.get(m) is not None]
        own = max(seen, default=0.0) * (1 + tol)
        out[m] = (own, f"the baseline's {max(seen):.4g} x {1 + tol:g}") if own > lim else (float(lim), f"{lim:g}")
    return out


def judge(metrics: Mapping[str, float], cfg: Mapping[str, Any], *, baseline: Sequence[Mapping[str, float]] | None = None,
          is_baseline: bool = False) -> tuple[str, str]:
    """(status, reason) of measured ``metrics`` against the ``[accuracy]`` thresholds ``cfg``.

    ``baseline``: the baseline's measured metrics (one dict per gate run) that raise the soft limits
    (:func:`soft_limits`); ``is_baseline``: these metrics are the baseline's own, the level the
    soft limits of later candidates come from, so they are never drift (over a hard limit they fail)."""
    hard, soft = cfg["hard"], cfg["soft"]
    unknown = sorted((set(hard) | set(soft)) - set(metrics))
    if unknown:
        raise ValueError(f"thresholds name unknown accuracy metrics {unknown}; known: {sorted(metrics)}")
    over_hard = [f"{m}={metrics[m]:.4g} > {lim:g}" for m, lim in hard.items() if metrics[m] > lim]
    if over_hard:
        return "fail", "accuracy below hard limit: " + "; ".join(over_hard)
    limits = soft_limits(cfg, baseline)
    over_soft = [f"{m}={metrics[m]:.4g} > {limits[m][1]}" for m in soft if metrics[m] > limits[m][0]]
    if over_soft and is_baseline:
        return "pass", ("the baseline's own drift from the float32 reference, the level its candidates are judged "
                        "against: " + "; ".join(f"{m}={metrics[m]:.4g}" for m in soft if metrics[m] > limits[m][0]))
    if over_soft:
        return "drift", "measurable drift (needs approval): " + "; ".join(over_soft)
    if "kl_mean" not in metrics:
        return "pass", f"generated off-top {metrics['gen_offtop_rate']:.3f} (worst prompt {metrics['gen_offtop_worst']:.3f})"
    return "pass", (f"kl_mean={metrics['kl_mean']:.3g}, ppl ratio={metrics['ppl_served'] / metrics['ppl_reference']:.4f}, "
                    f"generated off-top {metrics['gen_offtop_rate']:.3f}")
