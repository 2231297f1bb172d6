"""How output counts are judged per engine API (gates/api.py): pinned lengths stay strict for an
engine that accepts `ignore_eos`; an engine that cannot pin them may stop at EOS if it says so."""

from __future__ import annotations

from gates.api import ApiMode
from orchestrator.bench.counts import count_violation
from orchestrator.bench.metrics import compute_metrics
from orchestrator.bench.timeline import RequestRecord

MS = 1_000_000
TEXT_ONLY = ApiMode(ignore_eos=False, token_ids=False, prompt_ids=False, echo_logprobs=False)


def rec(usage: int, client: int | None, finish: str = "length", out: int = 20, from_text: bool = False) -> RequestRecord:
    ch = [(10 + i) * MS for i in range(max(1, usage))]
    return RequestRecord(index=0, prompt_tokens=8, output_tokens=out, t_sent_ns=0, t_first_chunk_ns=ch[0],
                         t_first_token_ns=ch[0], t_last_token_ns=ch[-1], t_done_ns=ch[-1], chunk_ns=ch,
                         usage_completion_tokens=usage, usage_prompt_tokens=8, client_tokens=client,
                         client_tokens_from_text=from_text, finish_reason=finish, done_seen=True, success=True)


def metrics(recs: list[RequestRecord], mode: ApiMode = ApiMode()) -> dict[str, float]:
    return compute_metrics(recs, bench_start_ns=0, bench_end_ns=100 * MS, mode=mode, tolerance=0.1)


def test_an_engine_with_ignore_eos_may_not_stop_early_even_if_it_says_so() -> None:
    m = metrics([rec(20, 20), rec(12, 12, finish="stop")])
    assert m["osl_short"] == 1 and m["osl_eos_short"] == 0 and m["osl_pinned"] == 1.0
    assert "with ignore_eos" in (count_violation(m, "s") or "")


def test_without_ignore_eos_an_announced_eos_stop_is_counted_not_refused() -> None:
    mode = ApiMode(ignore_eos=False)
    m = metrics([rec(20, 20), rec(12, 12, finish="stop")], mode)
    assert m["osl_short"] == 0 and m["osl_eos_short"] == 1 and m["osl_pinned"] == 0.0
    assert count_violation(m, "s") is None
    assert m["total_output_tokens"] == 32  # per-token metrics use what was delivered
    # Short without saying it stopped, or longer than asked: still invalid.
    for bad in (rec(12, 12, finish="length"), rec(24, 24, finish="stop")):
        m = metrics([bad], mode)
        assert m["osl_short"] == 1 and "without stopping at EOS" in (count_violation(m, "s") or "")


def test_text_counts_agree_within_the_tolerance_and_a_usage_lie_does_not() -> None:
    ok = [rec(20, 19, from_text=True), rec(12, 11, finish="stop", from_text=True)]  # a merge; the EOS has no text
    m = metrics(ok, TEXT_ONLY)
    assert m["osl_mismatch"] == 0 and m["osl_short"] == 0 and count_violation(m, "s") is None
    m = metrics([rec(40, 20, out=40, from_text=True)], TEXT_ONLY)  # bills double what it sent
    assert m["osl_mismatch"] == 1 and "usage.completion_tokens" in (count_violation(m, "s") or "")
    m = metrics([rec(20, 19, from_text=True)])  # ids are exact: one token off is a mismatch
    assert m["osl_mismatch"] == 1


def test_one_text_reply_merging_past_the_tolerance_is_judged_with_the_scenarios_totals() -> None:
    # transformers serve's replies from the tiny model: "-1', '%s', '%s', '%s', '" is 16 generated
    # tokens that re-tokenize to 13; the 23 others of its scenario agreed (15 or 16).
    honest = [rec(16, 13, out=16, from_text=True)] + [rec(16, 16 - i % 2, out=16, from_text=True) for i in range(23)]
    m = metrics(honest, TEXT_ONLY)
    assert m["osl_mismatch"] == 0 and m["osl_short"] == 0 and count_violation(m, "s") is None
    # Alone, the same reply is judged by itself: 3 of 16 is past the tolerance.
    m = metrics(honest[:1], TEXT_ONLY)
    assert m["osl_mismatch"] == 1 and m["osl_short"] == 1
    # Every reply three short while usage bills 16: the totals disagree, and each reply counts.
    shorted = [rec(16, 13, out=16, from_text=True) for _ in range(24)]
    m = metrics(shorted, TEXT_ONLY)
    assert m["osl_mismatch"] == 24 and m["osl_short"] == 24
    # One reply with half its text missing fails even when the totals agree.
    m = metrics([rec(16, 7, out=16, from_text=True)] + honest[1:], TEXT_ONLY)
    assert m["osl_mismatch"] == 1 and m["osl_short"] == 1 and "usage.completion_tokens" in (count_violation(m, "s") or "")
    # With token ids nothing is forgiven: one token off is off.
    m = metrics([rec(16, 15, out=16)] + [rec(16, 16, out=16) for _ in range(23)])
    assert m["osl_mismatch"] == 1 and m["osl_short"] == 1
