"""AgentProposer: Claude, through the Messages API with tools, edits the engine and picks knobs.

One conversation lasts the whole run. The agent works with its tools until it calls
`run_trial`; the proposer then commits the engine worktree and returns that commit as the
Candidate. The next `propose()` answers that `run_trial` call with what the controller measured
(gates, metrics, score against baseline and best), so the agent only ever sees the
controller's numbers. The conversation is saved after every step (`agent/conversation.json` in
the run dir), so a resumed run continues it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

from orchestrator.agent.client import LLMClient, Usage
from orchestrator.agent.config import AgentConfig
from orchestrator.agent.conversation import Conversation
from orchestrator.agent.errors import AgentAPIError, AgentConfigError
from orchestrator.agent.render import history_rows, render
from orchestrator.agent.sandbox import EngineWorktree
from orchestrator.agent.tools import FinishRequest, Toolbox, TrialRequest, load_skills
from orchestrator.config.workspace import PACKAGE_ROOT
from orchestrator.core.candidate import Candidate
from orchestrator.core.roles import BudgetExhausted
from orchestrator.targets import TargetSpec

__all__ = ["AgentProposer"]

_FINISHED = object()
_CONTINUE = "Continue with your tools; when the change is ready call run_trial(...), or finish(summary) if nothing is left."


def _tool_result(tool_use_id: str, content: Any, is_error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": str(content) or "(empty)"}
    if is_error:
        block["is_error"] = True
    return block


def _block(b: Any) -> dict[str, Any]:
    if b.type == "text":
        return {"type": "text", "text": b.text}
    if b.type == "tool_use":
        return {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input}
    return b.model_dump(exclude_none=True)


def _with_cache_point(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with a cache breakpoint on the last block: the next call reads the whole
    conversation so far from the prompt cache (0.1x price) instead of paying for it again.
    Only the request copy is marked, so the stored conversation never piles up breakpoints
    (the API allows four: system, tools and this one)."""
    if not messages:
        return messages
    last = messages[-1]
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else [dict(b) for b in content]
    blocks[-1]["cache_control"] = {"type": "ephemeral"}
    return [*messages[:-1], {**last, "content": blocks}]


