"""Paste mm_bench.py's measured launch tables into examples/hfserve/hfkernels.py, in place.

    python3 benchmarks/gpu/paste_tables.py OUT/glu.json [OUT/fuse.json ...] [--kernels PATH] [--dry-run]

Each JSON is an ``mm_bench.py --glu-only`` or ``--fuse-only`` result; its printed table (``glu_configs_py``:
``MM_GLU_CONFIGS``, ``fuse_configs_py``: ``MM_FUSE_CONFIGS``, ``mm_configs_py``: ``MM_CONFIGS``) replaces that
table's entries in hfkernels.py: the winners only, so a launch that lost to today's is no longer listed and the
engine keeps today's launches for it. The line declaring the table and the comments above it stay (say in them
where the numbers come from when committing). The step scripts run it on the GPU machine between a sweep and the
servers, so those serve the launches just measured; run here on the fetched JSON, it makes the same edit.
Exit 2 with one line when a file or a table is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"glu_configs_py": "MM_GLU_CONFIGS", "fuse_configs_py": "MM_FUSE_CONFIGS", "mm_configs_py": "MM_CONFIGS"}


def tables(res: dict) -> dict[str, list[str]]:
    """{table name: its entry lines} of one mm_bench result (a sweep prints one or two of them)."""
    out = {}
    for key, name in KEYS.items():
        text = res.get(key) or ""
        if not text.strip():
            continue
        lines = text.splitlines()
        if not lines or not lines[0].startswith(name):
            raise ValueError(f"{key} does not start with {name}")
        out[name] = [ln for ln in lines[1:] if ln.startswith("    ")]
    return out


def paste(src: str, name: str, entries: list[str]) -> str:
    """``src`` with the entries of the table ``name`` (its ``NAME...= {`` line to the first ``}`` line) replaced."""
    m = re.search(rf"^{name}(: [^=]+)? = \{{\n(.*?)^\}}\n", src, flags=re.M | re.S)
    if m is None:
        raise ValueError(f"no {name} table in the kernels file")
    head = src[m.start():src.index("\n", m.start()) + 1]
    return src[:m.start()] + head + "".join(f"{e}\n" for e in entries) + "}\n" + src[m.end():]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="mm_bench.py --out JSON files")
    ap.add_argument("--kernels", default=str(ROOT / "examples/hfserve/hfkernels.py"))
    ap.add_argument("--dry-run", action="store_true", help="print the tables, change nothing")
    args = ap.parse_args(argv)
    lines = []
    try:
        path = Path(args.kernels)
        src = path.read_text()
        for f in args.results:
            for name, entries in tables(json.loads(Path(f).read_text())).items():
                src = paste(src, name, entries)
                lines += [f"{name}: {len(entries)} entries from {f}", *entries]
        if not args.dry_run:
            path.write_text(src)  # before printing: a reader that stops early (`| head -1`) must not stop the paste
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"paste_tables: {exc}", file=sys.stderr)
        return 2
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:
        sys.stdout = None  # the pasted file is written; nothing more to say
    return 0


if __name__ == "__main__":
    sys.exit(main())
