"""Write mm_bench.py's measured launch tables into the tables file of the GPU they were measured on.

    python3 benchmarks/gpu/paste_tables.py OUT/glu.json [OUT/fuse.json ...] [--gpu NAME] [--tables DIR] [--dry-run]

Each JSON is an ``mm_bench.py`` result; the tables it printed (``glu_configs_py``: ``MM_GLU_CONFIGS``,
``fuse_configs_py``: ``MM_FUSE_CONFIGS``, ``mm_configs_py``: ``MM_CONFIGS``, ``attn_configs_py``: ``ATTN_CONFIGS``
and ``ATTN_LOWP_FP8``) replace those tables in ``hfserve/tables/<GPU>.json`` (hfserve.tables): the winners only, so
a launch that lost to today's is no longer listed and the engine keeps today's launches for it; the file's other
tables stay. The GPU is the one the result names (its ``meta.device``, torch.cuda.get_device_name), or ``--gpu``.
The engine reads the running GPU's file when it starts, so servers started after this serve the launches just
measured. Exit 2 with one line when a file or a table cannot be read.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

from hfserve import hfkernels as kernels
from hfserve.tables import TABLES_DIR, TableError, table_path, write_tables

KEYS = {"glu_configs_py": ("MM_GLU_CONFIGS",), "fuse_configs_py": ("MM_FUSE_CONFIGS",),
        "mm_configs_py": ("MM_CONFIGS",), "attn_configs_py": ("ATTN_CONFIGS", "ATTN_LOWP_FP8")}
_ENTRY = re.compile(r"^\s+(\(.*?\)):\s*(\w+)\((.*?)\),?\s*(?:#\s*(.*))?$")


def _cfg(kind: type, args: str) -> Any:
    """``MmCfg(64, 128, 4, 5, 1, True, '')``'s arguments as the dataclass (literals only: nothing is evaluated)."""
    call = ast.parse(f"f({args})", mode="eval").body
    return kind(*(ast.literal_eval(a) for a in call.args), **{k.arg: ast.literal_eval(k.value) for k in call.keywords})


def tables(res: dict) -> tuple[dict[str, dict[tuple, Any]], dict[str, dict[tuple, str]]]:
    """{table name: {key: cfg}} and {table name: {key: note}} of one mm_bench result's printed tables."""
    out: dict[str, dict[tuple, Any]] = {}
    notes: dict[str, dict[tuple, str]] = {}
    for key, names in KEYS.items():
        text = res.get(key) or ""
        if not text.strip():
            continue
        name = None
        for line in text.splitlines():
            head = re.match(r"^(\w+)(:[^=]+)? = \{", line)
            if head:
                name = head.group(1)
                if name not in names:
                    raise ValueError(f"{key} prints {name}, not {' or '.join(names)}")
                out[name], notes[name] = {}, {}
                continue
            m = _ENTRY.match(line)
            if m and name:
                k = ast.literal_eval(m.group(1))
                out[name][k] = _cfg(kernels.TABLE_KINDS[name], m.group(3))
                if m.group(4):
                    notes[name][k] = m.group(4).strip()
        if name is None:
            raise ValueError(f"{key} does not start with {names[0]}")
    return out, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="mm_bench.py --out JSON files")
    ap.add_argument("--gpu", default="", help="the GPU's name (default: the result's meta.device)")
    ap.add_argument("--tables", default=str(TABLES_DIR), help="the tables folder (default: hfserve's)")
    ap.add_argument("--dry-run", action="store_true", help="print the tables, change nothing")
    args = ap.parse_args(argv)
    lines = []
    try:
        for f in args.results:
            res = json.loads(Path(f).read_text())
            gpu = args.gpu or res.get("meta", {}).get("device") or ""
            if not gpu:
                raise ValueError(f"{f} names no GPU (meta.device): pass --gpu")
            found, notes = tables(res)
            path = table_path(gpu, Path(args.tables))
            if not args.dry_run:
                write_tables(path, gpu, found, {n: f"benchmarks/gpu/mm_bench.py ({Path(f).name})" for n in found}, notes)
            for name, entries in found.items():
                lines += [f"{name}: {len(entries)} entries from {f} -> {path}",
                          *(f"    {k}: {c}" for k, c in entries.items())]
    except (OSError, ValueError, SyntaxError, TypeError, TableError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"paste_tables: {exc}", file=sys.stderr)
        return 2
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:
        sys.stdout = None  # the tables are written; nothing more to say
    return 0


if __name__ == "__main__":
    sys.exit(main())
