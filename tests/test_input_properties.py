"""Property-based tests (hypothesis): no input, however mangled, gives a traceback or leaves a run.

Inputs are random text and *mutations of valid inputs* (typo'd keys, dropped keys, wrong-typed,
negative, NaN and huge values, flipped characters), so most examples land near the valid ones,
where a missed check would hide. Each input must either be accepted as a valid model or be
refused with the module's own error type; through the CLI, with exit code 2 (bad input) and
nothing created. Example counts are kept modest so CI stays fast.
"""

import json
import math
import os
from pathlib import Path

import tomllib
from fake_target import write_fake_target
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config.goal import GoalError, GoalSpec, load_goal, parse_goal
from orchestrator.config.workspace import Config, ConfigError, Workspace
from orchestrator.store import Store
from orchestrator.targets import TargetError, TargetSpec, load_target

ROOT = Path(__file__).resolve().parent.parent
FAST = settings(max_examples=int(os.environ.get("HYP_N", 60)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CLI = settings(max_examples=int(os.environ.get("HYP_N_CLI", 20)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
runner = CliRunner()

VALID_GOALS = [
    "beat the baseline by 20% on TTFT and TPOT without accuracy loss within 30m",
    "improve throughput by 2.5x without accuracy loss within 12 trials",
    "get p90 TTFT under 150 ms within 1h and 20 trials",
    "get throughput above 500 tok/s",
    "/goal cut e2e by 30%, improve throughput by 20% within 2h",
]
WORDS = ["beat", "the", "baseline", "by", "on", "and", ",", "improve", "cut", "get", "under", "above", "ms", "s",
         "tok/s", "x", "%", "within", "trials", "trial", "h", "m", "without", "accuracy", "loss", "ttft", "tpot",
         "itl", "e2e", "throughput", "p50", "p90", "p99", "mean", "0", "-1", "1e400", "9" * 40, "9" * 400, "0.0", "nan", ".toml"]

# --- strategies ---------------------------------------------------------------------------

text_chars = st.characters(blacklist_categories=("Cs", "Cc"))


@st.composite
def mutated_text(draw, seeds):
    """A valid input with a few character or word edits."""
    s = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(s)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "word"]))
        if op == "insert":
            s = s[:i] + draw(st.text(text_chars, min_size=1, max_size=3)) + s[i:]
        elif op == "delete":
            s = s[:i] + s[i + draw(st.integers(1, 5)):]
        elif op == "replace":
            s = s[:i] + draw(st.text(text_chars, min_size=1, max_size=2)) + s[i + 1:]
        else:
            s = s[:i] + " " + draw(st.sampled_from(WORDS)) + " " + s[i:]
    return s


goal_texts = st.one_of(
    mutated_text(VALID_GOALS),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join),
    st.text(text_chars, max_size=60),
)

scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.text(text_chars, max_size=12), st.sampled_from(["p99", "tpot", "relative", "accuracy", "30m", "-3", "{{ x }}", "forge:tiny"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(text_chars, min_size=1, max_size=8), inner, max_size=3)), max_leaves=6)


def _typo(key: str, draw) -> str:
    i = draw(st.integers(0, max(len(key) - 1, 0)))
    op = draw(st.sampled_from(["drop", "swap", "double", "plural", "upper"]))
    if op == "drop":
        return key[:i] + key[i + 1:] or "x"
    if op == "swap" and len(key) > 1:
        i = min(i, len(key) - 2)
        return key[:i] + key[i + 1] + key[i] + key[i + 2:]
    if op == "double":
        return key[:i] + key[i] + key[i:]
    if op == "plural":
        return key[:-1] if key.endswith("s") else key + "s"
    return key.upper()


@st.composite
def mutated_dict(draw, base):
    """`base` (parsed TOML) with 1-4 structural edits at random paths."""
    data = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 4))):
        node = data
        while True:  # walk down to a random table
            kids = [k for k, v in node.items() if isinstance(v, dict)] + [
                (k, i) for k, v in node.items() if isinstance(v, list) for i, x in enumerate(v) if isinstance(x, dict)]
            if not kids or draw(st.booleans()):
                break
            k = draw(st.sampled_from(kids))
            node = node[k] if isinstance(k, str) else node[k[0]][k[1]]
        op = draw(st.sampled_from(["typo", "delete", "value", "add"]))
        keys = sorted(node)
        if op == "add" or not keys:
            node[draw(st.text(text_chars, min_size=1, max_size=10))] = draw(values)
            continue
        key = draw(st.sampled_from(keys))
        if op == "typo":
            node[_typo(key, draw)] = node.pop(key)
        elif op == "delete":
            del node[key]
        else:
            node[key] = draw(values)
    return data


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def to_toml(data: dict) -> str:
    """A tiny TOML writer (inline tables) so mutated dicts become files again."""
    return "".join(f"{json.dumps(k, ensure_ascii=False)} = {_toml_value(v)}\n" for k, v in data.items())


def _goal_bases():
    return [tomllib.loads(p.read_text()) for p in sorted((ROOT / "examples" / "goals").glob("*.toml"))]


def _target_bases(tmp: Path):
    fake = tomllib.loads(write_fake_target(tmp / "fake-base.toml").read_text())
    hf = tomllib.loads((ROOT / "examples" / "targets" / "hfserve.toml").read_text())
    hf["source"] = str(ROOT / "examples" / "hfserve")
    return [fake, hf]


def _no_traceback(r) -> None:
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)


def _runs(ws: Path) -> list:
    db = ws / ".infergoal" / "infergoal.db"
    return Store(f"sqlite:///{db}").list_runs() if db.exists() else []


