"""The layer rule of docs/architecture.md, held against the code: a module imports only from its own
layer or the layers below it (function-local imports included: a lazy import is still an arrow)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module's layer is the first prefix (dotted) that matches it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("gates", "orchestrator.core", "orchestrator.store")),
    ("specs", ("orchestrator.config", "orchestrator.targets", "orchestrator.bench", "orchestrator.models",
               "orchestrator.agent")),
    ("execution", ("orchestrator.hosts", "orchestrator.remote")),
    ("loop parts", ("orchestrator.proposers", "orchestrator.trial")),
    ("loop", ("orchestrator.loop",)),
    ("after a run", ("orchestrator.knowledge", "orchestrator.review", "orchestrator.report")),
    ("composition", ("orchestrator.runs",)),
    ("faces", ("orchestrator.cli",)),
]


def layer_of(module: str) -> int | None:
    if module in ("orchestrator", "gates"):  # the package roots hold nothing but a docstring and a version
        return 0
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str, root: Path) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = module_name(path, root).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            # `from orchestrator.trial import verdict` names a module by its alias; `from x.y import Name` by its base.
            subs = [f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}", root)]
            found += [(node.lineno, m) for m in (subs or [base])]
    return found


def upward_imports(root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted(p for d in ("orchestrator", "gates") for p in (root / d).rglob("*.py")):
        mine = layer_of(module_name(path, root))
        assert mine is not None, f"{path.relative_to(root)} has no layer: add it to LAYERS and docs/architecture.md"
        for line, target in imports_of(path, root):
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                bad.append(f"{path.relative_to(root)}:{line} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
    return bad


def test_every_module_imports_only_from_its_layer_or_below():
    assert upward_imports() == []


def test_the_rule_catches_an_upward_import(tmp_path):
    # The check itself must be able to fail: a foundations module that imports the loop, lazily, is caught.
    (tmp_path / "orchestrator" / "store").mkdir(parents=True)
    (tmp_path / "gates").mkdir()
    (tmp_path / "orchestrator" / "__init__.py").write_text("")
    (tmp_path / "orchestrator" / "store" / "__init__.py").write_text(
        "def f():\n    from orchestrator.loop.controller import Controller\n    return Controller\n")
    (tmp_path / "orchestrator" / "loop").mkdir()
    (tmp_path / "orchestrator" / "loop" / "controller.py").write_text("from orchestrator.store import Store\n")
    assert upward_imports(tmp_path) == [
        "orchestrator/store/__init__.py:2 (foundations) imports orchestrator.loop.controller (loop)"]


def test_the_layers_are_drawn_in_the_architecture_doc():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for name, prefixes in LAYERS:
        assert name in doc, f"docs/architecture.md does not name the layer {name!r}"
        for prefix in prefixes:  # each layer's folders (or module), as the table writes them
            folder = ROOT.joinpath(*prefix.split(".")).is_dir()
            shown = prefix.removeprefix("orchestrator.").replace(".", "/") + ("/" if folder else ".py")
            assert shown in doc, f"docs/architecture.md does not place {shown} in the layer {name!r}"

