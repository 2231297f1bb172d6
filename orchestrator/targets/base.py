"""The floor of targets/: what spec.py and its helper modules share, importing nothing of targets/.

spec.py's `TargetSpec` calls the helpers (space, launch, multi, ibyaml); the helpers raise
`TargetError`, read `Knob`s and `KnobRule`s, and read a target through the `Target` Protocol here,
so they import this module and never spec.py (no import circle, no function-local imports).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ConstraintViolated", "Knob", "KnobRule", "Target", "TargetError"]


class TargetError(ValueError):
    """A target file that cannot be used; the message says which field and why."""


class ConstraintViolated(TargetError):
    """A knob set that breaks one of the target's constraints: it would not start, so it is not launched."""


class KnobRule(BaseModel):
    """A rule between knobs (a target file's `[[constraints]]`): a jinja2 expression over the
    active knobs (inactive ones are None). Not the goal's accuracy constraint (goal.Constraint)."""

    model_config = ConfigDict(frozen=True)
    expr: str
    """E.g. `max_num_batched_tokens >= max_model_len or enable_chunked_prefill`."""
    message: str = ""
    """What the engine would say; shown when a proposal breaks the rule."""


class Knob(BaseModel):
    """One tunable engine setting."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    type: Literal["categorical", "int", "float", "bool"]
    default: Any
    """The baseline's value."""
    choices: tuple[Any, ...] | None = None
    """Categorical values."""
    low: float | None = None
    high: float | None = None
    log: bool = False
    """Sample int/float knobs on a log scale."""
    help: str = ""
    flag: str | None = None
    """CLI flag rendered into `{{ flags }}` (`--max-num-seqs 64`; for a bool: the flag alone when true)."""
    false_flag: str | None = None
    """A bool knob's flag when false (`--no-enable-prefix-caching`); nothing is rendered if unset."""
    env_var: str | None = None
    """Set this environment variable to the knob's value (for engines tuned through env vars)."""
    when: dict[str, Any] = Field(default_factory=dict)
    """Active only when each named (earlier) knob has this value, or one of these values (a list)."""
    memory: Literal["up", "down", "none"] | list[Any] | None = None
    """How the knob acts on memory, for the failed regions an out-of-memory trial marks
    (`targets.regions`): `up` (a larger value needs more: batch size, max model length, cache and
    chunk sizes), `down`, `none`; for a categorical knob, its choices from least to most memory
    (`[256, 1024, 0]` when 0 means "no chunking"). Unset: guessed from the knob's name."""
    prior: dict[str, float] | float | None = None
    """The search's cost model before any trial measured the knob (`proposers.costmodel`): how much a
    level multiplies the score, by level (`{ "fast-graphs" = 3.8 }`, keyed by the choice as text; the
    default and levels not named: 1), or for an int or float knob, per doubling of its value. The
    run's measured trials correct it (a screening level for which candidate to deploy, never a verdict)."""

    @model_validator(mode="after")
    def _check(self) -> Knob:
        if isinstance(self.memory, list) and (self.type != "categorical" or sorted(map(repr, self.memory))
                                              != sorted(map(repr, self.choices or ()))):
            raise ValueError("a `memory` list orders a categorical knob's choices: list each choice once")
        if self.type == "bool":
            if not isinstance(self.default, bool):
                raise ValueError(f"a bool knob's default must be true or false, not {self.default!r}")
            return self
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


class Target(Protocol):
    """A target as the helper modules read it; `spec.TargetSpec` is the implementation (its fields
    are documented there). Read-only: a spec is frozen."""

    @property
    def name(self) -> str: ...
    @property
    def launch(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def served_model_name(self) -> str: ...
    @property
    def api(self) -> str: ...
    @property
    def health_path(self) -> str: ...
    @property
    def ready_timeout_s(self) -> float: ...
    @property
    def knobs(self) -> Mapping[str, Knob]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def python(self) -> str | None: ...
    @property
    def prefix(self) -> str: ...
    @property
    def preload(self) -> Sequence[str]: ...
    @property
    def constraints(self) -> list[KnobRule]: ...
    @property
    def variants(self) -> Mapping[str, Target]: ...

    def resolve(self, knobs: dict[str, Any]) -> tuple[Target, dict[str, Any]]:
        """The concrete target and its own knobs: itself, or the variant the `engine` knob picks."""
        ...

    def baseline_knobs(self) -> dict[str, Any]:
        """The defaults of the knobs active under the defaults."""
        ...
