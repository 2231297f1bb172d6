"""Turning errors and logs into the one line a person needs.

A server log or a trial error often ends in a Python traceback; the line that says what went
wrong is the *last* meaningful one (`ValueError: ...`), not the first (`Traceback ...`).
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["last_meaningful_line", "one_line", "plain_number", "summarize_failure"]

# Lines that are traceback scaffolding, not the error.
_NOISE = re.compile(
    r"^(Traceback \(most recent call last\):|File \".*\", line \d+|During handling of the above exception"
    r"|The above exception was the direct cause|\^+~*|~+\^*|\[\s*\w+\s*\]?$|[-=_*#.]{3,}$)"
)
_ERROR = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning|Crashed|Timeout|Tampered)\b|error:|fatal:)", re.I)


def last_meaningful_line(text: str | None, limit: int = 300) -> str:
    """The line of `text` that says what went wrong: the last exception line, else the last
    non-scaffolding line; cut to `limit` characters."""
    if not text:
        return ""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not _NOISE.match(ln)]
    errors = [ln for ln in useful if _ERROR.match(ln)]
    line = (errors or useful or lines or [""])[-1]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def one_line(e: BaseException, limit: int = 300) -> str:
    """`Type: message` on one line, the message reduced to its meaningful line."""
    msg = str(e).strip()
    first = msg.splitlines()[0] if msg else ""
    # Our own messages put what/where/what-next first and detail (a log tail) after.
    body = first if first and not _NOISE.match(first) else last_meaningful_line(msg, limit)
    text = f"{type(e).__name__}: {body}" if body else type(e).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summarize_failure(text: str | None, limit: int = 300) -> str:
    """A stored failure (`what; last log lines:` + a log tail) as one line: what, then why.

    `ServerCrashed: server exited ...; last log lines:` + a traceback becomes
    `ServerCrashed: server exited ... — ModuleNotFoundError: No module named 'x'`.
    """
    if not text:
        return ""
    lines = [ln for ln in str(text).splitlines() if ln.strip()]
    head = lines[0].strip() if lines else ""
    why = last_meaningful_line("\n".join(lines[1:]), limit) if len(lines) > 1 else ""
    if _NOISE.match(head):
        head, why = last_meaningful_line(text, limit), ""
    out = f"{head} — {why}" if why and why != head else head
    return out if len(out) <= limit else out[: limit - 1] + "…"


def plain_number(v: Any) -> str:
    """A number as a person reads it: about 3 significant digits, no float noise and never scientific
    notation (`1040`, not `1.04e+03`; `0.000012`, not `1.2e-05`)."""
    if isinstance(v, bool) or not isinstance(v, float) or not math.isfinite(v):
        return str(v)
    size = abs(v)
    if size >= 999.5:
        return f"{v:.0f}"
    if size == 0 or size >= 1e-4:
        return f"{v:.3g}"
    return f"{v:.{2 - math.floor(math.log10(size))}f}"
