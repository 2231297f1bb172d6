"""Workspace: `infergoal.toml` -> a pydantic config, plus where state lives (`.infergoal/`).

Every field can be overridden on the command line with `-o a.b=value` (e.g. `-o bench.scale=0.5`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.agent.config import AgentConfig
from orchestrator.core.tomlfile import read_toml, validation_message

__all__ = ["BenchConfig", "Config", "ConfigError", "Workspace", "apply_overrides"]

CONFIG_NAME = "infergoal.toml"
STATE_DIR = ".infergoal"
# The shipped example target; `infergoal init` and the default run use it.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TARGET = PACKAGE_ROOT / "examples" / "targets" / "hfserve.toml"


class ConfigError(ValueError):
    """A config file or override that cannot be used."""


class BenchConfig(BaseModel):
    """How trials are measured."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    scale: float = Field(1.0, gt=0, le=1000)
    """Scenario size factor: 1.0 runs each scenario in seconds on the tiny CPU model; raise it on a GPU."""
    repeats: int = Field(1, ge=1, le=100)
    """Measurements of each scenario per candidate (borderline results are re-measured on top)."""
    baseline_repeats: int = Field(2, ge=1, le=100)
    """Measurements of the baseline; their spread is the run's noise estimate."""
    timeout_s: float = Field(120.0, gt=0, le=86400)
    """Per-request timeout in seconds."""
    settle_s: float = Field(30.0, ge=0, le=3600)
    """Before a paired A/B round redone because other tenants loaded the host: the longest wait for the
    host to calm down to the baseline's contention (0 = redo at once)."""
    screen_fraction: float = Field(0.0, ge=0, lt=1)
    """Multi-fidelity screening (`orchestrator.trial.fidelity`): a search candidate is first benched with this
    fraction of each scenario's requests (whole waves of its concurrency) and measured in full only when
    the search's pruner calls it promising. 0 = off; baselines, sentinels, paired rounds and probes are
    always measured in full."""
    scenarios: str = ""
    """TOML file (relative to the workspace) whose `[NAME]` tables replace built-in scenarios of that
    name, unscaled: how a GPU run sizes InferenceBench A-C (see benchmarks/gpu/scenarios.toml)."""
    slo_precision: float = Field(0.05, gt=0, le=1)
    """SLO goals' rate search (`orchestrator.bench.rate`): bisect until the highest passing and the lowest
    failing rate are this close (relative); the score is within it of the server's limit."""
    slo_min_requests: int = Field(30, ge=8, le=100000)
    """SLO goals: fewest measured requests in one step of the rate search (its percentiles rest on them)."""
    slo_min_seconds: float = Field(4.0, gt=0, le=3600)
    """SLO goals: shortest step of the rate search, so a queue has time to build up at an unsustainable rate."""
    slo_max_step_s: float = Field(40.0, gt=0, le=3600)
    """SLO goals: longest step of the rate search. A rate at which `slo_min_requests` take longer than this
    is not tried: a server that meets the limits only below `slo_min_requests / slo_max_step_s` req/s
    scores 0, as one that meets them at no rate (it bounds how long a hopeless candidate's search runs)."""
    slo_confirmations: int = Field(4, ge=0, le=20)
    """SLO goals: most confirmation tries (steps twice as long, each lower after a failure) that settle the
    search's answer; a rate counts only once it has passed twice (0: trust the bisection's single pass). A
    pass reached by a doubled stride is bisected back up with at most this less 2 more such steps."""
    floors: str = ""
    """The host's speed of light: a JSON as `benchmarks/gpu/sol.py --out` writes it (relative to the
    workspace), recorded on the run at its start like `infergoal floors FILE`; a trial of that model
    measured faster than its floors is invalid (gates/plausible.py)."""


class GateConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    accuracy: bool = True
    """Run the accuracy gate (never turn off for real runs; it is what keeps wins honest)."""
    integrity: bool = True


