"""Failed regions: the parts of a target's knob space that a failed trial rules out for the rest of its run.

A failed trial marks a region from its stored knobs and error alone, so the regions are rebuilt
from the store on every proposal (a resumed run has them all) and the search never proposes a
knob set inside one again (a constraint model, as SCOOT and auto-tuning-vllm keep one).

Semantics, for a trial that failed with knob set K (its active knobs):

- **Out of memory** (CUDA out of memory, any message `failures.classify` reads as `out_of_memory`,
  or the host's OOM killer), at start-up or during the bench: the region is every knob set with
  each categorical and bool knob of K at K's value, and each knob that raises memory at K's value
  or more (one that lowers memory: at K's value or less). Numeric knobs that do not act on memory
  (thread counts) are free: memory did not run out because of them. Which knobs raise memory, the
  target says with `memory = "up"` (or `"down"`, `"none"`) on the knob; a categorical knob can list
  its choices from least to most memory (`memory = [256, 1024, 0]`). Absent that, an int or float
  knob whose name says batch size, sequence or model length, KV/cache size, chunk or token budget,
  or a memory fraction raises memory (`MEMORY_NAMES`); every other knob is compared for equality
  when categorical and left free when numeric.
- **Deterministic start-up crash** (a start-up failure that is none of out of memory, timeout,
  port in use): exactly K's active knob combination.
- **Nothing** for a timeout (the server may only have been slow), a port in use or any other host
  error (the host, not the knobs), a bench failure without an out-of-memory message, an invalid
  trial (a gate's verdict), and a knob set the target's own `[[constraints]]` refused before it was
  launched (the constraints already keep it out).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.targets.base import Knob
from orchestrator.targets.failures import OOM_PATTERN

__all__ = ["MEMORY_NAMES", "FailedRegion", "failed_regions", "memory_direction", "region_of", "region_containing"]

# Knob names that, absent a `memory` attribute, raise memory as they grow (int/float knobs only).
MEMORY_NAMES = re.compile(
    r"batch|num_seqs|model_len|seq_len|context_len|max_tokens|batched_tokens|kv|cache_size|cache_blocks|chunk"
    r"|gpu_memory|mem_fraction|memory_utilization|swap_space|cuda_graph_max", re.I)
# What the host's OOM killer leaves in a log or an error (the kernel's words, and a shell's).
HOST_OOM = re.compile(r"oom[-_ ]kill|Out of memory: Killed process|Killed process \d+|killed by the OOM", re.I)
# Start-up failure kinds (failures.KINDS) that say nothing about the knobs: the host, or slowness.
NOT_THE_KNOBS = ("timeout", "port_in_use")
_STARTUP = re.compile(r"^start-up failure \((\w+)([^)]*)\)")


@dataclass(frozen=True)
class FailedRegion:
    """A region of the knob space a failed trial ruled out.

    Attributes:
        kind: `out_of_memory` or `crash`.
        trial: the number of the trial that marked it (None: a record without one).
        knobs: that trial's knob set.
        bounds: knob -> (op, value): `==` (the same value), `>=` / `<=` (a numeric memory knob),
            `in` (a categorical memory knob: these choices). A knob not named is free.
        evidence: the failure's words (the error's first line, cut).
    """

    kind: str
    trial: int | None
    knobs: dict[str, Any]
    bounds: dict[str, tuple[str, Any]] = field(default_factory=dict)
    evidence: str = ""

    def contains(self, knobs: Mapping[str, Any]) -> bool:
        """Whether the knob set lies inside this region (a bounded knob it does not carry: outside)."""
        if self.kind == "crash" and set(knobs) != set(self.knobs):
            return False
        for name, (op, v) in self.bounds.items():
            if name not in knobs:
                return False
            x = knobs[name]
            if not ((op == "==" and x == v) or (op == ">=" and x >= v) or (op == "<=" and x <= v)
                    or (op == "in" and x in v)):
                return False
        return True

    def describe(self) -> str:
        """The region in words: `out of memory at #5: engine='fast', max_batch_size>=16`."""
        parts = [f"{n} in {list(v)!r}" if op == "in" else f"{n}{'=' if op == '==' else op}{v!r}"
                 for n, (op, v) in self.bounds.items()]
        what = "out of memory" if self.kind == "out_of_memory" else "start-up crash"
        scope = "exactly " if self.kind == "crash" else ""
        at = f" at #{self.trial}" if self.trial is not None else ""
        return f"{what}{at}: {scope}{', '.join(parts) or 'every knob set'}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bounds"] = {n: [op, list(v) if op == "in" else v] for n, (op, v) in self.bounds.items()}
        d["describe"] = self.describe()
        return d


def memory_direction(name: str, knob: Knob) -> str | list[Any] | None:
    """`up`, `down`, a categorical's choices from least to most memory, or None (no memory effect)."""
    declared = knob.memory
    if declared == "none":
        return None
    if declared is not None:
        if declared in ("up", "down") and knob.type == "categorical":
            if not all(isinstance(c, int | float) and not isinstance(c, bool) for c in knob.choices or ()):
                return None  # unordered choices: compared for equality
            ordered = sorted(knob.choices or ())
            return ordered if declared == "up" else ordered[::-1]
        return declared if knob.type != "bool" else None
    if knob.type in ("int", "float") and MEMORY_NAMES.search(name):
        return "up"
    return None


def region_of(target: Any, number: int | None, knobs: Mapping[str, Any], status: str, error: str | None) -> FailedRegion | None:
    """The region a trial marks (module docstring), or None when its failure says nothing about the knobs."""
    if status != "failed" or not error:
        return None
    m = _STARTUP.match(error)
    kind = m.group(1) if m else None
    if kind in NOT_THE_KNOBS or (m and "not launched" in m.group(2)):
        return None
    evidence = error.splitlines()[0][:200]
    if kind == "out_of_memory" or OOM_PATTERN.search(error) or HOST_OOM.search(error):
        bounds: dict[str, tuple[str, Any]] = {}
        for name, value in knobs.items():
            knob = target.knobs.get(name)
            if knob is None:
                continue
            way = memory_direction(name, knob)
            if isinstance(way, list):
                if value in way:
                    bounds[name] = ("in", tuple(way[way.index(value):]))
                else:
                    bounds[name] = ("==", value)
            elif way == "up":
                bounds[name] = (">=", value)
            elif way == "down":
                bounds[name] = ("<=", value)
            elif knob.type in ("categorical", "bool"):
                bounds[name] = ("==", value)
        return FailedRegion("out_of_memory", number, dict(knobs), bounds, evidence)
    if m is None:  # a failure after start-up without an out-of-memory message: the bench, the host
        return None
    return FailedRegion("crash", number, dict(knobs), {n: ("==", v) for n, v in knobs.items()}, evidence)


def failed_regions(target: Any, history: Iterable[Any]) -> list[FailedRegion]:
    """Every region the run's stored trials marked, oldest first."""
    out = []
    for t in history:
        r = region_of(target, getattr(t, "number", None), t.knobs or {}, t.status, getattr(t, "error", None))
        if r is not None:
            out.append(r)
    return out


def region_containing(regions: Iterable[FailedRegion], knobs: Mapping[str, Any]) -> FailedRegion | None:
    """The first region the knob set lies in, or None."""
    return next((r for r in regions if r.contains(knobs)), None)
