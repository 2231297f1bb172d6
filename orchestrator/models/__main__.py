"""``python -m orchestrator.models make OUT [--preset tiny] [--seed 0] [--train-steps N]``."""

from __future__ import annotations

import argparse
import json
import sys

from orchestrator.models.forge import MODEL_INFO_FILE, PRESETS, default_model, make_model


def main(argv: list[str] | None = None) -> int:
    """Entry point of the model forge CLI; returns the process exit code."""
    ap = argparse.ArgumentParser(prog="python -m orchestrator.models", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="build a model folder")
    mk.add_argument("out")
    mk.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--train-steps", type=int, default=None)
    df = sub.add_parser("default", help="print the cached default model dir (building it once)")
    df.add_argument("--cache-dir", default=None)
    args = ap.parse_args(argv)
    if args.cmd == "make":
        out = make_model(args.out, preset=args.preset, seed=args.seed, train_steps=args.train_steps)
        info = json.loads((out / MODEL_INFO_FILE).read_text())
        print(json.dumps({"path": str(out), **{k: info[k] for k in ("preset", "seed", "final_loss")}}))
    else:
        print(default_model(args.cache_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
