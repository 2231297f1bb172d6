"""Rendering a launch: argv (prefix + template with `python` and `flags`) and environment.

`python` is the engine's own interpreter when the target names one (a venv folder or an
executable; vLLM usually lives in its own venv), else the orchestrator's. `flags` renders every
active knob that declares a `flag`: `--name value`, and for bools the flag (true) or `false_flag`
(false) alone, as InferenceBench's search-space files describe them.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import jinja2

from orchestrator.targets.base import Target, TargetError

__all__ = ["interpreter", "knob_flags", "placed_source", "render_argv", "render_env"]

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


def _render(target: Target, what: str, template: str, **ctx: Any) -> str:
    try:
        return _ENV.from_string(template).render(**ctx)
    except jinja2.UndefinedError as e:
        raise TargetError(f"target {target.name}: {what} uses an undefined variable: {e}") from None
    except jinja2.TemplateError as e:
        raise TargetError(f"target {target.name}: {what} is not a valid template: {e}") from None


def interpreter(target: Target) -> str:
    """The engine's python: `target.python` rendered over os.environ (a venv dir -> its bin/python)."""
    if not target.python:
        return sys.executable
    text = _render(target, "python", target.python, env=os.environ).strip()
    if not text:  # e.g. an unset environment variable with an empty default
        return sys.executable
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "bin" / "python"
    if not path.exists():
        raise TargetError(f"target {target.name}: the engine's interpreter {path} does not exist; install the engine there or fix `python`")
    return str(path)


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def knob_flags(target: Target, knobs: dict[str, Any]) -> list[str]:
    """CLI arguments for the active knobs that declare a `flag`, in declaration order."""
    out: list[str] = []
    for name, knob in target.knobs.items():
        if name not in knobs or not knob.flag and not knob.false_flag:
            continue
        v = knobs[name]
        if knob.type == "bool":
            flag = knob.flag if v else knob.false_flag
            if flag:
                out.append(flag)
        elif knob.flag:
            out += [knob.flag, _value(v)]
    return out


def render_argv(target: Target, knobs: dict[str, Any], *, port: int, model: str, source: str, python: str | None = None) -> list[str]:
    """prefix + the launch template rendered (inactive knobs are None in the template)."""
    if target.variants:  # the engine as a knob: the chosen engine's own launch
        sub, own = target.resolve(knobs)
        return render_argv(sub, own, port=port, model=model, source=placed_source(target, sub, source), python=python)
    ctx = {name: None for name in target.knobs} | knobs
    text = _render(
        target, "launch template", target.launch,
        **ctx, port=port, model=model, source=source, python=python or interpreter(target),
        served_model_name=target.served_model_name, flags=shlex.join(knob_flags(target, knobs)),
    )
    prefix = _render(target, "prefix", target.prefix, env=os.environ) if target.prefix else ""
    return shlex.split(prefix) + shlex.split(" ".join(text.split()))


def placed_source(target: Target, sub: Target, source: str) -> str:
    """The chosen engine's source as the trial placed it. `source` is `target.source`'s tree at the
    trial's commit, placed where the server runs (a worktree of an agent's commit, a folder on an
    SSH host); an engine whose tree is that one, or a folder in it, is found there. An engine
    whose tree lies elsewhere was not placed: it gets its own path."""
    if sub.source == target.source:
        return source
    try:
        rel = PurePosixPath(sub.source).relative_to(target.source)
    except ValueError:
        return sub.source
    return str(PurePosixPath(source) / rel)


def render_env(target: Target, knobs: dict[str, Any]) -> dict[str, str]:
    """`env` values rendered over the knobs (empty results are left unset), plus knobs' `env_var`."""
    if target.variants:
        sub, own = target.resolve(knobs)
        return render_env(sub, own)
    ctx = {name: None for name in target.knobs} | knobs
    out: dict[str, str] = {}
    for key, template in target.env.items():
        value = _render(target, f"env.{key}", template, **ctx, env=os.environ).strip()
        if value:
            out[key] = value
    for name, knob in target.knobs.items():
        if knob.env_var and name in knobs:
            out[knob.env_var] = _value(knobs[name])
    return out
