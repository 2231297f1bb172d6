"""Session fixtures for the gate tests: one forge model, its damaged copies, and real servers.

Everything expensive happens once per session: the forge model comes from the cache
(``$INFERGOAL_CACHE`` or ``~/.cache/infergoal``), damaged folders are derived from it in a tmp dir,
and all servers start *in parallel* on first use of :func:`fleet` (each takes seconds to import
torch; on 2 cores starting them one by one would dominate the run).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gate_servers import (
    CHEATS,
    FLAWED_SPECS,
    GEN_PROXIES,
    PROXY_MODES,
    SERVED_NAME,
    SERVER,
    SERVER_SPECS,
    Served,
    free_port,
    model_name,
    spawn,
    start_fleet,
    stop,
    stop_fleet,
    wait_healthy,
)

# Honest configurations beyond the main fleet's fp32/fp16/bf16/batched (the calibration script
# runs all of them over 20 seeds; here each once).
EXTRA_HONEST = ("manual", "static", "sdpa")


@pytest.fixture(scope="session")
def model_dir(tiny_model: Path) -> Path:
    """The forge's default tiny model (tests/conftest.py builds it once, cached)."""
    return Path(tiny_model)


@pytest.fixture(scope="session")
def model_variants(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Name -> folder: the honest model and every damaged copy."""
    import gate_damage as damage

    from orchestrator.models.forge import MODEL_INFO_FILE, cache_root, make_model

    base = tmp_path_factory.mktemp("variants")
    cfg = json.loads((model_dir / "config.json").read_text())
    theta = cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)
    return {
        "honest": model_dir,
        "drop_layer": damage.drop_layer(model_dir, base / "drop_layer"),
        "quant3": damage.quantize(model_dir, base / "quant3", bits=3),
        "quant6": damage.quantize(model_dir, base / "quant6", bits=6),
        "rope": damage.wrong_rope(model_dir, base / "rope", theta=float(theta) * 10),
        "other_model": _other_model(cache_root(), make_model, MODEL_INFO_FILE),
    }


def _other_model(root: Path, make_model: Callable[..., Path], info_file: str) -> Path:
    """A different, cheaper model passed off as the declared one (other seed, a fifth of the
    training), kept in the forge cache so later test runs skip the build."""
    out = root / "gatetest-tiny-seed1-steps60"
    if not (out / info_file).exists():
        make_model(out, preset="tiny", seed=1, train_steps=60)
    return out


@pytest.fixture(scope="session")
def fleet(model_variants: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    """Every server of SERVER_SPECS plus one cheating proxy per mode (in front of ``fp32``)."""
    if not SERVER.exists():
        pytest.skip(f"{SERVER} not present yet")
    logs = tmp_path_factory.mktemp("logs")
    started: dict[str, Served] = {}
    try:
        for name, (variant, extra) in SERVER_SPECS.items():
            port = free_port()
            # Every candidate declares the same name: a damaged model is passed off as the real one.
            argv = [sys.executable, str(SERVER), "--model", str(model_variants[variant]), "--port", str(port),
                    "--served-model-name", SERVED_NAME, *extra]
            started[name] = Served(f"http://127.0.0.1:{port}", spawn(argv, logs / f"{name}.log"),
                                   model_variants[variant])
        for name, s in started.items():
            wait_healthy(s.url, s.proc, logs / f"{name}.log")
            s.name = model_name(s.url)
        upstream = started["fp32"]
        for mode in PROXY_MODES:
            port = free_port()
            argv = [sys.executable, str(CHEATS), "--upstream", upstream.url, "--port", str(port), "--mode", mode,
                    "--tokenizer", str(upstream.model_dir)]
            started[f"proxy:{mode}"] = Served(f"http://127.0.0.1:{port}", spawn(argv, logs / f"proxy-{mode}.log"),
                                              upstream.model_dir, upstream.name)
        for mode in PROXY_MODES:
            wait_healthy(started[f"proxy:{mode}"].url, started[f"proxy:{mode}"].proc, logs / f"proxy-{mode}.log")
        yield started
    finally:
        for s in started.values():
            stop(s.proc)


@pytest.fixture(scope="session")
def gen_fleet(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    """The generation check's cases: honest configurations, flawed decode paths and cheating
    proxies (in front of an fp32 server). Independent of ``fleet``, so the generation tests alone
    start only what they judge."""
    if not SERVER.exists():
        pytest.skip(f"{SERVER} not present yet")
    names = [*EXTRA_HONEST, "bf16", "batched", *FLAWED_SPECS, *GEN_PROXIES]
    started = start_fleet(names, model_dir, tmp_path_factory.mktemp("genlogs"))
    try:
        yield started
    finally:
        stop_fleet(started)
