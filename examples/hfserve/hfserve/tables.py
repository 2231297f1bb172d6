"""The Triton kernels' tuned launch tables: data per GPU, read at run time.

A table maps a shape (a GEMM's row bucket, N and K; decode attention's batch and context buckets) to the launch
configuration a sweep on that GPU found fastest (benchmarks/gpu/gemv_bench.py, mm_bench.py). Each GPU's tables are
one JSON file in ``tables/``, named after ``torch.cuda.get_device_name()`` (``NVIDIA H200`` -> ``NVIDIA_H200.json``),
as vLLM keeps its fused-MoE configs per device name. The engine reads the running GPU's file when it starts with
the Triton kernels; a GPU without a file gets the defaults: every table empty (cuBLAS, today's launches).
benchmarks/gpu/paste_tables.py writes a sweep's winners into the file of the GPU it ran on.

A file::

    {"device": "NVIDIA H200",
     "tables": {"MM_CONFIGS": {"source": "where the numbers come from",
                               "entries": [{"key": [16, 6144, 4096], "cfg": {"block_n": 64, ...}, "note": "qkv 14.7 vs 15.7 us"}]},
                ...}}
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

TABLES_DIR = Path(__file__).resolve().with_name("tables")

__all__ = ["TABLES_DIR", "TableError", "device_name", "read_tables", "table_path", "write_tables"]


class TableError(ValueError):
    """A tables file that cannot be read as one (its path and what is wrong)."""


def table_path(device: str, folder: Path = TABLES_DIR) -> Path:
    """The tables file of the GPU named ``device`` (as torch.cuda.get_device_name says it)."""
    return folder / (re.sub(r"[^A-Za-z0-9.-]+", "_", device).strip("_") + ".json")


def device_name(device: Any = None) -> str | None:
    """torch.cuda.get_device_name of ``device`` (the current GPU), or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device)


def read_tables(path: Path, kinds: dict[str, type]) -> dict[str, dict[tuple, Any]]:
    """Every table of ``kinds`` (name -> its config dataclass) from the file at ``path``: {name: {key tuple: cfg}};
    a table the file does not list is empty, and so is every table where there is no file. Raises TableError."""
    out: dict[str, dict[tuple, Any]] = {name: {} for name in kinds}
    if not path.exists():
        return out
    try:
        data = json.loads(path.read_text())
        for name, table in data.get("tables", {}).items():
            if name not in kinds:
                raise TableError(f"{path}: unknown table {name!r} (known: {', '.join(kinds)})")
            out[name] = {tuple(e["key"]): kinds[name](**e["cfg"]) for e in table.get("entries", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, TableError):
            raise
        raise TableError(f"{path}: not a tables file ({exc})") from None
    return out


def write_tables(path: Path, device: str, tables: dict[str, dict[tuple, Any]], sources: dict[str, str] | None = None,
                 notes: dict[str, dict[tuple, str]] | None = None) -> None:
    """Write (replace) the tables named in ``tables`` in the file at ``path``, keeping its other tables; ``sources``
    says per table where its numbers come from, ``notes`` per entry (a measured time)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data["device"] = device
    have = data.setdefault("tables", {})
    for name, table in tables.items():
        old = have.get(name, {})
        have[name] = {"source": (sources or {}).get(name, old.get("source", "")),
                      "entries": [{"key": list(k), "cfg": dataclasses.asdict(c),
                                   **({"note": n} if (n := (notes or {}).get(name, {}).get(k)) else {})}
                                  for k, c in table.items()]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(_dump(data))
    tmp.replace(path)


def _dump(data: dict) -> str:
    """The file's JSON with one entry per line (a sweep's diff reads as the entries it changed)."""
    tables = [f"  {json.dumps(name)}: {{\"source\": {json.dumps(t.get('source', ''))}, \"entries\": ["
              + ",".join(f"\n   {json.dumps(e)}" for e in t.get("entries", [])) + "\n  ]}"
              for name, t in data.get("tables", {}).items()]
    return (f'{{\n "device": {json.dumps(data.get("device", ""))},\n "tables": {{\n' + ",\n".join(tables)
            + "\n }\n}\n")
