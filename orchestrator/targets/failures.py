"""Start-up failures classified from the server log, so the run (and the proposer) knows *why*.

A trial whose server never became healthy is recorded as `failed` with an error starting
`start-up failure (<kind>): ...`. Kinds: `bad_flag` (the engine refused an argument), `out_of_memory`,
`constraint_violated` (the engine's own config validation), `missing_dependency`, `port_in_use`,
`crash` (anything else that exited), `timeout` (still not healthy at `ready_timeout_s`).
The patterns come from the engines' own messages (argparse, pydantic config validation, torch).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KINDS", "OOM_PATTERN", "StartupFailure", "classify", "classify_log", "refused_values"]

# What an engine, torch or the C++ runtime print when memory ran out (`targets.regions` reads it
# in any failed trial's error, a failure during the bench included).
OOM_PATTERN = re.compile(
    r"out of memory|OutOfMemoryError|Cannot allocate memory|std::bad_alloc|MemoryError"
    r"|No available memory for the cache blocks|insufficient memory|not enough (KV cache|memory)", re.I)

# Order matters: a vLLM config error is raised as a pydantic ValidationError, and OOM
# messages often mention "memory" inside tracebacks that also name other things.
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("bad_flag", re.compile(
        r"error: (unrecognized arguments|argument [^:]+: (invalid|expected)|the following arguments are required)"
        r"|No such option|unexpected keyword argument|Got unexpected extra argument", re.I)),
    ("out_of_memory", OOM_PATTERN),
    ("constraint_violated", re.compile(
        r"ValidationError|Value error,|is smaller than|must be (greater|less|smaller|larger|divisible|at least|a multiple)"
        r"|should be (greater|less|smaller|larger)|is not supported (with|when|for)|cannot be used with|exceeds", re.I)),
    ("missing_dependency", re.compile(r"ModuleNotFoundError|ImportError|No module named|command not found|No such file or directory", re.I)),
    ("port_in_use", re.compile(r"Address already in use|EADDRINUSE", re.I)),
]
KINDS = ("bad_flag", "out_of_memory", "constraint_violated", "missing_dependency", "port_in_use", "crash", "timeout")


@dataclass(frozen=True)
class StartupFailure:
    """Why a server did not start: `kind` (one of KINDS) and the log line that shows it."""

    kind: str
    evidence: str

    def message(self, error: str) -> str:
        return f"start-up failure ({self.kind}): {self.evidence or error}"


def classify_log(text: str, *, timed_out: bool = False) -> StartupFailure:
    """Classify a server log's text; the last matching line is the evidence (the root cause
    is usually printed last, after the traceback)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if timed_out:  # still running, so none of its log lines is a cause of death
        return StartupFailure("timeout", lines[-1][:300] if lines else "")
    for kind, pattern in _PATTERNS:
        hits = [ln for ln in lines if pattern.search(ln)]
        if hits:
            return StartupFailure(kind, hits[-1][:300])
    return StartupFailure("crash", lines[-1][:300] if lines else "")


def classify(log_path: str | Path | None, *, timed_out: bool = False, max_bytes: int = 200_000) -> StartupFailure:
    """Classify from the log file's tail (missing file -> crash/timeout with no evidence)."""
    text = ""
    if log_path and Path(log_path).is_file():
        with open(log_path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", "replace")
    return classify_log(text, timed_out=timed_out)


def refused_values(target: Any, history: Iterable[Any]) -> set[tuple[str, str]]:
    """(knob, value) pairs an engine refused at start-up with `bad_flag`, read from failed trials'
    errors: the knob's flag (for a bool: the flag of the value tried) appears in the refusal, and
    for a valued flag so does the value. The search stops proposing them."""
    out: set[tuple[str, str]] = set()
    for t in history:
        error = getattr(t, "error", None) or ""
        if not error.startswith("start-up failure (bad_flag)"):
            continue
        evidence = error.split("): ", 1)[-1].split(" [", 1)[0]
        for name, value in (t.knobs or {}).items():
            knob = target.knobs.get(name)
            if knob is None:
                continue
            if knob.type == "bool":
                flag = knob.flag if value else knob.false_flag
                if flag and re.search(re.escape(flag) + r"\b", evidence):
                    out.add((name, repr(value)))
            elif knob.flag and knob.flag in evidence and (str(value) in evidence or "unrecognized" in evidence):
                out.add((name, repr(value)))
    return out
