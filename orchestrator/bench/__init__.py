"""Benchmark client: scenarios, aiohttp load generator, metrics and exports."""

from .loadgen import run_scenario, run_scenario_sync
from .metrics import compute_metrics, stats
from .results import ScenarioResult, to_aiperf_json, to_vllm_json, write_exports
from .scenarios import Scenario, arrival_offsets, builtin_scenarios, load_trace
from .timeline import RequestRecord

__all__ = [
    "RequestRecord", "Scenario", "ScenarioResult", "arrival_offsets", "builtin_scenarios",
    "compute_metrics", "load_trace", "run_scenario", "run_scenario_sync",
    "stats", "to_aiperf_json", "to_vllm_json", "write_exports",
]
