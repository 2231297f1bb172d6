"""Reading user-written TOML files (goals, targets, config) with errors that say where and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomllib
from pydantic import ValidationError

__all__ = ["read_toml", "validation_message"]


def read_toml(path: Path, what: str, error: type[Exception], hint: str = "") -> dict[str, Any]:
    """Parse `path`, raising `error` for a missing file or invalid TOML (`what` names the file's role)."""
    if not path.is_file():
        raise error(f"{what} {path} does not exist" + (f"; {hint}" if hint else ""))
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise error(f"{what} {path} is not valid TOML: {e}") from None


def validation_message(e: ValidationError) -> str:
    """pydantic errors as `field.path: message; ...`."""
    return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
