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
