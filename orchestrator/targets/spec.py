"""Target spec: a TOML file describing how to launch an engine and which knobs it has.

The launch command is a jinja2 template rendered with the knobs plus `python`, `port`,
`model`, `served_model_name`, `source` (the engine's source dir at the trial's commit) and
`flags` (every active knob that declares a `flag`, rendered as CLI arguments), then split with
`shlex`. The knob space is what the search proposer explores; each knob's `default` is the naive
baseline (trial #0). Conditional knobs (`when`), constraints between knobs, templated `env`, the
engine's own interpreter (`python`) and a command `prefix` live in `orchestrator/targets/space.py`
and `orchestrator/targets/launch.py`; see docs/architecture.md "Engines as targets".
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

import jinja2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.core.tomlfile import read_toml, validation_message
from orchestrator.targets.base import ConstraintViolated, Knob, KnobRule, TargetError
from orchestrator.targets.engineknob import compose, read_multi
from orchestrator.targets.engineknob import resolve as resolve_engine
from orchestrator.targets.ibyaml import import_search_space
from orchestrator.targets.launch import render_argv, render_env
from orchestrator.targets.parallel import Parallel, check_parallel
from orchestrator.targets.space import active_only, check_constraints, check_space

# TargetError, ConstraintViolated, Knob and KnobRule live in base.py (the helpers raise and read them
# without importing this module); they are exported here too, where callers have always found them.
__all__ = ["Capabilities", "ConstraintViolated", "Knob", "KnobRule", "TargetError", "TargetSpec", "check_paths", "load_target"]

# Names the launch template gets besides the knobs.
_RESERVED = frozenset({"python", "port", "model", "source", "served_model_name", "flags"})


class Capabilities(BaseModel):
    """What the engine's OpenAI API can do; the gates and the bench judge an engine that cannot
    another way, and say which (gates/api.py; docs/engines.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    ignore_eos: bool = True
    """Accepts `ignore_eos` (vLLM, SGLang, hfserve do; `transformers serve` answers 422).
    Without it output lengths are bounded by max_tokens, not pinned."""
    echo_logprobs: bool = True
    """Returns prompt logprobs for `echo: true, max_tokens: 0` on /v1/completions. Without them
    the accuracy gate judges by its generation check alone."""
    token_ids: bool = True
    """Returns generated token ids (`return_tokens_as_token_ids` with `logprobs`). Without them
    tokens are counted from the text, re-tokenized."""
    prompt_ids: bool = True
    """Accepts a prompt as a list of token ids on /v1/completions. Without it prompts go as text."""
    completions: bool = True
    """Serves /v1/completions (not only /v1/chat/completions)."""


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
    """Environment variables; values are jinja2 templates over the knobs (a value rendering empty is not set)."""
    python: str | None = None
    """The engine's interpreter: a python executable or a venv folder (its bin/python); a jinja2
    template over `env` (the orchestrator's environment). Unset: the orchestrator's own."""
    prefix: str = ""
    """Command prefix put before the launch argv (`numactl -C 0-1`, `conda run -n sglang`)."""
    preload: list[str] = Field(default_factory=list)
    """Modules a `python server.py ...` (or `python -m server ...`) launch imports first (`["torch", "transformers", "aiohttp"]`): a
    host runs the next launch in a standby interpreter that imported them while the previous
    server ran, where that is equivalent to a cold start (orchestrator.hosts.standby). Empty: none."""
    constraints: list[KnobRule] = Field(default_factory=list)
    """Rules between knobs, checked before launch: a knob set breaking one is never deployed."""
    capabilities: Capabilities = Field(default_factory=Capabilities)
    parallel: Parallel = Field(default_factory=Parallel)
    """The knobs that spread one server over several GPUs, and the rules that refuse a knob set the
    host or the model cannot take (orchestrator/targets/parallel.py). Unset: one GPU per trial."""
    version: str = ""
    """The engine version the knobs' flags were checked against."""
    version_command: str = ""
    """A shell command (jinja2 over `python`) printing the installed engine's version, for the fingerprint."""
    variants: dict[str, TargetSpec] = Field(default_factory=dict)
    """Engine as a knob: the sub-target per value of the `engine` knob (see targets/engineknob.py)."""
    path: str = ""
    """Where the spec was loaded from (filled by `load_target`)."""

    @model_validator(mode="after")
    def _check_target(self) -> TargetSpec:
        if not self.health_path.startswith("/"):
            raise ValueError(f"health_path must start with '/', got {self.health_path!r}")
        for name in self.knobs:
            # A composed target (the engine as a knob) names its knobs `<engine>.<knob>`; they are
            # rendered by the chosen engine's own spec, never by this template.
            if self.variants and "." in name and all(p.isidentifier() for p in name.split(".")):
                continue
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
        """The defaults of the knobs active under the defaults (conditional knobs may drop out)."""
        return active_only(self, {k: v.default for k, v in self.knobs.items()})

    def validate_knobs(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """Fill missing knobs with defaults, drop inactive ones; refuse unknown names,
        out-of-space values and broken constraints (`ConstraintViolated`)."""
        unknown = set(knobs) - set(self.knobs)
        if unknown:
            raise TargetError(f"unknown knob(s) {sorted(unknown)} for target {self.name}; known: {sorted(self.knobs)}")
        out = active_only(self, {k: v.default for k, v in self.knobs.items()} | knobs)
        for k, v in out.items():
            spec = self.knobs[k]
            if spec.type == "bool" and not isinstance(v, bool):
                raise TargetError(f"knob {k}={v!r} is not true or false")
            if spec.type == "categorical" and v not in spec.choices:
                raise TargetError(f"knob {k}={v!r} is not one of {list(spec.choices)}")
            if spec.type in ("int", "float") and not spec.low <= v <= spec.high:
                raise TargetError(f"knob {k}={v!r} is outside [{spec.low}, {spec.high}]")
        check_constraints(self, out)
        return out

    def resolve(self, knobs: dict[str, Any]) -> tuple[TargetSpec, dict[str, Any]]:
        """The concrete target and its own knobs: itself, or the variant the `engine` knob picks."""
        return resolve_engine(self, knobs)

    def render(self, knobs: dict[str, Any], *, port: int, model: str, source: str, python: str | None = None) -> list[str]:
        """The launch argv for these knobs (prefix, interpreter and `flags` included)."""
        return render_argv(self, knobs, port=port, model=model, source=source, python=python)

    def launch_env(self, knobs: dict[str, Any]) -> dict[str, str]:
        """The environment variables for these knobs (templated `env` plus knobs' `env_var`)."""
        return render_env(self, knobs)


def check_paths(spec: TargetSpec, *, local: bool) -> None:
    """Refuse a target whose files are not there, before a model is built or a run created: its
    `source` folder, the files under it its launch command names (`{{ source }}/server.py`), and on a
    local host the `python` it names and the program its command starts. A target copied elsewhere
    with `source = "../hfserve"` failed only when the baseline launched, after minutes of model
    building. Raises `TargetError` naming the path, the key and the file it came from."""
    where = spec.path or spec.name
    for variant in spec.variants.values():
        check_paths(variant, local=local)
    if spec.variants:
        return
    source = Path(spec.source)
    if not source.is_dir():
        raise TargetError(f"{where}: source {spec.source} is not a folder (a relative source resolves against the "
                          "target file's folder); fix `source`, or leave it out for an engine installed as a package")
    try:
        argv = spec.render(spec.baseline_knobs(), port=1, model="MODEL", source=str(source), python="PYTHON")
    except (TargetError, jinja2.TemplateError, ValueError):
        return  # refused by the template check already, with its own words
    for arg in argv:
        if arg.startswith(f"{source}/") and not Path(arg).exists():
            raise TargetError(f"{where}: the launch command names {arg}, which does not exist under source {source}; "
                              "fix `source` or `launch`")
    if not local:
        return  # the interpreter and the program are the remote host's
    python = spec.python or ""
    if python and "{" not in python and not Path(python).exists() and not shutil.which(python):
        raise TargetError(f"{where}: python {python} does not exist here; fix `python` (an interpreter or a venv folder)")
    program = argv[0] if argv else "PYTHON"  # the prefix's program when there is one (`taskset`, `numactl`)
    if program != "PYTHON" and not shutil.which(program):
        raise TargetError(f"{where}: the launch command starts {program!r}, which is not on PATH here; install it, "
                          "or fix `launch` / `prefix`")


def load_target(path: str | Path) -> TargetSpec:
    """Load a target TOML; relative `source`/`model` paths resolve against the file's folder."""
    path = Path(path)
    data = read_toml(path, "target file", TargetError, "see examples/targets/ for examples")
    if "path" in data:
        raise TargetError(f"{path}: path: unknown key (infergoal fills it in); remove it")
    if "engines" in data:  # the engine as a knob: a file naming one target file per engine
        return _load_multi(path, data)
    base = path.resolve().parent
    if "search_space" in data:  # an InferenceBench-style YAML adds knobs (the TOML's own win)
        data["knobs"] = import_search_space(base / str(data.pop("search_space")), data.get("knobs", {}))
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
        spec = TargetSpec.model_validate({**data, "path": str(path.resolve())})
    except ValidationError as e:
        raise TargetError(f"{path}: {validation_message(e, TargetSpec)}") from None
    check_space(spec, str(path))
    check_parallel(spec, spec.parallel, str(path))
    return spec


def _load_multi(path: Path, data: dict[str, Any]) -> TargetSpec:
    """A multi-engine file (targets/engineknob.py): each engine's own target file loaded, given the
    file's model and served name, and composed into one target whose `engine` knob picks."""
    f = read_multi(path, data)
    variants: dict[str, TargetSpec] = {}
    for engine, rel in f.engines.items():
        sub = load_target(path.resolve().parent / rel)
        if sub.variants:
            raise TargetError(f"{path}: engines.{engine} is itself a multi-engine file")
        variants[engine] = sub.model_copy(update={"model": f.model, "served_model_name": f.served_model_name})
    return TargetSpec(**compose(path, f, variants))
