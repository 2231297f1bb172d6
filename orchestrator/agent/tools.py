"""The agent's tools: typed methods whose signatures and docstrings are the schemas it sees.

Files and commands go through `EngineWorktree` (confined); history and the knowledge base are
read-only views of the store and the KB. `run_trial` and `finish` return requests the proposer
acts on (they end the agent's turn); every other tool returns text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.agent.errors import ToolError
from orchestrator.agent.render import history_rows, render
from orchestrator.agent.sandbox import EngineWorktree, truncate
from orchestrator.agent.schema import call_checked, tool_schema
from orchestrator.core.frontmatter import read_frontmatter

__all__ = ["FinishRequest", "Skill", "Toolbox", "TrialRequest", "load_skills"]

_KEY_METRICS = ("ttft_ms_p50", "tpot_ms_p50", "e2e_ms_p50", "output_throughput", "request_throughput", "completed", "failed")


@dataclass(frozen=True)
class TrialRequest:
    knobs: dict[str, Any]
    rationale: str
    prediction: str
    expected_score: float | None


@dataclass(frozen=True)
class FinishRequest:
    summary: str


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    body: str


def load_skills(skills_dir: Path) -> dict[str, Skill]:
    """`skills/<name>/SKILL.md` files with `name`/`description` frontmatter."""
    out: dict[str, Skill] = {}
    for f in sorted(Path(skills_dir).glob("*/SKILL.md")) if Path(skills_dir).is_dir() else []:
        meta, body = read_frontmatter(f, what="a skill")
        name = str(meta.get("name", f.parent.name))
        out[name] = Skill(name, str(meta.get("description", "")), body.strip())
    return out


class Toolbox:
    """Everything the agent can do, bound to one run."""

    TOOLS = ("list_files", "read_file", "grep", "edit_file", "write_file", "run_command", "show_diff",
             "trial_history", "trial_details", "search_knowledge", "read_knowledge", "load_skill", "run_trial", "finish")

    def __init__(self, worktree: EngineWorktree, *, store: Any, run_id: int, target: Any, kb: Any,
                 skills: dict[str, Skill]) -> None:
        self.wt, self.store, self.run_id, self.target, self.kb, self.skills = worktree, store, run_id, target, kb, skills

    def schemas(self) -> list[dict[str, Any]]:
        return [tool_schema(getattr(self, name)) for name in self.TOOLS]

    def call(self, name: str, args: Any) -> tuple[Any, bool]:
        """Run one tool; return (result, is_error). Never raises: errors go back to the model."""
        if name not in self.TOOLS:
            return f"unknown tool {name!r}; the tools are {', '.join(self.TOOLS)}", True
        fn: Callable[..., Any] = getattr(self, name)
        try:
            return call_checked(fn, args), False
        except ToolError as e:
            return str(e), True
        except Exception as e:  # noqa: BLE001 - a tool bug must reach the model, not end the run
            return f"{type(e).__name__}: {e}", True

    # --- engine files ----------------------------------------------------------------------
    def list_files(self, path: str = ".") -> str:
        """List the files under a folder of the engine's source (recursively).

        Args:
            path: folder relative to the engine source folder
        """
        return self.wt.list_files(path)

    def read_file(self, path: str, offset: int = 0, limit: int = 400) -> str:
        """Read a text file of the engine's source, with line numbers.

        Args:
            path: file relative to the engine source folder
            offset: first line to show (0-based)
            limit: number of lines to show
        """
        return self.wt.read_file(path, offset, limit)

    def grep(self, pattern: str, path: str = ".") -> str:
        """Search the engine's source for a Python regular expression; returns file:line: text.

        Args:
            pattern: Python regular expression
            path: file or folder relative to the engine source folder
        """
        return self.wt.grep(pattern, path)

    def edit_file(self, path: str, old: str, new: str) -> str:
        """Replace one exact, unique occurrence of `old` with `new` in a file.

        Args:
            path: file relative to the engine source folder
            old: the exact text to replace (must occur exactly once)
            new: the replacement text
        """
        return self.wt.edit_file(path, old, new)

    def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a file of the engine's source.

        Args:
            path: file relative to the engine source folder
            content: the whole new content
        """
        return self.wt.write_file(path, content)

    def run_command(self, command: str, timeout_s: float | None = None) -> str:
        """Run a bash command in the engine source folder (e.g. a syntax check or a unit test).

        Output is truncated; there is a timeout. Commands must stay inside the worktree. Do not
        benchmark here: only the controller's measurements count.

        Args:
            command: bash command line
            timeout_s: seconds before the command is killed (capped by the config)
        """
        return self.wt.run_command(command, timeout_s)

    def show_diff(self) -> str:
        """Show your uncommitted and committed changes against the run's base commit."""
        diff = self.wt.repo.git.diff(self.wt.base_commit, "--", str(self.wt.rel_source) if str(self.wt.rel_source) != "." else ".")
        return truncate(diff or "(no change from the base commit)", self.wt.max_output_chars)

    # --- history and knowledge -------------------------------------------------------------
    def trial_history(self) -> str:
        """The run's trials so far: status, score over the baseline, changed knobs, commit."""
        trials = self.store.list_trials(self.run_id)
        return render("history.md.j2", rows=history_rows(trials, self.target.baseline_knobs()))

    def trial_details(self, number: int) -> str:
        """One trial in full: knobs, commit, rationale, gate verdicts, key metrics, error.

        Args:
            number: trial number (0 = the baseline)
        """
        t = self.store.get_trial_by_number(self.run_id, number)
        if t is None:
            raise ToolError(f"no trial #{number}; see trial_history")
        gates = [f"{g.gate}: {g.status} — {g.reason}" for g in self.store.gate_results(t.id)]
        metrics: dict[str, dict[str, float]] = {}
        for m in self.store.measurements(t.id):
            if m.metric in _KEY_METRICS:
                metrics.setdefault(f"{m.scenario}#{m.repeat}", {})[m.metric] = round(m.value, 3)
        return json.dumps({"number": t.number, "status": t.status, "score": t.score, "knobs": t.knobs,
                           "commit": t.commit, "proposer": t.proposer, "rationale": t.rationale,
                           "prediction": t.prediction, "error": t.error, "gates": gates, "metrics": metrics,
                           "objective": t.objective}, indent=1, default=str)

    def search_knowledge(self, query: str) -> str:
        """Search the knowledge base (contracts, constraints, findings, playbooks) by words.

        Args:
            query: words to look for in titles and bodies
        """
        words = [w.lower() for w in query.split() if w]
        scored = []
        for e in self.kb.entries.values():
            text = (str(e.meta.get("title", "")) + " " + e.body).lower()
            hits = sum(text.count(w) for w in words)
            if hits:
                scored.append((hits, e))
        scored.sort(key=lambda x: -x[0])
        lines = [f"- {e.id} ({e.kind}, {e.status}): {e.meta.get('title', '')}" for _, e in scored[:15]]
        return "\n".join(lines) or "(no matching entries)"

    def read_knowledge(self, entry_id: str) -> str:
        """Read one knowledge-base entry in full.

        Args:
            entry_id: the entry's id from search_knowledge
        """
        e = self.kb.entries.get(entry_id)
        if e is None:
            raise ToolError(f"no knowledge entry {entry_id!r}; use search_knowledge")
        meta = {k: v for k, v in e.meta.items() if k != "id"}
        return truncate(f"{json.dumps(meta, default=str)}\n\n{e.body.strip()}", self.wt.max_output_chars)

    def load_skill(self, name: str) -> str:
        """Load a skill's playbook (the system prompt lists each skill's name and description).

        Args:
            name: the skill's name
        """
        if name not in self.skills:
            raise ToolError(f"no skill {name!r}; the skills are {sorted(self.skills)}")
        return self.skills[name].body

    # --- control ---------------------------------------------------------------------------
    def run_trial(self, knobs: dict, rationale: str, prediction: str, expected_score: float | None = None) -> TrialRequest:
        """Submit a candidate: your edits are committed and the controller measures them with these knobs.

        The result (gates, metrics, score vs baseline and best) is this call's answer. Knobs not
        given keep their baseline values.

        Args:
            knobs: knob name -> value, within the target's knob space
            rationale: why this should be faster (becomes the commit message)
            prediction: which metric moves, in which direction, by about how much
            expected_score: the geometric-mean speedup over the baseline you expect (e.g. 1.3)
        """
        try:
            knobs = self.target.validate_knobs(knobs)
        except ValueError as e:
            raise ToolError(str(e)) from None
        if not rationale.strip():
            raise ToolError("give a rationale: it is the commit message and the trial's record")
        return TrialRequest(knobs, rationale.strip(), prediction.strip(), expected_score)

    def finish(self, summary: str) -> FinishRequest:
        """End your work on this run: nothing better is left to try.

        Args:
            summary: what you tried, what worked, what did not
        """
        return FinishRequest(summary)
