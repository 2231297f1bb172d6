"""No module of examples/hfserve is named like a package that transformers or torch may import.

server.py puts its own folder first on the import path, so a module there named like such a package
is imported in its place. examples/hfserve/kernels.py did that to the `kernels` package, which
transformers >= 5.25 requires and imports: every hfserve server died at start-up (ImportError:
cannot import name 'CUDAProperties' from 'kernels'); the Triton kernels are hfkernels.py since.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

HFSERVE = Path(__file__).resolve().parents[2] / "examples" / "hfserve"


def _probed_by_transformers() -> set[str]:
    """The packages transformers' import_utils looks for (``_is_package_available("kernels")`` ...), read
    from its source without importing it: the optional ones need not be installed here to be a hazard."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return set()
    src = Path(spec.submodule_search_locations[0], "utils", "import_utils.py")
    text = src.read_text() if src.exists() else ""
    return {m.split(".")[0] for m in re.findall(r"_is_package_available\(\s*[\"']([\w.]+)[\"']", text)}


def test_no_hfserve_module_shadows_a_package() -> None:
    ours = {p.stem for p in HFSERVE.glob("*.py")}
    assert {"server", "engine", "fastengine", "hfkernels"} <= ours  # the folder is where we think it is
    installed = set(importlib.metadata.packages_distributions())  # every installed top-level import name
    probed = _probed_by_transformers()
    assert not ours & (installed | probed), sorted(ours & (installed | probed))


def test_nothing_imports_the_old_name() -> None:
    """The tests and the GPU benches import our kernels as ``hfkernels``: an ``import kernels`` left behind
    would get the Hugging Face package where it is installed (or nothing), on a GPU host first."""
    root = HFSERVE.parents[1]
    old = re.compile(r"^\s*(import kernels\b|from kernels import)|sys\.modules\[[\"']kernels[\"']\]", re.M)
    hits = [str(p.relative_to(root)) for d in ("examples", "benchmarks", "tests", "orchestrator", "gates")
            for p in (root / d).rglob("*.py") if old.search(p.read_text(errors="replace"))]
    assert not hits, hits
