"""Import examples/hfserve/kernels.py with its Triton kernels interpreted (TRITON_INTERPRET=1), for CPU tests."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

HFSERVE = Path(__file__).resolve().parents[2] / "examples" / "hfserve"


def import_interpreted():
    """Import kernels.py with TRITON_INTERPRET=1 (read when @triton.jit runs), then restore the env.

    Set at import rather than for the session, so the rest of a whole-suite run sees the env as it was.
    A kernels module imported earlier with compiled kernels (fastengine imports it) is reloaded in
    place, so every holder of the module (FastModel's ``get_ops``) sees the interpreted kernels.
    """
    if str(HFSERVE) not in sys.path:
        sys.path.insert(0, str(HFSERVE))
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import kernels as mod
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(mod._rmsnorm_kernel, InterpretedFunction):  # imported earlier, compiled
            mod = importlib.reload(mod)
        return mod
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
