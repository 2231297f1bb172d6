"""Nothing in hfserve's tree is named like a package that transformers or torch may import.

The server runs in its tree (examples/hfserve: ``python -m hfserve`` there, or ``python examples/hfserve``),
so that folder is first on the import path: a module or folder there named like such a package is imported
in its place (a ``kernels.py`` there once took the place of the ``kernels`` package, which transformers >=
5.25 requires and imports, and every server died at start-up). The tree holds the package ``hfserve`` and
its launcher alone; the engine's modules are inside the package.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

TREE = Path(__file__).resolve().parents[2] / "examples" / "hfserve"


def _probed_by_transformers() -> set[str]:
    """The packages transformers' import_utils looks for (``_is_package_available("kernels")`` ...), read
    from its source without importing it: the optional ones need not be installed here to be a hazard."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return set()
    src = Path(spec.submodule_search_locations[0], "utils", "import_utils.py")
    text = src.read_text() if src.exists() else ""
    return {m.split(".")[0] for m in re.findall(r"_is_package_available\(\s*[\"']([\w.]+)[\"']", text)}


def _top_level(folder: Path) -> set[str]:
    """The names a folder first on the import path offers: its modules and its folders."""
    return {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()
                                                    and p.name.isidentifier()}


def test_the_tree_offers_the_package_alone_and_shadows_nothing() -> None:
    ours = _top_level(TREE)
    assert ours == {"hfserve", "__main__"}, sorted(ours)
    assert {"server", "engine", "fast", "hfkernels", "loading", "tables"} <= _top_level(TREE / "hfserve")
    dists = importlib.metadata.packages_distributions()  # every installed top-level import name
    others = {name for name, d in dists.items() if set(d) != {"infergoal"}}  # this project installs hfserve itself
    hazards = (others | _probed_by_transformers()) & (ours - {"__main__"})
    assert not hazards, sorted(hazards)


def test_a_module_beside_the_package_is_seen(tmp_path: Path) -> None:
    """The check's other way: a module or folder put beside the package in the tree is listed."""
    (tmp_path / "hfserve").mkdir()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "__main__.py").write_text("")
    (tmp_path / "torch.py").write_text("")
    assert _top_level(tmp_path) == {"hfserve", "kernels", "__main__", "torch"}
