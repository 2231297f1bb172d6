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


def test_search_stops_proposing_what_the_engine_refused(tmp_path):
    from orchestrator.proposers.search import SearchProposer
    from orchestrator.targets import load_target
    from orchestrator.targets.failures import refused_values

    f = tmp_path / "t.toml"
    f.write_text('name = "x"\nlaunch = "run {{ port }} {{ flags }}"\n'
                 '[knobs.turbo]\ntype = "bool"\ndefault = false\nflag = "--turbo"\n'
                 '[knobs.dtype]\ntype = "categorical"\nchoices = ["float32", "int1"]\ndefault = "float32"\nflag = "--dtype"\n'
                 '[knobs.n]\ntype = "int"\nlow = 1\nhigh = 64\ndefault = 1\n')
    t = load_target(f)

    class Trial:
        def __init__(self, knobs, error, number, rationale=""):
            self.knobs, self.error, self.status, self.score, self.proposer = knobs, error, "failed", None, "search"
            self.number, self.rationale = number, rationale

    history = [
        Trial({"turbo": True, "dtype": "float32", "n": 3}, "start-up failure (bad_flag): server.py: error: unrecognized arguments: --turbo [ServerCrashed: ...]", 0),
        Trial({"turbo": False, "dtype": "int1", "n": 5}, "start-up failure (bad_flag): error: argument --dtype: invalid choice: 'int1' [...]", 1),
        Trial({"turbo": False, "dtype": "float32", "n": 7}, "start-up failure (crash): Segmentation fault [...]", 2),
    ]
    assert refused_values(t, history) == {("turbo", "True"), ("dtype", "'int1'")}
    p = SearchProposer(seed=0, n_startup=2)
    for _ in range(8):
        c = p.propose(history, t)
        assert c.knobs["turbo"] is False and c.knobs["dtype"] == "float32"
        history.append(Trial(c.knobs, None, len(history), c.rationale))
        history[-1].status, history[-1].score = "kept", 1.0
