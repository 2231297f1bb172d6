"""`infergoal shell`: set goals the way coding tools taught engineers to, by typing `/goal ...`.

The standard library's `cmd` and `readline` give the prompt its history (kept in
`.infergoal/shell_history`) and tab completion (commands, then trial numbers). A goal started
here runs as a child `infergoal goal` process, so the prompt stays usable and the run is exactly
what the CLI would do; a watcher thread prints each trial as the store records it. `/stop` sends
that process SIGINT: the controller marks the run `stopped` and tears the server down, and
`/resume` continues it with nothing lost. Every human act (steer, approve, reject, stop) goes
into the audit log with who and when.
"""

from __future__ import annotations

import cmd
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from orchestrator.config.workspace import Workspace
from orchestrator.review import trials as listing
from orchestrator.review.actions import DecisionError, decide, record_action, who_am_i
from orchestrator.review.facts import why_facts
from orchestrator.review.leaseloss import lease_words
from orchestrator.review.why import explain_run, explain_trial
from orchestrator.runs import open_store
from orchestrator.store import StoreError

try:  # readline is missing on some platforms (Windows); the shell works without history then
    import readline
except ImportError:  # pragma: no cover
    readline = None  # type: ignore[assignment]

__all__ = ["COMMANDS", "Shell"]

COMMANDS = ("/goal", "/status", "/trials", "/show", "/why", "/steer", "/approve", "/reject", "/stop",
            "/resume", "/run", "/kb", "/help", "/quit")
_NUMBERED = ("show", "why", "approve", "reject")
_DONE = ("kept", "discarded", "failed", "invalid", "needs_approval", "rejected")


