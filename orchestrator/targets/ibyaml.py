"""Import an InferenceBench-style search-space YAML into a target's knobs.

The format (`src/baselines/search_spaces/{vllm,sglang,tgi}.yaml` in aisa-group/InferenceBench):

    parameters:
      - {name: max_num_seqs, flag: --max-num-seqs, type: int, values: [16, 32, 64, 128]}
      - {name: enable_prefix_caching, flag: --enable-prefix-caching, type: bool,
         false_flag: --no-enable-prefix-caching}

A target file uses one with `search_space = "vllm-ib.yaml"` (relative to the target file) and
`{{ flags }}` in its launch template; knobs written in the TOML itself win over imported ones.
A value list becomes a categorical knob (its first value the default unless `default` is given);
`low`/`high` (or `range: [low, high]`) make an int/float range.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.targets.base import TargetError

__all__ = ["import_search_space", "parse_search_space"]

_TYPES = {"bool": "bool", "boolean": "bool", "categorical": "categorical", "choice": "categorical",
          "str": "categorical", "string": "categorical", "int": "int", "integer": "int", "float": "float"}


def _knob(p: dict[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(p, dict) or "name" not in p:
        raise TargetError(f"{where}: each parameter needs at least `name` (got {p!r})")
    name = str(p["name"]).replace("-", "_")
    kind = _TYPES.get(str(p.get("type", "categorical")).lower())
    if kind is None:
        raise TargetError(f"{where}: parameter {name}: type {p.get('type')!r} is not one of {sorted(set(_TYPES))}")
    knob: dict[str, Any] = {"flag": p.get("flag"), "help": str(p.get("help", p.get("description", "")))}
    if p.get("env"):
        knob["env_var"] = p["env"]
    values = p.get("values")
    low, high = (p.get("range") or [p.get("low"), p.get("high")])[:2]
    if kind == "bool":
        knob |= {"type": "bool", "default": bool(p.get("default", False)), "false_flag": p.get("false_flag")}
    elif values:
        # A listed set of numbers is searched as given (InferenceBench's grids), not as a range.
        knob |= {"type": "categorical", "choices": list(values), "default": p.get("default", values[0])}
    elif low is not None and high is not None:
        knob |= {"type": kind if kind in ("int", "float") else "float", "low": low, "high": high,
                 "default": p.get("default", low), "log": bool(p.get("log", False))}
    else:
        raise TargetError(f"{where}: parameter {name} needs `values`, or `low`/`high` (or `range`)")
    if p.get("when"):
        knob["when"] = p["when"]
    return name, {k: v for k, v in knob.items() if v is not None}


def parse_search_space(text: str, where: str = "search space") -> dict[str, dict[str, Any]]:
    """knob name -> knob fields (as a target TOML's `[knobs.NAME]` table would give them)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TargetError(f"{where} is not valid YAML: {e}") from None
    params = doc.get("parameters") if isinstance(doc, dict) else None
    if not isinstance(params, list):
        raise TargetError(f"{where}: expected a top-level `parameters:` list of {{name, flag, type, values}}")
    out: dict[str, dict[str, Any]] = {}
    for p in params:
        name, knob = _knob(p, where)
        if name in out:
            raise TargetError(f"{where}: parameter {name} is listed twice")
        out[name] = knob
    return out


def import_search_space(path: Path, toml_knobs: dict[str, Any]) -> dict[str, Any]:
    """The YAML's knobs, then the TOML's own (which win), as one `knobs` table."""
    if not path.is_file():
        raise TargetError(f"search space {path} does not exist")
    return parse_search_space(path.read_text(), str(path)) | dict(toml_knobs)
