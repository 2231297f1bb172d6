"""Each engine step as served on one GPU: A-D per step from the committed ib_baseline.py runs, % of the floor, a plot.

    python benchmarks/gpu/served_steps.py [benchmarks/gpu/served_steps_h200.toml] [--md OUT.md] [--plot OUT.svg]
        [--json]

profile_best.py/step_table.py model each step from its profiled parts; this reads what the served scenarios
measured (InferenceBench's A-D of scenarios_ib.toml, client side, through HTTP) in the runs each session kept under
benchmarks/gpu/results/, so every step's figure is a measurement on the card, not a model. The manifest lists, per
engine step (the engine's code at that step), the runs that served it: a result file, the server's label in it, and
the knob set it ran (``knobs``: the number of the engine_steps.json entry, plus ``extra`` knobs). Nothing is taken on
trust: each entry's file must say the manifest's GPU, and the server's recorded command line must parse (with the
server's own parser, examples/hfserve) to exactly what examples/targets/hfserve_gpu.toml launches for that
knob set; a server given the wrong knob set, or a run from another card, is refused (one line, exit 2). ``tree``
(``before`` / ``this``) must match whether the command ran the tree before the commit under test (``.before/``).
What the command line cannot show is the code: steps 6 and 9 changed no knob, so which tree served them is the
manifest's word, from each run's record.

Per step and scenario the launches' figures are pooled (a scenario's repeats ``X_2``, ``X_3`` are launches too):
the median and the range. A: TTFT p50, B: TPOT p50 (InferenceBench scores both by p50), C: output tok/s of the
burst, D: TTFT p50 / TPOT p50 / req/s. % of floor (sol.json's measured ceilings, gates.plausible.floors for
these shapes): A floor/TTFT, B floor/TPOT, C tok/s / ceiling; D has no floor. The manifest's ``[bars]`` (the
goal's lines: ``a_ttft_ms``, ``b_tpot_ms``, ``c_frac_of_floor``) are drawn dotted in the scenario's colour. Entries with ``plot = false``
(variants served beside a step's own knob set) are in the table, not in the plot.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

import tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

from step_table import step_numbers  # noqa: E402  (beside this file)

from gates.plausible import floors  # noqa: E402
from orchestrator.targets.spec import TargetError, load_target  # noqa: E402

TARGET = ROOT / "examples" / "targets" / "hfserve_gpu.toml"
IGNORED = ("model", "port", "host", "served_model_name")  # where, not how: not compared
SCEN = {"A": "prefill", "B": "decode", "C": "throughput", "D": "general"}


class ManifestError(ValueError):
    """A manifest entry that does not hold against its run."""


def _server_parse() -> Any:
    """hfserve's own parse_args (imports torch: the server's module does)."""
    from hfserve.server import parse_args

    return parse_args


def _server_argv(command: str) -> list[str]:
    """The server's own arguments from a recorded command (``env X=Y python examples/hfserve ARGS``,
    ``python -m hfserve ARGS``, or an older record's ``python .../server.py ARGS``)."""
    words = shlex.split(command)
    for i, w in enumerate(words):
        if w.rstrip("/").endswith(("examples/hfserve", "server.py")) or w == "hfserve" and words[i - 1] == "-m":
            return words[i + 1:]
    raise ManifestError(f"no hfserve launch in the command {command[:120]!r}")


def config(parse: Any, argv: list[str]) -> dict[str, Any]:
    """What a server launched with ``argv`` is configured to do (its parsed options, where it listens left out)."""
    try:
        ns = parse(argv)
    except SystemExit as exc:
        raise ManifestError(f"the server's parser refused {' '.join(argv)[:160]!r}") from exc
    return {k: v for k, v in vars(ns).items() if k not in IGNORED}


