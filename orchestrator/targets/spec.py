"""Target spec: a TOML file describing how to launch an engine and which knobs it has.

The launch command is a jinja2 template rendered with the knobs plus `python`, `port`,
`model`, `served_model_name` and `source` (the engine's source dir at the trial's commit), then
split with `shlex`. The knob space is what the search proposer explores; each knob's
`default` is the naive baseline (trial #0).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Literal

import jinja2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.tomlfile import read_toml, validation_message

__all__ = ["Knob", "TargetError", "TargetSpec", "load_target"]

# Names the launch template gets besides the knobs.
_RESERVED = frozenset({"python", "port", "model", "source", "served_model_name"})


class TargetError(ValueError):
    """A target file that cannot be used; the message says which field and why."""


class Knob(BaseModel):
    """One tunable engine setting."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    type: Literal["categorical", "int", "float"]
    default: Any
    """The baseline's value."""
    choices: tuple[Any, ...] | None = None
    """Categorical values."""
    low: float | None = None
    high: float | None = None
    log: bool = False
    """Sample int/float knobs on a log scale."""
    help: str = ""

    @model_validator(mode="after")
    def _check(self) -> Knob:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical knob needs `choices`")
            if self.default not in self.choices:
                raise ValueError(f"default {self.default!r} is not one of the choices {list(self.choices)}")
        else:
            if self.low is None or self.high is None or self.low > self.high:
                raise ValueError("int/float knobs need `low` <= `high`")
            if isinstance(self.default, bool) or not isinstance(self.default, int | float):
                raise ValueError(f"default {self.default!r} of a {self.type} knob must be a number")
            if self.type == "int" and not all(float(x).is_integer() for x in (self.default, self.low, self.high)):
                raise ValueError("an int knob needs whole-number `default`, `low` and `high`")
            if self.log and self.low <= 0:
                raise ValueError("a log-scale knob needs `low` > 0")
            if not self.low <= self.default <= self.high:
                raise ValueError(f"default {self.default} is outside [{self.low}, {self.high}]")
        return self


class TargetSpec(BaseModel):
    """An engine + model to optimise (see examples/targets/)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    name: str = Field(min_length=1)
    engine: str = "hfserve"
    """Adapter key: hfserve, vllm, sglang, tgi."""
    launch: str
    """jinja2 template of the launch command."""
    model: str = "forge:tiny"
    """A model directory, or `forge:<preset>` to use the model forge's cached model."""
    served_model_name: str = "model"
    reference_model: str = "same"
    """`same` = the target's own weights run in float32 by the accuracy gate, or a model dir."""
    source: str = "."
    """The engine's source tree (a git repo or a folder in one); code candidates are commits of it."""
    health_path: str = "/health"
    ready_timeout_s: float = Field(180.0, gt=0, le=86400)
    api: Literal["completions", "chat"] = "completions"
    knobs: dict[str, Knob] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    path: str = ""
    """Where the spec was loaded from (filled by `load_target`)."""

    @model_validator(mode="after")
    def _check_target(self) -> TargetSpec:
        if not self.health_path.startswith("/"):
            raise ValueError(f"health_path must start with '/', got {self.health_path!r}")
        for name in self.knobs:
            if not name.isidentifier() or name in _RESERVED:
                raise ValueError(
                    f"knob name {name!r} cannot be used in the launch template "
                    f"(use letters, digits and _; not one of {', '.join(sorted(_RESERVED))})"
                )
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
        try:
            env.parse(self.launch)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"launch template line {e.lineno}: {e.message}") from None
        # Render the baseline once now: an undefined variable or an empty command is refused
        # before a run exists, not discovered as a failed baseline trial.
        try:
            argv = self.render(self.baseline_knobs(), port=1, model="MODEL", source="SOURCE", python="PYTHON")
        except (TargetError, jinja2.TemplateError, ValueError) as e:
            raise ValueError(f"launch template: {e}") from None
        if not argv:
            raise ValueError("launch template renders to an empty command")
        return self

    def baseline_knobs(self) -> dict[str, Any]:
        return {k: v.default for k, v in self.knobs.items()}

    def validate_knobs(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """Fill missing knobs with defaults; refuse unknown names or out-of-space values."""
        unknown = set(knobs) - set(self.knobs)
        if unknown:
            raise TargetError(f"unknown knob(s) {sorted(unknown)} for target {self.name}; known: {sorted(self.knobs)}")
        out = self.baseline_knobs() | knobs
        for k, v in out.items():
            spec = self.knobs[k]
            if spec.type == "categorical" and v not in spec.choices:
                raise TargetError(f"knob {k}={v!r} is not one of {list(spec.choices)}")
            if spec.type != "categorical" and not spec.low <= v <= spec.high:
                raise TargetError(f"knob {k}={v!r} is outside [{spec.low}, {spec.high}]")
        return out

    def render(self, knobs: dict[str, Any], *, port: int, model: str, source: str, python: str | None = None) -> list[str]:
        """The launch argv for these knobs."""
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
        try:
            text = env.from_string(self.launch).render(
                **knobs,
                port=port,
                model=model,
                source=source,
                python=python or sys.executable,
                served_model_name=self.served_model_name,
            )
        except jinja2.UndefinedError as e:
            raise TargetError(f"target {self.name}: launch template uses an undefined variable: {e}") from None
        except jinja2.TemplateError as e:
            raise TargetError(f"target {self.name}: launch template: {e}") from None
        try:
            return shlex.split(" ".join(text.split()))
        except ValueError as e:  # an unbalanced quote
            raise TargetError(f"target {self.name}: launch command cannot be split: {e}") from None


def load_target(path: str | Path) -> TargetSpec:
    """Load a target TOML; relative `source`/`model` paths resolve against the file's folder."""
    path = Path(path)
    data = read_toml(path, "target file", TargetError, "see examples/targets/ for examples")
    if "path" in data:
        raise TargetError(f"{path}: path: unknown key (infergoal fills it in); remove it")
    base = path.resolve().parent
    for key in ("source", "model"):
        if key in data and not isinstance(data[key], str):
            raise TargetError(f"{path}: {key} must be a string, got {data[key]!r}")
    try:
        data["source"] = str((base / data.get("source", ".")).resolve())
        model = data.get("model", "forge:tiny")
        if not model.startswith("forge:"):
            data["model"] = str((base / model).resolve())
    except (OSError, ValueError) as e:  # a NUL byte, a path too long
        raise TargetError(f"{path}: source/model is not a usable path: {e}") from None
    try:
        return TargetSpec.model_validate({**data, "path": str(path.resolve())})
    except ValidationError as e:
        raise TargetError(f"{path}: {validation_message(e, TargetSpec)}") from None
