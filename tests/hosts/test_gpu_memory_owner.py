"""GPU memory of this process and its children is ours, not another tenant's: a host-state change
counts only others' memory. nvidia-smi is a fake answering what an H200 did."""

import os
import subprocess

from orchestrator.hosts import state
from orchestrator.hosts.measure import TrustPolicy, state_change


def _smi(gpu_line, apps):
    def smi(query):
        return gpu_line + "\n" if query.startswith("--query-gpu") else apps
    return smi


def test_gpu_memory_of_our_own_processes_is_not_others(tmp_path):
    line = "GPU-5f2a, 1980, 1980, 41, 44323, 143771, 0"
    # The fp32 reference in this process and the server under test: 44 GB, all ours.
    ours = state.gpu_state({1234, 1240}, smi=_smi(line, "GPU-5f2a, 1234, 28800\nGPU-5f2a, 1240, 15523\n"))
    assert ours[0]["mem_used_mib"] == 44323 and ours[0]["mem_own_mib"] == 44323 and ours[0]["mem_others_mib"] == 0
    # A tenant's process is others'.
    shared = state.gpu_state({1234}, smi=_smi(line, "GPU-5f2a, 1234, 28800\nGPU-5f2a, 999, 15523\n"))
    assert shared[0]["mem_others_mib"] == 15523
    # The H200's resume: before, our 44 GB read as others' and forced a sentinel.
    idle = state.gpu_state({4321}, smi=_smi("GPU-5f2a, 1980, 1980, 35, 0, 143771, 0", ""))
    policy = TrustPolicy()
    assert state_change({"gpus": idle}, {"gpus": ours}, policy) is None
    assert state_change({"gpus": idle}, {"gpus": shared}, policy) is None  # 15.5 of 143.7 GB: under the 25% line
    tenant = state.gpu_state({4321}, smi=_smi("GPU-5f2a, 1980, 1980, 35, 60000, 143771, 0", "GPU-5f2a, 777, 60000\n"))
    assert state_change({"gpus": tenant}, {"gpus": ours}, policy) == "GPU 0 memory used by others moved 0 -> 60000 MiB"
    # A state recorded without the split (an older run) cannot tell ours from others': not compared.
    old = [{"mem_used_mib": 44323.0, "mem_total_mib": 143771.0, "sm_clock_max_mhz": 1980.0}]
    assert state_change({"gpus": idle}, {"gpus": old}, policy) is None


def test_snapshot_counts_this_process_and_its_children_as_ours(monkeypatch):
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert {os.getpid(), child.pid} <= state.own_tree()
        line = "GPU-5f2a, 1980, 1980, 41, 44323, 143771, 0"
        apps = f"GPU-5f2a, {os.getpid()}, 28800\nGPU-5f2a, {child.pid}, 523\nGPU-5f2a, 1, 1000\n"
        monkeypatch.setattr(state, "nvidia_smi", _smi(line, apps))
        gpu = state.snapshot()["gpus"][0]
        assert gpu["mem_own_mib"] == 29323 and gpu["mem_others_mib"] == 44323 - 29323
    finally:
        child.kill()
        child.wait()
