"""The bench audit against real servers: what was generated under the measured load.

A server can be honest for the gates' own requests and not for the bench's. `proxy:evade` (in
front of the fp32 server, generating the bench's longer prompts on a 2-layers-dropped copy) passes
the integrity and accuracy gates; the audit of its measured requests rejects it. Honest decode
paths, batched bf16 included, pass; a batching bug that shows under the bench's concurrency fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_servers import Served, start_fleet, stop_fleet

from gates import accuracy, audit, integrity, load_thresholds
from orchestrator.bench import builtin_scenarios, run_scenario_sync
from orchestrator.trial.gating import audit_samples

pytestmark = pytest.mark.slow


def _measured(server: Served, model_dir: Path) -> list[dict]:
    """The throughput scenario as a trial measures it (c=8, 128/32, token-id prompts), sampled."""
    sc = builtin_scenarios()["throughput"].model_copy(update={"num_requests": 16, "warmup_requests": 1})
    res = run_scenario_sync(server.url, server.name, sc, tokenizer=str(model_dir), timeout_s=120)
    assert res.ok, res.failures
    cfg = load_thresholds()["accuracy"]["audit"]
    samples = audit_samples([(sc, res.requests)], str(model_dir), int(cfg["requests"]), int(cfg["min_output_tokens"]))
    assert len(samples) == int(cfg["requests"]) and {len(s["output_ids"]) for s in samples} == {32}
    return samples


@pytest.mark.parametrize("name", ["fp32", "bf16", "batched", "batched_bf16"])
def test_honest_servers_pass_the_audit(gen_fleet: dict[str, Served], model_dir: Path, name: str, tmp_path: Path) -> None:
    server = gen_fleet[name] if name in gen_fleet else None
    started = {}
    if server is None:
        started = start_fleet([name], model_dir, tmp_path, existing=gen_fleet)
        server = started[name]
    try:
        r = audit.check(_measured(server, model_dir), reference_model_dir=model_dir, margin=0.05)
    finally:
        stop_fleet(started)
    assert r.status == "pass", (r.reason, r.details["metrics"])


def test_a_server_honest_only_for_the_gates_is_caught_by_the_audit(gen_fleet: dict[str, Served], model_dir: Path,
                                                                  tmp_path: Path) -> None:
    started = start_fleet(["proxy:evade"], model_dir, tmp_path, existing=gen_fleet)
    try:
        proxy = started["proxy:evade"]
        integ = integrity.check(proxy.url, served_model=proxy.name, tokenizer_dir=model_dir, seed=7)
        acc = accuracy.check(proxy.url, served_model=proxy.name, reference_model_dir=model_dir, seed=41)
        assert (integ.status, acc.status) == ("pass", "pass"), (integ.reason, acc.reason)  # both gates fooled
        r = audit.check(_measured(proxy, model_dir), reference_model_dir=model_dir,
                        margin=acc.details["metrics"]["gen_margin"])
    finally:
        stop_fleet(started)
    assert r.status == "fail" and "audit_offtop" in r.reason, (r.reason, r.details["metrics"])


def test_a_batching_bug_under_the_bench_load_fails_the_audit(gen_fleet: dict[str, Served], model_dir: Path) -> None:
    r = audit.check(_measured(gen_fleet["batch_positions"], model_dir), reference_model_dir=model_dir, margin=0.05)
    assert r.status == "fail", (r.reason, r.details["metrics"])


def test_nothing_long_enough_to_audit_passes_and_says_so(model_dir: Path) -> None:
    r = audit.check([], reference_model_dir=model_dir, margin=0.05)
    assert r.status == "pass" and "nothing to audit" in r.reason
