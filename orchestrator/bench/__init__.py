"""Benchmark client: scenarios, aiohttp load generator, metrics, exports and scores."""

from .loadgen import run_scenario, run_scenario_sync
from .metrics import compute_metrics, stats
from .records import RequestRecord
from .results import ScenarioResult, to_aiperf_json, to_vllm_json, write_exports
from .scenarios import Scenario, arrival_offsets, builtin_scenarios, load_trace
from .score import geomean, scenario_speedup, score, speedup

__all__ = [
    "RequestRecord", "Scenario", "ScenarioResult", "arrival_offsets", "builtin_scenarios",
    "compute_metrics", "geomean", "load_trace", "run_scenario", "run_scenario_sync",
    "scenario_speedup", "score", "speedup", "stats", "to_aiperf_json", "to_vllm_json", "write_exports",
]