# --- goal text ----------------------------------------------------------------------------

@FAST
@given(text=goal_texts)
def test_goal_text_is_parsed_or_refused_with_goal_error(text):
    try:
        spec = parse_goal(text)
    except GoalError as e:
        assert str(e).strip()
        return
    assert isinstance(spec, GoalSpec) and spec.describe()
    b = spec.budget
    assert (b.trials is None or b.trials >= 1) and (b.wall_s is None or b.wall_s > 0)
    assert all(math.isfinite(o.value) and o.value > 0 for o in spec.objectives)
    assert len({(o.scenario, o.key) for o in spec.objectives}) == len(spec.objectives)


@CLI
@given(text=goal_texts)
@example(text="-0")  # found by hypothesis: click reads it as an option (typer's vendored click)
def test_goal_command_never_tracebacks_or_leaves_a_run(tmp_path, text):
    # The last override makes even a valid goal stop in the pre-run checks (an unknown proposer),
    # so no example launches a server; what matters is that nothing is created before refusing.
    r = runner.invoke(app, ["-w", str(tmp_path), "-o", 'proposer="nope"', "goal", "--no-report", text])
    _no_traceback(r)
    assert r.exit_code == 2, r.output
    assert "error:" in r.output.lower()  # ours ("error: ...") or click's usage error ("Error: No such option")
    assert _runs(tmp_path) == []


# --- goal TOML ----------------------------------------------------------------------------

@FAST
@given(data=st.data())
def test_goal_toml_is_loaded_or_refused_with_goal_error(tmp_path, data):
    mutated = data.draw(mutated_dict(data.draw(st.sampled_from(_goal_bases()))))
    f = tmp_path / "goal.toml"
    f.write_text(to_toml(mutated))
    try:
        spec = load_goal(str(f))
    except GoalError as e:
        assert str(f) in str(e)
        return
    assert spec.objectives and spec.budget.stall_trials >= 1


@FAST
@given(raw=st.binary(max_size=200) | mutated_text([p.read_text() for p in sorted((ROOT / "examples" / "goals").glob("*.toml"))]).map(str.encode))
def test_goal_toml_bytes_are_loaded_or_refused_with_goal_error(tmp_path, raw):
    f = tmp_path / "goal.toml"
    f.write_bytes(raw)
    try:
        load_goal(str(f))
    except GoalError:
        pass


# --- target TOML --------------------------------------------------------------------------

def _mangled_target(tmp_path, data) -> Path:
    """A target file drawn from one of the valid bases with keys dropped, added or given odd values."""
    f = tmp_path / "target.toml"
    f.write_text(to_toml(data.draw(mutated_dict(data.draw(st.sampled_from(_target_bases(tmp_path)))))))
    return f


@FAST
@given(data=st.data())
def test_target_toml_is_loaded_or_refused_with_target_error(tmp_path, data):
    f = _mangled_target(tmp_path, data)
    try:
        spec = load_target(f)
    except TargetError as e:
        assert str(e).strip()
        return
    assert isinstance(spec, TargetSpec)
    spec.render(spec.baseline_knobs(), port=8000, model="m", source="s")  # a loaded target renders


@CLI
@given(data=st.data())
def test_goal_with_a_mangled_target_never_tracebacks_or_leaves_a_run(tmp_path, data):
    f = _mangled_target(tmp_path, data)
    r = runner.invoke(app, ["-w", str(tmp_path), "-o", 'proposer="nope"', "goal", "--target", str(f),
                            "beat the baseline by 20% on TPOT within 3 trials"])
    _no_traceback(r)
    assert r.exit_code == 2, r.output
    assert _runs(tmp_path) == []


# --- config and -o ------------------------------------------------------------------------

CONFIG_KEYS = ["db", "host", "target", "proposer", "seed", "min_gain", "kb", "allow_concurrent_runs", "bench.scale",
               "bench.repeats", "bench.baseline_repeats", "bench.timeout_s", "gates.accuracy", "gates.integrity", "extra.x"]
override_values = st.one_of(
    st.sampled_from(["0", "-1", "0.5", "1e9", "nan", "inf", "true", "yes", '""', '"x"', "[1, 2]", "{a = 1}", "notaurl",
                     '"sqlite:///"', '"postgresql+psycopg://u@h/db"', "1 2", "=", ""]),
    st.text(text_chars, max_size=15),
)


@st.composite
def overrides(draw):
    out = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(CONFIG_KEYS))
        if draw(st.booleans()):
            key = _typo(key, draw)
        out.append(f"{key}={draw(override_values)}" if draw(st.integers(0, 9)) else draw(st.text(text_chars, max_size=10)))
    return out


@FAST
@given(ovr=overrides())
def test_overrides_give_a_config_or_a_config_error(tmp_path, ovr):
    try:
        ws = Workspace(tmp_path, ovr)
    except ConfigError as e:
        assert str(e).strip()
        return
    c = ws.config
    assert isinstance(c, Config) and c.bench.scale > 0 and c.bench.repeats >= 1 and c.bench.baseline_repeats >= 1


@CLI
@given(ovr=overrides())
def test_overrides_through_the_cli_never_traceback_or_leave_a_run(tmp_path, ovr):
    args = [a for o in ovr for a in ("-o", o)]
    r = runner.invoke(app, ["-w", str(tmp_path), *args, "status"])
    _no_traceback(r)
    assert r.exit_code in (0, 2, 4), r.output
    r = runner.invoke(app, ["-w", str(tmp_path), *args, "-o", 'proposer="nope"', "goal", "improve throughput by 2x"])
    _no_traceback(r)
    assert r.exit_code == 2, r.output
    assert _runs(tmp_path) == []
