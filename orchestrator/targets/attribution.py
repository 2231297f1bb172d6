"""Failure attribution: which knob level made a trial crash, read from the run's trials.

A trial that crashed (a start-up crash or refusal, or a server that answered its requests with errors) says
that some level of its knob set cannot be served, not that every level of it is bad. Its *suspects*
are its levels other than a knob's default that no trial which served carried (a trial that
served, even one a gate then judged invalid, clears every level it carried). Then:

- one suspect left: that level is the **culprit**: the search never proposes it again;
- several: the failure is **open**, and the search's next proposal re-deploys the crashed knob set
  with the second half of its suspects (in the target's knob order: the top of the knob tree is
  kept) reset to their defaults (`bisect`). If that serves, its levels are cleared and the rest
  are the suspects; if it crashes, it is the smaller failure, which explains the larger one (a
  failure whose suspects contain another failure's is not bisected again);
- none left: each level served elsewhere, so the crash came of a combination (or of the host):
  nothing is condemned.

Out of memory, time-outs, a port in use and host errors are not attributed to a level here: the
failed regions (`orchestrator.targets.regions`) read those. The search is told a crashed trial
as a failure of its unresolved suspects alone (the other levels of its knob set keep their chance).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.targets.space import active_only

__all__ = ["SERVED", "Attribution", "attribute", "bisect", "is_crash", "suspects"]

SERVED = ("kept", "discarded", "invalid")
# A start-up crash or the engine's own refusal of a combination (not the target's constraints: "not launched"),
# or requests the server answered with an error or dropped (not a timeout: the host may be slow).
_CRASH = re.compile(r"^start-up failure \((crash|constraint_violated)\)|requests failed in .*\b(server_error|http_5\d\d|connection_error|reset)")


def is_crash(trial: Any) -> bool:
    """Whether `trial` failed because its server crashed or answered with server errors."""
    error = getattr(trial, "error", None) or ""
    return trial.status == "failed" and _CRASH.search(error) is not None


def _served(history: Sequence[Any]) -> set[tuple[str, str]]:
    return {(k, repr(v)) for t in history if t.status in SERVED for k, v in (t.knobs or {}).items()}


def suspects(target: Any, trial: Any, served: set[tuple[str, str]]) -> list[str]:
    """The knobs of `trial` whose level could have crashed it (in the target's knob order)."""
    knobs = trial.knobs or {}
    return [k for k in target.knobs if k in knobs and knobs[k] != target.knobs[k].default and (k, repr(knobs[k])) not in served]


@dataclass(frozen=True)
class Attribution:
    """What the run's crashes say: `culprits` ((knob, repr(value)) never to propose again), `open`
    ((trial, its suspect knobs) still to bisect, oldest first), `told` (trial number -> the knobs of it
    the search is told failed)."""

    culprits: frozenset[tuple[str, str]]
    open: tuple[tuple[Any, tuple[str, ...]], ...]
    told: dict[Any, tuple[str, ...]]

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.culprits)) or "none"


def attribute(target: Any, history: Sequence[Any]) -> Attribution:
    """The attribution of every crash in `history` (module docstring)."""
    served = _served(history)
    crashes = [(t, tuple(suspects(target, t, served))) for t in history if is_crash(t)]
    culprits: set[tuple[str, str]] = set()
    open_: list[tuple[Any, tuple[str, ...]]] = []
    told: dict[Any, tuple[str, ...]] = {}
    for t, s in crashes:
        levels = {(k, repr(t.knobs[k])) for k in s}
        explained = any(o is not t and o_s and {(k, repr(o.knobs[k])) for k in o_s} < levels for o, o_s in crashes)
        told[t.number] = s
        if len(s) == 1:
            culprits |= levels
        elif len(s) > 1 and not explained:
            open_.append((t, s))
    return Attribution(frozenset(culprits), tuple(open_), told)


def bisect(target: Any, trial: Any, suspect: Sequence[str]) -> dict[str, Any]:
    """`trial`'s knob set with the second half of `suspect` reset to their defaults."""
    keep = (len(suspect) + 1) // 2
    knobs = dict(trial.knobs) | {k: target.knobs[k].default for k in suspect[keep:]}
    return active_only(target, {k: v.default for k, v in target.knobs.items()} | knobs)
