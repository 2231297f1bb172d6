"""Read, search, reuse and write back the knowledge base.

Entries live in `read_dirs` (the shipped seed, then the workspace's own; later dirs win on equal
ids); the loop writes findings and constraints to `write_dir`. Contracts are human-owned: the loop
can only propose them (`approval.propose_contract`), a person approves.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.candidate import knob_key
from orchestrator.core.roles import PAIRED
from orchestrator.knowledge import reuse
from orchestrator.knowledge.distill import distill
from orchestrator.knowledge.entries import STATUS_RANK, Entry, parse_entry
from orchestrator.knowledge.fingerprint import (
    describe_hardware,
    describe_model,
    hardware_key,
    similarity,
    workload_key,
)
from orchestrator.knowledge.slofindings import write_slo_finding
from orchestrator.knowledge.writeback import update_prior, write_constraints, write_effects, write_winner
from orchestrator.trial.paired import beat_baseline

__all__ = ["Entry", "KnowledgeBase", "parse_entry", "workload_key"]

_SKIP_DIRS = {"pending"}


@dataclass
class KnowledgeBase:
    """Entries from `read_dirs` (later dirs win on equal ids); findings go to `write_dir`."""

    read_dirs: list[Path]
    write_dir: Path
    entries: dict[str, Entry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.write_dir = Path(self.write_dir)
        for d in self.read_dirs:
            for f in sorted(Path(d).rglob("*.md")) if Path(d).is_dir() else []:
                if f.name.lower() == "readme.md" or _SKIP_DIRS & set(f.relative_to(d).parts[:-1]):
                    continue
                e = parse_entry(f)
                self.entries[e.id] = e

    # --- the setting a run is in ---------------------------------------------------------
    @staticmethod
    def setting(*, engine: str, model: str | None = None, hardware: dict[str, Any] | None = None,
                workload: str | None = None, engine_version: str | None = None, model_dir: Path | None = None) -> dict[str, Any]:
        """The run's fingerprint in `applies_to` shape: exact names plus descriptions."""
        out: dict[str, Any] = {"engine": engine}
        if engine_version:
            out["engine_version"] = engine_version
        if model:
            out["model"], out["model_desc"] = model, describe_model(model, model_dir)
        if hardware is not None:
            out["hardware"], out["hardware_desc"] = hardware_key(hardware), describe_hardware(hardware)
        if workload:
            out["workload"] = workload
        return out

    # --- reading ---------------------------------------------------------------------------
    def search(self, *, kind: str | None = None, engine: str | None = None, hardware: str | None = None,
               model: str | None = None) -> list[Entry]:
        """Entries whose exact names match: each `applies_to` field that is set must match (`*` matches all)."""
        out = []
        for e in self.entries.values():
            if kind and e.kind != kind:
                continue
            a = e.applies_to
            if any(want and a.get(k) not in (None, "*", want) for k, want in
                   (("engine", engine), ("hardware", hardware), ("model", model))):
                continue
            out.append(e)
        return sorted(out, key=lambda e: (-STATUS_RANK.get(e.status, 0), -float(e.meta.get("speedup", 1.0))))

    def similar(self, here: dict[str, Any], *, kind: str | None = None, min_sim: float = 0.0) -> list[tuple[float, Entry]]:
        """(weight, entry) for entries that fit `here` (a `setting`), by similarity x status."""
        return reuse.rank(list(self.entries.values()), here, kind=kind, min_sim=min_sim)

    def priors(self, *, engine: str, model: str, hardware: dict[str, Any], workload: str | None = None,
               slo: Any = None) -> list[dict[str, Any]]:
        """The warm-start plan with its provenance: knobs, source entry id, weight, similarity.
        `slo` (an SLO goal's `SloGoal`): findings measured under a fitting SLO first (`reuse.for_goal`)."""
        here = self.setting(engine=engine, model=model, hardware=hardware, workload=workload)
        findings = reuse.for_goal(self.similar(here, kind="finding"), slo)
        avoid = reuse.avoided(self.similar(here, kind="constraint"), won=findings)
        plan = reuse.warm_knobs(findings, here, avoid)
        return [{"knobs": k, "entry": e.id, "weight": w, "similarity": similarity(e.applies_to, here)} for w, e, k in plan]

    def warm_start(self, *, engine: str, model: str, hardware: dict[str, Any], workload: str | None = None,
                   slo: Any = None) -> list[dict[str, Any]]:
        """Knob sets to try first: this exact setting's findings, then priors from similar settings
        (another model size, a similar host), translated, best weight first; refuted ones never.
        For an SLO goal (`slo`), findings that moved the rate under a fitting SLO come first."""
        return [p["knobs"] for p in self.priors(engine=engine, model=model, hardware=hardware, workload=workload, slo=slo)]

    def prior_observations(self, *, engine: str, model: str, hardware: dict[str, Any], workload: str | None = None) -> list[dict[str, Any]]:
        """Knob sets measured on similar settings, with scores and weights: the search's prior."""
        here = self.setting(engine=engine, model=model, hardware=hardware, workload=workload)
        return reuse.prior_observations(self.similar(here, kind="finding"), here)

    def avoid(self, *, engine: str, model: str, hardware: dict[str, Any], workload: str | None = None) -> dict[str, list[Any]]:
        """knob -> values that failed or never paid off on similar settings."""
        here = self.setting(engine=engine, model=model, hardware=hardware, workload=workload)
        return reuse.avoided(self.similar(here, kind="constraint"), won=self.similar(here, kind="finding"))

    def context(self, *, engine: str, hardware: dict[str, Any], limit: int = 20, model: str | None = None,
                workload: str | None = None) -> str:
        """A markdown digest of applicable entries for an agent's prompt; priors are marked as such."""
        here = self.setting(engine=engine, model=model, hardware=hardware, workload=workload)
        return reuse.render_context(self.similar(here, min_sim=0.3), here, limit)

    # --- writing ---------------------------------------------------------------------------
    def _writable(self, e: Entry) -> Entry:
        """A seed entry is copied into `write_dir` before its status changes (the seed stays as shipped)."""
        try:
            e.path.resolve().relative_to(self.write_dir.resolve())
            return e
        except ValueError:
            dst = self.write_dir / e.path.parent.name / e.path.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(e.path, dst)
            return parse_entry(dst)

    def write_back(self, store: Any, run_id: int, *, engine: str, model: str, hardware: dict[str, Any],
                   workload: str | None = None, min_gain: float = 0.0, interrupted: str | None = None) -> Path | None:
        """Distill the run into findings and constraints; move the status of priors it tried.

        Returns the winner finding's path (None without a winner); the rest is recorded as a
        `kb.distill` event with every path written. `interrupted`: the run was stopped before its stop
        (SIGINT, SIGTERM, a command's time limit, often in the paired rounds at the stop): what it
        learned is written all the same, the best kept trial as an unconfirmed winner (`hypothesis`,
        its evidence says why), so a later run on another model starts warm. A later write of the same
        run (`infergoal resume` finishing it) replaces this run's evidence instead of adding to it."""
        d = distill(store, run_id)
        here = self.setting(engine=engine, model=model, hardware=hardware, workload=workload)
        hw = here["hardware"]
        key: list[Any] = [engine, model, hw] + ([workload] if workload else [])
        evidence_extra: dict[str, Any] = {"workload": workload} if workload else {}
        # The paired A/B outcome the controller recorded on the winner (the newest, if it was confirmed twice).
        found = store.events(run_id, kind=PAIRED, trial_id=d.winner["trial_id"]) if d.winner else []
        paired = found[-1].data if found else None
        if paired and paired.get("score"):  # the paired A/B ratio and its interval, when the run measured one
            evidence_extra["paired"] = {"ratio": round(paired["score"], 4), "lo": round(paired["lo"], 4),
                                        "hi": round(paired["hi"], 4), "rounds": paired["rounds"], "goal_met": paired["met"]}
        if d.winner and paired and paired.get("score") and not beat_baseline(paired):
            # Its paired interval holds 1.0: no knob set beat the baseline, and none is written as "giving" a speedup.
            d.winner = None
        if d.winner and paired and paired.get("met"):  # confirmed by its paired rounds before the run was stopped
            d.winner["confirmed_by_relaunch"] = True
        if interrupted and d.winner and not d.winner["confirmed_by_relaunch"]:
            evidence_extra["unconfirmed"] = f"not confirmed by paired rounds: {interrupted}"
        winner = write_winner(self.write_dir, d, here, key, evidence_extra)
        effects = write_effects(self.write_dir, d, here, key)
        constraints = write_constraints(self.write_dir, d, here, key)
        slo_rate = write_slo_finding(self.write_dir, store, run_id, here, key)  # an SLO goal: what moved the rate
        moved = []
        for t in d.warm_trials:
            for _w, e in self.similar(here, kind="finding", min_sim=reuse.MIN_SIMILARITY):
                sim = similarity(e.applies_to, here)
                if sim >= 0.999 or not e.meta.get("knobs"):
                    continue  # the exact setting's own finding is promoted by write_winner
                if knob_key(reuse.translate(dict(e.meta["knobs"]), e.applies_to, here)) != knob_key(t["knobs"]):
                    continue
                status = update_prior(self._writable(e), run_id, t, sim, model, min_gain)
                moved.append({"entry": e.id, "from": e.status, "to": status, "trial": t["trial"]})
        written = [str(p) for p in (winner, effects, constraints, slo_rate) if p]
        if store is not None and (written or moved):
            store.add_event(run_id, "kb.distill", f"{len(written)} entr(ies) written, {len(moved)} prior(s) re-rated",
                            data={"written": written, "priors": moved, "failures": d.failures, "dead_ends": d.dead_ends})
        return winner
