"""The engine as a knob: one target whose `engine` knob picks between engines' target files.

A multi-engine file names one target file per engine:

    name = "tiny-any-engine"
    model = "forge:tiny"
    served_model_name = "tiny"
    default_engine = "hfserve"
    [engines]
    hfserve = "hfserve.toml"
    vllm = "vllm.toml"

Each engine's knobs become a conditional sub-space, `<engine>.<knob>`, active only when
`engine == <engine>` (Optuna define-by-run), so one run searches across engines for the same model
under the same gates and scenarios. The model, served name and API are the file's, shared by all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.core.tomlfile import validation_message
from orchestrator.targets.base import Knob, Target, TargetError

__all__ = ["ENGINE_KNOB", "MultiFile", "compose", "read_multi", "resolve"]

ENGINE_KNOB = "engine"


class MultiFile(BaseModel):
    """A multi-engine target file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    engines: dict[str, str]
    """Engine name -> its target file (relative to this file)."""
    default_engine: str | None = None
    """The baseline's engine (trial #0); default: the first listed."""
    model: str = "forge:tiny"
    served_model_name: str = "model"
    reference_model: str = "same"


def read_multi(path: Path, data: dict[str, Any]) -> MultiFile:
    """The file checked: two engines or more, `default_engine` one of them (filled in when unset),
    a model path made absolute. spec.load_target then loads each engine's own file."""
    try:
        f = MultiFile(**data)
    except ValidationError as e:
        raise TargetError(f"{path}: {validation_message(e)}") from None
    if len(f.engines) < 2:
        raise TargetError(f"{path}: `engines` needs at least two engines to choose between")
    default = f.default_engine or next(iter(f.engines))
    if default not in f.engines:
        raise TargetError(f"{path}: default_engine {default!r} is not one of {list(f.engines)}")
    model = f.model if f.model.startswith("forge:") else str((path.resolve().parent / f.model).resolve())
    return f.model_copy(update={"default_engine": default, "model": model})


def compose(path: Path, f: MultiFile, variants: dict[str, Target]) -> dict[str, Any]:
    """The composed target's fields, from `read_multi`'s file and each engine's own target (already
    given the file's model and served name): the `engine` knob, then each engine's knobs as
    `<engine>.<knob>`, active only under their engine. Their flags and env vars are dropped here:
    the chosen engine's own spec renders them."""
    knobs: dict[str, Knob] = {ENGINE_KNOB: Knob(type="categorical", choices=tuple(f.engines), default=f.default_engine,
                                                help="Which engine serves the model; each has its own knobs.")}
    for engine, sub in variants.items():
        for name, k in sub.knobs.items():
            when = {ENGINE_KNOB: engine} | {f"{engine}.{p}": v for p, v in k.when.items()}
            knobs[f"{engine}.{name}"] = k.model_copy(update={"when": when, "env_var": None, "flag": None, "false_flag": None})
    apis = {v.api for v in variants.values()}
    if len(apis) > 1:
        raise TargetError(f"{path}: the engines' `api` differ ({sorted(apis)}); the bench needs one")
    first = variants[str(f.default_engine)]
    return dict(
        name=f.name, engine="multi", launch="", model=f.model, served_model_name=f.served_model_name,
        reference_model=f.reference_model, source=first.source, health_path=first.health_path,
        ready_timeout_s=max(v.ready_timeout_s for v in variants.values()), api=first.api,
        knobs=knobs, variants=variants, path=str(path.resolve()),
    )


def resolve(target: Target, knobs: dict[str, Any]) -> tuple[Target, dict[str, Any]]:
    """(the engine's own target, its knobs without the `<engine>.` prefix); itself if single-engine."""
    if not target.variants:
        return target, knobs
    engine = knobs.get(ENGINE_KNOB, target.knobs[ENGINE_KNOB].default)
    sub = target.variants[engine]
    prefix = f"{engine}."
    return sub, {k[len(prefix):]: v for k, v in knobs.items() if k.startswith(prefix)}
