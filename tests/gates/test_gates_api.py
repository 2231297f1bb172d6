"""gates/api.py and gates/textalign.py without a server: what is asked, how counts agree, and
why a text-only reply is spelled back into ids with the reference rather than re-tokenized."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.accuracy import draw_windows, load_reference
from gates.api import ApiMode
from gates.generation import reference_greedy
from gates.textalign import align_text

TEXT_ONLY = {"ignore_eos": False, "token_ids": False, "prompt_ids": False, "echo_logprobs": False}


def test_modes_from_capabilities_and_the_fields_left_out() -> None:
    assert ApiMode.of(None).exact and ApiMode.of({"completions": False}).exact and ApiMode().note() == ""
    mode = ApiMode.of(TEXT_ONLY)
    body = {"model": "m", "prompt": "x", "ignore_eos": True, "return_tokens_as_token_ids": True, "logprobs": 0,
            "max_tokens": 4}
    assert mode.body(body) == {"model": "m", "prompt": "x", "max_tokens": 4}
    assert ApiMode().body(body) == body
    note = mode.note()
    assert note.startswith(" (judged as:") and "generation check only" in note and "[" not in note
    assert mode.describe()["lengths"].startswith("bounded by max_tokens")


def test_counts_agree_exactly_with_ids_and_within_tolerance_from_text() -> None:
    assert ApiMode().agree(9, 9, 0.1) and not ApiMode().agree(8, 9, 0.1)
    text = ApiMode(token_ids=False)
    assert text.agree(8, 9, 0.1) and text.agree(60, 64, 0.1) and not text.agree(9, 18, 0.1)


@pytest.fixture(scope="module")
def reference(tiny_model: Path):
    return load_reference(tiny_model)


def test_text_spelled_back_with_the_reference_gives_the_generated_ids(reference) -> None:
    model, tok = reference
    import random

    from gates.accuracy import _heldout_ids

    # Seed 3: window 19 is the first whose greedy continuation re-tokenizes differently
    # ("Ġ'" + "'" written back as "Ġ''"); 1 in 40 windows of 32 tokens do on the forged model.
    windows = draw_windows(_heldout_ids(tok), random.Random(3), 40, 32)
    mode = ApiMode.of(TEXT_ONLY)
    for w in windows[17:20]:  # three windows, one of which needs the aligner: seconds, not half a minute
        _, prompt = mode.prompt(tok, [tok.bos_token_id, *w])
        greedy, _ = reference_greedy(model, prompt, 32)
        text = tok.decode(greedy, skip_special_tokens=True)
        assert align_text(model, tok, prompt, text, 32) == greedy
        if list(tok(text, add_special_tokens=False)["input_ids"]) != greedy:
            return  # why the aligner exists: plain re-tokenization does not give the ids back
    pytest.fail("no window needed the aligner (forge model changed?): pick another seed")


def test_a_text_only_stream_is_counted_chunk_by_chunk(reference) -> None:
    """The integrity gate's max_tokens probe on a text-only engine (transformers serve): a reply of
    9 tokens whose joined text re-tokenizes to 7 (neighbouring tokens merge across chunks) was
    judged as not honouring max_tokens=9 under load in CI; each chunk read back on its own counts 9.
    A stream that really stops short is still caught."""
    from gates.integrity import _check_max_tokens, _Failed, _stream_count

    _, tok = reference
    mode = ApiMode.of(TEXT_ONLY)
    # Pairs that merge when joined (" '" + "'" -> " ''", "t" + "he" -> "the"), as the forged model can emit them.
    parts = [" '", "'", "t", "he", " a", "nd", " the", " the", " of"]
    chunks = [{"text": p, "finish_reason": None} for p in parts] + [{"text": "", "finish_reason": "length"}]
    joined = mode.count(tok, None, "".join(parts))
    assert joined < len(parts) - 1, "the joined text no longer merges: pick other chunks"
    assert _stream_count(chunks, mode, tok) == 9
    probe = {"stream_chunks": _stream_count(chunks, mode, tok), "stream_finish": "length",
             "nonstream_tokens": 9, "nonstream_finish": "length"}
    assert "stream_chunks 9" in _check_max_tokens(probe, 9, mode, 0.1)
    with pytest.raises(_Failed, match="not honoured"):  # what the joined count made of the same reply
        _check_max_tokens({**probe, "stream_chunks": joined}, 9, mode, 0.1)
    short = [c for c in chunks if c["text"] not in (" the", " of")]  # 6 tokens sent, finish "length"
    with pytest.raises(_Failed, match="not honoured"):
        _check_max_tokens({**probe, "stream_chunks": _stream_count(short, mode, tok)}, 9, mode, 0.1)


def test_a_text_only_non_streamed_reply_equal_to_the_stream_is_counted_by_its_chunks(reference) -> None:
    """The non-streamed half of the max_tokens probe on a text-only engine: its whole text
    re-tokenized merges tokens (9 read back as 7 failed a transformers-serve baseline in a test run).
    When it is the streamed reply's text exactly, it is counted as the stream's chunks are; a reply
    cut short, or one that differs from the stream, is still counted from its own text and caught."""
    from gates.integrity import _check_max_tokens, _Failed, _nonstream_count, _stream_count

    _, tok = reference
    mode = ApiMode.of(TEXT_ONLY)
    parts = [" '", "'", "t", "he", " a", "nd", " the", " the", " of"]
    chunks = [{"text": p, "finish_reason": None} for p in parts] + [{"text": "", "finish_reason": "length"}]
    streamed = _stream_count(chunks, mode, tok)
    same = {"text": "".join(parts), "finish_reason": "length"}
    assert mode.count(tok, None, same["text"]) < 8, "the joined text no longer merges: pick other chunks"
    assert _nonstream_count(same, chunks, streamed, mode, tok) == 9
    probe = {"stream_chunks": streamed, "stream_finish": "length", "nonstream_finish": "length"}
    assert "nonstream_tokens 9" in _check_max_tokens({**probe, "nonstream_tokens": 9}, 9, mode, 0.1)
    # Cut short (its last two tokens dropped) while the stream sent all 9: counted from its own text.
    cut = {"text": "".join(parts[:-2]), "finish_reason": "length"}
    n_cut = _nonstream_count(cut, chunks, streamed, mode, tok)
    assert n_cut == mode.count(tok, None, cut["text"]) < 8
    with pytest.raises(_Failed, match="nonstream_tokens"):
        _check_max_tokens({**probe, "nonstream_tokens": n_cut}, 9, mode, 0.1)
    # With token ids the ids decide, whatever the text.
    ids_mode = ApiMode()
    assert _nonstream_count({"text": same["text"], "logprobs": {"tokens": [1, 2, 3]}}, chunks, 9, ids_mode, tok) == 3


# A bfloat16 `transformers serve` reply on the forged model (its accuracy gate, seed 6): where the reference's
# top is a newline and 3 spaces, the server wrote a newline and 7 (a near-tie, 0.02 nats). The aligner takes the
# reference's top token whenever it fits the text ("\n   ", a newline and 3), which leaves four single spaces at
# 2-4 nats each: 6 of 32 tokens off the top, and the honest server failed the gate. The tokenizer's own spelling
# of the same text has every token on the top.
STRANDED_PROMPT = [0, 1552, 325, 270, 351, 86, 298, 292, 1140, 71, 949, 90, 86, 702, 521, 1527, 570, 436, 1224, 917,
                   674, 415, 271, 302, 72, 326, 917, 674, 15, 368, 472, 989, 90]
STRANDED_TEXT = ("ing the\n        #\n    #  #  The the the the the the the the the\n        #\n        # the the file.\n"
                 "        # be the file is")


def test_a_text_reply_the_aligner_strands_is_judged_by_the_spelling_with_fewer_tokens_off_the_top(reference) -> None:
    from gates.generation import _counted, _Reply, fewer_off_top
    from gates.reference import score_many
    from gates.thresholds import load_thresholds

    model, tok = reference
    margin = float(load_thresholds()["accuracy"]["generation"]["margin"])
    aligned = align_text(model, tok, STRANDED_PROMPT, STRANDED_TEXT, 32)[:32]
    plain = list(tok(STRANDED_TEXT, add_special_tokens=False)["input_ids"])[:32]
    (gaps, _), (other, _) = score_many(model, [(STRANDED_PROMPT, aligned), (STRANDED_PROMPT, plain)])
    assert sum(g > margin for g in gaps) >= 4, gaps  # the trap, as the gate scored it before
    assert sum(g > margin for g in other) == 0, other
    # The gate's count step hands both spellings on; the scoring judges the one with fewer tokens off the top.
    reply = _Reply(ids=[], usage={"completion_tokens": 32, "prompt_tokens": len(STRANDED_PROMPT)}, finish="length",
                   text=STRANDED_TEXT)
    served, stopped, alt = _counted(reply, "completions", 32, (model, tok, STRANDED_PROMPT), ApiMode.of(TEXT_ONLY), 0.1)
    assert served == aligned and alt == plain and not stopped
    assert fewer_off_top(gaps, other, margin) and not fewer_off_top(other, gaps, margin)
    # A reply the aligner spells as the reference would (its greedy text) has no other spelling to weigh.
    greedy, _ = reference_greedy(model, STRANDED_PROMPT, 32)
    ok = _Reply(ids=[], usage={"completion_tokens": 32, "prompt_tokens": len(STRANDED_PROMPT)}, finish="length",
                text=tok.decode(greedy, skip_special_tokens=True))
    served, _, alt = _counted(ok, "completions", 32, (model, tok, STRANDED_PROMPT), ApiMode.of(TEXT_ONLY), 0.1)
    assert served == greedy and (alt is None or not fewer_off_top(score_many(model, [(STRANDED_PROMPT, served)])[0][0],
                                                                  score_many(model, [(STRANDED_PROMPT, alt)])[0][0], margin))
