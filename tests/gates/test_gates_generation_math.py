"""The generation check's pieces that need no server: prompt drawing, summaries, re-judging."""

from __future__ import annotations

import random

import calibrate

from gates import load_thresholds
from gates.generation import draw_probes, summarize_generation


def test_probes_are_equal_length_distinct_pairs_sharing_a_prefix() -> None:
    heldout = list(range(5000))
    probes = draw_probes(heldout, random.Random(3), pairs=6, length=32, tail=12, chat=True)
    firsts, seconds = probes[:6], probes[6:]
    assert all(p.concurrent for p in firsts) and not any(p.concurrent for p in seconds)
    assert {len(p.content_ids) for p in probes} == {32}
    assert len({tuple(p.content_ids) for p in probes}) == 12  # distinct content
    for a, b in zip(firsts, seconds, strict=True):
        assert a.content_ids[:20] == b.content_ids[:20] and a.content_ids[20:] != b.content_ids[20:]
        assert (a.api, a.stream) == (b.api, b.stream)  # a cache keyed on shape + prefix is hit too
    assert {p.api for p in probes} == {"completions", "chat"}
    only_completions = draw_probes(heldout, random.Random(3), pairs=6, length=32, tail=12, chat=False)
    assert {p.api for p in only_completions} == {"completions"}


def _rec(concurrent: bool, offtop: int, prefix: int, gaps: list[float] | None = None) -> dict:
    return {"concurrent": concurrent, "offtop": offtop, "prefix": prefix, "nll": 1.0, "nll_ref": 0.9,
            "gaps": gaps or [], "shape": "completions"}


def test_a_flaw_in_one_phase_is_not_averaged_away() -> None:
    honest = [_rec(True, 0, 10) for _ in range(3)]
    cached = [_rec(False, 6, 0) for _ in range(3)]  # only the sequential phase replays replies
    m = summarize_generation(honest + cached, 10)
    assert m["gen_offtop_rate"] == 0.6  # the sequential phase's rate, not the mean 0.3
    assert m["gen_offtop_worst"] == 0.6 and m["gen_prefix_short"] == 1.0


def test_rejudge_uses_todays_thresholds_and_margin() -> None:
    cfg = load_thresholds()["accuracy"]
    n = int(cfg["generation"]["new_tokens"])
    base = {"status": "pass", "reason": "", "seconds": 1.0, "kl_mean": 0.0, "mean_abs_dlogprob": 0.0,
            "containment_fail_rate": 0.0, "ppl_log_ratio": 0.0, "greedy_mismatch_rate": 0.0,
            "ppl_served": 2.0, "ppl_reference": 2.0}
    records = [_rec(c, 0, n, gaps=[0.3] * 4) for c in (True, False)]
    status, _, metrics = calibrate.rejudge({**base, "records": records}, 0.5, cfg)
    assert status == "pass" and metrics["gen_offtop_rate"] == 0.0
    status, reason, _ = calibrate.rejudge({**base, "records": records}, 0.1, cfg)
    assert status == "fail" and "gen_offtop_rate" in reason


# The concurrent phase of trial 4 of the H200 run (benchmarks/gpu/results/h200_cond_run.db): the fast
# engine, batched bf16, on the 7B. Teacher-forced it erred like the baseline (mean |dlogprob| 0.018,
# max 0.098); one prompt's greedy path flipped at near-ties and then went its own way.
H200_BATCHED_BF16 = [[], [], [], [], [], [0.069, 0.071, 0.076, 0.103]]


def _phase(gaps_per_prompt: list[list[float]], margin: float, n: int = 32) -> dict[str, float]:
    recs = [_rec(True, sum(g > margin for g in gaps), n, gaps) for gaps in gaps_per_prompt]
    return summarize_generation(recs, n)


def test_the_margin_widens_to_the_servers_own_noise_and_no_further() -> None:
    from gates.accuracy import generation_margin

    g = load_thresholds()["accuracy"]["generation"]
    base, cap = float(g["margin"]), float(g["margin_cap"])
    assert generation_margin(g, {"p99_abs_dlogprob": 0.0}) == base  # exact scoring: every known flaw and cheat
    assert generation_margin(g, {}) == base  # no echo logprobs (text-only engines): nothing measured
    assert generation_margin(g, {"p99_abs_dlogprob": 0.01}) == base  # the tiny model's bf16 noise
    assert generation_margin(g, {"p99_abs_dlogprob": 0.06}) == 0.06 * float(g["margin_noise_factor"])
    assert generation_margin(g, {"p99_abs_dlogprob": 5.0}) == cap  # noise added to scoring buys the cap, no more


def test_honest_batched_bf16_on_a_7b_passes_with_its_own_margin_but_not_with_the_fixed_one() -> None:
    from gates.accuracy import generation_margin

    acc = load_thresholds()["accuracy"]
    hard = acc["hard"]
    fixed = _phase(H200_BATCHED_BF16, float(acc["generation"]["margin"]))
    assert fixed["gen_offtop_worst"] > hard["gen_offtop_worst"]  # what rejected it on the H200
    own = _phase(H200_BATCHED_BF16, generation_margin(acc["generation"], {"p99_abs_dlogprob": 0.05}))
    assert own["gen_offtop_worst"] <= hard["gen_offtop_worst"] and own["gen_offtop_rate"] <= hard["gen_offtop_rate"]
    # A broken decode path stays broken at the cap: the split cheat and a late layer drop leave
    # gaps of several tenths (tests/gates/README.md), far above any margin.
    broken = [[0.4, 0.9, 1.7, 0.3, 2.2]] * 6
    at_cap = _phase(broken, float(acc["generation"]["margin_cap"]))
    assert at_cap["gen_offtop_rate"] > hard["gen_offtop_rate"]


def test_p99_ignores_a_few_outlying_positions() -> None:
    from gates.accuracy import _quantile

    xs = [0.01] * 760 + [3.0] * 7  # 7 of 767 positions: under 1%
    assert _quantile(xs, 0.99) == 0.01
    assert _quantile([0.01] * 750 + [3.0] * 17, 0.99) == 3.0  # more than 1%: it is the noise
