"""Start-up failures are classified from the server's own log lines."""

import pytest

from orchestrator.targets.failures import classify, classify_log

# Lines as the engines print them (vLLM 0.32's argparse and config validation, torch, Python).
CASES = [
    ("api_server.py: error: unrecognized arguments: --warp-speed 9", "bad_flag"),
    ("api_server.py: error: argument --dtype: invalid choice: 'int1' (choose from auto, bfloat16)", "bad_flag"),
    ("pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
     "  Value error, max_num_batched_tokens (512) is smaller than max_model_len (1024).", "constraint_violated"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out_of_memory"),
    ("ValueError: No available memory for the cache blocks. Try increasing `VLLM_CPU_KVCACHE_SPACE`", "out_of_memory"),
    ("ModuleNotFoundError: No module named 'vllm'", "missing_dependency"),
    ("OSError: [Errno 98] Address already in use", "port_in_use"),
    ("Segmentation fault (core dumped)", "crash"),
    ("", "crash"),
]


@pytest.mark.parametrize("log, kind", CASES)
def test_classify(log, kind):
    f = classify_log("INFO starting\nTraceback (most recent call last):\n" + log)
    assert f.kind == kind
    assert f.message("ServerCrashed").startswith(f"start-up failure ({kind})")


def test_timeout_and_log_file(tmp_path):
    assert classify_log("loading weights 40%", timed_out=True).kind == "timeout"
    log = tmp_path / "server.log"
    log.write_text("x\n" * 50_000 + "api_server.py: error: unrecognized arguments: --nope\n")
    f = classify(log)
    assert (f.kind, f.evidence) == ("bad_flag", "api_server.py: error: unrecognized arguments: --nope")
    assert classify(tmp_path / "missing.log").kind == "crash"
