"""The run's engine worktree, as the agent may touch it: confined files, commands, commits.

One git worktree per run (branch `infergoal/run-N`, from the run's base commit) under the
run dir. The agent sees only the engine's source folder inside it (`root`), and within that:
- a path must be relative, without `..`, and never pass through a symlink (a symlink can point
  at the gates or the bench whatever its name says);
- the gate suite, the accuracy data, the harness and `.git` are refused by name as well, for
  engines whose source folder is the repository root;
- a command runs with the root as cwd, a scrubbed environment (no API key, HOME/TMPDIR inside
  the run dir), a timeout, truncated output; it is refused when it names a path outside the
  worktree, and protected files it changed anyway are restored from the base commit.
The gates are judged on the commit's diff as well (`gates.diffscan`), so these checks are the
first of two lines, not the only one.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path, PurePosixPath

import git

from gates.diffscan import DEFAULT_PROTECTED
from orchestrator.agent.errors import ToolError

__all__ = ["PROTECTED", "EngineWorktree", "truncate"]

# The gate suite, its held-out data and the harness, plus git's own files.
PROTECTED: tuple[str, ...] = (*DEFAULT_PROTECTED, ".git", "*/.git/*", "gates", "*heldout*", "*/gates/*")
# Absolute paths a command may name: system tools and devices, all read-only for us.
_SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib", "/opt/", "/etc/", "/proc/self", "/proc/cpuinfo", "/proc/meminfo",
                    "/dev/null", "/dev/stdout", "/dev/stderr")
_AUTHOR = ("-c", "user.name=infergoal-agent", "-c", "user.email=agent@infergoal.invalid")


def truncate(text: str, limit: int) -> str:
    """Keep the head and the tail: errors sit at the end of a log, context at the start."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"


def _protected(rel_to_repo: str) -> bool:
    """Whether a repo-relative path is one the agent may never read or write."""
    p = rel_to_repo.strip("/")
    for pat in PROTECTED:
        stem = pat[:-2] if pat.endswith("/*") else pat
        if fnmatch.fnmatch(p, pat) or p == stem or p.startswith(stem + "/"):
            return True
    return False


