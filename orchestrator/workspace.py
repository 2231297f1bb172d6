"""Workspace: `infergoal.toml` -> a pydantic config, plus where state lives (`.infergoal/`).

Every field can be overridden on the command line with `-o a.b=value` (e.g. `-o bench.scale=0.5`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.tomlfile import validation_message

__all__ = ["BenchConfig", "Config", "ConfigError", "Workspace", "apply_overrides"]

CONFIG_NAME = "infergoal.toml"
STATE_DIR = ".infergoal"
# The shipped example target; `infergoal init` and the default run use it.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TARGET = PACKAGE_ROOT / "examples" / "targets" / "hfserve.toml"


class ConfigError(ValueError):
    """A config file or override that cannot be used."""


class BenchConfig(BaseModel):
    """How trials are measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    scale: float = 1.0
    """Scenario size factor: 1.0 runs each scenario in seconds on the tiny CPU model; raise it on a GPU."""
    repeats: int = 1
    """Measurements of each scenario per candidate (borderline results are re-measured on top)."""
    baseline_repeats: int = 2
    """Measurements of the baseline; their spread is the run's noise estimate."""
    timeout_s: float = 120.0
    """Per-request timeout."""


class GateConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    accuracy: bool = True
    """Run the accuracy gate (never turn off for real runs; it is what keeps wins honest)."""
    integrity: bool = True


class Config(BaseModel):
    """Workspace configuration (`infergoal.toml`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    db: str = ""
    """SQLAlchemy URL; empty = SQLite at `.infergoal/infergoal.db`."""
    host: str = "local"
    """`local`, `ssh://user@host:port`, a name from `infergoal hosts add`, or several, comma-separated (a pool)."""
    target: str = ""
    """Target TOML path; empty = the shipped hfserve example."""
    proposer: str = "search"
    """`search` (Optuna TPE) or `scripted:FILE.json`."""
    seed: int = 0
    min_gain: float = 0.03
    """A candidate is kept only if it beats the best kept score by this fraction (and by the noise)."""
    kb: str = ""
    """Knowledge base dir findings are written to; empty = `.infergoal/knowledge_base`. The shipped seed is always read."""
    bench: BenchConfig = BenchConfig()
    gates: GateConfig = GateConfig()
    extra: dict[str, Any] = Field(default_factory=dict)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` strings; values are parsed as TOML scalars when they can be."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value, e.g. bench.scale=0.5")
        key, raw = item.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return data


class Workspace:
    """A folder with an optional `infergoal.toml` and the `.infergoal/` state dir."""

    def __init__(self, root: str | Path = ".", overrides: list[str] | None = None) -> None:
        self.root = Path(root).resolve()
        data: dict[str, Any] = {}
        cfg_path = self.root / CONFIG_NAME
        if cfg_path.is_file():
            try:
                data = tomllib.loads(cfg_path.read_text())
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{cfg_path} is not valid TOML: {e}") from None
        data = apply_overrides(data, overrides or [])
        try:
            self.config = Config(**data)
        except ValidationError as e:
            raise ConfigError(f"configuration error: {validation_message(e)}") from None

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def db_url(self) -> str:
        return self.config.db or f"sqlite:///{self.state_dir / 'infergoal.db'}"

    @property
    def target_path(self) -> Path:
        if not self.config.target:
            return DEFAULT_TARGET
        p = Path(self.config.target)
        return p if p.is_absolute() else self.root / p

    @property
    def kb_write_dir(self) -> Path:
        """Where findings are written back: `kb` from the config, else `.infergoal/knowledge_base`.

        Never the shipped seed: a demo run in a clone must not edit tracked files.
        """
        if self.config.kb:
            p = Path(self.config.kb)
            return p if p.is_absolute() else self.root / p
        return self.state_dir / "knowledge_base"

    @property
    def kb_read_dirs(self) -> list[Path]:
        """The shipped seed KB, then the workspace's own (later entries win on equal ids)."""
        dirs = [PACKAGE_ROOT / "knowledge_base", self.kb_write_dir]
        return list(dict.fromkeys(d.resolve() for d in dirs))

    def run_dir(self, run_id: int) -> Path:
        return self.state_dir / "runs" / str(run_id)
