"""Exact output counts as a validity rule: a trial whose token counts are off cannot be scored.

Every bench request pins its output length (``ignore_eos`` + ``max_tokens``) and asks for the
generated token ids, so the client knows exactly how many tokens it received. A server that
delivers fewer or more than asked, or whose ``usage`` disagrees with the ids it sent, makes the
throughput and TPOT numbers meaningless: the trial is ``invalid``, not merely warned about.

An engine whose target declares no ``ignore_eos`` (``transformers serve``) cannot be pinned:
its outputs that stop at EOS and say so are allowed and counted (``osl_eos_short``, normalised
per token); anything else short, anything longer, and usage that disagrees still make the
trial invalid (without token ids, "disagrees" means beyond the re-tokenization tolerance).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["count_violation"]


def count_violation(metrics: Mapping[str, float], scenario: str) -> str | None:
    """One line saying why ``metrics`` (of one scenario run) break the count rules, or None."""
    problems = []
    if metrics.get("osl_short", 0) > 0:
        pinned = metrics.get("osl_pinned", 1.0) > 0
        problems.append(f"{int(metrics['osl_short'])} request(s) got a different number of tokens than "
                        + ("max_tokens with ignore_eos" if pinned else "max_tokens without stopping at EOS"))
    if metrics.get("osl_mismatch", 0) > 0:
        problems.append(f"{int(metrics['osl_mismatch'])} request(s) reported usage.completion_tokens "
                        f"different from the token ids delivered")
    if metrics.get("isl_mismatch", 0) > 0:
        problems.append(f"{int(metrics['isl_mismatch'])} request(s) reported usage.prompt_tokens "
                        f"different from the prompt sent")
    if not problems:
        return None
    return f"token counts in {scenario}: " + "; ".join(problems)
