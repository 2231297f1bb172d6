"""Tree manifests: relative path -> sha256, so a sync sends only the files that changed.

Both ends use this module: the orchestrator hashes its local tree, the host hashes its copy, and
the difference is what travels. Hashing a large model on every trial would cost more than the
sync saves, so each side remembers digests by (size, mtime_ns) and rehashes only files that moved.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

__all__ = ["CACHE_NAME", "EXCLUDED_DIRS", "diff", "manifest", "tar_files", "tree_digest"]

CACHE_NAME = ".infergoal-manifest.json"
# Build and VCS debris never matters to a server, and the workspace state dir may sit inside a tree.
EXCLUDED_DIRS = frozenset({".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".infergoal"})
_EXCLUDED_SUFFIXES = (".pyc", ".pyo")

# (abs path, size, mtime_ns) -> sha256: the orchestrator's side of the cache, per process.
_MEMO: dict[tuple[str, int, int], str] = {}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _walk(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            if name == CACHE_NAME or name.endswith(_EXCLUDED_SUFFIXES):
                continue
            yield Path(dirpath) / name


def manifest(root: str | Path, *, persist: bool = False) -> dict[str, str]:
    """sha256 of every file under `root` (posix relative path -> hex digest).

    `persist` keeps the (size, mtime) cache in a file inside the tree (the host's side, where each
    call is a fresh process); otherwise an in-process memo is used.
    """
    root = Path(root)
    cache_file = root / CACHE_NAME
    saved: dict[str, list] = {}
    if persist and cache_file.is_file():
        try:
            saved = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            saved = {}
    out: dict[str, str] = {}
    fresh: dict[str, list] = {}
    for path in _walk(root):
        rel = path.relative_to(root).as_posix()
        try:
            st = path.stat()
        except OSError:
            continue  # a dangling symlink: nothing a server could read either
        key = (str(path), st.st_size, st.st_mtime_ns)
        entry = saved.get(rel)
        if entry and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
            digest = entry[2]
        elif key in _MEMO:
            digest = _MEMO[key]
        else:
            digest = _sha256(path)
            _MEMO[key] = digest
        out[rel] = digest
        fresh[rel] = [st.st_size, st.st_mtime_ns, digest]
    if persist:
        try:
            cache_file.write_text(json.dumps(fresh))
        except OSError:
            pass
    return out


def diff(local: dict[str, str], remote: dict[str, str]) -> tuple[list[str], list[str]]:
    """(paths to send, paths to delete) to make `remote` equal `local`."""
    send = sorted(p for p, d in local.items() if remote.get(p) != d)
    delete = sorted(set(remote) - set(local))
    return send, delete


def tree_digest(files: dict[str, str]) -> str:
    """One sha256 for a whole manifest: the engine version / model hash recorded with a trial."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def tar_files(root: Path, rels: list[str], extra: dict[str, bytes] | None = None, *, gz: bool = False) -> bytes:
    """A tar of `rels` under `root` (mtimes kept, so the host's digest cache stays valid) plus `extra` files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for rel in rels:
            tar.add(root / rel, arcname=rel, recursive=False)
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
