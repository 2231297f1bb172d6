"""What every GPU command shares: the environment, the carried wheels, the clock, the forged model, $OUT.

A command runs from the repository root on a bare GPU machine. The image has torch, transformers, triton and
most of what the orchestrator needs; the rest travels as wheels in ``.whl/`` (benchmarks/gpu/wheels.py downloads
them) and is installed once per machine into /tmp/site. Children run with that site, the repository and hfserve's tree on
PYTHONPATH. Only 8 files come back from $OUT, so logs go to $OUT/logs/ and are packed into one logs.tgz at the
end (see ``finish``). ``--dry-run`` prints each command instead of running it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.gpu.tool.manifest import ROOT

SITE = Path("/tmp/site")
MAX_OUT_FILES = 8  # what comes back from a device command's $OUT
FORGE = """
import json, shutil, sys
from orchestrator.models.forge import PRESETS, cache_root, cached_model
preset = sys.argv[1]
if preset not in PRESETS:
    sys.exit(f"no forge preset {preset!r}; choose from {', '.join(sorted(PRESETS))}")
for d in cache_root().glob(f"{preset}-*"):  # the cache key has no recipe in it: drop a build of other steps
    info = d / "infergoal_model.json"
    if info.exists() and json.loads(info.read_text())["train_steps"] != PRESETS[preset].train_steps:
        shutil.rmtree(d); print("dropped stale", d, file=sys.stderr)
