"""A RAM-backed copy of the trial's model on this host, so every deploy reads its weights from memory.

A trial launches a fresh server, and a 7B server spends most of its deploy reading 14.5 GB of
weights. From the page cache that is fast, until something evicts it (another model, the forge,
a big bench log); from a tmpfs (/dev/shm) it stays fast for the whole run. So on a CUDA host
the model folder is copied once into ``/dev/shm/infergoal/models/<key>/<name>`` and every trial
launches from there (same folder name: a server that names its model after the folder says the same). The key is a digest of the folder's manifest of names, sizes and mtimes
(hashing 14.5 GB would cost more than the copy saves; the forge writes a model whole and renames
it into place, so a changed model has new mtimes). A copy is made only where the tmpfs keeps a
tenth of its size free after it; otherwise the trial uses the folder where it is.

Setting (`model_cache` in infergoal.toml): "auto" (the default) = on where a CUDA GPU is visible
(/dev/nvidia0...), off on CPU-only hosts; "off"; or a folder to keep the copies in (on anywhere).
The copies outlive the run (a next run on the same model reuses them); `rm -rf /dev/shm/infergoal`
gives the memory back.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["DEFAULT_ROOT", "cached_copy", "cuda_host", "manifest_key", "resolve"]

DEFAULT_ROOT = Path("/dev/shm/infergoal/models")
_DONE = ".infergoal-cache-complete"


def cuda_host() -> bool:
    """Whether this machine shows an NVIDIA GPU device (no CUDA import needed)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def resolve(setting: str) -> Path | None:
    """The cache folder a `model_cache` setting means here, or None for no cache."""
    if setting in ("", "off"):
        return None
    if setting == "auto":
        return DEFAULT_ROOT if cuda_host() else None
    return Path(setting)


def manifest_key(src: Path) -> str:
    """A digest of (relative path, size, mtime_ns) of every file under `src`."""
    rows = []
    for p in sorted(src.rglob("*")):
        if p.is_file():
            st = p.stat()
            rows.append([str(p.relative_to(src)), st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def cached_copy(src: str | Path, root: Path) -> Path:
    """The cached copy of the model folder `src` under `root`, made on first use; `src` itself
    where there is no room (the reason goes to stderr) or `src` already lives under `root`."""
    src = Path(src).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if src.is_relative_to(root.resolve()):
        return src
    dest = root / manifest_key(src) / src.name
    if (dest / _DONE).exists():
        return dest
    with open(root / f".{dest.parent.name}.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # two runs on one host copy once
        if (dest / _DONE).exists():
            return dest
        size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        usage = shutil.disk_usage(root)
        if usage.free - size < usage.total / 10:
            print(f"infergoal: no room in {root} for a {size / 1e9:.1f} GB copy of {src.name} "
                  f"({usage.free / 1e9:.1f} GB free); trials load it from {src}", file=sys.stderr)
            return src
        for old in root.glob(f"*/{src.name}/{_DONE}"):  # an earlier version of this model: give its memory back
            if old.read_text() == str(src):
                shutil.rmtree(old.parent.parent, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.parent.name}.", dir=root))
        try:
            shutil.copytree(src, tmp / src.name, copy_function=_link_or_copy)
            (tmp / src.name / _DONE).write_text(str(src))
            shutil.rmtree(dest.parent, ignore_errors=True)  # a copy cut short earlier
            os.replace(tmp, dest.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _link_or_copy(a: str, b: str) -> None:
    # A hard link where the cache is on the same file system (a configured folder on disk), else a copy.
    try:
        os.link(a, b)
    except OSError:
        shutil.copy2(a, b)
