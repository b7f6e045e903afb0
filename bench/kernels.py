"""`trtfuse bench kernels`: the fused INT8 conv per ResNet-50 layer (and seed 000's shapes) against
our own unfused pair, cuBLASLt int8 GEMM (torch._int_mm, no epilogue), cuDNN fp16 conv(+add+relu)
channels_last, and the memory/compute floors. Each figure is the median over CUDA-graph replays
(many launches per replay, so launch overhead is out), timed with CUDA events. Every layer is
first checked against the golden semantics on fresh random data with the output poisoned.
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import sys

import numpy as np

from trtfuse import args as flags
from ..errors import TrtfuseError
from ..ui import print_json, print_table, progress

INT8_PEAK_TOPS = 1979.0  # H100/H200 SXM dense int8 (datasheet)


def add_arguments(p) -> None:
    flags.batch(p, [1, 8, 256], "batch sizes (default 1 8 256)", nargs="+")
    p.add_argument("--layers", choices=["resnet50", "seed000", "all"], default="all")
    p.add_argument("--filter", help="only layers whose name contains this text")
    flags.autotune(p, "time every tactic and split count, keep the best")
    p.add_argument("--no-baselines", action="store_true", help="time only our kernels")
    flags.reps(p, 15, "timed graph replays per figure")
    p.add_argument("--roofline", help="write a roofline PNG here")


def _torch():
    try:
        import torch
    except ImportError:
        raise TrtfuseError("trtfuse bench kernels needs PyTorch with CUDA (for baselines and timing)") from None
    if not torch.cuda.is_available():
        raise TrtfuseError("trtfuse bench kernels needs a CUDA GPU")
    return torch


def captured_graph(torch, fn, target_ms: float = 2.0):
    """fn warmed up, then captured `inner` times back to back in one CUDA graph of about target_ms (2 to 200 calls):
    (graph, inner, the stream it was captured on)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    with torch.cuda.stream(stream):
        fn()
    stop.record(stream)
    stop.synchronize()
    inner = int(min(200, max(2, target_ms / max(start.elapsed_time(stop), 1e-3))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(inner):
            fn()
    return graph, inner, stream


def graph_time_ms(torch, fn, reps: int) -> float:
    """Median ms of one fn() call: fn captured in a CUDA graph of ~2 ms (captured_graph), replays timed by events."""
    graph, inner, stream = captured_graph(torch, fn)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):  # replay and events on one stream
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start.record(stream)
            graph.replay()
            stop.record(stream)
            stop.synchronize()
            times.append(start.elapsed_time(stop) / inner)
    return statistics.median(times)


def copy_bandwidth_tbps(torch) -> float:
    """Device-to-device copy, bytes read + written, as the memory ceiling."""
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = graph_time_ms(torch, lambda: b.copy_(a), 5)
    return 2 * (2 << 30) / (ms * 1e-3) / 1e12


def fma_f32_on_device(torch, a, b, c):
    """plugins/reference.py's fma_f32 with torch on the GPU: float32 a * b + c rounded once (the float64 sum rounded to
    odd, then to float32), elementwise with broadcasting."""
    a, b, c = (t.float().double() for t in (a, b, c))
    p = a * b  # exact: two 24-bit significands
    s = p + c
    bp = s - p
    err = (p - (s - bp)) + (c - bp)  # exact: s + err == p + c
    inexact_even = (err != 0) & ((s.view(torch.int64) & 1) == 0)
    toward = torch.where(err > 0, torch.full_like(s, float("inf")), torch.full_like(s, float("-inf")))
    return torch.where(inexact_even, torch.nextafter(s, toward), s).float()


def golden_on_device(torch, problem):
    """docs/ops.md semantics with torch on the GPU, bit for bit plugins/reference.py's fused_conv_int8: float64 conv on
    integer values (exact), the folded scales (reference.folded_scales), then each float32 fused multiply-add rounded
    once (fma_f32_on_device), ReLU, round half to even, saturate. tests/test_conv_kernel_gpu.py shows it equals the
    numpy reference."""
    from ..plugins.reference import folded_scales

    sh = problem.shape
    x = torch.nn.functional.pad(torch.from_numpy(problem.x).cuda().double(), (sh.pads[1], sh.pads[3], sh.pads[0], sh.pads[2]))
    acc = torch.nn.functional.conv2d(x, torch.from_numpy(problem.w).cuda().double(), stride=sh.stride).round().long()
    k = sh.k
    residual_scale = None if problem.residual is None else float(np.asarray(problem.residual_scale).reshape(-1)[0])
    a, b, rs = folded_scales(problem.scale[:k], problem.bias[:k], float(np.asarray(problem.out_scale).reshape(-1)[0]),
                             residual_scale)
    per_channel = lambda v: torch.from_numpy(np.ascontiguousarray(v)).cuda().view(1, k, 1, 1)
    v = fma_f32_on_device(torch, acc.float(), per_channel(a), per_channel(b))
    if problem.residual is not None:
        v = fma_f32_on_device(torch, torch.from_numpy(problem.residual).cuda().float(),
                              torch.tensor(rs, dtype=torch.float32, device="cuda"), v)
    if problem.relu:
        v = torch.clamp_min(v, 0.0)
    return torch.round(v).clamp(-128, 127).to(torch.int8)


def floors(bytes_moved: float, ops: float, ours_ms: float, bw_tbps: float) -> dict:
    """A record's floors: memory (bytes_moved at the copy bandwidth measured in the run), compute (ops at the int8
    peak), the larger of the two, and the rate ours_ms reached."""
    memory_ms = bytes_moved / (bw_tbps * 1e12) * 1e3
    compute_ms = ops / (INT8_PEAK_TOPS * 1e12) * 1e3
    return {"floor_memory_ms": memory_ms, "floor_compute_ms": compute_ms, "floor_ms": max(memory_ms, compute_ms),
            "ours_tops": ops / (ours_ms * 1e-3) / 1e12}


def bench_layer(torch, name, shape, has_res, args, bw_tbps):
    from ..plugins.conv import ConvLaunch, precompile
    from ..plugins.elementwise import add_relu_requant
    from ..plugins import stem
    from ..plugins.layout import pack_nchwv, pack_weight, round_up
    from ..plugins.tactics import candidate_tactics
    from .conv_problem import POISON, ConvProblem, passes_lsb_rule

    problem = ConvProblem.random(shape, has_res)
    m, n_pad, kg = shape.gemm
    oh, ow = shape.out_hw
    kp = round_up(shape.k, 32)
    dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
    x = dev(pack_nchwv(problem.x, shape.vec))
    w = dev(pack_weight(problem.w, shape.vec))
    scale, bias, out_scale = dev(problem.scale), dev(problem.bias), dev(problem.out_scale)
    res = dev(pack_nchwv(problem.residual, 32)) if has_res else None
    res_scale = dev(problem.residual_scale) if has_res else None
    y = torch.empty((shape.n, kp // 32, oh, ow, 32), dtype=torch.int8, device="cuda")
    cur = lambda: torch.cuda.current_stream().cuda_stream

    # The space-to-depth stem (plugins/stem.py) runs a different conv on folded operands, same output.
    operands = {id(shape): (x, w)}
    if stem.applies(shape):
        folded = problem.folded()
        operands[id(folded.shape)] = (dev(pack_nchwv(folded.x, folded.shape.vec)), dev(pack_weight(folded.w, folded.shape.vec)))

    def make_run(plan, relu=True, with_res=True, out=y):
        ws = torch.zeros(max(plan.workspace_bytes, 4), dtype=torch.uint8, device="cuda")
        r = res if with_res else None
        rs = res_scale if with_res else None
        xb, wb = operands[id(plan.shape)]
        return lambda: plan.launch(xb.data_ptr(), wb.data_ptr(), scale.data_ptr(), bias.data_ptr(), out_scale.data_ptr(),
                                   out.data_ptr(), residual=r.data_ptr() if r is not None else 0,
                                   residual_scale=rs.data_ptr() if rs is not None else 0, relu=relu,
                                   workspace=ws.data_ptr() if plan.workspace_bytes else 0, stream=cur())

    from ..plugins.cuda_driver import compute_capability

    arch = compute_capability()  # sm_90: the wgmma tactics (plugins/wgmma.py) join the heuristic and autotune
    forms = [shape] + ([folded.shape] if stem.applies(shape) else [])
    heuristic_plan = ConvLaunch.plan(forms[-1])  # what the GPU runner launches for this layer
    heuristic_tactic, heuristic_splits = heuristic_plan.tactic, heuristic_plan.splits
    plans = [heuristic_plan]
    if args.autotune:
        for form in forms:
            ktiles = math.ceil(form.gemm[2] / 64)
            for t in candidate_tactics(form, arch):
                for s in (1, 2, 4, 8) if t.family == "mma" else (1,):
                    if s <= max(1, ktiles // 2) and not (form is heuristic_plan.shape and t == heuristic_tactic and s == heuristic_splits):
                        plans.append(ConvLaunch(form, t, s))
    # Which plan a failing launch came from: graph_time_ms synchronizes before it returns, so an error is
    # reported while the plan that caused it is timed, right after its name.
    trace = os.environ.get("TRTFUSE_BENCH_TRACE")

    def time_plan(p):
        if trace:
            print(f"trace: {name} batch {shape.n} {p.tactic.name} splits {p.splits}", file=sys.stderr, flush=True)
        return graph_time_ms(torch, make_run(p), args.reps)

    precompile([p.tactic for p in plans], arch)  # side by side (NVRTC releases the GIL), not one by one as timed
    timed = [(time_plan(p), p) for p in plans]
    ours_ms, best = min(timed, key=lambda tp: tp[0])
    form_label = lambda plan: "space-to-depth CHW16" if plan.shape is not shape else f"CHW{shape.vec}"
    best_by_form = {}
    for ms, plan in timed:
        best_by_form[form_label(plan)] = min(ms, best_by_form.get(form_label(plan), ms))

    # Correctness of the chosen plan on this layer's data, output poisoned first.
    y.fill_(POISON)
    make_run(best)()
    torch.cuda.synchronize()
    out = y.permute(0, 1, 4, 2, 3).reshape(shape.n, kp, oh, ow)
    golden = golden_on_device(torch, problem)
    diff = (out[:, : shape.k].int() - golden.int()).abs()
    stats = {"exact_fraction": float((diff == 0).float().mean()), "max_abs_diff": int(diff.max())}
    pad_zero = bool((out[:, shape.k :] == 0).all())
    correct = passes_lsb_rule(stats) and pad_zero

    rec = {"layer": name, "batch": shape.n, "M": m, "N": shape.k, "K": shape.c * shape.r * shape.s, "K_gemm": kg,
           "residual": has_res, "tactic": best.tactic.name, "family": best.tactic.family, "splits": best.splits,
           "form": form_label(best), "best_ms_by_form": best_by_form,
           "heuristic": heuristic_plan.name, "heuristic_ms": timed[0][0],
           "ours_ms": ours_ms, "correct": correct, **stats}
    bytes_moved = x.numel() + w.numel() + y.numel() + (res.numel() if has_res else 0)
    rec.update(floors(bytes_moved, 2.0 * m * shape.k * shape.c * shape.r * shape.s, ours_ms, bw_tbps))

    rec["unfused_ms"] = rec["cublaslt_int8_ms"] = rec["cudnn_fp16_ms"] = None
    if has_res:  # our own unfused pair: conv(+scale, bias, requant) then add + ReLU + requant
        t_buf = torch.empty_like(y)
        conv_only = make_run(ConvLaunch(best.shape, best.tactic, best.splits), relu=False, with_res=False, out=t_buf)
        t_scale = dev(np.array([0.05], np.float32))

        def unfused():
            conv_only()
            add_relu_requant(t_buf.data_ptr(), t_scale.data_ptr(), res.data_ptr(), res_scale.data_ptr(),
                             out_scale.data_ptr(), True, y.numel(), y.data_ptr(), stream=cur())

        rec["unfused_ms"] = graph_time_ms(torch, unfused, args.reps)
    if not args.no_baselines:
        if m > 16 and kg % 8 == 0 and kp % 8 == 0:
            a_mat = torch.randint(-128, 128, (m, kg), dtype=torch.int8, device="cuda")
            b_mat = w.t()  # [KG, Kpad] column-major: cuBLASLt's preferred TN int8 layout
            rec["cublaslt_int8_ms"] = graph_time_ms(torch, lambda: torch._int_mm(a_mat, b_mat), args.reps)
            del a_mat
        torch.backends.cudnn.benchmark = True
        xf = torch.randn(shape.n, shape.c, shape.h, shape.w, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        wf = torch.randn(shape.k, shape.c, shape.r, shape.s, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        rf = torch.randn(shape.n, shape.k, oh, ow, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last) if has_res else None
        pad = (shape.pads[1], shape.pads[3], shape.pads[0], shape.pads[2])
        sym = shape.pads[0] == shape.pads[2] and shape.pads[1] == shape.pads[3]

        def cudnn():
            inp = xf if sym else torch.nn.functional.pad(xf, pad)
            out_f = torch.nn.functional.conv2d(inp, wf, stride=shape.stride, padding=(shape.pads[0], shape.pads[1]) if sym else 0)
            if rf is not None:
                out_f = out_f + rf
            return torch.relu_(out_f)

        rec["cudnn_fp16_ms"] = graph_time_ms(torch, cudnn, args.reps)
    return rec


def pooled_golden_on_device(torch, problem) -> np.ndarray:
    """The stem conv's golden (golden_on_device) then the 3x3/2 max-pool, int8 NCHW on the host."""
    conv = golden_on_device(torch, problem).float()
    return torch.nn.functional.max_pool2d(conv, 3, 2, 1).to(torch.int8).cpu().numpy()  # pads with -inf: never wins


def bench_stem_pool(torch, shape, args, bw_tbps) -> dict:
    """The stem conv fused with its 3x3/2 max-pool (plugins/kernels/stem_pool.cu, stem_pool_rows.cu: every tile the GPU
    runs) against the two kernels it replaces
    (the runner's heuristic stem plan, then trtfuse_maxpool_chw32): times, and its output (poisoned first) against
    the golden conv then max-pool computed on the device."""
    from ..plugins import cuda_driver as cd
    from ..plugins import network_ops, stem
    from ..plugins.conv import ConvLaunch
    from .conv_problem import ConvProblem, DeviceConv, DeviceStemPool, passes_lsb_rule

    cur = lambda: torch.cuda.current_stream().cuda_stream
    problem = ConvProblem.random(shape, False)
    fused = DeviceStemPool(problem)
    folded = problem.folded()
    tile_ms = {}
    arch = cd.compute_capability(cd.current_device())
    for tile in stem.pool_tiles(arch):  # the tiles autotune chooses from
        fused.tile = tile
        tile_ms[tile] = graph_time_ms(torch, lambda: fused.run(stream=cur()), args.reps)
    fused.tile = min(tile_ms, key=tile_ms.get)
    heuristic = stem.default_tile(arch)  # the runner's tile without autotune or plans
    pair_conv = DeviceConv(folded, ConvLaunch.plan(folded.shape))
    oh, ow = shape.out_hw
    pooled = torch.empty(fused.y_shape, dtype=torch.int8, device="cuda")

    def pair():
        pair_conv.run(stream=cur())
        network_ops.maxpool(pair_conv.y.ptr, shape.n, shape.k, oh, ow, *stem.POOL_WINDOW, pooled.data_ptr(), stream=cur())

    ours_ms = tile_ms[fused.tile]
    pair_ms = graph_time_ms(torch, pair, args.reps)
    out, _ = fused.run_checked()
    golden = pooled_golden_on_device(torch, problem)
    diff = np.abs(out.astype(np.int32) - golden.astype(np.int32))
    stats = {"exact_fraction": float((diff == 0).mean()), "max_abs_diff": int(diff.max())}
    m = shape.n * oh * ow
    macs = shape.k * shape.c * shape.r * shape.s
    rec = {"layer": "stem 7x7/2 + max-pool 3x3/2", "batch": shape.n, "M": m, "N": shape.k, "K": shape.c * shape.r * shape.s,
           "K_gemm": folded.shape.gemm[2], "residual": False, "tactic": f"stem_pool/{stem.tile_name(fused.tile)}", "family": "mma", "splits": 1,
           "form": "space-to-depth CHW16, pooled CHW32", "fused_with_pool": True,
           "ms_by_tile": {stem.tile_name(t): ms for t, ms in tile_ms.items()}, "heuristic": f"stem_pool/{stem.tile_name(heuristic)}",
           "heuristic_ms": tile_ms[heuristic], "ours_ms": ours_ms,
           "unfused_ms": pair_ms, "unfused": f"{pair_conv.launch_plan.name} + maxpool",
           "correct": passes_lsb_rule(stats), **stats}
    rec.update(floors(fused.x.nbytes + fused.w.nbytes + fused.y.nbytes, 2.0 * m * macs, ours_ms, bw_tbps))
    rec["cublaslt_int8_ms"] = rec["cudnn_fp16_ms"] = None
    return rec


def bench_stem_conv1(torch, shape, args, bw_tbps) -> dict:
    """The stem + max-pool kernel's row tile with res2's first conv1 (1x1 64 -> 64) inside (STEM_POOL_ROWS_CONV1, as the
    GPU runner runs it on Hopper) against the stem + max-pool alone on the same tile and then that conv's own kernel
    (the runner's heuristic plan): times, and both outputs (poisoned first) against goldens computed on the device."""
    from ..plugins import cuda_driver as cd
    from ..plugins import stem
    from ..plugins.conv import ConvLaunch
    from ..plugins.conv_shape import ConvShape
    from .conv_problem import ConvProblem, DeviceConv, DeviceStemPool, passes_lsb_rule

    cur = lambda: torch.cuda.current_stream().cuda_stream
    tile = stem.default_tile(cd.compute_capability(cd.current_device()))
    problem = ConvProblem.random(shape, False)
    pooled = pooled_golden_on_device(torch, problem)
    ph, pw = stem.pooled_hw(shape)
    conv1 = ConvProblem.random(ConvShape(shape.n, 64, ph, pw, 64, 1, 1, residual=False), False)
    fused = DeviceStemPool(problem, tile=tile, conv1=conv1, pooled_golden=pooled)
    alone = DeviceStemPool(problem, tile=tile)
    separate = DeviceConv(fused.conv1, ConvLaunch.plan(fused.conv1.shape))
    ours_ms = graph_time_ms(torch, lambda: fused.run(stream=cur()), args.reps)
    pair_ms = graph_time_ms(torch, lambda: (alone.run(stream=cur()), separate.run(stream=cur())), args.reps)
    out, _ = fused.run_checked()
    out1, _ = fused.conv1_output()
    golden1 = golden_on_device(torch, fused.conv1).cpu().numpy()
    diffs = [np.abs(a.astype(np.int32) - b.astype(np.int32)) for a, b in ((out, pooled), (out1, golden1))]
    stats = {"exact_fraction": float(min((d == 0).mean() for d in diffs)), "max_abs_diff": int(max(d.max() for d in diffs))}
    m = shape.n * ph * pw
    oh, ow = shape.out_hw
    macs = shape.k * shape.c * shape.r * shape.s * (oh * ow) // (ph * pw) + 64 * 64  # per pooled pixel: stem's, conv's
    name = f"stem_pool/{stem.tile_name(tile)}+conv1"
    rec = {"layer": "stem 7x7/2 + max-pool 3x3/2 + res2 first conv1, one kernel", "batch": shape.n, "M": m, "N": 64,
           "K": macs, "K_gemm": macs, "residual": False, "tactic": name, "family": "wgmma", "splits": 1,
           "form": "space-to-depth CHW16, pooled and conv1 CHW32", "fused_with_pool": True, "replaces": 2,
           "heuristic": name, "heuristic_ms": ours_ms, "ours_ms": ours_ms, "unfused_ms": pair_ms,
           "unfused": f"stem_pool/{stem.tile_name(tile)} + {separate.launch_plan.name}",
           "correct": passes_lsb_rule(stats), **stats}
    rec.update(floors(fused.x.nbytes + 2 * fused.y.nbytes, 2.0 * m * macs, ours_ms, bw_tbps))
    rec["cublaslt_int8_ms"] = rec["cudnn_fp16_ms"] = None
    return rec


TAIL_LAYERS = ("tail average pool 7x7x2048 -> fp32", "tail classifier fp32 2048 -> 1000", "tail top-1 of 1000")
FP32_PEAK_TFLOPS = 66.9  # H100/H200 SXM fp32 FMA (datasheet): the classifier's compute floor


def bench_tail(torch, n, args, bw_tbps) -> list[dict]:
    """ResNet-50's tail as the GPU runner runs it after res5 (plugins/network_ops.py): the fp32 average pool of the
    int8 CHW32 7x7x2048 map, the fp32 classifier (one sequential fmaf chain per output: docs/ops.md) and the row-wise
    top-1, each timed alone (its input L2-warm, as it is after the layer before it) against PyTorch's fp32 op (cuBLAS
    for the classifier, TF32 off), each output poisoned first and compared bit for bit with the reference."""
    from ..plugins import network_ops
    from ..plugins import reference as ref
    from ..plugins.layout import pack_nchwv

    cur = lambda: torch.cuda.current_stream().cuda_stream
    rng = np.random.default_rng()
    c, hw, classes = 2048, 7, 1000
    x = rng.integers(-128, 128, (n, c, hw, hw), dtype=np.int8)
    scale = np.array([0.0173], np.float32)
    w = (rng.normal(size=(classes, c)) * 0.02).astype(np.float32)
    bias = rng.normal(size=classes).astype(np.float32)
    xd = torch.from_numpy(pack_nchwv(x, 32)).cuda()
    sd, wd, bd = (torch.from_numpy(a).cuda() for a in (scale, w, bias))
    pooled = torch.empty((n, c), dtype=torch.float32, device="cuda")
    logits = torch.empty((n, classes), dtype=torch.float32, device="cuda")
    top1 = torch.empty(n, dtype=torch.int32, device="cuda")
    runs = {
        "avgpool": lambda: network_ops.global_avgpool_f32(xd.data_ptr(), sd.data_ptr(), n, c, hw, hw, pooled.data_ptr(), stream=cur()),
        "classifier": lambda: network_ops.linear_f32(pooled.data_ptr(), wd.data_ptr(), bd.data_ptr(), n, classes, c, logits.data_ptr(), stream=cur()),
        "top-1": lambda: network_ops.argmax_rows(logits.data_ptr(), n, classes, top1.data_ptr(), stream=cur()),
    }
    for out in (pooled, logits, top1):
        out.fill_(float("nan") if out.dtype == torch.float32 else -1)
    for run_step in runs.values():  # the outputs, each from its poisoned buffer
        run_step()
    torch.cuda.synchronize()
    mean = x.astype(np.int64).sum(axis=(2, 3)).astype(np.float32) / np.float32(hw * hw) * scale[0]
    got_pooled, got_logits = pooled.cpu().numpy(), logits.cpu().numpy()
    rows = sorted({0, n - 1} | set(range(0, n, max(1, n // 8))))  # the reference's sequential chains are slow: 9 rows
    correct = {
        "avgpool": np.array_equal(got_pooled.view(np.int32), mean.view(np.int32)),
        "classifier": np.array_equal(got_logits[rows].view(np.int32), ref.linear_f32(got_pooled[rows], w, bias).view(np.int32)),
        "top-1": np.array_equal(top1.cpu().numpy(), np.argmax(got_logits, axis=1)),
    }
    xt = torch.from_numpy(x).cuda().float()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        baselines = {"avgpool": lambda: xt.mean(dim=(2, 3)), "classifier": lambda: torch.nn.functional.linear(pooled, wd, bd),
                     "top-1": lambda: logits.argmax(dim=1)}
        base_ms = {} if args.no_baselines else {k: graph_time_ms(torch, f, args.reps) for k, f in baselines.items()}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    moved = {"avgpool": x.nbytes + n * c * 4, "classifier": (n * c + classes * c + n * classes) * 4,
             "top-1": n * classes * 4 + n * 4}
    records = []
    classifier_tile = network_ops.linear_tile(n, classes)  # the tile linear_f32 takes for this shape
    for (key, step), layer in zip(runs.items(), TAIL_LAYERS):
        ours = graph_time_ms(torch, step, args.reps)
        rec = {"layer": layer, "batch": n, "tactic": {"classifier": f"linear_f32/{classifier_tile}"}.get(key, key),
               "family": "fp32", "splits": 1, "network_tail": True, "ours_ms": ours, "unfused_ms": base_ms.get(key),
               "unfused": "PyTorch fp32 (cuBLAS for the classifier, TF32 off)", "correct": bool(correct[key])}
        rec.update(floors(moved[key], 0.0, ours, bw_tbps))
        if key == "classifier":  # fp32 FMAs, not int8 ops: the compute floor at the fp32 peak
            rec["floor_compute_ms"] = 2.0 * n * classes * c / (FP32_PEAK_TFLOPS * 1e12) * 1e3
            rec["floor_ms"] = max(rec["floor_memory_ms"], rec["floor_compute_ms"])
        rec["cublaslt_int8_ms"] = rec["cudnn_fp16_ms"] = None
        records.append(rec)
    return records


# res2's identity block as one kernel: kind (the record's tactic) -> (layer-name suffix, family, bench/conv_problem.py's
# class that runs it)
BLOCK_KERNELS = {"bottleneck": ("", "mma", "DeviceBottleneck"), "block_rows": (", row pipeline", "wgmma", "DeviceBlockRows")}


def bench_bottleneck(torch, n, args, bw_tbps, records, kind: str = "bottleneck") -> dict:
    """res2's identity bottleneck block as one kernel against the three conv kernels it replaces: kind "bottleneck"
    (plugins/kernels/bottleneck.cu, mma, patch buffers) or "block_rows" (plugins/kernels/block_rows.cu, wgmma, the
    row pipeline; Hopper only). The three convs' autotuned (or heuristic) times come from this run's own records where
    it has them, else the three heuristic plans are timed here. The fused output (poisoned first) is checked against
    the golden chain computed on the device."""
    from ..plugins import bottleneck
    from ..plugins.conv import ConvLaunch
    from . import conv_problem
    from .conv_problem import BottleneckProblem, DeviceConv, passes_lsb_rule

    suffix, family, device_class = BLOCK_KERNELS[kind]
    cur = lambda: torch.cuda.current_stream().cuda_stream
    problem = BottleneckProblem.random(n, 56, 56, golden=lambda p: golden_on_device(torch, p).cpu().numpy())
    fused = getattr(conv_problem, device_class)(problem)
    ours_ms = graph_time_ms(torch, lambda: fused.run(stream=cur()), args.reps)
    out, _ = fused.run_checked()
    diff = np.abs(out.astype(np.int32) - problem.golden().astype(np.int32))
    stats = {"exact_fraction": float((diff == 0).mean()), "max_abs_diff": int(diff.max())}
    names = ("res2 conv1 1x1 256->64", "res2 first conv2 3x3/1 64", "res2 conv3 1x1 64->256 +res")
    mine = {r["layer"]: r for r in records if r["batch"] == n}
    if all(name in mine for name in names):
        parts = [mine[name] for name in names]
        unfused_ms = sum(r["ours_ms"] for r in parts)
        unfused = " + ".join(f"{r['tactic'].split('_')[0]}/s{r['splits']}" for r in parts)
    else:
        convs = [DeviceConv(c, ConvLaunch.plan(c.shape)) for c in problem.convs]
        unfused_ms = sum(graph_time_ms(torch, lambda d=d: d.run(stream=cur()), args.reps) for d in convs)
        unfused = " + ".join(f"{d.launch_plan.tactic.name.split('_')[0]}/s{d.launch_plan.splits}" for d in convs)
    m = n * 56 * 56
    macs = sum(c.shape.k * c.shape.c * c.shape.r * c.shape.s for c in problem.convs)
    rec = {"layer": "res2 bottleneck 256->64->64->256 +res" + suffix, "batch": n, "M": m, "N": bottleneck.CHANNELS,
           "K": macs, "K_gemm": macs, "residual": True, "tactic": kind, "family": family, "splits": 1, "form": "CHW32",
           "fused_block": True, "heuristic": kind, "heuristic_ms": ours_ms, "ours_ms": ours_ms,
           "unfused_ms": unfused_ms, "unfused": unfused, "correct": passes_lsb_rule(stats), **stats}
    weights = sum(c.w.nbytes for c in problem.convs)
    rec.update(floors(2 * problem.x.nbytes + weights, 2.0 * m * macs, ours_ms, bw_tbps))  # x read once, y written
    rec["cublaslt_int8_ms"] = rec["cudnn_fp16_ms"] = None
    return rec


# The chain kernel's pairs (plugins/chain_conv.py's VARIANTS) as ResNet-50 has them at 224 x 224: (K1, C1, C2) ->
# (stage, map side, conv 1's layer, conv 2's layer), the layers named as bench/layers.py names them
CHAIN_PAIRS = {
    (64, 256, 64): ("res2", 56, "res2 conv3 1x1 64->256 +res", "res2 conv1 1x1 256->64"),
    (64, 256, 128): ("res2", 56, "res2 conv3 1x1 64->256 +res", "res3 first conv1 1x1 256->128"),
    (128, 512, 128): ("res3", 28, "res3 conv3 1x1 128->512 +res", "res3 conv1 1x1 512->128"),
    (128, 512, 256): ("res3", 28, "res3 conv3 1x1 128->512 +res", "res4 first conv1 1x1 512->256"),
}


def bench_chain(torch, n, key, args, bw_tbps, records, downsample: bool = False, y_stride: int = 1) -> dict:
    """A residual block's conv3 (K1 -> C1, + residual, ReLU) and the next block's conv1 (C1 -> C2), key = (K1, C1,
    C2), as one kernel (plugins/kernels/chain_conv.cu) against the two conv kernels it replaces, each timed as
    bench_layer times it (autotuned with --autotune): from this run's own records where it has them. Both outputs
    (poisoned first) are checked against the golden pair (docs/ops.md twice). downsample: the stage's first block,
    its residual computed inside by the downsample (chain_conv.DOWNSAMPLE_VARIANTS), against what runs without it: the
    downsample's conv kernel, then the chain kernel reading its output. y_stride 2: y stored only at its even rows and
    columns (the pair feeding the next stage, whose downsample is y's only other reader: CudaRunner._y_stride), against
    the same kernel storing y whole; y's stored pixels are checked against the golden y's."""
    from ..plugins import chain_conv
    from .conv_problem import ChainProblem, DeviceChain, passes_lsb_rule

    k1, c1, c2 = key
    stage, side, *names = CHAIN_PAIRS[key]
    ds_k = chain_conv.DOWNSAMPLE_VARIANTS[key].ds_k if downsample else 0
    cur = lambda: torch.cuda.current_stream().cuda_stream
    problem = ChainProblem.random(n, side, side, c2, golden=lambda p: golden_on_device(torch, p).cpu().numpy(), k1=k1,
                                  c1=c1, ds_k=ds_k)
    fused = DeviceChain(problem, y_stride=y_stride)
    ours_ms = graph_time_ms(torch, lambda: fused.run(stream=cur()), args.reps)
    y, z, _, _ = fused.run_checked()
    golden = (problem.golden_conv(0)[:, :, ::y_stride, ::y_stride], problem.golden_conv(1))
    diffs = [np.abs(out.astype(np.int32) - want.astype(np.int32)) for out, want in zip((y, z), golden)]
    stats = {"exact_fraction": float(min((d == 0).mean() for d in diffs)), "max_abs_diff": int(max(d.max() for d in diffs))}
    mine = {r["layer"]: r for r in records if r["batch"] == n}
    conv1, conv2 = problem.shapes
    m = n * side * side
    macs = conv1.k * conv1.c + conv2.k * conv2.c
    # (res2's records keep the names their history lines have)
    tactic = f"chain/c{c2}" if stage == "res2" else f"chain/{k1}-{c1}-{c2}"
    compared_with = None
    pair = f"{stage} conv3 + residual -> conv1 {c1}->{c2}"  # the pair's record name, y stored whole
    if y_stride != 1:
        whole = mine.get(f"{pair}, one kernel")
        if whole is not None:
            unfused_ms = whole["ours_ms"]
        else:
            plain = DeviceChain(problem)
            unfused_ms = graph_time_ms(torch, lambda: plain.run(stream=cur()), args.reps)
        unfused, compared_with = tactic, "y whole"
        layer, tactic, replaces = f"{pair}, y stored at stride {y_stride}, one kernel", tactic + f"/y{y_stride}", 1
    elif downsample:
        ds_name = f"{stage} downsample 1x1/1 {ds_k}->{c1}"
        ds_rec = mine.get(ds_name) or bench_layer(torch, ds_name, problem.downsample.shape, False, args, bw_tbps)
        plain = DeviceChain(ChainProblem.random(n, side, side, c2, golden=problem.conv_golden, k1=k1, c1=c1))
        plain_ms = graph_time_ms(torch, lambda: plain.run(stream=cur()), args.reps)
        unfused_ms = ds_rec["ours_ms"] + plain_ms
        unfused = f"{ds_rec['tactic'].split('_')[0]}/s{ds_rec['splits']} + {tactic}"
        macs += conv1.k * ds_k
        layer, tactic, replaces = f"{stage} downsample + conv3 + residual -> conv1 {c1}->{c2}, one kernel", tactic + "/ds", 2
    else:
        parts = [mine.get(name) or bench_layer(torch, name, shape, i == 0, args, bw_tbps)
                 for i, (name, shape) in enumerate(zip(names, problem.shapes))]
        unfused_ms = sum(r["ours_ms"] for r in parts)
        unfused = " + ".join(f"{r['tactic'].split('_')[0]}/s{r['splits']}" for r in parts)
        layer, replaces = f"{pair}, one kernel", 2
    rec = {"layer": layer, "batch": n, "M": m, "N": conv1.k,
           "K": macs, "K_gemm": macs, "residual": True, "tactic": tactic, "family": "wgmma", "splits": 1,
           "form": "CHW32", "fused_block": True, "replaces": replaces, "heuristic": tactic, "heuristic_ms": ours_ms, "ours_ms": ours_ms,
           "unfused_ms": unfused_ms, "unfused": unfused, "correct": passes_lsb_rule(stats), **stats}
    if compared_with:
        rec["compared_with"] = compared_with
    # x, the residual (or x0), y as stored, z, weights
    y_pixels = n * int(np.prod(chain_conv.stored_y_hw(conv1, y_stride)))
    moved = m * (conv1.c + (ds_k or conv1.k) + conv2.k) + y_pixels * conv1.k + conv1.k * (conv1.c + ds_k) + conv2.k * conv2.c
    rec.update(floors(moved, 2.0 * m * macs, ours_ms, bw_tbps))
    rec["cublaslt_int8_ms"] = rec["cudnn_fp16_ms"] = None
    return rec


def next_stage_downsample(key: tuple[int, int, int], n: int) -> tuple[tuple[str, object], tuple[str, object]] | None:
    """For a CHAIN_PAIRS pair whose second conv is the next stage's first conv1: that stage's 1x1 stride-2 downsample
    as resnet50_layers names and shapes it, and the same conv reading y stored at stride 2 (stride 1 on the stored
    map), each (name, shape). None for a pair within a stage."""
    from ..plugins.chain_conv import stored_y_hw
    from ..plugins.conv_shape import ConvShape

    k1, c1, c2 = key
    _, side, _, conv2_name = CHAIN_PAIRS[key]
    if " first conv1 " not in conv2_name:
        return None
    stage = conv2_name.split(" ")[0]
    h, w = stored_y_hw(ConvShape(n, k1, side, side, c1, 1, 1), 2)
    return ((f"{stage} downsample 1x1/2 {c1}->{4 * c2}", ConvShape(n, c1, side, side, 4 * c2, 1, 1, (2, 2), residual=False)),
            (f"{stage} downsample 1x1 {c1}->{4 * c2} on y stored at stride 2", ConvShape(n, c1, h, w, 4 * c2, 1, 1, residual=False)))


def bench_stored_downsample(torch, n, key, args, bw_tbps, records) -> dict:
    """The next stage's downsample run stride 1 on the pair's y stored at stride 2 (next_stage_downsample), against the
    same downsample reading y whole at stride 2 (this run's record of it, else timed here); each checked as
    bench_layer checks a conv."""
    (strided_name, strided_shape), (name, shape) = next_stage_downsample(key, n)
    rec = bench_layer(torch, name, shape, False, args, bw_tbps)
    strided = next((r for r in records if r["batch"] == n and r["layer"] == strided_name), None)
    if strided is None:
        strided = bench_layer(torch, strided_name, strided_shape, False, args, bw_tbps)
    rec.update({"unfused_ms": strided["ours_ms"], "unfused": f"{strided['tactic'].split('_')[0]}/s{strided['splits']}",
                "compared_with": "y whole, read at stride 2", "reads_stored_map": True})
    return rec


def run(args) -> int:
    torch = _torch()
    from ..plugins import block_rows, chain_conv, stem
    from ..plugins import cuda_driver as cd
    from .layers import resnet50_layers, seed000_layers

    torch.cuda.init()
    cd.context()
    device = torch.cuda.get_device_name()
    bw = copy_bandwidth_tbps(torch)
    layers = []
    if args.layers in ("resnet50", "all"):
        for b in args.batch:
            layers += resnet50_layers(b)
    if args.layers in ("seed000", "all"):
        layers += seed000_layers()
    if args.filter:
        layers = [entry for entry in layers if args.filter in entry[0]]
    records = []
    for name, shape, has_res in progress(layers, desc="layers", unit="layer"):
        rec = bench_layer(torch, name, shape, has_res, args, bw)
        rec["device"] = device
        records.append(rec)
        if name.startswith("stem"):  # and the stem as the GPU runner runs it: fused with its max-pool
            records.append({**bench_stem_pool(torch, shape, args, bw), "device": device})
            if stem.default_tile(cd.compute_capability(cd.current_device())) in stem.ROW_TILES:  # res2's first conv1 inside
                records.append({**bench_stem_conv1(torch, shape, args, bw), "device": device})
        if name.startswith("res2 conv1 "):  # and res2's identity blocks as the fused bottleneck kernel
            records.append({**bench_bottleneck(torch, shape.n, args, bw, records), "device": device})
            if block_rows.device_refusal() is None:
                records.append({**bench_bottleneck(torch, shape.n, args, bw, records, "block_rows"), "device": device})
        stage = name.split(" ")[0]
        if name.startswith(f"{stage} conv1 ") and chain_conv.device_refusal() is None:
            # and, on Hopper, the stage's conv3 -> next conv1 pairs as the chain kernel (after the stage's conv3 and
            # conv1 records): within res2 and into res3, within res3 and into res4
            for key, (pair_stage, *_) in CHAIN_PAIRS.items():
                if pair_stage == stage and key in chain_conv.VARIANTS:
                    records.append({**bench_chain(torch, shape.n, key, args, bw, records), "device": device})
                    if chain_conv.VARIANTS[key].in_runner and next_stage_downsample(key, shape.n):
                        # the pair into the next stage stores y at stride 2 in the runner, and that stage's
                        # downsample reads the stored map
                        records.append({**bench_chain(torch, shape.n, key, args, bw, records, y_stride=2), "device": device})
                        records.append({**bench_stored_downsample(torch, shape.n, key, args, bw, records), "device": device})
                if pair_stage == stage and key in chain_conv.DOWNSAMPLE_VARIANTS:  # the stage's first block
                    records.append({**bench_chain(torch, shape.n, key, args, bw, records, downsample=True), "device": device})
        torch.cuda.empty_cache()
    if args.layers in ("resnet50", "all"):  # and the network's tail after res5
        for b in args.batch:
            if not args.filter or any(args.filter in name for name in TAIL_LAYERS):
                records += [{**rec, "device": device} for rec in bench_tail(torch, b, args, bw)
                            if not args.filter or args.filter in rec["layer"]]
    date = datetime.date.today().isoformat()
    result = {"device": device, "date": date, "command": args.command_line,
              "copy_bandwidth_tbps": bw, "int8_peak_tops": INT8_PEAK_TOPS, "records": records}
    from . import record_result

    path = record_result("kernels", device, result, args.output, kernel_key_figures(records))
    if args.roofline:
        _roofline(records, bw, args.roofline, device)
    if args.json:
        print_json(result)
    else:
        fmt = lambda v: "-" if v is None else f"{v:.4f}"
        print_table(["layer", "batch", "tactic", "ours_ms", "unfused", "cublasLt", "cudnn16", "floor", "x floor", "ok"],
                    [[r["layer"], r["batch"], f"{r['tactic'].split('_')[0]}/s{r['splits']}", fmt(r["ours_ms"]),
                      fmt(r["unfused_ms"]), fmt(r["cublaslt_int8_ms"]), fmt(r["cudnn_fp16_ms"]), fmt(r["floor_ms"]),
                      f"{r['ours_ms'] / r['floor_ms']:.2f}", "yes" if r["correct"] else "NO"] for r in records])
        print(f"copy bandwidth {bw:.2f} TB/s; results: {path}")
    return 0 if all(r["correct"] for r in records) else 1


def kernel_key_figures(records: list[dict]) -> dict:
    """A run's history line: batch-256 times of the residual block and the 3x3 layers docs/PERF.md follows, the
    24 distinct layers' sum, and whether every record was correct."""
    b256 = [r for r in records if r["batch"] == 256 and not r["layer"].startswith("seed") and not r.get("fused_with_pool")
            and not r.get("fused_block") and not r.get("network_tail") and not r.get("reads_stored_map")]
    figures = {}
    for r in b256:
        name = r["layer"]
        if name.startswith("res3 conv3") or name.startswith("stem") or " 3x3" in name:
            figures[name] = round(r["ours_ms"], 4)
    for r in records:
        if r["batch"] == 256 and (r.get("fused_with_pool") or r.get("fused_block") or r.get("reads_stored_map")):
            figures[r["layer"]] = round(r["ours_ms"], 4)
            replaced = r.get("replaces", 2 if r.get("fused_with_pool") else 3)  # kernels the fused one stands for
            against = r.get("compared_with") or f"{'two' if replaced == 2 else 'three'} kernels"
            figures[r["layer"] + f" ({against})"] = round(r["unfused_ms"], 4)
    for r in records:
        if r["batch"] == 256 and r.get("network_tail"):
            figures[r["layer"]] = round(r["ours_ms"], 4)
    if b256:
        figures["distinct_layers_b256_sum_ms"] = round(sum(r["ours_ms"] for r in b256), 3)
    figures["records"] = len(records)
    figures["all_correct"] = all(r["correct"] for r in records)
    return figures


def _roofline(records, bw_tbps, path, device) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    xs = np.logspace(0, 4, 200)
    ax.loglog(xs, np.minimum(INT8_PEAK_TOPS, xs * bw_tbps), "k-", lw=1, label="roofline (int8 peak, copy BW)")
    for batch, marker in ((1, "o"), (8, "s"), (256, "^")):
        pts = [r for r in records if r["batch"] == batch and not r["layer"].startswith("seed")]
        if pts:
            ai = [2.0 * r["M"] * r["N"] * r["K"] / (r["floor_memory_ms"] * 1e-3 * bw_tbps * 1e12) for r in pts]
            ax.scatter(ai, [r["ours_tops"] for r in pts], marker=marker, label=f"ResNet-50 layers, batch {batch}")
    ax.set_xlabel("arithmetic intensity (int8 ops / byte moved)")
    ax.set_ylabel("TOPS")
    ax.set_title(f"trtfuse fused INT8 conv, {device}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
