"""Read, search and write back the knowledge base.

An entry is a markdown file whose YAML frontmatter carries `id, kind (contract | constraint |
finding | playbook), title, applies_to {hardware, engine, model}, status (hypothesis | probable
| confirmed | refuted), evidence [...], created, updated` and, for tuning findings, `knobs`.
Findings are written by the loop with provenance (run id, trial ids, measured deltas, hardware);
each run that reproduces a finding raises its status one step. Contracts are human-owned and
never written here.

Findings are keyed by workload too (`applies_to.workload`: the goal's scenario set and the bench
scale, `workload_key`): knobs that won on short single-stream requests prove nothing about a
batched load, so a finding from another workload is never used to warm-start a run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.paired import latest_paired

__all__ = ["Entry", "KnowledgeBase", "parse_entry", "workload_key"]

_STATUS_RANK = {"refuted": -1, "hypothesis": 0, "probable": 1, "confirmed": 2}
_PROMOTE = {"hypothesis": "probable", "probable": "confirmed", "confirmed": "confirmed"}


@dataclass(frozen=True)
class Entry:
    path: Path
    meta: dict[str, Any]
    body: str

    @property
    def id(self) -> str:
        return str(self.meta.get("id", self.path.stem))

    @property
    def kind(self) -> str:
        return str(self.meta.get("kind", "finding"))

    @property
    def status(self) -> str:
        return str(self.meta.get("status", "hypothesis"))

    @property
    def applies_to(self) -> dict[str, Any]:
        return dict(self.meta.get("applies_to") or {})


def parse_entry(path: Path) -> Entry:
    text = path.read_text()
    m = re.match(r"^---\n(.*?)\n---\n?(.*)$", text, re.S)
    if not m:
        raise ValueError(f"{path}: a knowledge entry must start with YAML frontmatter between '---' lines")
    meta = yaml.safe_load(m.group(1)) or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: frontmatter must be a mapping")
    return Entry(path=path, meta=meta, body=m.group(2))


def _render(meta: dict[str, Any], body: str) -> str:
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n" + body


def workload_key(scenarios: list[str] | tuple[str, ...], scale: float) -> str:
    """`decode+throughput@1.0`: which scenarios, at which bench scale (order does not matter)."""
    return "+".join(sorted(scenarios)) + f"@{float(scale):g}"


def _hardware_key(fp: dict[str, Any]) -> str:
    gpus = fp.get("gpus") or []
    return gpus[0].split(",")[0].strip() if gpus else f"cpu-{fp.get('machine', '?')}-{fp.get('cpu_count', '?')}c"


@dataclass
class KnowledgeBase:
    """Entries from `read_dirs` (later dirs win on equal ids); findings go to `write_dir`."""

    read_dirs: list[Path]
    write_dir: Path
    entries: dict[str, Entry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for d in self.read_dirs:
            for f in sorted(Path(d).rglob("*.md")) if Path(d).is_dir() else []:
                if f.name.lower() == "readme.md":
                    continue
                e = parse_entry(f)
                self.entries[e.id] = e

    def search(self, *, kind: str | None = None, engine: str | None = None, hardware: str | None = None,
               model: str | None = None) -> list[Entry]:
        """Entries that apply: each `applies_to` field that is set must match (a `*` matches all)."""
        out = []
        for e in self.entries.values():
            if kind and e.kind != kind:
                continue
            a = e.applies_to
            if any(want and a.get(k) not in (None, "*", want) for k, want in
                   (("engine", engine), ("hardware", hardware), ("model", model))):
                continue
            out.append(e)
        return sorted(out, key=lambda e: (-_STATUS_RANK.get(e.status, 0), -float(e.meta.get("speedup", 1.0))))

    def warm_start(self, *, engine: str, model: str, hardware: dict[str, Any], workload: str | None = None) -> list[dict[str, Any]]:
        """Knob sets of prior findings for this engine/model/hardware, best first (refuted ones never).

        With `workload`, findings measured on another workload are left out; findings that name no
        workload (written before workloads were recorded) come after the matching ones."""
        found = self.search(kind="finding", engine=engine, model=model, hardware=_hardware_key(hardware))
        if workload is not None:
            same = [e for e in found if e.applies_to.get("workload") == workload]
            found = same + [e for e in found if e.applies_to.get("workload") in (None, "*")]
        return [dict(e.meta["knobs"]) for e in found if e.meta.get("knobs") and e.status != "refuted"]

    def context(self, *, engine: str, hardware: dict[str, Any], limit: int = 20) -> str:
        """A markdown digest of applicable entries, for an agent's prompt."""
        parts = [f"## {e.meta.get('title', e.id)} ({e.kind}, {e.status})\n{e.body.strip()}"
                 for e in self.search(engine=engine, hardware=_hardware_key(hardware))[:limit]]
        return "\n\n".join(parts)

    def write_back(self, store: Any, run_id: int, *, engine: str, model: str, hardware: dict[str, Any],
                   workload: str | None = None) -> Path | None:
        """Record the run's best kept candidate as a finding (or strengthen the existing one).

        The speedup recorded is the paired A/B ratio when the run confirmed one (it is the trial's
        score then), with its interval in the evidence."""

        run = store.get_run(run_id)
        if run is None or run.best_trial_id is None:
            return None
        best = store.get_trial(run.best_trial_id)
        if best is None or best.number == 0 or not best.score:
            return None
        hw = _hardware_key(hardware)
        key = [engine, model, hw, best.knobs] + ([workload] if workload else [])
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
        fid = f"finding-{engine}-{digest}"
        path = self.write_dir / "findings" / f"{fid}.md"
        today = dt.date.today().isoformat()
        evidence = {
            "run": run_id, "trial": best.number, "score": round(best.score, 4),
            "objective": {k: round(v, 4) for k, v in (best.objective or {}).items()},
            "confirmed_by_relaunch": "GoalMet" in (run.stop_reason or ""),
        }
        paired = latest_paired(store, run_id, best.id)
        if paired and paired.get("score"):
            evidence["paired"] = {"ratio": round(paired["score"], 4), "lo": round(paired["lo"], 4),
                                  "hi": round(paired["hi"], 4), "rounds": paired["rounds"], "goal_met": paired["met"]}
        if workload:
            evidence["workload"] = workload
        if path.is_file():
            e = parse_entry(path)
            meta = dict(e.meta)
            if not any(ev.get("run") == run_id for ev in meta.get("evidence", [])):
                meta["evidence"] = [*meta.get("evidence", []), evidence]
                meta["status"] = _PROMOTE.get(meta.get("status", "hypothesis"), "probable")
            meta["speedup"] = max(float(meta.get("speedup", 0)), round(best.score, 4))
            meta["updated"] = today
            body = e.body
        else:
            meta = {
                "id": fid, "kind": "finding",
                "title": f"{engine} on {hw}: knobs giving {best.score:.2f}x on '{run.goal_text}'",
                "applies_to": {"engine": engine, "model": model, "hardware": hw, **({"workload": workload} if workload else {})},
                "status": "probable" if evidence["confirmed_by_relaunch"] else "hypothesis",
                "knobs": best.knobs, "speedup": round(best.score, 4), "evidence": [evidence],
                "created": today, "updated": today,
            }
            knob_lines = "\n".join(f"- `{k}` = `{v}`" for k, v in best.knobs.items())
            body = (f"\nRun {run_id}, trial #{best.number} scored {best.score:.3f}x (geomean speedup over the "
                    f"baseline) for the goal `{run.goal_text}`.\n\nKnobs:\n{knob_lines}\n\n"
                    "Warm-starts the search on matching engine/model/hardware; each run that reproduces it "
                    "raises its status.\n")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_render(meta, body))
        return path
