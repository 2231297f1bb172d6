"""GPUs per trial as a knob: the rules that refuse what the host or the model cannot take, both ways."""

import json
from pathlib import Path

import pytest

from orchestrator.targets import ConstraintViolated, TargetError, load_target
from orchestrator.targets.parallel import ModelShape, check_fit, gpus_needed

EX = Path(__file__).resolve().parents[2] / "examples" / "targets"
GIB = 1024**3


def _model(tmp_path: Path, *, heads=32, kv=8, layers=32, hidden=4096, weights_gib=0.0) -> ModelShape:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"num_attention_heads": heads, "num_key_value_heads": kv,
                                               "num_hidden_layers": layers, "hidden_size": hidden}))
    with open(d / "model.safetensors", "wb") as f:  # a sparse file: its size is what the rule reads
        f.truncate(int(weights_gib * GIB))
    return ModelShape.read(d)


def test_gpus_per_trial_is_tensor_times_data():
    v = load_target(EX / "vllm-gpu.toml")
    assert gpus_needed(v, v.validate_knobs({"tensor_parallel_size": 2, "data_parallel_size": 4})) == 8
    assert gpus_needed(v, v.baseline_knobs()) == 1
    s = load_target(EX / "sglang.toml")
    assert gpus_needed(s, s.validate_knobs({"tp_size": 4, "dp_size": 2})) == 8
    h = load_target(EX / "hfserve.toml")  # the example engine: one GPU per replica
    assert gpus_needed(h, h.baseline_knobs()) == 1


def test_more_gpus_than_the_host_has_refused_and_as_many_accepted(tmp_path):
    v = load_target(EX / "vllm-gpu.toml")
    knobs = v.validate_knobs({"tensor_parallel_size": 2, "data_parallel_size": 2})
    with pytest.raises(ConstraintViolated, match=r"tensor_parallel_size=2 x data_parallel_size=2 needs 4 GPUs; the host has 2"):
        check_fit(v, knobs, gpus_on_host=2)
    check_fit(v, knobs, gpus_on_host=4)


def test_tensor_size_must_split_the_heads_and_kv_heads(tmp_path):
    v = load_target(EX / "vllm-gpu.toml")
    tp = lambda n: v.validate_knobs({"tensor_parallel_size": n})  # noqa: E731
    odd = _model(tmp_path, heads=12, kv=4, hidden=768)
    with pytest.raises(ConstraintViolated, match="tensor_parallel_size=8 does not divide the model's 12 attention heads"):
        check_fit(v, tp(8), gpus_on_host=8, shape=odd)
    check_fit(v, tp(4), gpus_on_host=8, shape=odd)
    gqa = _model(tmp_path, heads=24, kv=3, hidden=3072)
    with pytest.raises(ConstraintViolated, match="tensor_parallel_size=2 neither divides the model's 3 KV heads"):
        check_fit(v, tp(2), gpus_on_host=8, shape=gqa)
    check_fit(v, tp(1), gpus_on_host=8, shape=gqa)
    mqa = _model(tmp_path, heads=32, kv=1)  # one KV head, replicated on every GPU: vLLM accepts it
    check_fit(v, tp(8), gpus_on_host=8, shape=mqa)


def test_weights_and_kv_must_fit_the_card(tmp_path):
    v = load_target(EX / "vllm-gpu.toml")
    big = _model(tmp_path, weights_gib=170)  # an 85B model in bf16
    with pytest.raises(ConstraintViolated, match=r"needs 85\.\d GiB per GPU \(weights 85\.0 GiB \+ KV of one 8192-token"):
        check_fit(v, v.validate_knobs({"tensor_parallel_size": 2}), gpus_on_host=8, shape=big, gpu_memory_bytes=80 * GIB)
    check_fit(v, v.validate_knobs({"tensor_parallel_size": 4}), gpus_on_host=8, shape=big, gpu_memory_bytes=80 * GIB)
    # The engine's memory share counts: 42.5 GiB of weights + KV fit 0.9 of 80 GiB, not 0.5 of it.
    tp4 = {"tensor_parallel_size": 4}
    with pytest.raises(ConstraintViolated, match="0.5 of a 80 GiB card is 40.0 GiB"):
        check_fit(v, v.validate_knobs(tp4 | {"gpu_memory_utilization": 0.5}), gpus_on_host=8, shape=big,
                  gpu_memory_bytes=80 * GIB)
    check_fit(v, v.validate_knobs(tp4), gpus_on_host=8, shape=big, gpu_memory_bytes=None)  # unknown card: not judged
    h = load_target(EX / "hfserve.toml")  # no [parallel]: the engine did not say how it uses the card
    check_fit(h, h.baseline_knobs(), gpus_on_host=1, shape=big, gpu_memory_bytes=80 * GIB)


def test_parallel_names_must_be_number_knobs(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('name = "x"\nlaunch = "s --port {{ port }}"\n[parallel]\ntensor = "tp"\n')
    with pytest.raises(TargetError, match="parallel.tensor names 'tp', which is not a knob"):
        load_target(f)
    f.write_text('name = "x"\nlaunch = "s --port {{ port }}"\n[parallel]\ntensor = "tp"\n'
                 '[knobs.tp]\ntype = "bool"\ndefault = false\n')
    with pytest.raises(TargetError, match="parallel.tensor: knob 'tp' must take numbers"):
        load_target(f)
    f.write_text('name = "x"\nlaunch = "s --port {{ port }}"\n[parallel]\ntensor = "tp"\n'
                 '[knobs.tp]\ntype = "categorical"\nchoices = [1, 2]\ndefault = 1\n')
    assert load_target(f).parallel.tensor == "tp"

