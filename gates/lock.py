"""``gates.lock``: sha256 digests of every gate file and of the reference data.

The controller calls :func:`verify` at run start and before every trial; any difference
(a file changed, added or removed) raises :class:`GateTampered` and stops the run. Changing a gate
is a human act: ``infergoal gates relock`` calls :func:`relock` and records it in the audit log.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_NAME", "GateTampered", "digest_tree", "relock", "verify"]

LOCK_NAME = "gates.lock"
# Build and editor debris is not part of the gate; everything else under gates/ is.
_IGNORED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
_IGNORED_SUFFIXES = {".pyc", ".pyo"}


class GateTampered(RuntimeError):
    """The gate files differ from ``gates.lock``.

    Attributes:
        changed, added, removed: paths relative to the gates folder, sorted.
    """

    def __init__(self, changed: list[str], added: list[str], removed: list[str], note: str = "") -> None:
        self.changed, self.added, self.removed = changed, added, removed
        parts = [note] if note else []
        for label, paths in (("changed", changed), ("added", added), ("removed", removed)):
            if paths:
                parts.append(f"{label}: {', '.join(paths)}")
        parts.append("if the change is intended, run `infergoal gates relock` (recorded in the audit log)")
        super().__init__("gate files differ from gates.lock; " + "; ".join(parts))


def _root(root: Path | str | None) -> Path:
    return Path(root) if root is not None else Path(__file__).resolve().parent


def _files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in _IGNORED_DIRS for part in rel.parts) or path.suffix in _IGNORED_SUFFIXES:
            continue
        if rel.as_posix() == LOCK_NAME:
            continue
        # A symlink could point the gate at mutable code elsewhere: hash it as a file so
        # adding one shows up, and refuse to follow it (its digest is of the link target text).
        if path.is_symlink():
            yield path
        elif path.is_file():
            yield path


def _digest(path: Path) -> str:
    if path.is_symlink():
        return "symlink:" + hashlib.sha256(str(path.readlink()).encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digest_tree(root: Path | str | None = None) -> dict[str, str]:
    """sha256 of every file under the gates folder (posix relative path -> hex digest)."""
    base = _root(root)
    return {p.relative_to(base).as_posix(): _digest(p) for p in _files(base)}


def _read_lock(base: Path) -> dict[str, str]:
    data = json.loads((base / LOCK_NAME).read_text())
    return dict(data["files"])


def verify(root: Path | str | None = None) -> dict[str, str]:
    """Check the gates folder against its lock; return the verified digests.

    Raises:
        GateTampered: a file changed, was added or removed, or the lock is missing/unreadable.
    """
    base = _root(root)
    current = digest_tree(base)
    try:
        locked = _read_lock(base)
    except (OSError, ValueError, KeyError) as exc:
        raise GateTampered([], sorted(current), [], note=f"lock unreadable ({exc.__class__.__name__})") from exc
    changed = sorted(p for p in current.keys() & locked.keys() if current[p] != locked[p])
    added = sorted(current.keys() - locked.keys())
    removed = sorted(locked.keys() - current.keys())
    if changed or added or removed:
        raise GateTampered(changed, added, removed)
    return current


def relock(who: str, root: Path | str | None = None) -> list[str]:
    """Rewrite the lock from the files as they are now; return the paths whose digest changed
    (including added and removed ones). ``who`` is stored in the lock for the audit trail."""
    base = _root(root)
    current = digest_tree(base)
    try:
        locked = _read_lock(base)
    except (OSError, ValueError, KeyError):
        locked = {}
    touched = sorted(p for p in current.keys() | locked.keys() if current.get(p) != locked.get(p))
    payload = {
        "version": 1,
        "relocked_by": who,
        "relocked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": current,
    }
    (base / LOCK_NAME).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return touched
