"""hfserve's model loading: safetensors straight onto the device, from_pretrained as the fallback.

``from_pretrained`` spends most of a 7B deploy (15-19 s on the H200) in its own bookkeeping; a
fresh process gets the same 14.5 GB of bf16 safetensors onto the GPU in 2.3-3.4 s with
``safetensors.torch.load_file(..., device="cuda")``. So :func:`load_model` builds the model from
its config with initialisation switched off (no random weights drawn only to be overwritten),
reads the checkpoint onto the device (below), assigns the tensors into the modules and
ties the embeddings as transformers does. Same tensors, so the same outputs (tests/examples/
test_hfserve.py compares the logits with ``from_pretrained``'s).

Where the fast path does not apply it says why and uses ``from_pretrained``: no safetensors
file, a checkpoint whose names or shapes do not match the model's, modules transformers keeps in
float32, or a quantisation config.

``load_file`` itself read at ~3.6 GB/s in the H200's trials (3.6-5.3 s for the 7B, likely page faults on
its mmap and a pageable copy per tensor). :func:`read_safetensors` is the default reader instead: it parses
the header itself, allocates every tensor on the device, and reads the data sections in large
chunks with several threads (``os.preadv`` into pinned staging buffers, each thread double-buffered
so its next read overlaps its last host-to-device copy on its own stream). The same bytes land in
the same places, so the tensors equal ``load_file``'s bit for bit (tests/hfserve/test_loading.py);
each owns its storage as ``load_file``'s do (``LOAD_LAYOUT = "file"``: views into one buffer per
file instead, for the benchmark). A dtype it does not know falls back to ``load_file`` (it says
why); a truncated or inconsistent file is an error (:class:`CheckpointError`), as in ``load_file``.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["CheckpointError", "LOAD_CHUNK_MIB", "LOAD_LAYOUT", "LOAD_THREADS", "Phases", "checkpoint_files",
           "init_device", "load_model", "load_settings", "read_safetensors"]

LOAD_THREADS = 4
"""Reader threads of :func:`read_safetensors` (env ``HFSERVE_LOAD_THREADS``)."""
LOAD_CHUNK_MIB = 64
"""Bytes per read and per host-to-device copy, in MiB (env ``HFSERVE_LOAD_CHUNK_MIB``); each thread pins two."""
LOAD_LAYOUT = "tensor"
"""``tensor``: each tensor its own device allocation, as ``load_file`` makes them; ``file``: one buffer per file and
the tensors views into it (one allocation; but a view keeps the whole buffer alive, so the fast engine's fused
QKV / gate-up copies would leave the originals' ~2/3 of the weights allocated). Env ``HFSERVE_LOAD_LAYOUT``."""


class Phases:
    """The engine's start-up, split into named consecutive spans (on the H200 the engine part was
    9.7-15.6 s while the weights took 3-4.5 s). Each :meth:`mark` closes the span that began at the
    previous mark (or at ``start``), so the spans add up to the time from ``start`` to the last mark."""

    def __init__(self, start: float | None = None) -> None:
        self.spans: list[tuple[str, float]] = []
        self.end: float = time.perf_counter() if start is None else start
        """When the last span closed (``time.perf_counter`` seconds)."""

    def mark(self, name: str) -> None:
        """End the current span and call it ``name`` (a repeated name adds to the first one)."""
        now = time.perf_counter()
        for i, (n, s) in enumerate(self.spans):
            if n == name:
                self.spans[i] = (n, s + now - self.end)
                break
        else:
            self.spans.append((name, now - self.end))
        self.end = now

    def line(self) -> str:
        """``hfserve: engine tokenizer 0.31s cuda 0.80s load 3.52s ... total 6.10s``."""
        parts = " ".join(f"{n} {s:.2f}s" for n, s in self.spans)
        return f"hfserve: engine {parts} total {sum(s for _, s in self.spans):.2f}s"


def init_device(device: str) -> None:
    """Create the CUDA context now (one allocation, synchronised), so its cost is timed on its own
    instead of inside the first weight copy; nothing to do on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=device)
        torch.cuda.synchronize()


def checkpoint_files(model_dir: str) -> list[str] | None:
    """The safetensors files of ``model_dir`` (one file, or the shards its index names); None if neither."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    index = single + ".index.json"
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_dir, s) for s in shards]
    return None


