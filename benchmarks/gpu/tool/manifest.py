"""The GPU experiments' manifest (benchmarks/gpu/experiments.toml): named server variants and named experiments.

A *variant* is one way to launch the engine's server: a flag string (``flags``, ``{base}`` expands to the manifest's
``base`` flags), or another variant's (``from``) plus flags (``add``, appended: the server's parser keeps the last
of a repeated flag), extra environment (``env``), and ``step`` when it is exactly an engine step's knob set
(engine_steps.json; a test holds the two together).

An *experiment* is a list of steps run in order on one GPU machine within a time limit (``limit_s``); each step's
``do`` is one of KINDS, its other keys that kind's parameters (SPEC). A ``serve`` step's ``servers`` are variant
names or ``LABEL=VARIANT`` (the label is the server's name in the results), and ``before`` names the labels served
from the tree carried in ``.before/`` (an older engine to compare against).

Only the standard library is used here: the tool starts on a bare GPU machine before the carried wheels are in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[3]
GPU = ROOT / "benchmarks" / "gpu"
MANIFEST = GPU / "experiments.toml"

# Each step kind's parameters and their defaults (None: required).
SPEC: dict[str, dict[str, Any]] = {
    "serve": {"servers": None, "scenarios": "scenarios_ib.toml", "only": "", "min_s": 60, "reserve_s": 10,
              "out": "ib_ab.json", "before": [], "step_log": [], "profile": [], "gaps_min_batch": 1,
              "client_gaps": False, "naive": False, "deadline_s": 0},
    "gate": {"variant": None, "label": "", "honest_only": True, "timeout_s": 0, "reserve_s": 5, "rejudge": ""},
    "profile": {"only": "", "timeout_s": 150, "db": ""},
    "floors": {"scenarios": "scenarios_ib.toml", "model_config": False, "timeout_s": 60},
    "script": {"script": None, "args": [], "timeout_s": 120, "tail": 30, "env": {}},
    "ttb": {"preset": "7b-peaked", "goal": "goal_4x.toml", "kind": "cold", "seed": 0, "trials": 0, "wall_s": 0,
            "name": "", "kb_from": "", "host": "local", "scenarios": "scenarios.toml", "floors": "results/sol.json",
            "screen_fraction": 0.25, "repeats": 1, "target": "examples/targets/hfserve_gpu.toml",
            "paired_reserve_s": 0, "best_known": "best_known.json", "reserve_s": 0},
}
KINDS = tuple(SPEC)
# The parameters that name a file, and the folder each is under.
FILE_PARAMS = (("scenarios", GPU), ("goal", GPU), ("target", ROOT), ("script", ROOT), ("floors", GPU),
               ("best_known", GPU))
BEST_GOAL = "best-known"  # a ttb step's goal made from best_known.json for the machine's card (ttb.py)
EXPERIMENT_KEYS = {"about", "card", "limit_s", "steps"}
VARIANT_KEYS = {"flags", "from", "add", "env", "step", "about"}


class ManifestError(ValueError):
    """A manifest that does not hold together (one line, said to the user as is)."""


@dataclass(frozen=True)
class Variant:
    name: str
    flags: str
    env: dict[str, str] = field(default_factory=dict)
    step: int | None = None
    about: str = ""


@dataclass(frozen=True)
class Step:
    do: str
    params: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.params[key]


@dataclass(frozen=True)
class Experiment:
    name: str
    about: str
    card: str
    limit_s: int
    steps: tuple[Step, ...]


@dataclass
class Manifest:
    server: str
    base: str
    variants: dict[str, Variant]
    experiments: dict[str, Experiment]
    path: Path = MANIFEST

    def variant(self, name: str) -> Variant:
        if name not in self.variants:
            raise ManifestError(f"no variant {name!r}; the manifest has {', '.join(sorted(self.variants))}")
        return self.variants[name]

    def experiment(self, name: str) -> Experiment:
        if name not in self.experiments:
            raise ManifestError(f"no experiment {name!r}; `list` shows them")
        return self.experiments[name]

    def command(self, variant: Variant, *, before: bool = False, env: dict[str, str] | None = None) -> str:
        """ib_baseline.py's server command (``{python}``, ``{model}``, ``{port}``, ``{device}``, ``{name}`` left for it
        to fill) for ``variant``, from ``.before/``'s tree when ``before``, with ``env`` besides the variant's."""
        allenv = {**variant.env, **(env or {})}
        prefix = "env " + " ".join(f"{k}={v}" for k, v in allenv.items()) + " " if allenv else ""
        return prefix + self.server.replace("{tree}", ".before/" if before else "") + " " + variant.flags


def _resolve(name: str, raw: dict[str, dict[str, Any]], base: str, seen: tuple[str, ...] = ()) -> tuple[str, dict]:
    if name in seen:
        raise ManifestError(f"variant {name!r}: `from` goes round in a circle ({' -> '.join((*seen, name))})")
    if name not in raw:
        raise ManifestError(f"variant {seen[-1]!r}: `from` names no variant {name!r}")
    v = raw[name]
    if "from" in v:
        flags, env = _resolve(v["from"], raw, base, (*seen, name))
        return (flags + " " + v.get("add", "")).strip(), {**env, **v.get("env", {})}
    return v["flags"].replace("{base}", base).strip(), dict(v.get("env", {}))


def _variants(raw: dict[str, dict[str, Any]], base: str) -> dict[str, Variant]:
    out = {}
    for name, v in raw.items():
        extra = set(v) - VARIANT_KEYS
        if extra:
            raise ManifestError(f"variant {name!r}: unknown key(s) {', '.join(sorted(extra))}")
        if ("flags" in v) == ("from" in v):
            raise ManifestError(f"variant {name!r}: give either `flags` or `from` (+ `add`)")
        flags, env = _resolve(name, raw, base)
        out[name] = Variant(name, " ".join(flags.split()), {k: str(x) for k, x in env.items()}, v.get("step"),
                            v.get("about", ""))
    return out


def servers(step: Step) -> list[tuple[str, str]]:
    """A serve step's (label, variant) pairs in order."""
    out = []
    for s in step["servers"]:
        label, _, variant = s.partition("=")
        out.append((label, variant or label))
    return out


