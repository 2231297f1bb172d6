"""A torch-free target for controller tests: the bench's fake streaming server."""

from pathlib import Path

FAKE_SERVER_DIR = Path(__file__).resolve().parent / "bench"


def target_head(name: str, source, *, engine: str = "fake", served_model_name: str = "fake",
                ready_timeout_s: int = 30) -> str:
    """A target TOML's opening lines (a blank line, then name to ready_timeout_s; the model is forge:tiny):
    the caller adds the launch and the knobs."""
    return f'''
name = "{name}"
engine = "{engine}"
model = "forge:tiny"
served_model_name = "{served_model_name}"
source = "{source}"
ready_timeout_s = {ready_timeout_s}
'''


def write_fake_target(path, *, choices=(8.0, 6.0, 4.0), extra_launch="", extra_knobs="", ready_timeout_s=30):
    """A target TOML for the bench's torch-free fake streaming server, with `tpot_ms` as a knob.

    Speedups are then known in advance (8 -> 4 ms is 2x); tests add knobs (e.g. faults) through
    `extra_launch` (jinja2) and `extra_knobs` (TOML tables).
    """
    path.write_text(target_head("fake", FAKE_SERVER_DIR, ready_timeout_s=ready_timeout_s) + f'''launch = """{{{{ python }}}} {{{{ source }}}}/fakeserver.py --port {{{{ port }}}} --ttft-ms 5 --tpot-ms {{{{ tpot_ms }}}}
{extra_launch}"""
[knobs.tpot_ms]
type = "categorical"
choices = {list(choices)}
default = {choices[0]}
{extra_knobs}
''')
    return path