def load_model(model_dir: str, *, dtype: torch.dtype, device: str = "cpu", attn: str | None = None,
               how: str = "fast") -> tuple[Any, str]:
    """The model of ``model_dir`` on ``device`` in ``dtype``, in eval mode, and how it was loaded.

    ``how``: "fast" (the safetensors read by :func:`read_safetensors` straight onto the device,
    ``load_file`` where that reader does not apply, from_pretrained where neither does),
    "safetensors" (the same with ``load_file`` always) or "hf" (from_pretrained always). The second
    value says which path ran (``safetensors-pread x4 64MiB``: the reader's threads and chunk; and
    why a fallback, if it was one); the server prints it with the load time.
    """
    if how not in ("fast", "safetensors", "hf"):
        raise ValueError(f"how must be fast, safetensors or hf, not {how!r}")
    t0 = time.perf_counter()
    model, path, parts = None, "from_pretrained", {}
    if how != "hf":
        try:
            model, path = _load_fast(model_dir, dtype=dtype, device=device, attn=attn, reader=how, parts=parts)
        except _NotFast as e:
            path = f"from_pretrained (fast load does not apply: {e})"
    if model is None:
        model = _from_pretrained(model_dir, dtype=dtype, device=device, attn=attn)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    # the fast path's parts: the model built from its config, the checkpoint read onto the device
    split = f" (model {parts['model']:.2f}s, read {parts['read']:.2f}s)" if model is not None and parts else ""
    print(f"hfserve: loaded {model_dir} in {secs:.2f}s via {path}{split}", file=sys.stderr, flush=True)
    return model.eval(), path


class _NotFast(Exception):
    """The fast path does not apply to this checkpoint; the message says why."""


def _from_pretrained(model_dir: str, *, dtype: torch.dtype, device: str, attn: str | None) -> Any:
    from transformers import AutoModelForCausalLM

    kw: dict[str, Any] = {"dtype": dtype}
    if attn:
        kw["attn_implementation"] = attn
    if torch.device(device).type != "cpu":
        kw["device_map"] = device  # load straight onto the GPU, no host copy
    return AutoModelForCausalLM.from_pretrained(model_dir, **kw)


