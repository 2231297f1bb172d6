"""What the fast engine records about itself when asked: HFSERVE_STEP_LOG and HFSERVE_PROFILE.

``HFSERVE_STEP_LOG=FILE``: every decode step's batch, wall time and engine-thread CPU time (with CUDA graphs, its
time on the device and the device's idle time before it), one burst per ``end``; beside it ``FILE.timeline``: each
job's arrival, each packed prefill pass and each garbage-collector pass of 1 ms or more.
``HFSERVE_PROFILE=FILE``: torch.profiler over ``PROFILE_STEPS`` decode steps of the first batch of >= 32 rows and
over the first large packed prefill pass, the kernel tables written to FILE and FILE.prefill.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

PROFILE_SKIP, PROFILE_STEPS = 20, 10
"""HFSERVE_PROFILE: the large decode steps skipped first, and how many are profiled."""
PROFILE_PREFILL_TOKENS = 8192
"""HFSERVE_PROFILE: the first packed prefill pass of at least this many tokens is profiled too (FILE.prefill)."""

_GC_HOOKS: list[tuple[weakref.ref, Callable[[str, dict[str, Any]], None]]] = []


def _gc_hook(engine: Profiling) -> Callable[[str, dict[str, Any]], None]:
    """A gc.callbacks entry calling ``engine._gc_mark`` while the engine lives (a weak reference: the hook does not
    keep an engine alive). Hooks of engines gone are taken out of gc.callbacks here, outside any collection."""
    for ref, dead in [h for h in _GC_HOOKS if h[0]() is None]:
        _GC_HOOKS.remove((ref, dead))
        if dead in gc.callbacks:
            gc.callbacks.remove(dead)
    ref = weakref.ref(engine)

    def hook(phase: str, info: dict[str, Any]) -> None:
        e = ref()
        if e is not None:
            e._gc_mark(phase, info)

    _GC_HOOKS.append((ref, hook))
    return hook


class Profiling:
    """The engine's step log, timeline and profiler (mixed into FastEngine; these read its ``fm`` and ``decoder``)."""

    _step_log_path: str | None = None
    _profile_path: str | None = None
    _timeline: deque | None = None

    def _profile_prefill(self, parts: list, used: int) -> torch.Tensor:
        """HFSERVE_PROFILE: one packed prefill pass under the profiler; its kernel table and wall time go
        to FILE.prefill."""
        self._prefill_profiled = True
        cuda = self.fm.device.type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        with self._profiler() as prof:
            logits = self.fm.prefill_packed(parts)
            sync()
        wall = time.perf_counter() - t0
        with open(f"{self._profile_path}.prefill", "w") as f:
            f.write(f"packed prefill of {used} tokens ({len(parts)} prompts): {wall * 1000:.1f} ms profiled\n"
                    f"{self._profile_table(prof)}\n")
        return logits

    def _profiler(self) -> Any:
        """HFSERVE_PROFILE's torch.profiler: CPU, and CUDA on a GPU."""
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if self.fm.device.type == "cuda"
                                                            else [])])

    def _profile_table(self, prof: Any) -> str:
        """The profile's kernel table, by device time on a GPU (CPU time on the CPU), 30 rows."""
        return prof.key_averages().table(sort_by="self_cuda_time_total" if self.fm.device.type == "cuda"
                                         else "self_cpu_time_total", row_limit=30)

    def _profile_step(self) -> None:
        """HFSERVE_PROFILE: start the profiler at the PROFILE_SKIP-th large step, stop it PROFILE_STEPS later."""
        self._profile_seen += 1
        if self._profile_seen == PROFILE_SKIP:
            self._profile = self._profiler()
            self._profile.__enter__()
        elif self._profile_seen == PROFILE_SKIP + PROFILE_STEPS and self._profile is not None:
            if self.fm.device.type == "cuda":
                torch.cuda.synchronize()
            prof, self._profile = self._profile, None
            prof.__exit__(None, None, None)
            with open(self._profile_path, "w") as f:
                f.write(f"{PROFILE_STEPS} decode steps from the {PROFILE_SKIP}-th of a batch >= 32\n"
                        f"{self._profile_table(prof)}\n")

    def _gc_mark(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks hook (HFSERVE_STEP_LOG): a pass of >= 1 ms into the timeline, in whichever thread ran it."""
        now = time.perf_counter()
        if phase == "start":
            self._gc_t0 = now
        elif now - self._gc_t0 >= 1e-3 and self._timeline is not None:
            self._timeline.append(f"G {info.get('generation', -1)} {self._gc_t0:.6f} {(now - self._gc_t0) * 1e3:.3f}")

    def _device_event(self) -> Any:
        """A CUDA event recorded now on the current stream (None off the GPU): the timeline's device clock."""
        if self.fm.device.type != "cuda":
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _flush_step_log(self) -> None:
        """Append the burst's steps: ``batch wall_time thread_cpu_time`` per step (the engine thread's CPU
        clock), and with CUDA graphs ``busy_ms idle_ms``: the graph's own time on the device and the device's
        wait from the step before's end to its start."""
        ev = self.decoder.timing or []
        dev = [""] * len(self._step_marks)
        if ev and len(ev) == len(self._step_marks):
            ev[-1][1].synchronize()
            for i, (a, b) in enumerate(ev):
                idle = ev[i - 1][1].elapsed_time(a) if i else 0.0
                dev[i] = f" {a.elapsed_time(b):.4f} {idle:.4f}"
        if self._timeline is not None:  # first: a reader that sees the step log's "end" finds the timeline's too
            lines = []
            while self._timeline:  # the event loop's thread appends arrivals meanwhile: popped one by one
                lines.append(self._timeline.popleft())
            with open(f"{self._step_log_path}.timeline", "a") as f:
                f.write("".join(f"{x}\n" for x in lines) + "end\n")
        with open(self._step_log_path, "a") as f:
            f.write("".join(f"{n} {t:.6f} {c:.6f}{d}\n" for (n, t, c), d in zip(self._step_marks, dev, strict=True))
                    + "end\n")
        self._step_marks.clear()
        if self.decoder.timing is not None:
            self.decoder.timing = []

