"""Loading ``gates/thresholds.toml`` (hashed by the lock like every other gate file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - 3.10 fallback
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["THRESHOLDS_PATH", "load_thresholds"]

THRESHOLDS_PATH = Path(__file__).with_name("thresholds.toml")


def load_thresholds(path: Path | str | None = None) -> dict[str, Any]:
    """Read the thresholds file (default: the one next to this module) as a nested dict."""
    with open(path or THRESHOLDS_PATH, "rb") as f:
        return tomllib.load(f)


def section(thresholds: dict[str, Any] | None, name: str) -> dict[str, Any]:
    """One gate's section, from the given dict or, when None, from the locked file."""
    return (thresholds if thresholds is not None else load_thresholds())[name]