def _load_fast(model_dir: str, *, dtype: torch.dtype, device: str, attn: str | None,
               reader: str = "fast", parts: dict[str, float] | None = None) -> tuple[Any, str]:
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers before 5.x kept it in modeling_utils
        from transformers.modeling_utils import no_init_weights

    files = checkpoint_files(model_dir)
    if files is None:
        raise _NotFast("no model.safetensors or model.safetensors.index.json")
    cfg = AutoConfig.from_pretrained(model_dir)
    if getattr(cfg, "quantization_config", None):
        raise _NotFast("a quantisation config")
    kw: dict[str, Any] = {"dtype": dtype}
    if attn:
        kw["attn_implementation"] = attn
    # Built on the CPU with every init function switched off: the parameters are allocated but never
    # touched (load_state_dict below replaces them with the device's tensors), while buffers computed
    # in __init__ (RoPE's inv_freq) are computed on the CPU, as from_pretrained computes them, and
    # moved to the device at the end: bit for bit the same model.
    t0 = time.perf_counter()
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(cfg, **kw)
    t1 = time.perf_counter()
    if getattr(model, "_keep_in_fp32_modules", None) or getattr(model, "_keep_in_fp32_modules_strict", None):
        raise _NotFast("the model keeps some modules in float32")
    state, path = _read_state(files, device, reader)
    if parts is not None:
        parts.update(model=t1 - t0, read=time.perf_counter() - t1)
    own = model.state_dict()
    unexpected = sorted(set(state) - set(own))
    if unexpected:
        raise _NotFast(f"checkpoint names the model does not have: {unexpected[:3]}")
    for k, t in state.items():
        if t.shape != own[k].shape:
            raise _NotFast(f"{k} has shape {tuple(t.shape)} in the checkpoint, {tuple(own[k].shape)} in the model")
        if t.dtype != dtype and t.is_floating_point():
            state[k] = t.to(dtype)  # what from_pretrained(dtype=...) does with a checkpoint of another dtype
    del own
    missing = model.load_state_dict(state, strict=False, assign=True).missing_keys
    # Tied weights (lm_head = embed_tokens) are not in the checkpoint; tie them as transformers does,
    # then every missing name must share its storage with a loaded tensor.
    model.tie_weights()
    loaded = {t.data_ptr() for t in state.values()}
    now = model.state_dict(keep_vars=True)
    untied = [k for k in missing if now[k].data_ptr() not in loaded]
    if untied:
        raise _NotFast(f"weights missing from the checkpoint: {untied[:3]}")
    model.to(device)  # the buffers; the parameters are there already
    if os.path.isfile(os.path.join(model_dir, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    return model, path


def _read_state(files: list[str], device: str, reader: str) -> tuple[dict[str, torch.Tensor], str]:
    """All tensors of ``files`` on ``device`` and how they were read: by :func:`read_safetensors` (``reader``
    "fast") or by safetensors' ``load_file`` (``reader`` "safetensors", or where the former does not apply)."""
    why = ""
    if reader == "fast":
        threads, chunk_mib, layout = load_settings()
        try:
            state = read_safetensors(files, device, threads=threads, chunk_bytes=chunk_mib << 20, layout=layout)
            lay = "" if layout == "tensor" else f" {layout}"
            return state, f"safetensors-pread x{threads} {chunk_mib}MiB{lay}"
        except _NotReadable as e:
            why = f" (pread reader does not apply: {e})"
        except (OSError, RuntimeError) as e:  # the source or the device refused it (pinning, a read into pinned
            # memory...): load_file may still do; a file that is not what its header says is a CheckpointError
            why = f" (pread reader failed: {type(e).__name__}: {str(e)[:200]})"
    from safetensors.torch import load_file

    state = {}
    for f in files:
        state.update(load_file(f, device=str(device)))
    return state, "safetensors" + why


def load_settings() -> tuple[int, int, str]:
    """The reader's threads, chunk MiB and layout: the module's constants, or the ``HFSERVE_LOAD_*`` environment."""
    threads = int(os.environ.get("HFSERVE_LOAD_THREADS") or LOAD_THREADS)
    chunk_mib = int(os.environ.get("HFSERVE_LOAD_CHUNK_MIB") or LOAD_CHUNK_MIB)
    layout = os.environ.get("HFSERVE_LOAD_LAYOUT") or LOAD_LAYOUT
    if threads < 1 or chunk_mib < 1 or layout not in ("tensor", "file"):
        raise ValueError(f"HFSERVE_LOAD_*: threads {threads} and chunk MiB {chunk_mib} must be >= 1, "
                         f"layout {layout!r} tensor or file")
    return threads, chunk_mib, layout


# --- the safetensors reader -------------------------------------------------------------------------------------

_ST_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, attr) for name, attr in (
        ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("I16", "int16"), ("U16", "uint16"), ("I32", "int32"),
        ("U32", "uint32"), ("I64", "int64"), ("U64", "uint64"), ("F16", "float16"), ("BF16", "bfloat16"),
        ("F32", "float32"), ("F64", "float64"), ("C64", "complex64"), ("F8_E4M3", "float8_e4m3fn"),
        ("F8_E4M3FNUZ", "float8_e4m3fnuz"), ("F8_E5M2", "float8_e5m2"), ("F8_E5M2FNUZ", "float8_e5m2fnuz"))
    if hasattr(torch, attr)}
"""safetensors' dtype names (as safetensors.torch maps them) that this torch has."""

_MAX_HEADER = 100 << 20  # safetensors refuses larger headers too


class CheckpointError(ValueError):
    """A safetensors file that is truncated or whose header does not describe its bytes (``load_file`` refuses
    such files as well)."""


class _NotReadable(Exception):
    """:func:`read_safetensors` cannot read this file (a dtype it does not know); ``load_file`` may."""


class _Entry:
    __slots__ = ("name", "dtype", "shape", "start", "end")

    def __init__(self, name: str, dtype: torch.dtype, shape: list[int], start: int, end: int) -> None:
        self.name, self.dtype, self.shape, self.start, self.end = name, dtype, shape, start, end