def check_entry(entry: dict[str, Any], report: dict[str, Any], knobs: dict[str, Any], *, gpu: str, parse: Any,
                target: Any) -> None:
    """Refuse (ManifestError) an entry whose run is from another GPU, whose server is missing, whose tree is not the
    one it names, or whose command does not launch exactly ``knobs``."""
    where = f"{entry['file']} {entry['server']!r}"
    if gpu not in str(report.get("gpu", "")):
        raise ManifestError(f"{where}: run on {report.get('gpu')!r}, not the manifest's {gpu}")
    srv = (report.get("servers") or {}).get(entry["server"])
    if srv is None:
        raise ManifestError(f"{where}: no such server in the file (it has {sorted(report.get('servers') or {})})")
    command = srv.get("command", "")
    before = ".before/" in command
    if before != (entry.get("tree", "this") == "before"):
        raise ManifestError(f"{where}: tree {entry.get('tree', 'this')!r}, but the command ran "
                            f"{'.before/' if before else 'this tree'}")
    try:
        full = target.validate_knobs(knobs)
    except TargetError as exc:
        raise ManifestError(f"{where}: {exc}") from exc
    want = config(parse, target.render(full, port=1, model="/m", source="/s")[3:])
    got = config(parse, _server_argv(command))
    diff = {k: (got.get(k), want.get(k)) for k in sorted(set(want) | set(got)) if got.get(k) != want.get(k)}
    if diff:
        shown = ", ".join(f"{k}: ran {g!r}, knob set says {w!r}" for k, (g, w) in diff.items())
        raise ManifestError(f"{where}: the command is not this knob set ({shown})")


def launches(report: dict[str, Any], server: str, scenario: str) -> list[dict[str, float]]:
    """The metrics of every passing launch of ``scenario`` (and its repeats ``scenario_N``) on ``server``."""
    out = []
    for name, s in ((report.get("servers") or {}).get(server, {}).get("scenarios") or {}).items():
        if (name == scenario or re.fullmatch(rf"{scenario}_\d+", name)) and s.get("ok") and s.get("metrics"):
            out.append(s["metrics"])
    return out


