"""What every command module of the CLI shares: the global options, the workspace, the store, who.

`main`'s root callback fills `STATE` from `-w`, `--db` and `-o` before any command runs, so a
command of any module (`kb`, `review`, `hosts`) opens the same workspace. Problems end the
command through `errors.fail`: one `error:` line and the outcome's exit code.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.cli.errors import fail

__all__ = ["STATE", "console", "err", "get_store", "get_workspace", "run_id_of", "whoami"]

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class _State:
    workspace: Path = Path(".")
    """`-w`: the workspace folder."""
    overrides: list[str] = []
    """`-o a.b=value` overrides, `--db` among them as `db="URL"`."""


STATE = _State()


def get_workspace(*, create: bool = False) -> Any:
    """The workspace the global options name; a bad config, or (unless `create`: `goal` makes one)
    a folder that does not exist, ends the command (bad input)."""
    from orchestrator.config.workspace import ConfigError, Workspace

    if not create and not STATE.workspace.is_dir():
        fail(f"workspace {STATE.workspace} does not exist; make one with `infergoal init {STATE.workspace}`, "
             "or point -w at an existing one")
    try:
        return Workspace(STATE.workspace, STATE.overrides)
    except ConfigError as e:
        fail(str(e))


def get_store(read_only: bool = False) -> Any:
    """The store; `read_only` (the review commands) never creates or writes, and is None if there is none yet."""
    from orchestrator.runs import open_store
    from orchestrator.store import StoreError

    ws = get_workspace()
    if read_only and not ws.config.db and not (ws.state_dir / "infergoal.db").is_file():
        return None
    try:
        return open_store(ws, read_only=read_only)
    except StoreError as e:
        fail(str(e), "failed")


def run_id_of(store: Any, run: int | None) -> int:
    """The id of run `run` (default: the latest run); no such run ends the command (bad input)."""
    r = None if store is None else store.get_run(run) if run is not None else store.latest_run()
    if r is None:
        ids = [x.id for x in store.list_runs()] if store is not None else []
        if run is not None and ids:  # the runs there are, not advice to start one
            shown = ", ".join(map(str, ids[-10:])) + (f" (and {len(ids) - 10} older)" if len(ids) > 10 else "")
            fail(f"no run {run} in this workspace; its runs are {shown} (`infergoal status` lists them)")
        fail("no run found" + (f" with id {run}" if run is not None else "") + "; start one with `infergoal goal \"...\"`")
    return r.id


def whoami() -> str:
    """Who is acting, for the audit log: the OS user."""
    return getpass.getuser()
