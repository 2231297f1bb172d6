"""`infergoal why N` in words: the evidence behind a verdict as (fact, value) rows, rounded.

The CLI and the shell print these rows; `--json` prints the raw record instead. Numbers are
rounded for a reader, nested records become `key=value` pairs, nothing is cut mid-string.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.oneline import plain_number
from orchestrator.trial.paired import describe
from orchestrator.trial.verdict import noise_words

__all__ = ["GLOSSARY", "plain_number", "why_facts"]

GLOSSARY = "docs/glossary.md"
"""Where the words of `infergoal why` and the reports are defined (paired, keep line, screen,
sentinel, measured...), relative to the infergoal repository."""

# Evidence keys that are abbreviations, as the why table says them.
_WORDS = {"k_sigma": "standard errors a change must clear (k_sigma)", "se": "standard error", "ci_low": "interval low",
          "ci_high": "interval high", "lo": "interval low", "hi": "interval high"}


_num = plain_number


def _flat(v: Any) -> str:
    """Any evidence value as one readable line: `key=value` pairs, rounded, never JSON."""
    if isinstance(v, dict) and "gate" in v and "status" in v:  # a gate's evidence: its verdict, then its numbers
        rest = {k: x for k, x in v.items() if k not in ("gate", "status", "reason")}
        return f"{v['status']}: {v.get('reason') or ''}" + (f" ({_flat(rest)})" if _flat(rest) else "")
    if isinstance(v, dict) and "metric" in v:  # one metric the performance gate compared
        said = f"{v['metric']} {_num(v.get('baseline_mean'))} -> {_num(v.get('candidate_mean'))}"
        if isinstance(v.get("delta"), (int, float)):
            said += f", change {v['delta']:+.1%}"
        if isinstance(v.get("se"), (int, float)):
            said += f" ± {v['se']:.1%}"
        if isinstance(v.get("required"), (int, float)):
            said += f", needs {v['required']:.0%}"
        return said + (f": {v['verdict']}" if v.get("verdict") else "")
    if isinstance(v, dict):
        return " ".join(f"{_WORDS.get(k, k)}={_flat(x)}" for k, x in v.items() if x not in (None, "", [], {}))
    if isinstance(v, (list, tuple)):
        return (", " if all(isinstance(x, (int, float)) for x in v) else "; ").join(_flat(x) for x in v)
    return _num(v)


def why_facts(ev: dict[str, Any]) -> list[tuple[str, str]]:
    """`infergoal why N`'s table: the evidence in words, rounded; the score is the screening score
    against the baseline it names, and a paired ratio is labelled paired."""
    ev = {k: v for k, v in ev.items() if v not in (None, {}, [], "")}
    rows: list[tuple[str, str]] = []
    base = ev.pop("baseline_trial", None)
    if "score" in ev:
        vs = f" against baseline #{base}" if base is not None else ""
        rows.append(("screening score" if "paired" in ev else "score", f"{ev.pop('score'):.2f}x{vs}"))
    if "paired" in ev:
        p = ev.pop("paired")
        rows.append(("paired ratio", f"{describe(p)} against a fresh baseline each round; goal {'met' if p.get('met') else 'not met'}"))
    if "noise" in ev:
        said = noise_words(float(ev.pop("noise")), str(ev.pop("noise_basis", "") or ""))
        rows.append(("noise", said.removeprefix("noise ") + (f" (baseline #{base})" if base is not None else "")))
    ev.pop("noise_basis", None)
    if "threshold" in ev:
        line = f"{ev.pop('threshold'):.3f}x"
        if "best" in ev and "needed_gain" in ev:
            line += f" = best {ev.pop('best'):.3f}x" + (f" (#{ev.pop('best_trial')})" if "best_trial" in ev else "")
            line += f" x (1 + {ev.pop('needed_gain'):.1%})"
        if "min_gain" in ev:
            line += f"; min_gain {ev.pop('min_gain'):.1%}"
        rows.append(("keep line", line))
    for k in ("best", "needed_gain", "min_gain"):
        if k in ev:
            rows.append((k.replace("_", " "), _num(ev.pop(k))))
    for k, v in ev.items():
        rows.append((_WORDS.get(k, k.replace("_", " ")), _flat(v)))
    return rows
