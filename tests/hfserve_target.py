"""The shipped hfserve target with its baseline on one torch thread, for measurements on a shared host.

With torch's default (2 OpenMP threads on a 2-core host, beside the bench client), any other runnable
task, even at nice 19, makes the server's speed erratic: the naive baseline served 12 and 618 tok/s a
minute apart where one thread served 768 and 642 (docs/results.md).
"""

from pathlib import Path

from orchestrator.config.workspace import PACKAGE_ROOT


def one_thread_target(d: Path) -> Path:
    """Write `d/hfserve-1t.toml`: examples/targets/hfserve.toml with `threads` defaulting to 1."""
    text = (PACKAGE_ROOT / "examples" / "targets" / "hfserve.toml").read_text()
    text = text.replace('source = "../hfserve"', f'source = "{PACKAGE_ROOT / "examples" / "hfserve"}"')
    old = "choices = [0, 1, 2]\ndefault = 0"
    if old not in text:
        raise ValueError("examples/targets/hfserve.toml's threads knob changed: update tests/hfserve_target.py")
    out = d / "hfserve-1t.toml"
    out.write_text(text.replace(old, "choices = [0, 1, 2]\ndefault = 1"))
    return out
