"""Decode steps replayed from CUDA graphs: one graph per (batch bucket, context bucket), captured at start-up.

:class:`GraphDecoder` pads a step's rows to a batch bucket and its context to a context bucket, replays the graph
captured for them (or runs the step eagerly without graphs: on the CPU, ``--cuda-graphs off``), and copies the
step's greedy ids to pinned host memory without a sync (:class:`_HostIds`).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .model import FastModel


class GraphDecoder:
    """Decode steps by CUDA graph replay: one graph per (batch bucket, context bucket)."""

    def __init__(self, fm: FastModel, max_batch: int, use_graphs: bool) -> None:
        self.fm = fm
        self.use_graphs = use_graphs and fm.device.type == "cuda"
        b, self.batch_buckets = 1, []
        while b < max_batch:
            self.batch_buckets.append(b)
            b *= 2
        self.batch_buckets.append(max_batch)
        c, self.ctx_buckets = 256, []
        while c < fm.capacity:
            self.ctx_buckets.append(c)
            c *= 2
        self.ctx_buckets.append(fm.capacity)
        dev = fm.device
        self.inp = torch.zeros(2, max_batch, dtype=torch.long, device=dev)  # tokens, positions
        self.host = torch.zeros(2, max_batch, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.host_np = self.host.numpy()  # the same memory: a list goes in without a tensor built per step
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor, torch.Tensor]] = {}
        self.pool = None
        # --overlap-schedule: each step's ids copied out at once into one of two pinned buffers (two
        # steps can be in flight), with an event the host waits on (see :meth:`copy_out`).
        cuda = dev.type == "cuda"
        self.out_host = [torch.zeros(max_batch, dtype=torch.long, pin_memory=cuda) for _ in range(2)]
        self.out_events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self.out_tables: dict[tuple[int, int], torch.Tensor] = {}  # (flip, columns): logprob tables' buffers
        self._flip = 0
        self.timing: list | None = None  # HFSERVE_STEP_LOG: (start, end) CUDA events of each graph step

    def _bucket(self, xs: list[int], n: int) -> int:
        return next(x for x in xs if x >= n)

    def capture_all(self) -> float:
        """Capture every (batch, context) graph now, so no request pays for a capture."""
        t0 = time.perf_counter()
        if self.use_graphs:
            for b in self.batch_buckets:
                for c in self.ctx_buckets:
                    self._graph(b, c)
        return time.perf_counter() - t0

    def _graph(self, b: int, c: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
        key = (b, c)
        if key not in self.graphs:
            self.inp[1, :b] = self.fm.scratch_pos  # harmless positions while capturing
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):  # warm-up outside the graph (cuBLAS handles, workspaces)
                    self.fm.decode(self.inp[0, :b], self.inp[1, :b], c)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.pool):
                logits, ids = self.fm.decode(self.inp[0, :b], self.inp[1, :b], c)
            self.graphs[key] = (graph, logits, ids)
        return self.graphs[key]

    def step(self, tokens: list[int], positions: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Decode one token for slots ``0..n-1``; returns (float logits [>=n, V], greedy ids [n])."""
        logits, ids = self.launch(tokens, positions)
        return logits, ids.tolist()  # the step's one device->host copy, the whole batch at once

    def launch(self, tokens: list[int] | None, positions: list[int],
               prev: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step` without waiting for it: the step is queued on the device and this returns at
        once with (float logits [>=n, V], greedy ids [n] on the device); ``ids.tolist()`` waits.
        ``tokens`` None: the input ids are ``prev``, the greedy ids of the step queued before (same rows,
        same order), copied on the device: the host need not have read them (--overlap-schedule)."""
        n = len(positions)
        b = self._bucket(self.batch_buckets, n)
        c = self._bucket(self.ctx_buckets, max(positions) + 1)
        h = self.host_np
        h[0, :n] = tokens if tokens is not None else 0
        h[1, :n] = positions
        h[0, n:b] = 0
        h[1, n:b] = self.fm.scratch_pos  # padding rows write only the scratch position
        self.inp[:, :b].copy_(self.host[:, :b], non_blocking=True)
        if tokens is None:
            self._feed(prev, n)
        if self.use_graphs:
            graph, logits, ids = self._graph(b, c)
            if self.timing is not None:  # HFSERVE_STEP_LOG: the step's start and end on the device
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
                graph.replay()
                ev[1].record()
                self.timing.append(ev)
            else:
                graph.replay()
        else:
            logits, ids = self.fm.decode(self.inp[0, :b], self.inp[1, :b], c)
        return logits, ids[:n]

    def _feed(self, prev: torch.Tensor, n: int) -> None:
        """The next step's input ids from the last step's output, on the device (stream order: after
        that step, before this one's replay overwrites a graph's output buffer)."""
        self.inp[0, :n].copy_(prev, non_blocking=True)

    def copy_out(self, ids: torch.Tensor) -> Any:
        """Queue ``ids``' copy to pinned host memory right behind the step that writes them (before a
        later replay of the same graph overwrites its output buffer); returns a handle whose
        ``tolist()`` waits for the copy alone, with the GIL released (later steps may still run).
        ``ids`` may also be a step's :func:`logprob_table` (float64 [n, columns])."""
        i, n = self._flip, ids.shape[0]
        self._flip ^= 1
        if ids.dim() == 1:
            buf = self.out_host[i][:n]
        else:
            key = (i, ids.shape[1])
            if key not in self.out_tables:
                self.out_tables[key] = torch.zeros(self.out_host[i].shape[0], ids.shape[1], dtype=ids.dtype,
                                                   pin_memory=self.out_events[i] is not None)
            buf = self.out_tables[key][:n]
        ev = self.out_events[i]
        buf.copy_(ids, non_blocking=True)
        if ev is not None:
            ev.record()
        return _HostIds(buf, ev)


class _HostIds:
    """A step's greedy ids on their way to pinned host memory (see :meth:`GraphDecoder.copy_out`)."""

    __slots__ = ("buf", "ev")

    def __init__(self, buf: torch.Tensor, ev: Any) -> None:
        self.buf, self.ev = buf, ev

    def tolist(self) -> list[int]:
        if self.ev is not None:
            self.ev.synchronize()  # releases the GIL while it waits
        return self.buf.tolist()


