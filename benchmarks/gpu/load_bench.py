"""Weight loading on one device, old reader against new (the 7B's 14.5 GB took 3.6-5.3 s per launch).

In one process, each repeated ``--repeats`` times with the device synchronised around it and everything freed
between runs (the CUDA caching allocator and the pinned host cache emptied, as in a fresh server process):

* ``load_file``: ``safetensors.torch.load_file(f, device=...)`` per file, the old path (``--load safetensors``);
* ``read``: the raw read bandwidth of the files (``os.preadv`` by N threads into pageable buffers, no copy): what
  the source (tmpfs under gVisor on the H200) gives at most;
* ``pread``: hfserve.loading's ``read_safetensors`` (the default ``--load fast``) at each
  ``--threads`` x ``--chunk-mib`` x ``--layout``, every run checked bit for bit against ``load_file``'s tensors
  (the exit status is 1 if one differs); with ``--unpinned`` also with pageable staging buffers (layout tensor,
  the first chunk size), in case pinned memory is slow or refused under the host's sandbox.

Prints a table (median seconds, GB/s, the slowest thread's seconds pinning staging memory and reading) and writes
the rows as JSON (``--out``). On the device machine::

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu/load_bench.py --preset 7b-peaked --out $OUT/load_bench.json
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu/load_bench.py MODEL_DIR --threads 2,4,8 --chunk-mib 64,256

``--device cpu`` runs it anywhere (a smoke test: tests/examples/test_loading.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import torch  # noqa: E402
from hfserve.loading import _empty_host_cache, _read_header, checkpoint_files, read_safetensors  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        _empty_host_cache()


def _old(files: list[str], device: torch.device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f, device=str(device)))
    return state


def _raw_read(files: list[str], threads: int, chunk: int) -> int:
    """Read the files' bytes with ``threads`` threads, ``chunk`` bytes per ``os.preadv``, into nothing."""
    jobs = [(f, off, min(chunk, size - off)) for f in files for size in [os.path.getsize(f)]
            for off in range(0, size, chunk)]
    lock, nxt, total = threading.Lock(), [0], [0] * threads

    def work(w: int) -> None:
        buf = memoryview(bytearray(min(chunk, max(n for _, _, n in jobs))))
        fds: dict[str, int] = {}
        try:
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= len(jobs):
                    return
                f, off, n = jobs[i]
                fd = fds.get(f)
                if fd is None:
                    fd = fds[f] = os.open(f, os.O_RDONLY)
                total[w] += os.preadv(fd, [buf[:n]], off)
        finally:
            for fd in fds.values():
                os.close(fd)

    ts = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(total)


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    if list(got) != list(want) and set(got) != set(want):
        return False
    for k, w in want.items():
        g = got[k]
        if (g.dtype, g.shape, g.device) != (w.dtype, w.shape, w.device):
            return False
        if not torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)):
            return False
    return True


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("model", nargs="?", help="a model folder (model.safetensors or an index) or one .safetensors file")
    ap.add_argument("--preset", help="a forge preset (7b-peaked): its cached model, forged if missing")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--chunk-mib", default="64,256")
    ap.add_argument("--layout", default="tensor,file")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--unpinned", action="store_true", help="also pread with pageable staging buffers")
    ap.add_argument("--out", help="write the rows here as JSON")
    args = ap.parse_args(argv)
    if bool(args.model) == bool(args.preset):
        ap.error("give a model folder or --preset, one of them")
    if args.preset:
        from orchestrator.models.forge import cached_model

        args.model = str(cached_model(args.preset))
    files = [args.model] if os.path.isfile(args.model) else checkpoint_files(args.model)
    if not files:
        ap.error(f"no safetensors in {args.model}")
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=device)
        _sync(device)
    heads = [_read_header(f) for f in files]
    header_bytes = sum(h[0] for h in heads)
    nbytes = sum(os.path.getsize(f) for f in files) - header_bytes
    rows: list[dict] = []

    def row(reader: str, secs: list[float], **kw: object) -> dict:
        r = {"reader": reader, **kw, "seconds": [round(s, 4) for s in secs],
             "median_s": round(statistics.median(secs), 4), "gb_s": round(nbytes / statistics.median(secs) / 1e9, 2)}
        rows.append(r)
        return r

    secs, ref = [], None
    for _ in range(args.repeats):
        ref = None
        _free(device)
        t0 = time.perf_counter()
        ref = _old(files, device)
        _sync(device)
        secs.append(time.perf_counter() - t0)
    row("load_file", secs)
    ok = True
    chunks = _ints(args.chunk_mib)
    for threads in _ints(args.threads):
        secs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            got = _raw_read(files, threads, chunks[0] << 20)
            secs.append(time.perf_counter() - t0)
            assert got == nbytes + header_bytes, (got, nbytes + header_bytes)
        row("read", secs, threads=threads, chunk_mib=chunks[0])
    settings = [(layout, chunk, threads, True) for layout in [x.strip() for x in args.layout.split(",") if x.strip()]
                for chunk in chunks for threads in _ints(args.threads)]
    settings += [("tensor", chunks[0], threads, False) for threads in _ints(args.threads) if args.unpinned]
    for layout, chunk, threads, pin in settings:
        secs, stats, eq = [], [], True
        for _ in range(args.repeats):
            _free(device)
            st: dict = {}
            t0 = time.perf_counter()
            state = read_safetensors(files, device, threads=threads, chunk_bytes=chunk << 20, layout=layout,
                                     pin=pin, stats=st)
            _sync(device)
            secs.append(time.perf_counter() - t0)
            stats.append(st)
            eq &= _equal(state, ref)
            del state
        row("pread" if pin else "pageable", secs, threads=threads, chunk_mib=chunk, layout=layout, equal=eq,
            pin_s=round(max(s["pin_s"] for s in stats), 4), read_s=round(max(s["read_s"] for s in stats), 4))
        ok &= eq
    ref = None
    _free(device)
    doc = {"model": args.model, "files": len(files), "bytes": nbytes, "header_bytes": header_bytes,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "cpus": os.cpu_count(), "repeats": args.repeats, "equal": ok, "rows": rows}
    print(f"{args.model}: {len(files)} file(s), {nbytes / 1e9:.2f} GB on {doc['device']}; pread equal to load_file: {ok}")
    print(f"{'reader':<10} {'threads':>7} {'MiB':>5} {'layout':<7} {'median s':>9} {'GB/s':>6} {'pin s':>6} {'read s':>7}"
          "  runs")
    for r in rows:
        print(f"{r['reader']:<10} {r.get('threads', ''):>7} {r.get('chunk_mib', ''):>5} {r.get('layout', ''):<7} "
              f"{r['median_s']:>9.3f} {r['gb_s']:>6.2f} {r.get('pin_s', ''):>6} {r.get('read_s', ''):>7}  "
              + ("" if r.get("equal", True) else "DIFFERS ")
              + " ".join(f"{s:.3f}" for s in r["seconds"]))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    sys.exit(0 if main()["equal"] else 1)