def _read_header(path: str) -> tuple[int, list[_Entry]]:
    """Where ``path``'s data section starts and its tensors (offsets relative to that section), checked against the
    file's size: every byte of the data section belongs to exactly one tensor, as safetensors requires."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header")
        n = int.from_bytes(head, "little")
        if n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path}: header of {n} bytes runs past the end of the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dname, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise CheckpointError(f"{path}: {name}: no dtype, shape and data_offsets in {info!r}") from None
        if dname not in _ST_DTYPES:
            raise _NotReadable(f"{name} has dtype {dname}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
            raise CheckpointError(f"{path}: {name}: bad shape {shape!r} or data_offsets {[start, end]!r}")
        dtype = _ST_DTYPES[dname]
        if end - start != math.prod(shape) * dtype.itemsize:
            raise CheckpointError(f"{path}: {name}: data_offsets {[start, end]} hold {end - start} bytes, "
                                  f"{dname} {shape} needs {math.prod(shape) * dtype.itemsize}")
        entries.append(_Entry(name, dtype, shape, start, end))
    entries.sort(key=lambda e: (e.start, e.end))
    pos = 0
    for e in entries:
        if e.start != pos:
            raise CheckpointError(f"{path}: {e.name} starts at data byte {e.start}, the tensor before it ends at {pos}")
        pos = e.end
    data = size - 8 - n
    if pos > data:
        raise CheckpointError(f"{path}: truncated: its tensors need {pos} bytes of data, the file has {data}")
    if pos < data:
        raise CheckpointError(f"{path}: {data - pos} bytes after the last tensor's data")
    return 8 + n, entries


def read_safetensors(files: str | list[str], device: str | torch.device = "cpu", *, threads: int = LOAD_THREADS,
                     chunk_bytes: int = LOAD_CHUNK_MIB << 20, layout: str = LOAD_LAYOUT,
                     pin: bool = True, stats: dict | None = None) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors ``files`` on ``device``, as ``safetensors.torch.load_file`` gives them.

    Every tensor is allocated on ``device`` first (``layout`` "file": one byte buffer per file, the tensors views
    into it). Then ``threads`` threads each take the next ``chunk_bytes`` of the files' data sections in turn,
    ``os.preadv`` it into a staging buffer (pinned on a GPU) and copy its pieces into the tensors it overlaps
    (on a GPU with ``non_blocking`` copies on the thread's own stream; two staging buffers per thread, so the
    next read overlaps the last copy); all streams are synchronised before it returns. ``pin=False``: pageable
    staging on a GPU too (each copy then waits for the driver's own staging; for the benchmark). ``stats``, if given,
    gets the bytes, the seconds and the slowest thread's seconds spent pinning staging memory and reading.
    Raises :class:`CheckpointError` on a truncated or inconsistent file.
    """
    t0 = time.perf_counter()
    paths = [files] if isinstance(files, str | os.PathLike) else list(files)
    if sys.byteorder != "little":
        raise _NotReadable("a big-endian host")
    if layout not in ("tensor", "file"):
        raise ValueError(f"layout must be tensor or file, not {layout!r}")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if dev.type not in ("cpu", "cuda"):
        raise _NotReadable(f"device {dev}")
    if cuda and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    chunk_bytes = max(1, int(chunk_bytes))
    out: dict[str, torch.Tensor] = {}
    names: list[str] = []  # the tensors in the order load_file gives them (by offset, file by file)
    late: list[tuple[_Entry, torch.Tensor]] = []  # misaligned tensors of layout "file", copied out after the read
    # per file: (data start, [(start, end, destination bytes)] sorted by start) and the chunks to read
    regions: list[tuple[int, list[int], list[tuple[int, int, torch.Tensor]]]] = []
    chunks: list[tuple[int, int, int]] = []
    for fi, path in enumerate(paths):
        data_start, entries = _read_header(str(path))
        total = entries[-1].end if entries else 0
        names += [e.name for e in entries]
        regs: list[tuple[int, int, torch.Tensor]] = []
        if layout == "file":
            buf = torch.empty(total, dtype=torch.uint8, device=dev)
            if total:
                regs.append((0, total, buf))
            for e in entries:
                if e.start == e.end:
                    out[e.name] = torch.empty(e.shape, dtype=e.dtype, device=dev)
                elif e.start % e.dtype.itemsize:  # not aligned for a view: its own tensor, filled after the read
                    late.append((e, buf))
                else:
                    out[e.name] = buf[e.start:e.end].view(e.dtype).view(e.shape)
        else:
            for e in entries:
                t = out[e.name] = torch.empty(e.shape, dtype=e.dtype, device=dev)
                if e.end > e.start:
                    regs.append((e.start, e.end, t.reshape(-1).view(torch.uint8)))
        regions.append((data_start, [r[0] for r in regs], regs))
        chunks += [(fi, off, min(chunk_bytes, total - off)) for off in range(0, total, chunk_bytes)]
    nbytes = sum(n for _, _, n in chunks)
    threads = max(1, min(int(threads), len(chunks)))
    size = min(chunk_bytes, max((n for _, _, n in chunks), default=0))
    fds = [os.open(str(p), os.O_RDONLY) for p in paths]
    lock, nxt, failed = threading.Lock(), [0], threading.Event()
    pin_s, read_s = [0.0] * threads, [0.0] * threads

    def work(w: int) -> None:
        try:
            _work(w)
        except BaseException:
            failed.set()  # the other threads stop after their current chunk
            raise

    def _work(w: int) -> None:
        with torch.cuda.device(dev) if cuda else contextlib.nullcontext():
            stream = torch.cuda.Stream(dev) if cuda else None
            t = time.perf_counter()
            staging = [torch.empty(size, dtype=torch.uint8, pin_memory=cuda and pin) for _ in range(2 if cuda else 1)]
            views = [s.numpy() for s in staging]
            pin_s[w] = time.perf_counter() - t
            done: list[Any] = [None] * len(staging)
            k = 0
            while not failed.is_set():
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= len(chunks):
                    break
                slot, k = k % len(staging), k + 1
                if done[slot] is not None:
                    done[slot].synchronize()  # its last copy has left the staging buffer
                fi, off, n = chunks[i]
                t = time.perf_counter()
                _pread_into(fds[fi], views[slot][:n], regions[fi][0] + off, paths[fi])
                read_s[w] += time.perf_counter() - t
                starts, regs = regions[fi][1], regions[fi][2]
                j = max(0, bisect.bisect_right(starts, off) - 1)
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    while j < len(regs) and regs[j][0] < off + n:
                        a, b, dst = regs[j]
                        lo, hi = max(a, off), min(b, off + n)
                        if lo < hi:
                            dst[lo - a:hi - a].copy_(staging[slot][lo - off:hi - off], non_blocking=cuda)
                        j += 1
                if cuda:
                    done[slot] = torch.cuda.Event()
                    done[slot].record(stream)
            if stream is not None:
                stream.synchronize()

    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="st-read") as pool:
            futures = [pool.submit(work, w) for w in range(threads if chunks else 0)]
            for f in futures:
                f.result()
    finally:
        for fd in fds:
            os.close(fd)
        if cuda:
            _empty_host_cache()  # give the pinned staging memory back
    for e, buf in late:
        own = out[e.name] = torch.empty(e.shape, dtype=e.dtype, device=dev)
        own.reshape(-1).view(torch.uint8).copy_(buf[e.start:e.end])
    if cuda:
        torch.cuda.synchronize(dev)
    out = {k: out[k] for k in names}
    if stats is not None:
        stats.update(bytes=nbytes, seconds=time.perf_counter() - t0, threads=threads, chunks=len(chunks),
                     pin_s=max(pin_s), read_s=max(read_s))
    return out


def _pread_into(fd: int, view: Any, offset: int, path: str) -> None:
    """Fill ``view`` (a writable buffer) with the file's bytes from ``offset`` on."""
    mv = memoryview(view).cast("B")
    got = 0
    while got < len(mv):
        n = os.preadv(fd, [mv[got:]], offset + got)
        if n <= 0:
            raise CheckpointError(f"{path}: ended at byte {offset + got} while {len(mv) - got} more were to be read")
        got += n


def _empty_host_cache() -> None:
    for f in (getattr(getattr(torch, "accelerator", None), "empty_host_cache", None),
              getattr(torch._C, "_host_emptyCache", None)):
        if f is not None:
            f()
            return