class EngineWorktree:
    """The agent's view of the engine source at the run's branch."""

    def __init__(self, repo_dir: Path, source_dir: Path, base_commit: str, dest: Path, branch: str,
                 *, max_output_chars: int = 8000, command_timeout_s: float = 120.0) -> None:
        repo = git.Repo(repo_dir, search_parent_directories=True)
        repo_root = Path(repo.working_tree_dir).resolve()
        self.rel_source = Path(source_dir).resolve().relative_to(repo_root)
        self.base_commit, self.branch = base_commit, branch
        self.max_output_chars, self.command_timeout_s = max_output_chars, command_timeout_s
        dest = Path(dest)
        if not (dest / ".git").exists():  # resume reuses the worktree and its uncommitted edits
            dest.parent.mkdir(parents=True, exist_ok=True)
            if branch in [h.name for h in repo.heads]:
                repo.git.worktree("add", str(dest), branch)
            else:
                repo.git.worktree("add", "-b", branch, str(dest), base_commit)
        self.top = dest.resolve()
        self.repo = git.Repo(self.top)
        self.root = (self.top / self.rel_source).resolve()
        self.scratch = self.top.parent / "scratch"
        self.scratch.mkdir(parents=True, exist_ok=True)

    # --- paths ---------------------------------------------------------------------------
    def resolve(self, path: str, *, must_exist: bool = False) -> Path:
        """A path the agent named -> an absolute path inside the root, or ToolError."""
        if not isinstance(path, str) or "\x00" in path:
            raise ToolError("path must be a string")
        if path.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", path):
            raise ToolError(f"refused: {path!r} is absolute; give a path relative to the engine source folder")
        parts = PurePosixPath(path.replace("\\", "/")).parts
        if ".." in parts:
            raise ToolError(f"refused: {path!r} climbs out with '..'; stay inside the engine source folder")
        current = self.root
        for part in parts:
            if part in (".", ""):
                continue
            current = current / part
            if current.is_symlink():
                raise ToolError(f"refused: {path!r} passes through a symlink ({current.relative_to(self.root)})")
        if not current.resolve().is_relative_to(self.root):
            raise ToolError(f"refused: {path!r} resolves outside the engine source folder")
        rel_repo = (self.rel_source / current.relative_to(self.root)).as_posix()
        if _protected(rel_repo) or ".git" in parts:
            raise ToolError(f"refused: {rel_repo} is protected (the gates, the accuracy data, the harness and git are off limits)")
        if must_exist and not current.exists():
            raise ToolError(f"{path} does not exist; use list_files to see what is there")
        return current

    def rel(self, p: Path) -> str:
        return p.relative_to(self.root).as_posix() or "."

    # --- files ---------------------------------------------------------------------------
    def list_files(self, path: str = ".") -> str:
        base = self.resolve(path, must_exist=True)
        if base.is_file():
            return self.rel(base)
        out = []
        for p in sorted(base.rglob("*")):
            rel = p.relative_to(self.root)
            if any(part in (".git", "__pycache__") for part in rel.parts) or _protected((self.rel_source / rel).as_posix()):
                continue
            out.append(rel.as_posix() + ("/" if p.is_dir() else "") + (" -> (symlink)" if p.is_symlink() else ""))
            if len(out) >= 500:
                out.append("... (more than 500 entries; list a subfolder)")
                break
        return "\n".join(out) or "(empty)"

    def read_file(self, path: str, offset: int = 0, limit: int = 400) -> str:
        p = self.resolve(path, must_exist=True)
        if not p.is_file():
            raise ToolError(f"{path} is a folder; use list_files")
        lines = p.read_text(errors="replace").splitlines()
        out: list[str] = []
        size = 0
        end = min(len(lines), offset + limit)
        for i in range(offset, end):
            line = f"{i + 1:5d}  {lines[i]}"
            if size + len(line) > self.max_output_chars and out:
                end = i  # cut at a line boundary: code read in pages, never with a hole in the middle
                break
            out.append(line)
            size += len(line) + 1
        if end < len(lines):
            out.append(f"... ({len(lines) - end} more lines; read on with offset={end})")
        return "\n".join(out)

    def grep(self, pattern: str, path: str = ".") -> str:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ToolError(f"bad regular expression {pattern!r}: {e}") from None
        base = self.resolve(path, must_exist=True)
        files = [base] if base.is_file() else sorted(f for f in base.rglob("*") if f.is_file() and not f.is_symlink())
        hits = []
        for f in files:
            rel = f.relative_to(self.root)
            if any(part in (".git", "__pycache__") for part in rel.parts) or _protected((self.rel_source / rel).as_posix()):
                continue
            for no, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{rel.as_posix()}:{no}: {line.strip()[:200]}")
        return truncate("\n".join(hits) or "(no matches)", self.max_output_chars)

    def edit_file(self, path: str, old: str, new: str) -> str:
        p = self.resolve(path, must_exist=True)
        text = p.read_text()
        count = text.count(old)
        if not old or count == 0:
            raise ToolError(f"the old text was not found in {path}; read the file and copy the text exactly")
        if count > 1:
            raise ToolError(f"the old text occurs {count} times in {path}; include more context to make it unique")
        p.write_text(text.replace(old, new, 1))
        return f"edited {path}"

    def write_file(self, path: str, content: str) -> str:
        p = self.resolve(path)
        if p.exists() and not p.is_file():
            raise ToolError(f"{path} is a folder")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        return f"wrote {len(content)} characters to {path}"

    # --- commands ------------------------------------------------------------------------
    def _check_command(self, command: str) -> None:
        try:
            tokens = shlex.split(command, comments=True)
        except ValueError as e:
            raise ToolError(f"cannot parse the command: {e}") from None
        for tok in tokens:
            for piece in re.split(r"[=:<>|;&()]", tok):
                if not piece or piece.startswith("//"):  # empty, or a URL's host part
                    continue
                if ".." in PurePosixPath(piece).parts:
                    raise ToolError(f"refused: {piece!r} climbs out of the worktree; commands stay inside it")
                if piece.startswith("~") or "$HOME" in piece:
                    raise ToolError(f"refused: {piece!r} is outside the worktree")
                if piece.startswith("/") and not (piece.startswith(_SYSTEM_PREFIXES) or Path(piece).resolve().is_relative_to(self.top)
                                                  or piece == sys.executable):
                    raise ToolError(f"refused: {piece!r} is outside the worktree; commands stay inside it")

    def run_command(self, command: str, timeout_s: float | None = None) -> str:
        self._check_command(command)
        timeout = min(float(timeout_s or self.command_timeout_s), self.command_timeout_s)
        env = {
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.scratch), "TMPDIR": str(self.scratch), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
        }
        proc = subprocess.Popen(["bash", "-c", command], cwd=self.root, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, text=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            status = f"exit code {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            status = f"killed after the {timeout:g} s timeout"
        restored = self.restore_protected()
        note = f"\nrefused and undone: the command changed protected files {restored}" if restored else ""
        return truncate(f"[{status}]\n{out}", self.max_output_chars) + note

    def restore_protected(self) -> list[str]:
        """Undo changes to protected paths (committed or not) since the base commit; return them."""
        changed = set(self.repo.git.diff("--name-only", self.base_commit).splitlines())
        changed |= set(self.repo.git.ls_files("--others", "--exclude-standard").splitlines())
        bad = sorted(p for p in changed if p and _protected(p))
        for p in bad:
            if p in self.repo.git.ls_tree("-r", "--name-only", self.base_commit).splitlines():
                self.repo.git.checkout(self.base_commit, "--", p)
            else:
                (self.top / p).unlink(missing_ok=True)
        return bad

    # --- commits -------------------------------------------------------------------------
    def commit(self, message: str) -> str | None:
        """Commit everything in the worktree; return the commit (None = still the base commit)."""
        self.repo.git.add("-A")
        if self.repo.is_dirty(index=True, working_tree=False, untracked_files=False):
            self.repo.git.execute(["git", *_AUTHOR, "commit", "-q", "--no-verify", "-m", message or "agent trial"])
        head = self.repo.head.commit.hexsha
        return None if head == self.base_commit else head