def _stat(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def build(manifest_path: str | Path, *, parse: Any = None) -> dict[str, Any]:
    """The checked manifest's rows: per (step, knob set) the pooled A-D figures and % of floor, with sources."""
    mpath = Path(manifest_path)
    try:
        man = tomllib.loads(mpath.read_text())
    except FileNotFoundError as exc:
        raise ManifestError(f"no manifest at {mpath}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{mpath}: not TOML ({exc})") from exc
    base = mpath.parent
    gpu = man.get("gpu")
    if not gpu or not man.get("run"):
        raise ManifestError(f"{mpath}: needs gpu = \"...\" and at least one [[run]]")
    steps = json.loads((HERE / "engine_steps.json").read_text())
    try:
        numbers = step_numbers(steps)
    except ValueError as exc:
        raise ManifestError(str(exc)) from exc
    by_no = dict(zip(numbers, steps, strict=True))
    sol = json.loads((base / man.get("sol", "results/sol.json")).read_text())
    scen = tomllib.loads((base / man.get("scenarios", "scenarios_ib.toml")).read_text())
    fl = floors(scen, sol["model"], sol["ceilings"])
    target = load_target(TARGET)
    parse = parse or _server_parse()
    reports: dict[str, dict[str, Any]] = {}
    rows: dict[tuple, dict[str, Any]] = {}
    for e in man["run"]:
        for key in ("step", "knobs", "file", "server"):
            if key not in e:
                raise ManifestError(f"{mpath}: a [[run]] lacks {key!r}: {e}")
        if e["knobs"] not in by_no:
            raise ManifestError(f"{mpath}: knobs = {e['knobs']}: engine_steps.json has steps {numbers}")
        if e["file"] not in reports:
            try:
                reports[e["file"]] = json.loads((base / e["file"]).read_text())
            except FileNotFoundError as exc:
                raise ManifestError(f"{mpath}: no run file {base / e['file']}") from exc
        report = reports[e["file"]]
        extra = dict(e.get("extra") or {})
        check_entry(e, report, by_no[e["knobs"]]["knobs"] | extra, gpu=gpu, parse=parse, target=target)
        key = (e["step"], e["knobs"], json.dumps(extra, sort_keys=True), e.get("variant", ""))
        row = rows.setdefault(key, {"step": e["step"], "knobs": e["knobs"], "extra": extra, "variant": key[3],
                                    "plot": e.get("plot", True), "sources": [], "notes": [],
                                    **{s: [] for s in SCEN}})
        if row["plot"] != e.get("plot", True):
            raise ManifestError(f"{mpath}: step {e['step']} knob set {e['knobs']} {extra} {key[3]!r}: plot differs "
                                "between runs (name the odd ones' variant)")
        row["sources"].append(f"{e['file']}:{e['server']}")
        if e.get("note"):
            row["notes"].append(e["note"])
        for s, name in SCEN.items():
            row[s] += launches(report, e["server"], name)
    out = []
    for key in sorted(rows, key=lambda k: (k[0], not rows[k]["plot"], k[1], k[2], k[3])):
        r = rows[key]
        a = _stat([m["ttft_ms_p50"] for m in r["A"] if m.get("ttft_ms_p50")])
        b = _stat([m["tpot_ms_p50"] for m in r["B"] if m.get("tpot_ms_p50")])
        c = _stat([m["output_throughput"] for m in r["C"] if m.get("output_throughput")])
        d = {k: _stat([m[k] for m in r["D"] if m.get(k)]) for k in ("ttft_ms_p50", "tpot_ms_p50", "request_throughput")}
        frac = {"A": fl["prefill_ttft_ms"] / a["median"] if a else None,
                "B": fl["decode_tpot_ms"] / b["median"] if b else None,
                "C": c["median"] / fl["throughput_tok_s"] if c else None}
        out.append({"step": r["step"], "knobs": r["knobs"], "extra": r["extra"], "variant": r["variant"], "plot": r["plot"],
                    "A_ttft_ms_p50": a, "B_tpot_ms_p50": b, "C_output_tok_s": c, "D": d, "frac_of_floor": frac,
                    "sources": r["sources"], "notes": r["notes"]})
    plotted: dict[int, tuple] = {}
    for r in out:
        if r["plot"] and plotted.setdefault(r["step"], (r["knobs"], r["extra"], r["variant"])) != (
                r["knobs"], r["extra"], r["variant"]):
            raise ManifestError(f"{mpath}: step {r['step']} has two knob sets to plot; mark the variants plot = false")
    bars = man.get("bars") or {}
    bar_frac = {"A": fl["prefill_ttft_ms"] / bars["a_ttft_ms"] if bars.get("a_ttft_ms") else None,
                "B": fl["decode_tpot_ms"] / bars["b_tpot_ms"] if bars.get("b_tpot_ms") else None,
                "C": bars.get("c_frac_of_floor")}
    return {"gpu": gpu, "manifest": str(manifest_path), "bars": bar_frac, "floors": fl, "floor_source": man.get("sol", "results/sol.json"),
            "steps": list(range(1, max(numbers) + 1)), "rows": out,
            "unserved": [n for n in range(1, max(numbers) + 1) if n not in plotted]}


def _fmt(st: dict[str, Any] | None, digits: int = 2) -> str:
    if not st:
        return "-"
    if st["n"] == 1:
        return f"{st['median']:.{digits}f}"
    return f"{st['median']:.{digits}f} ({st['min']:.{digits}f}-{st['max']:.{digits}f}, {st['n']})"


def _pct(x: float | None) -> str:
    return f"{100 * x:.1f}%" if x is not None else "-"


def _knobs(r: dict[str, Any]) -> str:
    extra = "".join(f" +{k}={v}" for k, v in r["extra"].items())
    return f"step {r['knobs']}'s{extra}" + (f" ({r['variant']})" if r["variant"] else "")


def markdown(doc: dict[str, Any]) -> str:
    """The table: one row per (engine step, knob set), medians with (min-max, launches)."""
    fl = doc["floors"]
    lines = [f"Served on the {doc['gpu']} (floors from {doc['floor_source']}: A {fl['prefill_ttft_ms']:.1f} ms, "
             f"B {fl['decode_tpot_ms']:.2f} ms, C {fl['throughput_tok_s']:.0f} tok/s). Median (min-max, launches).",
             "",
             "| step | knobs | A TTFT p50 ms | A % | B TPOT p50 ms | B % | C out tok/s | C % | D TTFT / TPOT p50 ms, req/s "
             "| runs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        d = r["D"]
        dd = "-" if not d["ttft_ms_p50"] else (f"{d['ttft_ms_p50']['median']:.0f} / {d['tpot_ms_p50']['median']:.2f}, "
                                                f"{d['request_throughput']['median']:.2f}")
        step = f"**{r['step']}**" if r["plot"] else f"{r['step']} (beside)"
        lines.append(f"| {step} | {_knobs(r)} | {_fmt(r['A_ttft_ms_p50'], 1)} | {_pct(r['frac_of_floor']['A'])} | "
                     f"{_fmt(r['B_tpot_ms_p50'])} | {_pct(r['frac_of_floor']['B'])} | {_fmt(r['C_output_tok_s'], 0)} | "
                     f"{_pct(r['frac_of_floor']['C'])} | {dd} | {'; '.join(r['sources'])} |")
    if doc["unserved"]:
        lines += ["", f"Not served on the {doc['gpu']}: steps "
                      f"{', '.join(map(str, doc['unserved']))}."]
    return "\n".join(lines) + "\n"


def write_plot(doc: dict[str, Any], path: str | Path) -> Path:
    """% of floor per scenario (A, B, C) per engine step, the plotted rows only; a step not served is a gap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if r["plot"]]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for scen, label in (("A", "A 4096/128 c1 (TTFT p50)"), ("B", "B 512/512 c1 (TPOT p50)"),
                        ("C", "C burst 64 x 512/128 (out tok/s)")):
        pts = {r["step"]: 100 * r["frac_of_floor"][scen] for r in rows if r["frac_of_floor"][scen] is not None}
        color = f"C{'ABC'.index(scen)}"
        # NaN where a step was not served: the line breaks there instead of bridging the gap
        ax.plot(doc["steps"], [pts.get(n, math.nan) for n in doc["steps"]], marker="o", color=color, label=label)
        for x, y in pts.items():
            ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", fontsize=6, ha="center",
                        xytext=(0, -10 if scen == "B" else 5))
        bar = (doc.get("bars") or {}).get(scen)
        if bar:  # the goal's line for this scenario, as % of the floor
            ax.axhline(100 * bar, color=color, lw=0.7, ls=":")
    if any((doc.get("bars") or {}).values()):
        ax.plot([], [], color="grey", lw=0.7, ls=":", label="the goal's line (same colour)")
    ax.axhline(100, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("engine step (the engine's code; no point: not served on this card)")
    ax.set_ylabel("% of speed-of-light floor")
    ax.set_xticks(doc["steps"])
    ax.set_ylim(0, 110)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"Each engine step served on the {doc['gpu']}: A-C against the floor (client side)", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="An entry that does not hold against its run (another card, another knob set, "
                                        "another tree) stops it with one line, exit 2.")
    ap.add_argument("manifest", nargs="?", default=str(HERE / "served_steps_h200.toml"),
                    help="which run served which step (default: served_steps_h200.toml beside this file)")
    ap.add_argument("--md", default="", help="write the markdown table here (default: print it)")
    ap.add_argument("--plot", default="", help="write the plot here (.svg or .png)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    args = ap.parse_args(argv)
    try:
        doc = build(args.manifest)
    except (ManifestError, OSError, KeyError, json.JSONDecodeError) as exc:
        print(f"served_steps: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(doc, indent=2))
    elif args.md:
        Path(args.md).write_text(markdown(doc))
    else:
        print(markdown(doc), end="")
    if args.plot:
        write_plot(doc, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
