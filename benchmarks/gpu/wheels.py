"""Download into .whl/ the wheels the GPU machine lacks to run the orchestrator (the GPU tool installs them).

    python3 benchmarks/gpu/wheels.py [--dest .whl] [--serve] [--dry-run]

The device image (library device/KINDS.md, "Python packages already there") holds torch, transformers, triton,
numpy, aiohttp, jinja2, rich, typer...; the orchestrator's own dependencies (pyproject's `dependencies`) and what
they need are read from this machine's .venv (the versions the tests ran with), and those the image lacks are
downloaded for CPython 3.12 on manylinux x86_64 (the device README's recipe), one version each.

``--serve`` adds what `transformers serve` needs (examples/targets/transformers-serve-gpu.toml; the GPU tool's
tserve-* experiments): its serving extra, which the image lacks (fastapi, starlette, uvicorn, openai), and
transformers itself at this machine's version, where the image's 5.17.0 lists only the Hugging Face cache on
/v1/models, not a model served from a folder, so the integrity gate's model check fails there. Every experiment of
that call then runs this transformers: build .whl without it for the others.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
# The image's packages (KINDS.md, read 2026-11-17), normalised names: carried only for another version.
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click cloudpickle colorama contourpy cycler filelock fonttools frozenlist fsspec h11 hf-xet httpcore
httpx huggingface-hub idna jinja2 kiwisolver markdown-it-py markupsafe matplotlib mdurl multidict numpy packaging pandas
pillow pip propcache psutil pygments pyparsing python-dateutil pyyaml regex requests rich safetensors setuptools
shellingham six sympy tokenizers torch tqdm transformers triton typer typing-extensions urllib3 wheel yarl
zipp""".split())
SERVE = ["fastapi", "starlette", "uvicorn", "openai"]
SERVE_FORCED = ["transformers"]  # carried although the image has it (another version)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> dict[str, str]:
    """name -> installed version for `roots` and everything they require (extras left out)."""
    seen: dict[str, str] = {}
    todo = [norm(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist.version
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(norm(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0]))
    return seen


def main(argv: list[str] | None = None) -> int:
    venv = ROOT / ".venv" / "bin" / "python"
    if venv.exists() and Path(sys.prefix).resolve() != venv.parent.parent.resolve():
        # Another interpreter (python3 on PATH) would read its own packages' versions, not the tests' ones.
        os.execv(venv, [str(venv), __file__, *(sys.argv[1:] if argv is None else argv)])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", default=str(ROOT / ".whl"))
    ap.add_argument("--serve", action="store_true", help="also what `transformers serve` needs (see above)")
    ap.add_argument("--dry-run", action="store_true", help="print the NAME==VERSION list only")
    a = ap.parse_args(argv)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    roots = [re.split(r"[ <>=!~\[]", d, maxsplit=1)[0] for d in deps] + (SERVE if a.serve else [])
    want = {n: v for n, v in closure(roots).items() if n not in IMAGE}
    if a.serve:
        want |= {n: v for n, v in closure(SERVE_FORCED).items() if n in SERVE_FORCED}
    pins = [f"{n}=={v}" for n, v in sorted(want.items())]
    print("\n".join(pins))
    if a.dry_run:
        return 0
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", a.dest, *[x for p in PLATFORMS for x in ("--platform", p)]]
    failed = [p for p in pins if subprocess.run([*cmd, p]).returncode != 0]  # one at a time: one miss stops none
    if failed:
        print(f"not downloaded (no wheel for CPython 3.12 manylinux x86_64?): {' '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
