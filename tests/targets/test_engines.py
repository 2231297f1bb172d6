"""Engine targets: interpreter, templated env, bool flag pairs, conditional knobs, constraints,
InferenceBench YAML import, the engine as a knob, capabilities — all before any launch."""

import sys
from pathlib import Path

import pytest

from orchestrator.proposers.search import SearchProposer
from orchestrator.targets import TargetError, load_target
from orchestrator.targets.adapters import capability_verdict, engine_fingerprint
from orchestrator.targets.ibyaml import parse_search_space
from orchestrator.targets.launch import placed_source
from orchestrator.targets.spec import Capabilities, ConstraintViolated

EX = Path(__file__).resolve().parents[2] / "examples" / "targets"
PY = sys.executable  # stands in for an engine venv's interpreter where that venv may be absent


def _render(t, knobs):
    return t.render(t.validate_knobs(knobs), port=9000, model="/m", source=t.source, python=PY)


def test_vllm_flags_bool_pairs_and_templated_env():
    t = load_target(EX / "vllm.toml")
    base = t.baseline_knobs()
    argv = _render(t, {})
    assert argv[:3] == [PY, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--max-num-seqs") + 1] == "256"
    assert "--enable-chunked-prefill" in argv and "--no-enforce-eager" in argv
    argv = _render(t, {"enable_prefix_caching": False, "enforce_eager": True})
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv and "--enable-prefix-caching" not in argv
    # Env vars are knobs: the KV space is unset at 0 (so --gpu-memory-utilization sizes it), set otherwise.
    assert t.launch_env(base) == {"VLLM_CPU_OMP_THREADS_BIND": "auto"}
    env = t.launch_env(t.validate_knobs({"cpu_kvcache_space_gib": 2, "cpu_threads_bind": "nobind"}))
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def test_engine_interpreter_from_venv_or_env(tmp_path, monkeypatch):
    from orchestrator.targets.launch import interpreter

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setenv("INFERGOAL_VLLM_VENV", str(venv))
    t = load_target(EX / "vllm.toml")
    assert interpreter(t) == str(venv / "bin" / "python")
    assert t.render(t.baseline_knobs(), port=1, model="m", source=".")[0] == str(venv / "bin" / "python")
    monkeypatch.setenv("INFERGOAL_VLLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(TargetError, match="interpreter .*nowhere.* does not exist"):
        t.render(t.baseline_knobs(), port=1, model="m", source=".")
    # SGLang's venv variable unset -> empty -> the orchestrator's own interpreter.
    monkeypatch.delenv("INFERGOAL_SGLANG_VENV", raising=False)
    assert interpreter(load_target(EX / "sglang.toml")) == sys.executable


def test_prefix_goes_before_the_interpreter(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('name = "x"\nprefix = "numactl -C 0-1"\nlaunch = "{{ python }} s.py --port {{ port }}"\n')
    assert load_target(f).render({}, port=5, model="m", source=".")[:3] == ["numactl", "-C", "0-1"]


def test_constraints_refuse_what_vllm_would_refuse():
    t = load_target(EX / "vllm.toml")
    # The combination that once cost a trial: vLLM exits with "max_num_batched_tokens (512)
    # is smaller than max_model_len (1024)". It is refused before launch now.
    with pytest.raises(ConstraintViolated, match="max_num_batched_tokens=512.*smaller than max_model_len"):
        t.validate_knobs({"max_num_batched_tokens": 512, "enable_chunked_prefill": False})
    assert t.validate_knobs({"max_num_batched_tokens": 512, "enable_chunked_prefill": True})
    g = load_target(EX / "vllm-gpu.toml")
    with pytest.raises(ConstraintViolated, match="at most 8 GPUs"):
        g.validate_knobs({"tensor_parallel_size": 4, "data_parallel_size": 4})


def test_conditional_knobs_exist_only_when_their_parent_says_so():
    t = load_target(EX / "transformers-serve.toml")
    off = t.baseline_knobs()
    assert "compile" in off and not any(k.startswith("cb_") for k in off)
    on = t.validate_knobs({"continuous_batching": True, "compile": True})  # compile drops out: inactive
    assert "compile" not in on and on["cb_block_size"] == 32
    argv = _render(t, {"continuous_batching": True, "cb_num_blocks": 1024})
    assert "--continuous-batching" in argv and argv[argv.index("--cb-num-blocks") + 1] == "1024"
    assert "--compile" not in argv and "--no-compile" not in argv
    with pytest.raises(ConstraintViolated, match="max-length"):
        t.validate_knobs({"continuous_batching": True, "cb_block_size": 16, "cb_num_blocks": 32})
    g = load_target(EX / "vllm-gpu.toml")
    assert "num_speculative_tokens" not in g.baseline_knobs()
    argv = _render(g, {"speculative": "ngram", "num_speculative_tokens": 5, "attention_backend": "FLASHINFER"})
    assert '"num_speculative_tokens": 5' in " ".join(argv) and "FLASHINFER" in argv


@pytest.mark.parametrize("body, match", [
    ('[knobs.b]\ntype = "bool"\ndefault = true\nwhen = { a = 1 }\n[knobs.a]\ntype = "categorical"\nchoices = [1]\ndefault = 1\n',
     "not a knob declared before it"),
    ('[knobs.a]\ntype = "categorical"\nchoices = [1, 2]\ndefault = 1\n[knobs.b]\ntype = "bool"\ndefault = true\nwhen = { a = 3 }\n',
     "can never be 3"),
    ('[knobs.a]\ntype = "int"\nlow = 1\nhigh = 9\ndefault = 1\nfalse_flag = "--no-a"\n', "only for bool"),
    ('[knobs.a]\ntype = "int"\nlow = 1\nhigh = 9\ndefault = 1\n[[constraints]]\nexpr = "a >"\n', "not a valid expression"),
    ('[knobs.a]\ntype = "int"\nlow = 1\nhigh = 9\ndefault = 1\n[[constraints]]\nexpr = "a > 1"\n', "defaults .* break a constraint"),
    ('[knobs.a]\ntype = "bool"\ndefault = "yes"\n', "true or false"),
])
def test_bad_spaces_are_refused_at_load(tmp_path, body, match):
    f = tmp_path / "t.toml"
    f.write_text('name = "x"\nlaunch = "run {{ port }}"\n' + body)
    with pytest.raises(TargetError, match=match):
        load_target(f)


def test_inferencebench_yaml_import():
    t = load_target(EX / "vllm-ib.toml")
    assert set(t.knobs) == {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching", "block_size"}
    assert t.knobs["max_num_seqs"].choices == (16, 64, 256) and t.knobs["enable_chunked_prefill"].type == "bool"
    argv = _render(t, {"enable_prefix_caching": False})
    assert "--no-enable-prefix-caching" in argv and argv[argv.index("--block-size") + 1] == "128"
    knobs = parse_search_space("parameters:\n  - {name: gpu-memory-utilization, flag: --gpu-memory-utilization, type: float, range: [0.5, 0.9]}\n")
    assert knobs["gpu_memory_utilization"] == {"flag": "--gpu-memory-utilization", "help": "", "type": "float",
                                               "low": 0.5, "high": 0.9, "default": 0.5, "log": False}
    for bad, match in [("parameters: 3", "parameters:"), ("parameters:\n  - {name: a, type: tensor, values: [1]}", "type 'tensor'"),
                       ("parameters:\n  - {name: a, type: int}", "needs `values`"), ("a: [", "not valid YAML")]:
        with pytest.raises(TargetError, match=match):
            parse_search_space(bad)


def test_engine_as_a_knob_dispatches_to_each_engines_own_launch():
    t = load_target(EX / "any-engine.toml")
    assert t.knobs["engine"].choices == ("hfserve", "vllm") and t.baseline_knobs()["engine"] == "hfserve"
    assert set(t.baseline_knobs()) == {"engine"} | {f"hfserve.{k}" for k in load_target(EX / "hfserve.toml").baseline_knobs()}
    hf = t.render(t.baseline_knobs(), port=1, model="/m", source=t.source, python=PY)
    assert hf[1:3] == ["-m", "hfserve"]  # run in its tree (the trial's working directory)
    v = t.validate_knobs({"engine": "vllm", "vllm.max_num_seqs": 16})
    assert all(k == "engine" or k.startswith("vllm.") for k in v)
    argv = t.render(v, port=1, model="/m", source=t.source, python=PY)
    assert "vllm.entrypoints.openai.api_server" in argv and argv[argv.index("--max-num-seqs") + 1] == "16"
    assert "--served-model-name" in argv and argv[argv.index("--served-model-name") + 1] == "tiny"
    assert t.launch_env(v)["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert t.resolve(v)[0].engine == "vllm" and t.resolve(v)[0].health_path == "/health"
    with pytest.raises(ConstraintViolated):  # each engine's own constraints still hold
        t.validate_knobs({"engine": "vllm", "vllm.max_num_batched_tokens": 512, "vllm.enable_chunked_prefill": False})


def test_engine_as_a_knob_launches_from_the_placed_source_not_the_engines_own(tmp_path):
    # The trial places the target's source (a worktree of an agent's commit, a folder on an SSH
    # host) and renders with that path; the chosen engine must launch from it, not from the tree
    # its file names on this machine.
    t = load_target(EX / "any-engine.toml")
    placed = "/srv/placed/trial-7/hfserve"
    assert t.variants["hfserve"].source != placed
    argv = t.render(t.baseline_knobs(), port=1, model="/m", source=placed, python=PY)
    assert argv[1:3] == ["-m", "hfserve"] and placed_source(t, t.variants["hfserve"], placed) == placed
    # An engine whose tree is a folder inside the placed one is found there; one whose tree lies
    # elsewhere was not placed, so it keeps its own path.
    for d in ("tree/sub", "other"):
        (tmp_path / d).mkdir(parents=True)
    launch = 'launch = "{{ python }} {{ source }}/serve.py --port {{ port }} --model {{ model }}"\n'
    (tmp_path / "a.toml").write_text(f'name = "a"\nsource = "tree"\n{launch}')
    (tmp_path / "b.toml").write_text(f'name = "b"\nsource = "tree/sub"\n{launch}')
    (tmp_path / "c.toml").write_text(f'name = "c"\nsource = "other"\n{launch}')
    (tmp_path / "m.toml").write_text('name = "m"\n[engines]\na = "a.toml"\nb = "b.toml"\nc = "c.toml"\n')
    m = load_target(tmp_path / "m.toml")
    assert m.source == str(tmp_path / "tree")
    placed = "/srv/placed/tree"
    for engine, want in [("a", placed), ("b", f"{placed}/sub"), ("c", str(tmp_path / "other"))]:
        argv = m.render(m.validate_knobs({"engine": engine}), port=1, model="/m", source=placed, python=PY)
        assert argv[1] == f"{want}/serve.py", engine


class _T:
    """A finished trial as the proposer sees it."""

    def __init__(self, knobs, score, number, rationale="", status="kept"):
        self.knobs, self.score, self.status, self.proposer = knobs, score, status, "search"
        self.number, self.rationale = number, rationale


def test_search_proposes_only_launchable_knob_sets_across_engines():
    t = load_target(EX / "any-engine.toml")
    p, history, engines = SearchProposer(seed=1, n_startup=3), [], set()
    for i in range(14):
        c = p.propose(history, t)
        assert t.validate_knobs(c.knobs) == c.knobs  # complete, active-only, within every constraint
        engines.add(c.knobs["engine"])
        history.append(_T(c.knobs, 1.0 + (c.knobs["engine"] == "vllm") + 0.01 * i, len(history), c.rationale))
    assert engines == {"hfserve", "vllm"}


def test_capabilities_change_how_the_gates_judge_and_only_no_completions_is_not_judged(tmp_path):
    class Store:
        def __init__(self):
            self.rows = []

        def add_gate_result(self, *row):
            self.rows.append(row)

    s = Store()
    assert capability_verdict(s, 1, Capabilities(), True, True) is None and not s.rows
    # transformers serve lacks ignore_eos, token ids, id prompts and echo logprobs: the gates judge it
    # another way (gates/api.py; tests/gates/test_gates_textonly.py), so there is no verdict here.
    caps = load_target(EX / "transformers-serve.toml").capabilities
    assert not (caps.ignore_eos or caps.token_ids or caps.prompt_ids or caps.echo_logprobs)
    assert capability_verdict(s, 7, caps, True, True) is None and not s.rows
    # TGI serves chat only: the gates' /v1/completions probes cannot run, and the trial says so.
    tgi = load_target(EX / "tgi.toml").capabilities
    verdict = capability_verdict(s, 8, tgi, True, True)
    assert "/v1/completions" in verdict
    assert [(r[1], r[2]) for r in s.rows] == [("integrity", "fail"), ("accuracy", "fail")]
    assert all(r[3].startswith("not judged:") for r in s.rows)
    assert capability_verdict(Store(), 1, tgi, False, False) is None  # gates turned off in the config: nothing to judge
    bad = tmp_path / "t.toml"
    bad.write_text('name = "x"\nlaunch = "x"\n[capabilities]\nignore_eoss = false\n')
    with pytest.raises(TargetError, match="ignore_eoss"):  # a misspelt capability is refused, not ignored
        load_target(bad)


def test_fingerprint_names_engine_version_and_env():
    t = load_target(EX / "hfserve.toml")
    fp = engine_fingerprint(t, ["x"], {"A": "1"})
    assert fp["engine"] == "hfserve" and fp["env"] == {"A": "1"} and fp["python"] == sys.executable
    tf = load_target(EX / "transformers-serve.toml").model_copy(update={"python": None})
    assert engine_fingerprint(tf, [], {})["version_installed"].startswith("transformers 5.")


def test_a_knob_can_be_an_environment_variable(tmp_path):
    (tmp_path / "s.yaml").write_text("parameters:\n  - {name: kv, env: VLLM_CPU_KVCACHE_SPACE, type: int, values: [1, 4]}\n")
    f = tmp_path / "t.toml"
    f.write_text('name = "x"\nsearch_space = "s.yaml"\nlaunch = "run {{ port }} {{ flags }}"\n[env]\nFIXED = "a"\n')
    t = load_target(f)
    assert t.launch_env(t.validate_knobs({"kv": 4})) == {"FIXED": "a", "VLLM_CPU_KVCACHE_SPACE": "4"}
    assert t.render(t.baseline_knobs(), port=3, model="m", source=".") == ["run", "3"]  # env-only knobs add no flags