class Shell(cmd.Cmd):
    intro = "infergoal shell — /goal TEXT starts a run in the background; /help lists commands; Tab completes."
    prompt = "infergoal> "

    def __init__(self, ws: Workspace, *, global_args: list[str] | None = None, stdout: Any = None) -> None:
        super().__init__(stdout=stdout)
        self.ws = ws
        self.store = open_store(ws)
        self.global_args = global_args or ["-w", str(ws.root)]
        self.child: subprocess.Popen[bytes] | None = None
        latest = self.store.latest_run()
        self.run_id: int | None = latest.id if latest else None
        self._seen: set[int] = set()
        self._watch_stop = threading.Event()
        self._lock = threading.Lock()
        self._matches: list[str] = []
        self.history = ws.state_dir / "shell_history"
        self._history_loaded = False

    # --- prompt plumbing ------------------------------------------------------------------
    def say(self, text: str) -> None:
        with self._lock:
            self.stdout.write(text + "\n")
            self.stdout.flush()

    def cmdloop(self, intro: Any = None) -> None:
        """The prompt; Ctrl-C clears the line instead of leaving (the background run goes on)."""
        while True:
            try:
                super().cmdloop(intro)
                return
            except KeyboardInterrupt:
                self.say("^C — /quit leaves the shell, /stop stops the run")
                intro = ""

    def preloop(self) -> None:
        if readline is not None and not self._history_loaded:
            self._history_loaded = True
            readline.set_completer_delims(" \t\n")  # '/' is part of a command name here
            self.history.parent.mkdir(parents=True, exist_ok=True)
            if self.history.is_file():
                readline.read_history_file(str(self.history))

    def postloop(self) -> None:
        if readline is not None:
            readline.set_history_length(1000)
            readline.write_history_file(str(self.history))

    def onecmd(self, line: str) -> bool:
        # A command that fails (database busy, bad number) says so and leaves the prompt up.
        try:
            return super().onecmd(line)
        except (StoreError, LookupError, ValueError, OSError) as e:
            self.say(f"error: {e}")
            return False

    def precmd(self, line: str) -> str:
        line = line.strip()
        return line[1:] if line.startswith("/") else line

    def emptyline(self) -> bool:
        return False

    def default(self, line: str) -> None:
        self.say(f"unknown command {line.split()[0]!r}; commands: {' '.join(COMMANDS)}")

    def complete(self, text: str, state: int) -> str | None:
        if state == 0:
            line = readline.get_line_buffer().lstrip() if readline is not None else text
            if " " not in line:
                self._matches = [c for c in COMMANDS if c.startswith(text) or c[1:].startswith(text)]
            elif line.split()[0].lstrip("/") in _NUMBERED and self.run_id is not None:
                numbers = [str(t.number) for t in self.store.list_trials(self.run_id)]
                self._matches = [n for n in numbers if n.startswith(text)]
            else:
                self._matches = []
        return self._matches[state] if state < len(self._matches) else None

    # --- background run -------------------------------------------------------------------
    def _running(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def _launch(self, args: list[str]) -> None:
        before = self.store.latest_run()
        log = self.ws.state_dir / "shell-run.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "orchestrator.cli", *self.global_args, *args]
        # Its own session: a Ctrl-C typed at the prompt must not stop the run; /stop does that.
        with log.open("ab") as out:
            self.child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, env={**os.environ, "COLUMNS": "120"})
        # One stop flag per watcher: a new launch must not revive the previous run's watcher.
        self._watch_stop = threading.Event()
        threading.Thread(target=self._watch, args=(before.id if before else 0, args[0] == "resume", self._watch_stop),
                         daemon=True).start()
        self.say(f"started in the background (pid {self.child.pid}, log {log}); /status to follow, /stop to stop")

    def _watch(self, before: int, resuming: bool, stop: threading.Event) -> None:
        """Print each trial as the store records it, and the run's end."""
        child = self.child
        while not stop.is_set():
            if not resuming:
                newer = [r for r in self.store.list_runs() if r.id > before]
                if newer:
                    if self.run_id != newer[0].id:
                        self.run_id = newer[0].id
                        self.say(f"run {self.run_id} started")
                    resuming = True
            if resuming and self.run_id is not None:
                for t in self.store.list_trials(self.run_id):
                    if t.status in _DONE and t.id not in self._seen:
                        self._seen.add(t.id)
                        score = f"{t.score:.3f}x" if t.score else "—"
                        self.say(f"  {self._label(t)} {listing.shown_status(t)} {score} {listing.knob_text(t.knobs)}" + (f" ({t.error.splitlines()[0][:100]})" if t.error else ""))
            if child is not None and child.poll() is not None:
                run = self.store.get_run(self.run_id) if self.run_id else None
                self.say(f"run {self.run_id} {run.status if run else 'ended'}: {run.stop_reason if run else f'exit {child.returncode}'}")
                return
            time.sleep(0.5)

    # --- commands -------------------------------------------------------------------------
    def do_goal(self, arg: str) -> None:
        """/goal TEXT — start a run toward TEXT in the background (e.g. /goal improve throughput by 2x within 8 trials)."""
        if not arg.strip():
            return self.say("usage: /goal TEXT, e.g. /goal beat the baseline by 20% on TPOT within 10 trials")
        if self._running():
            return self.say("a run is already going; /stop it first")
        from orchestrator.config.goal import GoalError, load_goal

        try:
            spec = load_goal(arg.strip())
        except GoalError as e:
            return self.say(f"error: {e}")
        self.say(f"goal: {spec.describe()}")
        self._seen.clear()
        self._launch(["goal", arg.strip()])
        return None

    def do_resume(self, arg: str) -> None:
        """/resume [RUN] — continue a stopped run in the background (default: the current run)."""
        if self._running():
            return self.say("a run is already going")
        run = int(arg) if arg.strip().isdigit() else self.run_id
        if run is None:
            return self.say("no run to resume")
        self.run_id = run
        self._seen = {t.id for t in self.store.list_trials(run) if t.status in _DONE}
        self._launch(["resume", str(run)])
        return None

    def do_stop(self, arg: str) -> None:
        """/stop — stop the background run cleanly (the trial in flight is redone by /resume)."""
        if not self._running():
            return self.say("no run is going")
        if self.run_id is not None:
            record_action(self.store, self.run_id, "stop.request", f"run {self.run_id} stopped from the shell by {who_am_i()}", who=who_am_i())
        self.child.send_signal(signal.SIGINT)
        try:
            self.child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.say("the run did not stop in 120 s; sending SIGTERM")
            self.child.terminate()
            self.child.wait()
        self._watch_stop.set()
        run = self.store.get_run(self.run_id) if self.run_id else None
        self.say(f"run {self.run_id} {run.status if run else 'stopped'}; /resume continues it")
        return None

    def do_status(self, arg: str) -> None:
        """/status — the current run: status, trials, best, what is in flight."""
        if self.run_id is None:
            return self.say("no run yet; /goal TEXT starts one")
        run = self.store.get_run(self.run_id)
        trials = self.store.list_trials(self.run_id)
        best = self.store.get_trial(run.best_trial_id) if run.best_trial_id else None
        inflight = [t.number for t in trials if t.status in ("pending", "running")]
        bg = "background: running" if self._running() else ("background: idle" if self.child is None else f"background: exited {self.child.returncode}")
        told = explain_run(self.store, run.id)
        lost = "" if not told["lease_lost"] else f" — {lease_words(told['lease_lost'][-1])}"
        said = listing.score_text(best.score, listing.paired_scores(self.store, run.id).get(best.id), unit="x") if best else ""
        self.say(f"run {run.id} {run.status}: {told['budget_line']}" + (f", best #{best.number} {said}" if said else "")
                 + (f", in flight #{inflight[0]}" if inflight else "") + (f" — {run.stop_reason}" if run.stop_reason else "") + lost + f" [{bg}]")
        return None

    def do_run(self, arg: str) -> None:
        """/run N — make run N the current run."""
        if not arg.strip().isdigit() or self.store.get_run(int(arg)) is None:
            return self.say(f"no run {arg!r}; runs: {', '.join(str(r.id) for r in self.store.list_runs()) or 'none'}")
        self.run_id = int(arg)
        return self.do_status("")

    def do_trials(self, arg: str) -> None:
        """/trials — the current run's trials."""
        paired = listing.paired_scores(self.store, self.run_id) if self.run_id else {}
        for t in self.store.list_trials(self.run_id) if self.run_id else []:
            score = listing.score_text(t.score, paired.get(t.id), unit="x") or "—"
            self.say(f"{self._label(t):<5} {listing.shown_status(t):<14} {score:>8}  {t.proposer:<9} {listing.knob_text(t.knobs)}")
        return None

    @staticmethod
    def _label(t: Any) -> str:
        """`#7` for a trial; `↳#8` for a measurement of one (a paired round, a sentinel, a re-run)."""
        if not listing.is_measurement(t):
            return f"#{t.number}"
        of = listing.measured_trial(t)
        return f"↳#{t.number}" + (f" ({t.proposer} of #{of})" if of is not None else f" ({t.proposer})")

    def _number(self, arg: str, command: str) -> int | None:
        if self.run_id is None:
            self.say("no run yet; /goal TEXT starts one, /run N picks one")
            return None
        if not arg.strip().isdigit():
            self.say(f"error: {arg.strip()!r} is not a trial number; e.g. /{command} 3 (/trials lists them)"
                     if arg.strip() else f"give a trial number, e.g. /{command} 3")
            return None
        return int(arg)

    def do_show(self, arg: str) -> None:
        """/show N — one trial: knobs, launch command, gates, error."""
        n = self._number(arg, "show")
        t = self.store.get_trial_by_number(self.run_id, n) if n is not None else None
        if t is None:
            return self.say(f"run {self.run_id} has no trial #{arg}") if n is not None else None
        self.say(f"#{t.number} {t.status}" + (f" {t.score:.3f}x" if t.score else "") + f" — {t.proposer}: {t.rationale}")
        self.say(f"  knobs: {listing.knob_text(t.knobs)}\n  launch: {t.launch_cmd}")
        for g in self.store.gate_results(t.id):
            self.say(f"  gate {g.gate}: {g.status} — {g.reason}")
        if t.error:
            self.say(f"  error: {t.error}")
        return None

    def do_why(self, arg: str) -> None:
        """/why [N] — the first thing that decided trial N, with its numbers (no N: why the run stopped)."""
        if not arg.strip() and self.run_id is not None:
            r = explain_run(self.store, self.run_id)
            self.say(f"run {self.run_id} {r['status']}: {r['stop_reason'] or 'still running'}; "
                     f"{r['budget_line']}, {r['used']['trial_s'] / 60:.1f} min of trial time")
            for loss in r["lease_lost"]:
                self.say(f"  {lease_words(loss)}")
            return None
        n = self._number(arg, "why")
        if n is None:
            return None
        try:
            w = explain_trial(self.store, self.run_id, n)
        except LookupError as e:
            return self.say(str(e))
        self.say(f"#{n} {w.status} (decided by {w.decided_by}): {w.sentence}")
        for k, v in why_facts(w.evidence):
            self.say(f"  {k}: {v}")
        return None

    def _decide(self, arg: str, status: str) -> None:
        n = self._number(arg, "approve" if status == "kept" else "reject")
        if n is None:
            return
        try:
            t = decide(self.store, self.run_id, n, status, who_am_i())
        except DecisionError as e:
            return self.say(str(e))
        self.say(f"trial #{t.number}: {t.status} (recorded as {who_am_i()})")

    def do_approve(self, arg: str) -> None:
        """/approve N — accept a trial that passed with accuracy drift (needs_approval)."""
        self._decide(arg, "kept")

    def do_reject(self, arg: str) -> None:
        """/reject N — reject a trial waiting for approval."""
        self._decide(arg, "rejected")

    def do_steer(self, arg: str) -> None:
        """/steer TEXT — guidance for the proposer, recorded in the audit log (agent proposers read it)."""
        if not arg.strip() or self.run_id is None:
            return self.say("usage: /steer TEXT (needs a run: /goal or /run N first)")
        record_action(self.store, self.run_id, "steer", arg.strip(), who=who_am_i(), text=arg.strip())
        self.say(f"noted for run {self.run_id}: {arg.strip()}")
        return None

    def do_kb(self, arg: str) -> None:
        """/kb [WORD] — knowledge-base entries (contracts, constraints, findings), optionally matching WORD."""
        from orchestrator.knowledge import KnowledgeBase

        kb = KnowledgeBase(self.ws.kb_read_dirs, write_dir=self.ws.kb_write_dir)
        for e in sorted(kb.entries.values(), key=lambda e: (e.kind, e.id)):
            title = str(e.meta.get("title", ""))
            if arg.strip().lower() in f"{e.id} {title}".lower():
                self.say(f"{e.kind:<10} {e.status:<10} {e.id}: {title}")
        return None

    def do_help(self, arg: str) -> None:
        """/help — this list."""
        for name in COMMANDS:
            fn = getattr(self, f"do_{name[1:]}", None)
            self.say((fn.__doc__ or name).strip().splitlines()[0] if fn else name)

    def do_quit(self, arg: str) -> bool:
        """/quit — leave the shell (a background run is stopped cleanly first; /resume later)."""
        if self._running():
            self.do_stop("")
        self._watch_stop.set()
        return True

    do_exit = do_quit

    def do_EOF(self, arg: str) -> bool:  # noqa: N802 - cmd's name for Ctrl-D
        self.say("")
        return self.do_quit(arg)

