"""How the CLI fails: one line on stderr, a documented exit code, JSON under --json.

`GuardedGroup` is the typer group class of the `infergoal` app: every exception a command
raises ends here and becomes `error: what; what to do next` plus its exit code
(orchestrator/core/exitcodes.py). Only `--debug` lets a traceback through.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, NoReturn

import click
import typer
from rich.console import Console
from rich.markup import escape

from orchestrator.core.exitcodes import EXIT_CODES

__all__ = ["ERRORS", "GuardedGroup", "emit", "fail", "fail_from", "pipe_closed"]

_err = Console(stderr=True, soft_wrap=True)


class _ErrorState:
    json: bool = False
    """`--json` was given: errors are also printed as JSON on stdout."""
    debug: bool = False
    """`--debug` was given: tracebacks go through."""


ERRORS = _ErrorState()


def emit(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def fail(msg: str, outcome: str = "bad_input") -> NoReturn:
    """Print `error: <first line>` (detail lines after it) and exit with the outcome's code."""
    code = EXIT_CODES[outcome]
    msg = str(msg).strip() or "unknown error"
    first, _, rest = msg.partition("\n")
    _err.print(f"[bold red]error:[/] {escape(first)}", highlight=False)
    if rest.strip():
        _err.print(escape(rest), highlight=False)
    if ERRORS.json:
        emit({"outcome": outcome, "exit_code": code, "error": first})
    raise typer.Exit(code)


def pipe_closed() -> NoReturn:
    """The reader of stdout went away (`infergoal kb show ID | head -40`): stop quietly with the
    status a command killed by SIGPIPE has (128 + 13), as other command-line tools do. Stdout is
    pointed at /dev/null first, so the interpreter's last flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test runner's buffer): nothing left to flush
        pass
    raise typer.Exit(128 + signal.SIGPIPE)


def fail_from(e: BaseException) -> NoReturn:
    """Map an exception to its user-facing line and exit code."""
    from gates.lock import GateTampered
    from orchestrator.config.goal import GoalError
    from orchestrator.config.workspace import ConfigError
    from orchestrator.core.oneline import one_line
    from orchestrator.hosts import HostError
    from orchestrator.hosts.runlease import LeaseHeld
    from orchestrator.store import StoreError
    from orchestrator.targets import TargetError

    if isinstance(e, LeaseHeld):
        fail(str(e), "busy")
    if isinstance(e, GateTampered):
        fail(str(e), "gates_tampered")
    if isinstance(e, GoalError | ConfigError | TargetError | HostError | LookupError):
        fail(str(e), "bad_input")
    if isinstance(e, StoreError):
        fail(str(e), "failed")
    if isinstance(e, OSError):
        where = f" ({e.filename})" if e.filename else ""
        fail(f"{e.strerror or e}{where}; check the path, its permissions and free space", "failed")
    fail(f"internal error: {one_line(e)} — a bug; rerun with --debug for the traceback and report it", "failed")


# typer 0.29 runs on its own vendored copy of click (typer._click): its usage errors (an unknown
# option such as a goal text "-0") are not the installed click's classes, so both are passed through.
_CLICK_FLOW: tuple[type[BaseException], ...] = (typer.Exit, click.exceptions.Exit, click.ClickException, click.exceptions.Abort)
_USAGE: tuple[type[BaseException], ...] = (click.UsageError,)
try:
    from typer._click import exceptions as _vendored_click
except ImportError:  # a typer that uses the installed click
    pass
else:
    _CLICK_FLOW += (_vendored_click.ClickException,)
    _USAGE += (_vendored_click.UsageError,)


def _usage(e: Any, ctx: click.Context) -> NoReturn:
    """A usage mistake (a bad argument, an unknown option or command): one line like every error,
    not click's four, with the command's --help to turn to. A bare group still prints its help."""
    if type(e).__name__ == "NoArgsIsHelpError":  # typer's own class or click's: same behaviour wanted
        raise e
    where = getattr(e, "ctx", None) or ctx
    root = where.find_root()
    name = getattr(e, "option_name", None)
    if name and where is not root and any(name in p.opts for p in root.command.params):
        # `infergoal goal -w DIR ...`: a global option given after the command
        sub = where.command_path[len(root.command_path):].strip()
        fail(f"{name} is a global option: put it before the command, e.g. "
             f"`{root.command_path} {name} ... {sub} ...`; see `{root.command_path} --help`")
    fail(f"{e.format_message().rstrip('.')}; see `{where.command_path} --help`")


class GuardedGroup(typer.core.TyperGroup):
    """The one place errors become `error: ...` + an exit code (tracebacks only under --debug)."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> click.Context:
        opts = args[: args.index("--")] if "--" in args else args
        ERRORS.json, ERRORS.debug = "--json" in opts, "--debug" in opts
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _USAGE as e:
            _usage(e, click.Context(self, info_name=info_name))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            out = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here when the output fit the buffer
            return out
        except _USAGE as e:
            _usage(e, ctx)
        except _CLICK_FLOW:  # --help, exits: click prints them with their own codes
            raise
        except BrokenPipeError:
            pipe_closed()
        except Exception as e:
            if ERRORS.debug:
                raise
            fail_from(e)