print(cached_model(preset))
"""


class Failed(RuntimeError):
    """A step that cannot go on (one line)."""


@dataclass
class Ctx:
    out: Path
    limit_s: float
    dry: bool = False
    python: str = sys.executable
    preset: str = "7b-peaked"
    start: float = field(default_factory=time.monotonic)
    env: dict[str, str] = field(default_factory=dict)
    _model: str = ""
    _checked: bool = False

    # -- the clock -------------------------------------------------------------------------------------------
    def elapsed(self) -> int:
        """Whole seconds since the command began (a dry run's clock stands still)."""
        return 0 if self.dry else int(time.monotonic() - self.start)

    def left(self, reserve: float = 0) -> int:
        """Seconds of the command's limit left, less ``reserve`` kept for what follows."""
        return int(self.limit_s - self.elapsed() - reserve)

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed()}s] {msg}", flush=True)

    # -- running ---------------------------------------------------------------------------------------------
    def sh(self, argv: list[str], *, timeout: float | None = None, env: dict[str, str] | None = None,
           cwd: Path | None = None, log: Path | None = None, signal: str = "TERM") -> int:
        """Run ``argv`` (its output to ``log`` when given, else through), at most ``timeout`` seconds (then
        ``signal``, SIGKILL 25 s later); the exit status. In a dry run: print it, 0."""
        full = ["timeout", "-s", signal, "-k", "25", str(int(timeout)), *argv] if timeout else list(argv)
        if self.dry:
            extra = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
            where = f"(cd {cwd} && " if cwd else ""
            print(f"$ {where}{extra}{shlex.join(full)}{')' if cwd else ''}{f' > {log}' if log else ''}", flush=True)
            return 0
        if timeout is not None and timeout <= 0:
            self.log(f"no time left for: {shlex.join(argv)[:100]}")
            return 124
        kw = {"env": {**os.environ, **self.env, **(env or {})}, "cwd": cwd or ROOT}
        if log:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as f:
                return subprocess.run(full, stdout=f, stderr=subprocess.STDOUT, **kw).returncode
        return subprocess.run(full, **kw).returncode

    def py(self, script: str, *args: str, **kw) -> int:
        return self.sh([self.python, script, *args], **kw)

    def capture(self, argv: list[str], *, timeout: float = 60, stderr: Path | None = None) -> str:
        """``argv``'s stdout (its stderr appended to ``stderr``); '' in a dry run."""
        if self.dry:
            print(f"$ {shlex.join(argv)}", flush=True)
            return ""
        err = stderr.open("ab") if stderr else subprocess.DEVNULL
        try:
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, cwd=ROOT,
                               env={**os.environ, **self.env})
        except subprocess.TimeoutExpired:
            return ""
        finally:
            if stderr:
                err.close()
        return r.stdout if r.returncode == 0 else ""

    def tail(self, path: Path, n: int = 30, grep: tuple[str, ...] = ()) -> None:
        """The last ``n`` lines of a log (only those holding one of ``grep``, when given)."""
        if self.dry or not path.exists():
            return
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if not grep or any(g in ln for g in grep)]
        print("\n".join(lines[-n:]), flush=True)

    # -- the machine -----------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """The environment, the carried wheels installed (once per machine) and the GPU named."""
        if not self.dry:
            (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                        GIT_PYTHON_REFRESH="quiet")
        wheels = sorted((ROOT / ".whl").glob("*.whl"))
        # The project, and the hfserve package from its tree (the engine's benches import it).
        path = [str(ROOT), str(ROOT / "examples" / "hfserve")] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
        if wheels:
            stamp, want = SITE / ".carried", "\n".join(w.name for w in wheels)
            if self.dry or not stamp.exists() or stamp.read_text() != want:
                rc = self.sh([self.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                              "--no-cache-dir", "--upgrade", "--target", str(SITE), *map(str, wheels)])
                if rc != 0:
                    raise Failed("the carried wheels did not install (pip's message above)")
                if not self.dry:
                    SITE.mkdir(parents=True, exist_ok=True)
                    stamp.write_text(want)
            path.insert(0, str(SITE))
        self.env["PYTHONPATH"] = ":".join(path)
        if not self.dry and shutil.which("nvidia-smi"):
            print(self.capture(["nvidia-smi", "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader"]),
                  end="", flush=True)

    def preflight(self) -> None:
        """Refuse, in one line, a machine where the orchestrator does not import (the wheels not carried)."""
        if self.dry or self._checked:
            return
        self._checked = True
        r = subprocess.run([self.python, "-c", "import orchestrator.cli"], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, **self.env})
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            raise Failed(f"the orchestrator does not import here ({last}): carry .whl "
                         "(python3 benchmarks/gpu/wheels.py, then name .whl in carry)")

    def model(self) -> str:
        """The forged model's folder (forged once per machine; ~155 s for the 7B on an H200)."""
        if not self._model:
            self.log(f"forge {self.preset}")
            if self.dry:
                self.capture([self.python, "-c", "<forge>", self.preset])
                self._model = f"/forge/{self.preset}"
            else:
                lines = self.capture([self.python, "-c", FORGE, self.preset], timeout=max(self.left(60), 30),
                                     stderr=self.out / "logs" / "forge.err").strip().splitlines()
                if not lines:
                    raise Failed(f"forging {self.preset} failed (logs/forge.err in $OUT)")
                self._model = lines[-1]
            self.log(f"model {self._model}")
        return self._model

    def gpu_name(self) -> str:
        """The first GPU's name as nvidia-smi gives it (best_known.json's `card`); '' without one or in a dry run."""
        if self.dry or not shutil.which("nvidia-smi"):
            return ""
        lines = self.capture(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).strip().splitlines()
        return lines[0].strip() if lines else ""

    def gate_batch(self) -> int:
        """The server batch the accuracy gate runs at: 64, or 32 on a card under 100 GB (the float32 reference,
        28 GB, does not fit beside a batch-64 server on an H100)."""
        mb = self.capture(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]) \
            if shutil.which("nvidia-smi") else ""
        try:
            return 32 if int(mb.split()[0]) < 100_000 else 64
        except (ValueError, IndexError):
            return 64

    def finish(self) -> list[str]:
        """$OUT made fit to come back: logs/ packed into logs.tgz; past 8 files, the rest into more.tgz."""
        if self.dry:
            return []
        logs = self.out / "logs"
        if logs.is_dir() and not any(logs.iterdir()):
            logs.rmdir()
        if logs.is_dir():
            with tarfile.open(self.out / "logs.tgz", "w:gz") as t:
                t.add(logs, arcname="logs")
            shutil.rmtree(logs)
        first = (".db", ".json", ".md", ".svg", ".txt", ".log")  # results before logs when some must be packed
        files = sorted((p for p in self.out.iterdir() if p.is_file()),
                       key=lambda p: (first.index(p.suffix) if p.suffix in first else len(first), p.name))
        if len(files) > MAX_OUT_FILES:
            keep, rest = files[:MAX_OUT_FILES - 1], files[MAX_OUT_FILES - 1:]
            with tarfile.open(self.out / "more.tgz", "w:gz") as t:
                for p in rest:
                    t.add(p, arcname=p.name)
            for p in rest:
                p.unlink()
            files = [*keep, self.out / "more.tgz"]
        return [p.name for p in files]