def _step(exp: str, i: int, raw: dict[str, Any], variants: dict[str, Variant]) -> Step:
    where = f"experiment {exp!r} step {i + 1}"
    do = raw.get("do")
    if do not in SPEC:
        raise ManifestError(f"{where}: `do` must be one of {', '.join(KINDS)}, not {do!r}")
    spec = SPEC[do]
    extra = set(raw) - set(spec) - {"do"}
    if extra:
        raise ManifestError(f"{where}: unknown key(s) for `{do}`: {', '.join(sorted(extra))}")
    missing = [k for k, d in spec.items() if d is None and k not in raw]
    if missing:
        raise ManifestError(f"{where}: `{do}` needs {', '.join(missing)}")
    params = {**spec, **{k: v for k, v in raw.items() if k != "do"}}
    for k, d in spec.items():
        if d is not None and not isinstance(params[k], type(d)) and not (isinstance(d, int) and
                                                                          isinstance(params[k], float)):
            raise ManifestError(f"{where}: `{k}` must be a {type(d).__name__}, not {params[k]!r}")
    step = Step(do, params)
    if do == "serve":
        pairs = servers(step)
        labels = [lab for lab, _ in pairs]
        if len(set(labels)) != len(labels):
            raise ManifestError(f"{where}: a server label twice in {labels}")
        for lab, var in pairs:
            if var not in variants:
                raise ManifestError(f"{where}: server {lab!r} names no variant {var!r}")
        for key in ("before", "step_log", "profile"):
            unknown = set(params[key]) - set(labels)
            if unknown:
                raise ManifestError(f"{where}: `{key}` names no server of this step: {', '.join(sorted(unknown))}")
    if do == "gate" and params["variant"] not in variants:
        raise ManifestError(f"{where}: no variant {params['variant']!r}")
    if do == "ttb" and params["kind"] not in ("cold", "warm"):
        raise ManifestError(f"{where}: `kind` must be cold or warm")
    if do == "ttb" and params["host"] not in ("local", "ssh"):
        raise ManifestError(f"{where}: `host` must be local or ssh")
    if (miss := missing_file(params)) is not None:
        key, value, under = miss
        raise ManifestError(f"{where}: `{key}` {value!r}: no such file under {under.relative_to(ROOT) or '.'}")
    return step


def missing_file(params: dict[str, Any]) -> tuple[str, str, Path] | None:
    """The first of a step's file parameters (FILE_PARAMS) naming no file: (key, value, the folder it is under);
    None when each names one. ``goal = "best-known"`` names none: ttb.py makes that goal on the machine."""
    for key, under in FILE_PARAMS:
        value = params.get(key)
        if value and not (key == "goal" and value == BEST_GOAL) and not (under / value).is_file():
            return key, value, under
    return None


def load(path: Path = MANIFEST) -> Manifest:
    """The manifest, every variant resolved and every step checked; ManifestError on the first fault."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{path}: {exc}") from None
    for key in ("server", "base"):
        if not isinstance(raw.get(key), str):
            raise ManifestError(f"{path}: the top-level `{key}` string is missing")
    if "{tree}" not in raw["server"]:
        raise ManifestError(f"{path}: `server` must say where the tree goes ({{tree}})")
    variants = _variants(raw.get("variants", {}), raw["base"])
    experiments = {}
    for name, e in raw.get("experiments", {}).items():
        extra = set(e) - EXPERIMENT_KEYS
        if extra:
            raise ManifestError(f"experiment {name!r}: unknown key(s) {', '.join(sorted(extra))}")
        if not e.get("steps"):
            raise ManifestError(f"experiment {name!r}: no steps")
        steps = tuple(_step(name, i, s, variants) for i, s in enumerate(e["steps"]))
        experiments[name] = Experiment(name, e.get("about", ""), e.get("card", ""), int(e.get("limit_s", 560)), steps)
    return Manifest(raw["server"], raw["base"], variants, experiments, Path(path))
