"""Can a kernel reduce int32 partial sums across the CTAs of a cluster fast enough to pay? Times
bench/probe_kernels/dsmem_probe.cu: 16-byte stores into, and loads out of, another CTA's shared memory in the same
cluster (distributed shared memory, sm_90), against the CTA's own shared memory, for clusters of 2, 4 and 8, next to
the HBM copy rate of the same GPU (device only):

    python3 -m trtfuse.bench.dsmem_probe [--passes 2000] [--out FILE]

Every run's result is checked before it is timed: each CTA's buffer after the store probe holds exactly what its
writer (the previous rank, or itself) stored in the last pass, and each thread's load sum is the one its slots give.
The rates are the GPU's total over its SMs (per SM: that total / the SM count), 256 threads a CTA, 8 accesses in
flight a thread: the pattern a reduction written with plain loads and stores would have.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import sys

import numpy as np

from trtfuse import args as flags
from ..io import atomic_write_json
from . import PROBE_KERNEL_DIR

SLOTS, THREADS, BUFFER_BYTES = 4096, 256, 65536
CLUSTERS = (2, 4, 8)


def slot_words(writer: int, it: int) -> np.ndarray:
    """The kernel's slot_word(writer, it, i) for i in 0..SLOTS-1 (uint32 arithmetic)."""
    i = np.arange(SLOTS, dtype=np.uint64)
    return (((writer * 131 + it * 7) & 0xFFFFFFFF) ^ ((i * 2654435761) & 0xFFFFFFFF)).astype(np.uint32)


def expected_store(ctas: int, cluster: int, iters: int, remote: bool) -> np.ndarray:
    """[ctas, SLOTS, 4] uint32: each CTA's buffer after probe_store (its writer: rank - 1 when remote, else itself)."""
    out = np.empty((ctas, SLOTS, 4), np.uint32)
    for cta in range(ctas):
        rank = cta % cluster
        writer = (rank - 1) % cluster if remote else rank
        out[cta, :, 0] = slot_words(writer, iters - 1)
        out[cta, :, 1] = writer
        out[cta, :, 2] = iters - 1
        out[cta, :, 3] = np.arange(SLOTS)
    return out


def expected_load(ctas: int, cluster: int, iters: int, remote: bool) -> np.ndarray:
    """[ctas, THREADS] uint32: probe_load's sum per thread. Thread t in pass `it` reads slots (t + 256 m + it) % 4096,
    m = 0..15; that set depends on (t + it) % 256 only, so a pass's sum is G[(t + it) % 256]."""
    by_rank = []
    for rank in range(cluster):
        owner = (rank + 1) % cluster if remote else rank
        slot = (slot_words(owner, 0).astype(np.uint64) + owner + np.arange(SLOTS, dtype=np.uint64)) & 0xFFFFFFFF
        g = slot.reshape(SLOTS // THREADS, THREADS).sum(axis=0)  # G[k], k = slot % 256
        full, rest = divmod(iters, THREADS)
        window = (np.arange(THREADS)[:, None] + np.arange(rest)[None, :]) % THREADS  # thread t's last `rest` passes
        total = full * g.sum() + g[window].sum(axis=1)
        by_rank.append((total & 0xFFFFFFFF).astype(np.uint32))
    return np.stack([by_rank[cta % cluster] for cta in range(ctas)])


def main(argv=None) -> int:
    import torch

    from ..plugins import cuda_driver as cd
    from .kernels import graph_time_ms

    ap = argparse.ArgumentParser(prog="python3 -m trtfuse.bench.dsmem_probe")
    flags.out(ap)
    ap.add_argument("--passes", type=int, default=2000, help="passes over the 64 KB buffer per CTA")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    torch.cuda.init()
    cd.context()
    sms = cd.device_attribute("MULTIPROCESSOR_COUNT")
    rows = []
    for cluster in CLUSTERS:
        module = cd.kernel_module("dsmem_probe.cu", {"CLUSTER": cluster}, include_dirs=(PROBE_KERNEL_DIR,))
        ctas = sms // cluster * cluster
        for probe in ("store", "load"):
            fn = module.function(f"probe_{probe}", BUFFER_BYTES)
            for remote in (False, True):
                size = ctas * SLOTS * 4 if probe == "store" else ctas * THREADS
                result = torch.full((size,), -1, dtype=torch.int32, device="cuda")  # poisoned
                it_arg, remote_arg, out_arg = ctypes.c_int32(args.passes), ctypes.c_int32(int(remote)), ctypes.c_uint64(result.data_ptr())
                launch = lambda: cd.launch(fn, (ctas, 1, 1), (THREADS, 1, 1), BUFFER_BYTES, torch.cuda.current_stream().cuda_stream,
                                           [ctypes.addressof(it_arg), ctypes.addressof(remote_arg), ctypes.addressof(out_arg)])
                launch()
                torch.cuda.synchronize()
                got = result.cpu().numpy().view(np.uint32)
                want = (expected_store if probe == "store" else expected_load)(ctas, cluster, args.passes, remote)
                if not np.array_equal(got.reshape(want.shape), want):
                    raise SystemExit(f"dsmem_probe: {probe} cluster {cluster} {'remote' if remote else 'local'} gave a wrong result")
                ms = graph_time_ms(torch, launch, 5)
                total = ctas * args.passes * BUFFER_BYTES / ms / 1e9  # TB/s
                row = {"cluster": cluster, "probe": probe, "memory": "peer CTA" if remote else "own CTA", "ctas": ctas,
                       "ms": round(ms, 4), "tb_per_s": round(total, 3), "gb_per_s_per_sm": round(total * 1e3 / sms, 1)}
                rows.append(row)
                print(f"cluster {cluster} {probe:5s} {row['memory']:8s} {ms:8.3f} ms {total:7.2f} TB/s "
                      f"{row['gb_per_s_per_sm']:7.1f} GB/s per SM", flush=True)
    src = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = graph_time_ms(torch, lambda: dst.copy_(src), 5)
    hbm = 2 * src.numel() / ms / 1e9
    print(f"HBM copy {ms:8.3f} ms {hbm:7.2f} TB/s {hbm * 1e3 / sms:7.1f} GB/s per SM (read + write)")
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "sms": sms,
              "command": "python3 -m trtfuse.bench.dsmem_probe" + (" " + " ".join(argv) if argv else ""),
              "passes": args.passes, "rows": rows, "hbm_copy_tb_per_s": round(hbm, 3)}
    if args.out:
        atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
