"""The repository speaks of the product alone: no text about how it was made.

Docs, code, comments, tests, results and the knowledge base say what is; the history of how it got
there lives in git. This test fails on phrases of that history: numbered or ordinal work sessions
("the fifth session", "next GPU session"), a person called a helper ("helper gpu13"), the lead,
tracker numbers ("issue 23", "issue #24"), device-time budgets, numbered stops, and paths of a
development machine. The word lists leave the product's own meanings legal: HTTP, SSH, aiohttp and
SQLAlchemy sessions, a process's own session (setsid), a run's `session` event, helper functions
and modules, CUDA device time.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What is scanned: the product's folders and top-level docs. Binary files (databases, images) are skipped.
SCANNED = ("README.md", "CHANGELOG.md", "docs", "orchestrator", "gates", "tests", "knowledge_base", "skills",
           "benchmarks", "examples", "Makefile", ".ci")
TEXT_SUFFIXES = {".md", ".py", ".toml", ".json", ".jsonl", ".txt", ".sh", ".j2", ".yaml", ".yml", ".cfg", ".ini",
                 ".log", ".timeline", ".template", ".html", ".csv", ""}
_ORDINAL = (r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            r"fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|twenty-\w+|thirtieth|"
            r"\d+(?:st|nd|rd|th)")

# (name, pattern): each a phrase of how the project was made, never of what it is.
PHRASES: list[tuple[str, re.Pattern[str]]] = [
    ("a work session", re.compile(
        rf"\b(?:{_ORDINAL}|this|next|previous|last|later|earlier|prior|a later|one more|working|work|dev)"
        r"(?:\s+(?:GPU|H100|H200|CPU|device|work|dev|development))?\s+sessions?\b", re.IGNORECASE)),
    ("a work session", re.compile(r"\b(?:GPU|H100|H200|device|development|work) sessions?\b")),
    ("a work session", re.compile(r"\bsessions? of the day\b|\b(?:the|this|a) session's device\b", re.IGNORECASE)),
    ("a helper (a person)", re.compile(
        r"\bhelpers? (?:[a-z]+\d+[a-z]*|said|says|wrote|found|measured|ran|noted|reported|saw)\b"
        r"|\b(?:a|the|another) helper (?:engineer|session|agent)\b", re.IGNORECASE)),
    ("the lead", re.compile(r"\bthe lead(?:'s)?\b(?! time| to\b)", re.IGNORECASE)),
    ("an issue number", re.compile(r"\bissues? #?\d+|(?<![a-z])issue\d+|#\d+ (?:item|defect)s?\b|\[gpu-time\]",
                                   re.IGNORECASE)),
    ("a device-time budget", re.compile(
        r"\bdevice[- ](?:time|seconds|s) (?:budget|was left|left|remaining)|\bdevice budget|\bdevice-time budget"
        r"|\bno device time\b|\bdevice-s left\b", re.IGNORECASE)),
    ("a numbered stop", re.compile(r"\bstop \d+\b(?! (?:s|ms|seconds|minutes|trials|requests|tokens)\b)")),
    ("a path of the development machine", re.compile(r"/work/|\.\./shared\b|/shared/FACTS|\.library/")),
]


def scanned_files(root: Path) -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        p = root / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix in TEXT_SUFFIXES
                       and "__pycache__" not in f.parts and ".venv" not in f.parts)
    return out


def hits(root: Path) -> list[str]:
    """Every process phrase under ``root``, as 'path:line: [what] the text'."""
    found: list[str] = []
    for f in scanned_files(root):
        rel = f.relative_to(root).as_posix()
        if rel == "tests/test_repository_words.py":
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for what, pat in PHRASES:
                m = pat.search(line)
                if m:
                    found.append(f"{rel}:{n}: [{what}] {line.strip()[:160]}")
                    break
    return found


def test_the_repository_has_no_process_phrases() -> None:
    found = hits(ROOT)
    assert not found, f"{len(found)} lines speak of how the project was made:\n" + "\n".join(found[:80])


@pytest.mark.parametrize("phrase", [
    "Measured in the fifth session of the day.",
    "The next GPU session runs step 15.",
    "See the twenty-second session's table.",
    "This session measured 4.1 ms.",
    "(helper gpu13) found the clock.",
    "as the lead asked",
    "Fixed for issue 49 item 2.",
    "the defect of issue #24",
    "tests/test_issue23_defects.py",
    "when the device budget runs low",
    "with 276 device-s left",
    "landed at stop 45",
    "see /work/shared/FACTS.md",
    "Additions to ../shared/FACTS.md",
])
def test_a_planted_phrase_fails(tmp_path: Path, phrase: str) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "planted.md").write_text(f"# A page\n\nSome text.\n{phrase}\n")
    found = hits(tmp_path)
    assert len(found) == 1 and found[0].startswith("docs/planted.md:4:"), found


@pytest.mark.parametrize("phrase", [
    "async with aiohttp.ClientSession() as session:",
    "with self._session('reading a run', write=False) as session:",
    "The server starts in its own session (setsid), outliving the SSH session.",
    "the SSH session's environment",
    "requests.Session() keeps the connection",
    "the run's Optuna study is written beside the store",
    "a helper function; the host-side helper (hostd)",
    "the step's device time per kernel (CUDA events)",
    "every session ended event holds its wall time; all sessions count",
    "trial #24 kept at 3.1x",
    "the lead time of a request",
    "stop 3 trials early",
])
def test_product_meanings_stay_legal(tmp_path: Path, phrase: str) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "legal.md").write_text(f"{phrase}\n")
    assert hits(tmp_path) == []
