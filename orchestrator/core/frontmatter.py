"""Markdown files with YAML frontmatter between `---` lines: knowledge entries and skills alike."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_frontmatter", "render_frontmatter"]


def read_frontmatter(path: Path, *, what: str = "a knowledge entry") -> tuple[dict[str, Any], str]:
    """(frontmatter mapping, body) of the file at `path`; ValueError names the file and what is wrong.

    `what` says what the file is meant to be, for the error message."""
    text = Path(path).read_text()
    m = re.match(r"^---\n(.*?)\n---\n?(.*)$", text, re.S)
    if not m:
        raise ValueError(f"{path}: {what} must start with YAML frontmatter between '---' lines")
    try:
        meta = yaml.safe_load(m.group(1)) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: the frontmatter is not valid YAML ({e}); fix it or delete the file") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: frontmatter must be a mapping")
    return meta, m.group(2)


def render_frontmatter(meta: dict[str, Any], body: str) -> str:
    """The file text for `meta` and `body`: the inverse of `read_frontmatter`."""
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n" + body
