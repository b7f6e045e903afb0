"""How fast do the tensor cores take int8 wgmmas in the conv kernel's operand layouts? Times
bench/probe_kernels/wgmma_peak.cu (wgmma alone: no copies, no barriers, no epilogue) on every SM (device only):

    python3 -m trtfuse.bench.wgmma_peak [--out FILE]

Each variant reports TOPS, its share of the 1979 TOPS datasheet peak, the SM clock it ran at (clock64 over
the global timer on one CTA) and its share of the peak at that clock, so a layout's cost and the clock's
cost read apart. Variants: wgmma N, 1 or 2 issuing warpgroups, operand B as 32-byte rows per k32 step (row
boxes), as 30-wide window views (the halo tiles), or as 128-byte rows (128-byte swizzle).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import sys

from trtfuse import args as flags
from ..io import atomic_write_json
from . import PROBE_KERNEL_DIR

PEAK_TOPS = 1979.0  # the datasheet's dense int8 figure: 132 SMs x 8192 ops per clock at 1.83 GHz
OPS_PER_SM_CLOCK = 8192
LAYOUTS = {0: "rows32", 1: "window32", 2: "rows128", 3: "window64"}
DEFAULT_VARIANTS = ["208:2:0", "208:2:1", "208:2:2", "256:2:0", "256:2:2", "128:2:0", "208:1:1", "256:1:2"]


def parse_variant(variant: str) -> tuple[int, int, int, int, int, int, int]:
    """'N:warpgroups:layout[:chains[:rs[:kt[:pitch[:turn]]]]]' -> its eight integers (one accumulator chain, operand A in
    shared memory unless named; with rs, kt k32 steps of A held in registers, 4 unless named; layout 3's tap rows pitch
    pair rows apart, 32 unless named; turn 1: two warpgroups in turns of kt / 4 batches, 0 (side by side) unless named)."""
    n, wgs, layout, *rest = (int(v) for v in variant.split(":"))
    rest += [1, 0, 4, 32, 0][len(rest):]
    return n, wgs, layout, rest[0], rest[1], rest[2], rest[3], rest[4]


def batches_run(iters: int, kt: int) -> int:
    """The kernel runs whole cycles of kt / 4 batches (the registers' k32 steps in order): iters rounded up to them."""
    per = kt // 4
    return -(-iters // per) * per


def launcher(torch, cd, variant: str, iters: int):
    """The peak kernel of one variant on every SM: (launch(), its clocks tensor [SM clocks, global-timer ns])."""
    from ..plugins.nvrtc import compile_kernel
    from ..plugins.wgmma import ARCH

    n, wgs, layout, chains, rs, kt, pitch, turn = parse_variant(variant)
    sms = cd.device_attribute("MULTIPROCESSOR_COUNT")
    module = cd.Module(compile_kernel("wgmma_peak.cu", {"PEAK_N": n, "PEAK_WGS": wgs, "PEAK_B": layout, "PEAK_CHAINS": chains,
                                                        "PEAK_RS": rs, "PEAK_RS_KT": kt, "PEAK_PITCH": pitch,
                                                        "PEAK_TURN": turn},
                                      ARCH, "cubin", include_dirs=(PROBE_KERNEL_DIR,)).image)
    b_bytes = n * 128 if layout == 2 else (n + 2 * pitch + 2) * 64 if layout == 3 else 4 * (n + 64) * 32
    smem = wgs * 64 * 128 + b_bytes + 1024
    fn = module.function("wgmma_peak", smem)
    out = torch.zeros(256, dtype=torch.int32, device="cuda")
    clocks = torch.zeros(2, dtype=torch.int64, device="cuda")
    args = [ctypes.c_int32(iters), ctypes.c_uint64(out.data_ptr()), ctypes.c_uint64(clocks.data_ptr())]

    def once(_alive=(module, out)):  # the module and the output buffer live as long as the launcher
        cd.launch(fn, (sms, 1, 1), (128 * wgs, 1, 1), smem, torch.cuda.current_stream().cuda_stream,
                  [ctypes.addressof(a) for a in args])

    return once, clocks


def main(argv=None) -> int:
    import torch

    from ..plugins import cuda_driver as cd

    ap = argparse.ArgumentParser()
    flags.out(ap)
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help="N:warpgroups:layout[:chains[:rs[:kt[:pitch[:turn]]]]] (parse_variant; layout 0 rows32, 1 window32, "
                    "2 rows128, 3 window64: the stride-2 windows' taps)")
    ap.add_argument("--iters", type=int, default=4000, help="batches of 4 wgmmas per warpgroup")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    torch.cuda.init()
    cd.context()
    sms = cd.device_attribute("MULTIPROCESSOR_COUNT")
    rows = []
    for variant in args.variants:
        once, clocks = launcher(torch, cd, variant, args.iters)
        n, wgs, layout, chains, rs, kt, pitch, turn = parse_variant(variant)
        once()
        torch.cuda.synchronize()
        times = []
        ghz = []
        for _ in range(5):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            once()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
            c, ns = clocks.tolist()
            ghz.append(c / ns)
        ms = sorted(times)[len(times) // 2]
        clock = sorted(ghz)[len(ghz) // 2]
        ops = 2.0 * 64 * n * 32 * 4 * chains * batches_run(args.iters, kt) * wgs * sms
        tops = ops / ms / 1e9
        row = {"variant": f"n{n} wg{wgs} {LAYOUTS[layout]}" + (f" {chains} chains" if chains > 1 else "") + (f" A in regs ({kt} steps)" if rs else "")
               + (f" pitch {pitch}" if layout == 3 else "") + (f" turns of {kt} steps" if turn else ""),
               "n": n, "warpgroups": wgs, "b_layout": LAYOUTS[layout], "chains": chains, "a_in_registers": bool(rs),
               "a_register_steps": kt if rs else 0, "pitch": pitch if layout == 3 else None, "turns": bool(turn),
               "ms": round(ms, 4), "tops": round(tops, 1), "pct_of_1979": round(100 * tops / PEAK_TOPS, 1),
               "sm_ghz": round(clock, 3), "pct_at_clock": round(100 * tops / (sms * OPS_PER_SM_CLOCK * clock / 1e3), 1)}
        rows.append(row)
        print(f"{row['variant']:22s} {ms:8.3f} ms {tops:7.1f} TOPS {row['pct_of_1979']:5.1f} % of 1979  "
              f"{clock:.3f} GHz  {row['pct_at_clock']:5.1f} % at that clock", flush=True)
    if args.out:
        atomic_write_json(args.out, {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                                     "command": "python3 -m trtfuse.bench.wgmma_peak " + " ".join(sys.argv[1:] if argv is None else argv),
                                     "iters": args.iters, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
