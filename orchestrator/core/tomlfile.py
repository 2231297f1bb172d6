"""Reading user-written TOML files (goals, targets, config) with errors that say where and why.

Every user input goes through the same two steps: `read_toml` (missing, unreadable, binary or
malformed files become one error line) and a pydantic model with `extra="forbid"`, whose errors
`validation_message` turns into `budget.trails: unknown key; did you mean 'trials'?`.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, ValidationError

__all__ = ["did_you_mean", "read_toml", "validation_message"]


def read_toml(path: Path, what: str, error: type[Exception], hint: str = "") -> dict[str, Any]:
    """Parse `path`, raising `error` for a missing, unreadable, binary or invalid TOML file."""
    if not path.is_file():
        raise error(f"{what} {path} does not exist" + (f"; {hint}" if hint else ""))
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise error(f"{what} {path} cannot be read ({e.strerror or e}); check its permissions") from None
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not a UTF-8 text file; is it the right file?") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{what} {path} is not valid TOML: {e}") from None


def did_you_mean(word: str, known: typing.Iterable[str]) -> str:
    """`; did you mean 'x'?` for the closest known word, or a list of the known ones."""
    known = sorted(known)
    close = difflib.get_close_matches(str(word), known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; known keys: {', '.join(known)}" if known else ""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """pydantic model classes inside an annotation (`X`, `X | None`, `tuple[X, ...]`, `dict[str, X]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None and not isinstance(annotation, types.UnionType):
        return []
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def _fields_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> set[str]:
    """The field names of the model that sits at `loc` inside `model` (empty if unknown)."""
    current: list[type[BaseModel]] = [model] if model else []
    for part in loc:
        nxt: list[type[BaseModel]] = []
        for m in current:
            if isinstance(part, str) and part in m.model_fields:
                nxt += _models_in(m.model_fields[part].annotation)
        if nxt:
            current = nxt
        # an int (tuple index) or a dict key keeps the element model found one level up
    return set(current[-1].model_fields) if current else set()


def validation_message(e: ValidationError, model: type[BaseModel] | None = None) -> str:
    """pydantic errors as `field.path: message; ...`, with a "did you mean" for unknown keys."""
    parts = []
    for err in e.errors():
        loc = tuple(err["loc"])
        where = ".".join(map(str, loc)) or "(top level)"
        if err["type"] == "extra_forbidden":
            known = _fields_at(model, loc[:-1]) if model else set()
            parts.append(f"{where}: unknown key{did_you_mean(str(loc[-1]), known)}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{where}: {msg}")
    return "; ".join(parts)
