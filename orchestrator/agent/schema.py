"""Tool schemas as plain dicts, generated from typed Python functions, and a checked call.

The function's name is the tool's name, its docstring's first paragraph the description, the
`Args:` lines the parameter descriptions, the type hints the JSON types. One source of truth:
what the model is told is what the function takes.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from orchestrator.agent.errors import ToolError

__all__ = ["call_checked", "tool_schema"]

_JSON = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def _json_type(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _json_type(inner[0]) if len(inner) == 1 else {}
    if origin is list:
        (item,) = typing.get_args(hint) or (str,)
        return {"type": "array", "items": _json_type(item)}
    if origin is dict or hint is dict:
        return {"type": "object"}
    if hint in _JSON:
        return {"type": _JSON[hint]}
    return {}


def _arg_docs(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    m = re.search(r"^Args:\n((?:[ \t]+.*\n?)+)", doc, re.M)
    for line in (m.group(1).splitlines() if m else []):
        k = re.match(r"\s+(\w+):\s*(.*)", line)
        if k:
            out[k.group(1)] = k.group(2)
    return out


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The Messages API tool definition of `fn`."""
    doc = inspect.getdoc(fn) or ""
    hints = typing.get_type_hints(fn)
    arg_docs = _arg_docs(doc)
    props: dict[str, Any] = {}
    required = []
    for name, p in inspect.signature(fn).parameters.items():
        if name == "self":
            continue
        props[name] = {**_json_type(hints.get(name, str)), "description": arg_docs.get(name, name)}
        if p.default is inspect.Parameter.empty:
            required.append(name)
    description = doc.split("\n\nArgs:")[0].strip()
    return {"name": fn.__name__, "description": description,
            "input_schema": {"type": "object", "properties": props, "required": required}}


def call_checked(fn: Callable[..., Any], args: Any) -> Any:
    """Call `fn(**args)` after checking the names and JSON types against its schema."""
    if not isinstance(args, dict):
        raise ToolError("tool input must be a JSON object")
    schema = tool_schema(fn)["input_schema"]
    unknown = set(args) - set(schema["properties"])
    if unknown:
        raise ToolError(f"unknown argument(s) {sorted(unknown)}; {fn.__name__} takes {sorted(schema['properties'])}")
    missing = [k for k in schema["required"] if k not in args]
    if missing:
        raise ToolError(f"missing argument(s) {missing} for {fn.__name__}")
    for k, v in args.items():
        want = schema["properties"][k].get("type")
        ok = {
            "string": isinstance(v, str), "integer": isinstance(v, int) and not isinstance(v, bool),
            "number": isinstance(v, int | float) and not isinstance(v, bool), "boolean": isinstance(v, bool),
            "object": isinstance(v, dict), "array": isinstance(v, list), None: True,
        }[want]
        if not ok and v is not None:
            raise ToolError(f"argument {k!r} must be a JSON {want}, got {type(v).__name__}")
    return fn(**args)
