"""The docs hold together: every relative Markdown link in README.md and docs/ points at a file that
exists, and the README and the results page stay the size a reader can take in."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def broken_links(root: Path) -> list[str]:
    """'page: target' for each relative link under ``root``'s README.md and docs/ whose file is missing."""
    pages = [p for p in (root / "README.md", root / "CHANGELOG.md") if p.exists()] + sorted((root / "docs").rglob("*.md"))
    out: list[str] = []
    for page in pages:
        for m in LINK.finditer(page.read_text(encoding="utf-8")):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            if not (page.parent / target).exists():
                out.append(f"{page.relative_to(root)}: {target}")
    return out


def test_every_relative_link_resolves() -> None:
    assert broken_links(ROOT) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "docs" / "here.md").write_text("# Here\n")
    (tmp_path / "README.md").write_text("[ok](docs/here.md#top) [web](https://example.com) [gone](docs/benchmarks.md)\n")
    (tmp_path / "docs" / "guide" / "a.md").write_text("[up](../here.md) [missing](../glossary.md)\n")
    assert broken_links(tmp_path) == ["README.md: docs/benchmarks.md", "docs/guide/a.md: ../glossary.md"]


def test_the_readme_and_the_results_page_stay_short() -> None:
    assert (ROOT / "README.md").stat().st_size < 15_000, "README.md: move depth into docs/guide/"
    lines = len((ROOT / "docs" / "results.md").read_text(encoding="utf-8").splitlines())
    assert lines <= 600, f"docs/results.md has {lines} lines: keep the current result of each measurement only"


def test_the_configuration_reference_is_the_shipped_example() -> None:
    """docs/guide/configuration.md quotes examples/infergoal.toml whole: the two never drift apart."""
    doc = (ROOT / "docs" / "guide" / "configuration.md").read_text(encoding="utf-8")
    quoted = re.search(r"```toml\n(.*?)```", doc, re.S)
    assert quoted, "docs/guide/configuration.md: the example is quoted in a toml block"
    assert quoted.group(1).rstrip() == (ROOT / "examples" / "infergoal.toml").read_text(encoding="utf-8").rstrip(), (
        "examples/infergoal.toml changed: copy it into docs/guide/configuration.md")