class AgentProposer:
    """The `claude` proposer. `bind(ctx, kb)` attaches it to a run before the first propose()."""

    name = "claude"

    def __init__(self, cfg: AgentConfig | None = None) -> None:
        self.cfg = cfg or AgentConfig()
        self.client = LLMClient(self.cfg)  # reads the key now: a missing key stops before the baseline runs
        self.ctx: Any = None

    # --- wiring ----------------------------------------------------------------------------
    def bind(self, ctx: Any, kb: Any) -> None:
        if not ctx.base_commit:
            raise AgentConfigError(
                f"the target's source {ctx.source_dir} is not in a git repository with a commit; the agent's "
                "candidates are commits: run `git init && git add -A && git commit -m base` there")
        self.ctx, self.store, self.run_id = ctx, ctx.store, ctx.run_id
        agent_dir = ctx.run_dir / "agent"
        tag = hashlib.sha1(str(agent_dir.resolve()).encode()).hexdigest()[:8]
        self.branch = f"infergoal/run-{ctx.run_id}-{tag}"
        self.wt = EngineWorktree(ctx.source_dir, ctx.source_dir, ctx.base_commit, agent_dir / "worktree", self.branch,
                                 max_output_chars=self.cfg.max_output_chars, command_timeout_s=self.cfg.command_timeout_s)
        skills = load_skills(PACKAGE_ROOT / "skills")
        self.tools = Toolbox(self.wt, store=ctx.store, run_id=ctx.run_id, target=ctx.target, kb=kb, skills=skills)
        self.conv = Conversation.load(agent_dir / "conversation.json")
        contracts = kb.context(engine=ctx.target.engine, hardware=ctx.host.fingerprint(), model=ctx.target.model) if kb is not None else ""
        goal = f"{ctx.goal.text}\n(read as: {ctx.goal.describe()})"
        system = render("system.md.j2", goal=goal, target=ctx.target, branch=self.branch, contracts=contracts,
                        skills=list(skills.values()))
        # Prompt caching: the system prompt and the tools are the same on every call of the run.
        self.system = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
        schemas = self.tools.schemas()
        schemas[-1] = {**schemas[-1], "cache_control": {"type": "ephemeral"}}
        self.tool_schemas = schemas

    # --- the loop --------------------------------------------------------------------------
    def should_stop_early(self, history: Sequence[Any], value: float, margin: float,
                          startup: int | None = None) -> str | None:
        """Never: the agent reads full measurements (screening is the search's)."""
        return None

    def propose(self, history: Sequence[Any], target: TargetSpec) -> Candidate | None:
        if self.ctx is None:
            raise AgentConfigError("the agent proposer was not bound to a run (call bind(ctx, kb) first)")
        conv = self.conv
        self._tag_best()
        if conv.finished is not None:
            return None
        usage = Usage()
        if conv.pending:
            trial = self._trial_for(conv.pending, history)
            if trial is None:  # killed between our answer and the controller creating the trial
                return self._candidate(conv.pending)
            self._answer_pending(trial, history)
        elif not conv.messages:
            conv.messages.append({"role": "user", "content": self._start_text(history, summary="")})
            conv.save()
        elif conv.unanswered_tool_uses():  # a kill cut a turn: run its tool calls now
            out = self._run_tools(conv.messages[-1]["content"], history)
            if out is not None:
                return self._done(out, usage, history)
        for _ in range(self.cfg.max_turns_per_trial):
            try:
                self._check_cost()
                message, u = self.client.create(system=self.system, tools=self.tool_schemas,
                                                messages=_with_cache_point(conv.messages))
            except BudgetExhausted:
                self._record_usage(usage, history)
                raise
            except AgentAPIError as e:
                self._record_usage(usage, history)
                self.store.add_event(self.run_id, "agent.error", str(e))
                self.store.set_run_status(self.run_id, "stopped", stop_reason=f"agent: {e}")
                raise
            usage.add(u)
            self._count(u)
            # An empty assistant turn would make every later request invalid: keep a placeholder.
            content = [_block(b) for b in message.content] or [{"type": "text", "text": "(no reply)"}]
            conv.messages.append({"role": "assistant", "content": content})
            conv.save()
            out = self._run_tools(conv.messages[-1]["content"], history)
            if out is not None:
                return self._done(out, usage, history)
        self._record_usage(usage, history)
        self.store.add_event(self.run_id, "agent.turn_limit",
                             f"no run_trial within {self.cfg.max_turns_per_trial} turns; the agent proposer stops")
        return None

    def _run_tools(self, content: list[dict[str, Any]], history: Sequence[Any]) -> Any:
        """Run the turn's tool calls. Return a Candidate / _FINISHED when the turn ends the proposal."""
        conv = self.conv
        uses = [b for b in content if b.get("type") == "tool_use"]
        if not uses:
            conv.messages.append({"role": "user", "content": _CONTINUE + self._steer_suffix()})
            conv.save()
            return None
        results: list[dict[str, Any]] = []
        for i, b in enumerate(uses):
            result, is_error = self.tools.call(b["name"], b.get("input") or {})
            rest = [_tool_result(x["id"], f"not run: {b['name']} ended your turn", True) for x in uses[i + 1:]]
            if isinstance(result, TrialRequest):
                commit = self.wt.commit(result.rationale)
                conv.pending = {
                    "id": b["id"], "results": results + rest, "after": max((t.number for t in history), default=-1),
                    "commit": commit, "knobs": result.knobs, "rationale": result.rationale,
                    "prediction": result.prediction, "expected_score": result.expected_score,
                }
                conv.save()
                return self._candidate(conv.pending)
            if isinstance(result, FinishRequest):
                conv.finished = result.summary
                conv.messages.append({"role": "user", "content": [*results, _tool_result(b["id"], "finished"), *rest]})
                conv.save()
                self.store.add_event(self.run_id, "agent.finish", result.summary[:2000])
                return _FINISHED
            results.append(_tool_result(b["id"], result, is_error))
        conv.messages.append({"role": "user", "content": results})
        conv.save()
        return None

    def _done(self, out: Any, usage: Usage, history: Sequence[Any]) -> Candidate | None:
        self._record_usage(usage, history)
        return None if out is _FINISHED else out

    # --- run_trial round trip --------------------------------------------------------------
    def _candidate(self, p: dict[str, Any]) -> Candidate:
        prediction = p["prediction"] + (f" (expected score {p['expected_score']:g}x)" if p.get("expected_score") else "")
        return Candidate(knobs=dict(p["knobs"]), commit=p["commit"], rationale=p["rationale"],
                         prediction=prediction or None, proposer=self.name, extra={"expected_score": p.get("expected_score")})

    def _trial_for(self, p: dict[str, Any], history: Sequence[Any]) -> Any:
        return next((t for t in history if t.number > p["after"] and t.proposer == self.name), None)

    def _await_approval(self, trial: Any) -> Any:
        """A trial waiting for a person: give them `approval_wait_s` to decide before the agent goes on."""
        deadline = time.monotonic() + self.cfg.approval_wait_s
        while trial.status == "needs_approval" and time.monotonic() < deadline:
            time.sleep(min(1.0, self.cfg.approval_wait_s))
            trial = self.store.get_trial(trial.id)
        return trial

    def _answer_pending(self, trial: Any, history: Sequence[Any]) -> None:
        conv, p = self.conv, self.conv.pending
        if trial.status == "needs_approval":
            trial = self._await_approval(trial)
        hit = self._score_prediction(trial, p)
        baseline = next((t for t in history if t.number == 0), None)
        best = self._best(history)
        later = [t for t in history if t.number > trial.number]
        text = render(
            "outcome.md.j2", trial=trial, base_commit=self.ctx.base_commit, gates=self.store.gate_results(trial.id), objective=trial.objective or {},
            baseline=(baseline.objective or {}) if baseline else {}, prediction=p.get("prediction") or trial.prediction, hit=hit,
            best=f"trial #{best.number}, {best.score:.3f}x" if best else "the baseline (1.0x)",
            later=render("history.md.j2", rows=history_rows(later, self.ctx.target.baseline_knobs())) if later else "",
            steer=self._new_steers(),
        )
        if conv.last_context_tokens >= self.cfg.compact_at_tokens:
            self._compact(history)
        conv.messages.append({"role": "user", "content": [*p["results"], _tool_result(p["id"], text)]})
        conv.pending = None
        conv.save()

    def _score_prediction(self, trial: Any, p: dict[str, Any]) -> bool | None:
        expected = p.get("expected_score")
        if not expected:
            return None
        hit = bool(trial.score) and abs(trial.score / expected - 1) <= self.cfg.prediction_tolerance
        self.store.add_event(self.run_id, "agent.prediction", f"trial #{trial.number}: {'hit' if hit else 'miss'}",
                             trial_id=trial.id, data={"expected_score": expected, "score": trial.score, "hit": hit,
                                                      "prediction": p.get("prediction")})
        return hit

    # --- long runs -------------------------------------------------------------------------
    def _start_text(self, history: Sequence[Any], summary: str) -> str:
        rows = history_rows(list(history), self.ctx.target.baseline_knobs())
        best = self._best(history)
        return render("start.md.j2", summary=summary, history=render("history.md.j2", rows=rows),
                      best=f"trial #{best.number}, {best.score:.3f}x" if best else "the baseline (1.0x)")

    def _compact(self, history: Sequence[Any]) -> None:
        """Replace every turn before the pending run_trial with a summary built from the store."""
        conv = self.conv
        notes = [f"- #{t.number}: {t.rationale.splitlines()[0][:160]}" for t in history if t.proposer == self.name]
        summary = "Your trials and their rationales:\n" + "\n".join(notes)
        conv.messages = [{"role": "user", "content": self._start_text(history, summary)}, conv.messages[-1]]
        conv.compactions += 1
        self.store.add_event(self.run_id, "agent.compact", f"conversation compacted at {conv.last_context_tokens} tokens")

    def _count(self, u: Usage) -> None:
        total = Usage(**{k: v for k, v in self.conv.usage.items() if k in Usage.__dataclass_fields__})
        total.add(u)
        self.conv.usage = total.as_dict()
        self.conv.last_context_tokens = u.context_tokens

    def _record_usage(self, usage: Usage, history: Sequence[Any]) -> None:
        """Tokens and dollars of this proposal, as an event tied to the trial it produced."""
        # The store's numbering, not `history`'s: the loop's own trials (sentinels, paired rounds) are
        # left out of the history but take numbers too.
        nxt = max((t.number for t in self.store.list_trials(self.run_id)), default=-1) + 1
        self.store.add_event(self.run_id, "agent.usage",
                             f"{usage.calls} call(s), {usage.input_tokens}+{usage.cache_read_input_tokens} cached in, "
                             f"{usage.output_tokens} out, ${usage.cost_usd:.4f}",
                             data={**usage.as_dict(), "for_trial": nxt, "total_cost_usd": self.conv.usage.get("cost_usd", 0.0)})

    def _check_cost(self) -> None:
        """Stop on spend: `agent.max_cost_usd`, the goal's "within $N" and its `budget.tokens`."""
        u = self.conv.usage
        spent = float(u.get("cost_usd", 0.0))
        budget = self.ctx.goal.budget
        for limit, source in ((self.cfg.max_cost_usd, "agent.max_cost_usd"), (budget.cost_usd, "the goal's budget")):
            if limit is not None and spent >= limit:
                raise BudgetExhausted(f"the agent spent ${spent:.2f}; the limit is ${limit:g} ({source})")
        tokens = sum(int(u.get(k, 0)) for k in ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                                                 "cache_read_input_tokens"))
        if budget.tokens is not None and tokens >= budget.tokens:
            raise BudgetExhausted(f"the agent used {tokens} tokens; the goal's budget is {budget.tokens}")

    # --- steering and the best commit ------------------------------------------------------
    def _new_steers(self) -> list[str]:
        new = [e for e in self.store.events(self.run_id, kind="steer") if e.id > self.conv.steer_seen]
        if new:
            self.conv.steer_seen = max(e.id for e in new)
        return [e.message for e in new]

    def _steer_suffix(self) -> str:
        steers = self._new_steers()
        return ("\n\nMessages from the operator (follow them):\n" + "\n".join(f"- {s}" for s in steers)) if steers else ""

    def _best(self, history: Sequence[Any]) -> Any:
        run = self.store.get_run(self.run_id)
        best = self.store.get_trial(run.best_trial_id) if run and run.best_trial_id else None
        return best if best is not None and best.number > 0 and best.score else None

    def _tag_best(self) -> None:
        best = self._best(())
        if best is not None and best.commit and best.commit != self.ctx.base_commit:
            self.wt.repo.git.tag("-f", f"{self.branch}-best", best.commit)
