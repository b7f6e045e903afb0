"""One-call device check of the Hopper wgmma tactic (plugins/kernels/wgmma_conv.cu).

    python3 -m trtfuse.bench.wgmma_check build        # compile every wgmma tactic, resources, SASS census
    python3 -m trtfuse.bench.wgmma_check correctness  # small/edge shapes x every wgmma tactic vs the CPU golden
    python3 -m trtfuse.bench.wgmma_check tiny         # one small launch per tactic (for compute-sanitizer)
    python3 -m trtfuse.bench.wgmma_check timing [--out FILE]  # b256 layers: mma.sync vs wgmma vs torch._int_mm

Every check runs on fresh random data with the output poisoned first (bench/conv_problem.py).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import time

from ..plugins.conv import ConvLaunch
from ..plugins.tactics import WGMMA_TACTICS, ConvShape, choose
from .conv_problem import ConvProblem, DeviceConv, compare, passes_lsb_rule

EDGE_CASES = [
    # (label, shape, residual, relu)
    ("1x1 s1 K=96 (partial channel tile)", ConvShape(2, 64, 8, 8, 96, 1, 1), True, True),
    ("3x3 s1 14x14 C=128 K=256", ConvShape(2, 128, 14, 14, 256, 3, 3, (1, 1), (1, 1, 1, 1)), True, True),
    ("3x3 s1 C=40 K=40 13x11 (channel pad)", ConvShape(2, 40, 13, 11, 40, 3, 3, (1, 1), (1, 1, 1, 1)), True, True),
    ("3x3 s2 15x13 C=64 K=160", ConvShape(3, 64, 15, 13, 160, 3, 3, (2, 2), (1, 1, 1, 1)), False, True),
    ("3x3 s1 7x7 N=9 (image tiles, N % nb)", ConvShape(9, 256, 7, 7, 128, 3, 3, (1, 1), (1, 1, 1, 1)), True, True),
    ("1x1 s2 9x9 C=96 K=200 pad0", ConvShape(3, 96, 9, 9, 200, 1, 1, (2, 2)), False, True),
    ("3x3 asym pad (0,1,2,1) 10x12", ConvShape(2, 64, 10, 12, 64, 3, 3, (1, 1), (0, 1, 2, 1)), True, False),
    ("5x5 s1 pad2 C=32 K=128", ConvShape(2, 32, 9, 9, 128, 5, 5, (1, 1), (2, 2, 2, 2)), False, False),
    ("3x3 s1 28x28 C=128 K=128 (row tiles)", ConvShape(2, 128, 28, 28, 128, 3, 3, (1, 1), (1, 1, 1, 1)), True, True),
    ("3x3 s2 56->28 C=128", ConvShape(1, 128, 56, 56, 128, 3, 3, (2, 2), (1, 1, 1, 1)), False, True),
    ("tiny M=1", ConvShape(1, 32, 1, 1, 32, 1, 1), True, True),
    ("3x3 56x56 K=256: 152 tiles > 132 SMs", ConvShape(4, 32, 56, 56, 256, 3, 3, (1, 1), (1, 1, 1, 1)), True, True),
]


def _run_case(shape, res, relu, tactic):
    problem = ConvProblem.random(shape, res, relu)
    shape = problem.shape  # its `residual` says whether the problem has one
    dev = DeviceConv(problem, ConvLaunch(shape, tactic, 1))
    out, raw = dev.run_checked()
    stats = compare(out, problem.golden())
    padded = raw.transpose(0, 1, 4, 2, 3).reshape(shape.n, -1, *raw.shape[2:4])
    pad_ok = not padded[:, shape.k:].any()
    return passes_lsb_rule(stats) and pad_ok, stats, pad_ok


def build() -> int:
    from ..plugins.nvrtc import compile_kernel

    bad = 0
    for t in WGMMA_TACTICS:
        k = compile_kernel("wgmma_conv.cu", t.defines(), "sm_90a", "cubin")
        res = k.resources.get("trtfuse_wgmma_conv")
        warn = [ln for ln in k.log.splitlines() if "warning" in ln.lower() or "serializ" in ln.lower()]
        census = ""
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.image)
            f.flush()
            try:
                sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True, timeout=60).stdout
                ops = {op: sass.count(op) for op in ("IGMMA", "HGMMA", "UTMALDG", "SYNCS", "IMMA", "LDL", "STL", "USETMAXREG")}
                census = " ".join(f"{o}={n}" for o, n in ops.items())
            except Exception as exc:  # no cuobjdump here
                census = f"(no SASS: {type(exc).__name__})"
        print(f"{t.name}: {res} smem={t.shared_bytes()} {census} {' | '.join(warn)}")
        bad += bool(k.spills())
    return 1 if bad else 0


def correctness() -> int:
    bad = 0
    for label, shape, res, relu in EDGE_CASES:
        shape = dataclasses.replace(shape, residual=res)
        for t in WGMMA_TACTICS:
            if t.geometry(shape) is None:
                print(f"  skip {t.name} {label}: geometry unsupported")
                continue
            t0 = time.time()
            try:
                ok, stats, pad_ok = _run_case(shape, res, relu, t)
            except Exception as exc:
                ok, stats, pad_ok = False, {"error": repr(exc)[:300]}, False
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {t.name:30s} {label:40s} {stats} pad0={pad_ok} {time.time() - t0:.1f}s")
    print(f"correctness: {bad} failing")
    return 1 if bad else 0


def tiny() -> int:
    """Small launches of one-tile-per-CTA and persistent tactics (32- and 128-byte weight boxes, the
    2-CTA multicast cluster, the pixel-major tiles with and without resident weights, ping-pong, flat pixel groups); persistent grids are capped at 2 CTAs (TRTFUSE_WGMMA_MAX_CTAS) so each CTA
    walks several tiles through the ring."""
    import os

    os.environ["TRTFUSE_WGMMA_MAX_CTAS"] = "2"
    # TRTFUSE_TINY_TACTICS=45,46: only those (a sanitizer run on the tactics a change touched)
    only = {int(i) for i in os.environ.get("TRTFUSE_TINY_TACTICS", "").split(",") if i}
    bad = 0
    cases = [(ConvShape(2, 64, 6, 5, 160, 3, 3, (1, 1), (1, 1, 1, 1)), True),
             (ConvShape(3, 64, 4, 4, 64, 3, 3, (2, 2), (1, 1, 1, 1)), False),
             (ConvShape(2, 32, 20, 20, 256, 3, 3, (1, 1), (1, 1, 1, 1)), True),
             (ConvShape(2, 64, 12, 10, 256, 1, 1), True),  # short GEMM-K: the resident-weight tiles
             (ConvShape(2, 256, 8, 8, 256, 1, 1), False),  # no residual: the tiles without residual buffers
             (ConvShape(13, 64, 5, 5, 64, 3, 3, (1, 1), (1, 1, 1, 1)), True),  # window tiles of several images side by side
             (ConvShape(2, 64, 24, 28, 96, 3, 3, (2, 2), (1, 1, 1, 1)), False),  # stride-2 windows
             (ConvShape(2, 128, 22, 16, 96, 3, 3, (2, 2), (1, 1, 1, 1)), True),  # ... with a residual
             (ConvShape(9, 64, 14, 14, 160, 3, 3, (2, 2), (1, 1, 1, 1)), True),  # stride-2 windows of stacked images
             (ConvShape(2, 128, 28, 24, 96, 3, 3, (2, 2), (1, 1, 1, 1)), True),  # quad windows (w89) with a residual
             (ConvShape(8, 96, 14, 14, 160, 1, 1, (2, 2)), True),  # stride-2 flat tiles: 7 x 7 outputs, one-pixel boxes
             (ConvShape(16, 64, 28, 28, 96, 1, 1, (2, 2)), False),  # ... 14 x 14 outputs, pixel-pair boxes, no residual
             (ConvShape(8, 64, 24, 24, 96, 1, 1, (2, 2)), False)]  # ... 12 x 12 outputs (a map in 8s), 4-pixel boxes
    by_id = {t.id: t for t in WGMMA_TACTICS}
    tiny_ids = (22, 24, 28, 31, 33, 35, 40, 41, 43, 45, 46, 50, 52, 53, 54, 55, 56, 57, 59, 60, 61, 64, 70, 71, 73, 65, 74, 89, 66, 67, 68, 69)
    for shape, res in cases:
        shape = dataclasses.replace(shape, residual=res)
        for t in (by_id[i] for i in tiny_ids):
            if only and t.id not in only:
                continue
            if t.geometry(shape) is None:
                continue
            ok, stats, _ = _run_case(shape, res, True, t)
            bad += not ok
            print(f"tiny {t.name} {shape}: {'ok' if ok else 'MISMATCH'} {stats}")
    return 1 if bad else 0


TIMED_TACTICS = (22, 24, 26, 28, 30, 31, 32, 33, 34, 35, 40, 41, 42)  # 32- vs 128-byte weight boxes, multicast clusters, one tile per CTA and persistent
TIMED = [
    ("res3 conv2 3x3 128", ConvShape(256, 128, 28, 28, 128, 3, 3, (1, 1), (1, 1, 1, 1))),
    ("res4 conv2 3x3 256", ConvShape(256, 256, 14, 14, 256, 3, 3, (1, 1), (1, 1, 1, 1))),
    ("res5 conv2 3x3 512", ConvShape(256, 512, 7, 7, 512, 3, 3, (1, 1), (1, 1, 1, 1))),
    ("res3 first conv2 3x3/2", ConvShape(256, 128, 56, 56, 128, 3, 3, (2, 2), (1, 1, 1, 1))),
    ("res4 first conv2 3x3/2", ConvShape(256, 256, 28, 28, 256, 3, 3, (2, 2), (1, 1, 1, 1))),
    ("res5 first conv2 3x3/2", ConvShape(256, 512, 14, 14, 512, 3, 3, (2, 2), (1, 1, 1, 1))),
    ("res4 conv1 1x1 1024->256", ConvShape(256, 1024, 14, 14, 256, 1, 1)),
    ("res5 conv1 1x1 2048->512", ConvShape(256, 2048, 7, 7, 512, 1, 1)),
    ("res3 conv3 1x1 128->512", ConvShape(256, 128, 28, 28, 512, 1, 1)),
]


class TorchOperands:
    """One problem's packed operands and output on the GPU as torch tensors (batch-256 timings; the
    output is not poisoned here), and `launcher(plan)`: a no-argument launch of `plan` on them on torch's
    current stream, as graph_time_ms captures it."""

    def __init__(self, torch, problem: ConvProblem):
        import numpy as np

        from ..plugins.layout import pack_nchwv, pack_weight, round_up

        shape = problem.shape
        oh, ow = shape.out_hw
        dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
        self.torch = torch
        self.x, self.w = dev(pack_nchwv(problem.x, 32)), dev(pack_weight(problem.w))
        self.scale, self.bias, self.out_scale = dev(problem.scale), dev(problem.bias), dev(problem.out_scale)
        self.y = torch.empty((shape.n, round_up(shape.k, 32) // 32, oh, ow, 32), dtype=torch.int8, device="cuda")
        self.res = dev(pack_nchwv(problem.residual, 32)) if problem.residual is not None else None
        self.res_scale = dev(problem.residual_scale) if problem.residual is not None else None

    def launcher(self, plan):
        t = self.torch
        res = {} if self.res is None else {"residual": self.res.data_ptr(), "residual_scale": self.res_scale.data_ptr()}
        return lambda: plan.launch(self.x.data_ptr(), self.w.data_ptr(), self.scale.data_ptr(), self.bias.data_ptr(),
                                   self.out_scale.data_ptr(), self.y.data_ptr(), relu=True,
                                   stream=t.cuda.current_stream().cuda_stream, **res)


def timing(out_path: str | None) -> int:  # noqa: C901 (one script per device call)
    import torch

    from ..plugins import cuda_driver as cd
    from ..plugins.layout import round_up
    from .conv_problem import POISON
    from .kernels import INT8_PEAK_TOPS, golden_on_device, graph_time_ms

    torch.cuda.init()
    cd.context()
    reps = 10
    rows, bad = [], 0
    for name, shape in TIMED:
        problem = ConvProblem.random(shape, False)
        m, n_pad, kg = shape.gemm
        oh, ow = shape.out_hw
        kp = round_up(shape.k, 32)
        ops = TorchOperands(torch, problem)
        w, y, runner = ops.w, ops.y, ops.launcher
        golden = None  # the float64 golden on the GPU for the 14x14 / 7x7 layers; elsewhere the mma.sync output
        if shape.h <= 14:
            golden = golden_on_device(torch, problem)

        def check(plan):
            nonlocal golden
            y.fill_(POISON)
            runner(plan)()
            torch.cuda.synchronize()
            out = y.permute(0, 1, 4, 2, 3).reshape(shape.n, kp, oh, ow)
            if golden is None:  # first call is the mma.sync plan (itself proven against the golden by its tests)
                golden = out[:, : shape.k].clone()
                return True
            diff = (out[:, : shape.k].int() - golden.int()).abs()
            pad_ok = bool((out[:, shape.k:] == 0).all())
            return bool((diff == 0).float().mean() >= 0.999 and int(diff.max()) <= 1 and pad_ok)

        flops = 2.0 * m * shape.k * shape.c * shape.r * shape.s
        t_mma, s_mma = choose(shape)
        mma_plan = ConvLaunch(shape, t_mma, s_mma)
        rec = {"layer": name, "M": m, "N": shape.k, "K": kg, "mma_tactic": f"{t_mma.name}/s{s_mma}",
               "mma_ms": graph_time_ms(torch, runner(mma_plan), reps), "mma_ok": check(mma_plan), "wgmma": {}}
        for t in WGMMA_TACTICS:
            if t.geometry(shape) is None or t.id not in TIMED_TACTICS:
                continue
            plan = ConvLaunch(shape, t, 1)
            try:
                ok = check(plan)
                ms = graph_time_ms(torch, runner(plan), reps)
            except Exception as exc:
                print(f"{name} {t.name}: {exc!r}"[:300])
                ok, ms = False, float("nan")
            rec["wgmma"][t.name] = {"ms": ms, "ok": ok, "tops": flops / (ms * 1e-3) / 1e12}
            bad += not ok
        heur, _ = choose(shape, arch="sm_90")
        rec["heuristic_sm90"] = heur.name
        a_mat = torch.randint(-128, 128, (m, kg), dtype=torch.int8, device="cuda")
        b_mat = w.t()
        rec["int_mm_ms"] = graph_time_ms(torch, lambda: torch._int_mm(a_mat, b_mat), reps)
        del a_mat
        rec["mma_tops"] = flops / (rec["mma_ms"] * 1e-3) / 1e12
        rec["int_mm_tops"] = flops / (rec["int_mm_ms"] * 1e-3) / 1e12
        rows.append(rec)
        torch.cuda.empty_cache()
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "peak_tops": INT8_PEAK_TOPS, "records": rows}, f, indent=1)
    print(f"\n{'layer':26s} {'M':>6s} {'N':>4s} {'K':>5s} | {'mma.sync':>8s} | {'best wgmma':>30s} {'ms':>7s} {'TOPS':>6s} {'%pk':>4s} ok | {'int_mm':>7s} {'x_intmm':>7s} heur")
    for r in rows:
        best = min(r["wgmma"].items(), key=lambda kv: kv[1]["ms"] if kv[1]["ms"] == kv[1]["ms"] else 1e9, default=None)
        if best is None:
            continue
        bn, b = best
        print(f"{r['layer']:26s} {r['M']:6d} {r['N']:4d} {r['K']:5d} | {r['mma_ms']:8.4f} | {bn:>30s} {b['ms']:7.4f} {b['tops']:6.0f} "
              f"{100 * b['tops'] / INT8_PEAK_TOPS:4.0f} {'y' if b['ok'] else 'N'} | {r['int_mm_ms']:7.4f} {r['int_mm_ms'] / b['ms']:7.2f} {r['heuristic_sm90']}")
    return 1 if bad else 0


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "correctness"
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    return {"build": build, "correctness": correctness, "tiny": tiny, "timing": lambda: timing(out)}[mode]()


if __name__ == "__main__":
    sys.exit(main())
