"""What a trial records about its engine, and how the gates treat what an engine cannot do.

* `engine_fingerprint`: the engine's name, declared and installed version, interpreter, command
  prefix and launch environment; stored with every trial (an `engine` event and
  `trial-N/engine.json`), so a result can be traced to the engine that produced it.
* `capability_verdict`: the gates judge with `ignore_eos`, token ids and `echo` prompt logprobs
  where the engine has them, and another way where its target declares it has not (gates/api.py:
  bounded lengths, re-tokenized counts, the generation check alone), naming the way in each gate
  result. Only an engine without /v1/completions cannot be judged at all; rather than skip a
  gate silently, its trial gets a recorded gate result saying so and is invalid.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from orchestrator.targets.launch import interpreter
from orchestrator.targets.spec import Capabilities, TargetSpec

__all__ = ["capability_verdict", "engine_fingerprint", "installed_version", "record_engine"]


@lru_cache(maxsize=32)
def installed_version(command: str) -> str:
    """stdout of the target's `version_command` (cached per process: it does not change mid-run)."""
    try:
        out = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return out.stdout.strip() or f"unknown (exit {out.returncode}: {out.stderr.strip()[-200:]})"


def engine_fingerprint(engine: TargetSpec, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    python = interpreter(engine)
    installed = ""
    if engine.version_command:
        cmd = jinja2.Environment(autoescape=False).from_string(engine.version_command).render(python=python)
        installed = installed_version(cmd)
    return {
        "engine": engine.engine, "target": engine.name, "version_checked": engine.version,
        "version_installed": installed, "python": python, "prefix": engine.prefix,
        "env": env, "argv": argv, "capabilities": engine.capabilities.model_dump(),
    }


def record_engine(store: Any, run_id: int, trial_id: int, engine: TargetSpec, argv: list[str],
                  env: dict[str, str], trial_dir: Path) -> dict[str, Any]:
    fp = engine_fingerprint(engine, argv, env)
    (trial_dir / "engine.json").write_text(json.dumps(fp, indent=2))
    store.add_event(run_id, "engine", json.dumps({k: fp[k] for k in ("engine", "version_installed", "version_checked", "env")}), trial_id=trial_id)
    return fp


def capability_verdict(store: Any, trial_id: int, caps: Capabilities, integrity: bool, accuracy: bool) -> str | None:
    """None when the gates can judge this engine (their usual way or the one its capabilities
    call for); else record why not and reject."""
    missing: list[tuple[str, str]] = []
    if integrity and not caps.completions:
        missing.append(("integrity", "the engine declares no /v1/completions, which the integrity gate's probes need"))
    if accuracy and not caps.completions:
        missing.append(("accuracy", "the engine declares no /v1/completions, which the accuracy gate's probe needs"))
    if not missing:
        return None
    for gate, reason in missing:
        store.add_gate_result(trial_id, gate, "fail", f"not judged: {reason}; the trial cannot count",
                              {"capabilities": caps.model_dump()}, 0.0)
    return "; ".join(f"{g} gate: {r}" for g, r in missing)