class Config(BaseModel):
    """Workspace configuration (`infergoal.toml`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    db: str = ""
    """SQLAlchemy URL; empty = SQLite at `.infergoal/infergoal.db`."""
    host: str = "local"
    """`local`, `ssh://user@host:port`, a name from `infergoal hosts add`, or several, comma-separated (a pool)."""
    gpus: int | list[int] | str = "auto"
    """The GPUs of the host trials run on, one trial per GPU set at once (orchestrator/hosts/gpus.py):
    `auto` = those `nvidia-smi -L` lists on the host (`CUDA_VISIBLE_DEVICES` where set; an SSH host
    registered with `--gpus` keeps its set); a count (`gpus = 4`: ids 0-3) or a list of ids
    (`gpus = [0, 2]`), also to simulate GPUs. One GPU or none: one trial at a time, as always."""
    model_cache: str = "auto"
    """A RAM-backed copy of the model that trials launch from (orchestrator.remote.modelcache), on a
    local host: `auto` = in /dev/shm where a CUDA GPU is visible, none on CPU-only hosts; `off`; or a
    folder to keep the copies in (used on any host)."""
    standby: bool = True
    """On a local or SSH host, run each launch of a target that names `preload` modules in a standby
    interpreter that imported them while the previous server ran (orchestrator.hosts.standby): a
    deploy saves the imports (torch, transformers: 2.6-4.2 s on the H200). Off: every launch starts cold."""
    standby_idle_s: float = Field(900.0, gt=0, le=7 * 24 * 3600)
    """A standby interpreter that got no launch for this long (seconds) exits by itself, so one left on an
    SSH host by an orchestrator that died (it outlives its orchestrator there) does not hold its memory
    until `hosts clean`; the next launch then starts cold."""
    target: str = ""
    """Target TOML path; empty = the shipped hfserve example."""
    proposer: str = "search"
    """`search` (Optuna TPE), `claude` (the code agent), `hybrid` (agent + search) or `scripted:FILE.json`."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Search seed (numpy's range)."""
    min_gain: float = Field(0.03, ge=0, lt=1)
    """A candidate is kept only if it beats the best kept score by this fraction (and by the noise)."""
    allow_concurrent_runs: bool = False
    """Let another run use the same host while this one is live (a pool whose runs do not share
    hardware). Off: a second run on a host is refused while the first is live, since two runs on
    one machine skew each other's numbers."""
    kb: str = ""
    """Knowledge base dir findings are written to; empty = `.infergoal/knowledge_base`."""
    kb_seed: bool = True
    """Read the shipped seed knowledge base (`knowledge_base/`) before the workspace's own. Off: the run
    knows only what its own `kb` holds (a cold run: the time-to-best benchmark's "empty knowledge base")."""
    probe_winner: int = Field(0, ge=0, le=100)
    """After the run stops, measure up to this many one-knob neighbours of its winner (never kept;
    not counted in the trial budget). The knowledge base then records which knob moved the winner
    and by how much, and a later run on another model uses that to pick which knobs to swap
    between the winners of its source runs. 0: off."""
    bench: BenchConfig = BenchConfig()
    gates: GateConfig = GateConfig()
    agent: AgentConfig = AgentConfig()
    """The code agent (`proposer = "claude"` or `"hybrid"`): model, key source, spend limit."""
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        if isinstance(v, bool) or isinstance(v, list) and any(isinstance(g, bool) or not isinstance(g, int) for g in v):
            raise ValueError(f"gpus = {v!r}: write auto, a count (gpus = 4) or a list of GPU ids (gpus = [0, 1])")
        if isinstance(v, str) and v != "auto":
            raise ValueError(f"gpus = {v!r}: write auto, a count (gpus = 4) or a list of GPU ids (gpus = [0, 1])")
        if isinstance(v, int) and v < 1 or isinstance(v, list) and (not v or min(v) < 0 or len(set(v)) != len(v)):
            raise ValueError(f"gpus = {v!r}: a count of at least 1, or distinct GPU ids (0 and up)")
        return v

    @field_validator("db")
    @classmethod
    def _db_url(cls, v: str) -> str:
        if v:
            from sqlalchemy.engine import make_url
            from sqlalchemy.exc import ArgumentError

            try:
                make_url(v)
            except ArgumentError:
                raise ValueError(
                    f"{v!r} is not a database URL; use e.g. sqlite:///path/to.db or postgresql+psycopg://user@host/db"
                ) from None
        return v


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` strings; values are parsed as TOML scalars when they can be."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value, e.g. bench.scale=0.5")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not _KEY.fullmatch(key):
            raise ConfigError(f"override key {key!r} must be a dotted name such as bench.scale")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = data
        parts = key.split(".")
        for i, p in enumerate(parts[:-1]):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is a value, not a table")
        node[parts[-1]] = value
    return data


_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*")


class Workspace:
    """A folder with an optional `infergoal.toml` and the `.infergoal/` state dir."""

    def __init__(self, root: str | Path = ".", overrides: list[str] | None = None) -> None:
        self.root = Path(root).resolve()
        data: dict[str, Any] = {}
        cfg_path = self.root / CONFIG_NAME
        if cfg_path.is_file():
            data = read_toml(cfg_path, "config file", ConfigError)
        data = apply_overrides(data, overrides or [])
        try:
            self.config = Config.model_validate(data)
        except ValidationError as e:
            raise ConfigError(f"configuration error in {cfg_path.name} or -o: {validation_message(e, Config)}") from None

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
        """The shipped seed KB (unless `kb_seed = false`), then the workspace's own (later entries win on equal ids)."""
        dirs = [*([PACKAGE_ROOT / "knowledge_base"] if self.config.kb_seed else []), self.kb_write_dir]
        return list(dict.fromkeys(d.resolve() for d in dirs))

    def run_dir(self, run_id: int) -> Path:
        return self.state_dir / "runs" / str(run_id)
