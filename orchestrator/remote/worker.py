"""The measurement worker: `python -m orchestrator.remote.worker`, next to the server on the host.

It reads one JSON request per line on stdin and answers one JSON line on stdout:
`verify` (the host's gate files against the orchestrator's lock), `integrity`, `accuracy`, `bench`,
`audit` (a sample of the bench's outputs scored by the reference, `gates.audit`).
It lives for the whole run, so the accuracy gate's float32 reference is loaded once per run on
the host (gates.accuracy keeps it per process) instead of once per trial; the windows it scores
are still drawn fresh, from a secret seed, for every gate run.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict

from gates import accuracy, audit, integrity
from gates.lock import GateTampered, digest_tree
from orchestrator.bench import Scenario, run_scenario_sync


def op_verify(req: dict) -> dict:
    """Hash the host's copy of the gates folder and compare it with the orchestrator's lock."""
    locked: dict[str, str] = req["files"]
    current = digest_tree(req["gates_dir"])
    changed = sorted(p for p in current.keys() & locked.keys() if current[p] != locked[p])
    added = sorted(current.keys() - locked.keys())
    removed = sorted(locked.keys() - current.keys())
    return {"changed": changed, "added": added, "removed": removed}


def op_integrity(req: dict) -> dict:
    return asdict(integrity.check(req.pop("base_url"), **req))


def op_accuracy(req: dict) -> dict:
    return asdict(accuracy.check(req.pop("base_url"), **req))


def op_audit(req: dict) -> dict:
    return asdict(audit.check(**req))


def op_bench(req: dict) -> dict:
    res = run_scenario_sync(req["base_url"], req["model"], Scenario(**req["scenario"]), tokenizer=req.get("tokenizer"),
                            api=req.get("api", "completions"), timeout_s=req.get("timeout_s", 120.0),
                            capabilities=req.get("capabilities"))
    return {"result": res.to_dict()}


OPS = {"verify": op_verify, "integrity": op_integrity, "accuracy": op_accuracy, "audit": op_audit, "bench": op_bench}


def main() -> int:
    # Replies go to the real stdout; anything the gates or libraries print goes to stderr (a log).
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # native code writing to fd 1 must not corrupt replies
    sys.stdout = sys.stderr
    reply.write(json.dumps({"ready": True}) + "\n")
    reply.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            out = {"ok": OPS[req.pop("op")](req)}
        except GateTampered as e:
            out = {"tampered": {"changed": e.changed, "added": e.added, "removed": e.removed}}
        except Exception as e:  # noqa: BLE001 - every failure goes back to the orchestrator as data
            traceback.print_exc()
            out = {"error": f"{type(e).__name__}: {e}"}
        reply.write(json.dumps(out) + "\n")
        reply.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
