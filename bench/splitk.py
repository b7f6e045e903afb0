"""`trtfuse bench splitk`: a GEMM plain vs as the split-K rewrite runs it, on a sweep of shapes, in PyTorch.

Each shape is a Gemm with a constant weight B [K, N] (as a classifier or linear layer holds it) and,
for most shapes, a bias [N]. The two computations are the op sequences the ONNX graphs run:

  plain:      torch.addmm(bias, A, B)  (Gemm: bias fused in the GEMM's epilogue)  or  A @ B
  rewritten:  exactly what graph_passes/split_k.py emits for that node -
              Pad K (when K % S != 0) -> Reshape [M, S, K0] -> Transpose [S, M, K0] (materialized, as the
              graph's Transpose node is; with M == 1 a Reshape only) -> MatMul with the pre-split constant
              [S, K0, N] -> ReduceSum over S -> + bias.

Times are medians of CUDA-event timings, both eagerly (one launch per op, as an un-fused runtime
would) and replayed from a CUDA graph of 20 calls (no launch gaps: closer to a TensorRT engine).
Each record says what the cost model's `auto` chose and whether that was right: declining is right when
no timed split count was at least `min_gain` faster; splitting is right when the chosen split was faster.
The cost model's assumed constants are then fitted to the timings (graph_passes/cost_model.fit) and the
fitted parameters are written into the results, ready for `--split-k-params`.
"""

from __future__ import annotations

import datetime
import math
import re
import statistics
import time
from dataclasses import dataclass

from trtfuse import args as flags
from trtfuse.errors import TrtfuseError
from trtfuse.graph_passes.cost_model import DEVICES, DeviceParams, GemmProblem, decide, device_params, fit, padded_k, predict_us

CALLS_PER_GRAPH = 20
MIN_K_TIMED = 128  # split counts that leave less K per split than this are not timed
MAX_REL_ERR = {"float32": 1e-4, "float16": 2e-2}


@dataclass(frozen=True)
class Shape:
    name: str
    m: int
    n: int
    k: int
    bias: bool = True

    def problem(self, dtype: str) -> GemmProblem:
        return GemmProblem(m=self.m, n=self.n, k=self.k, dtype=dtype, has_bias=self.bias)


def sweep_shapes(quick: bool = False) -> list[Shape]:
    """The grid (M 1..512, N 256..4096, K 512..16384), seed 001's example and ResNet-50's classifier."""
    ms = (1, 16, 256) if quick else (1, 4, 16, 64, 256, 512)
    ns = (256, 4096) if quick else (256, 1024, 4096)
    ks = (2048, 16384) if quick else (512, 2048, 8192, 16384)
    shapes = [Shape(f"grid m{m} n{n} k{k}", m, n, k) for m in ms for n in ns for k in ks]
    shapes.append(Shape("seed001 [1,49,2016]x[2016,448]", 49, 448, 2016, bias=False))
    shapes += [Shape(f"resnet50 fc b{b}", b, 1000, 2048) for b in (1, 2, 4, 8)]
    return shapes


def splits_to_time(k: int, candidates=(2, 4, 8, 16, 32, 64)) -> list[int]:
    return [s for s in candidates if padded_k(k, s) // s >= MIN_K_TIMED]


def device_slug(device_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown"


def params_for_device(device_name: str, override: str | None) -> DeviceParams:
    if override:
        return device_params(override)
    for key, params in DEVICES.items():
        if key in device_name.lower():
            return params
    return DEVICES["h200"]


def record_name(dtype: str) -> str:
    """The benchmark's record name: one latest record and one history per dtype ("splitk", "splitk-fp16")."""
    return "splitk" if dtype == "float32" else "splitk-fp16"


def judge(decision_splits: int, plain_us: float | None, rewritten_us: dict[int, float], min_gain: float) -> bool | None:
    """Was `auto`'s choice right for these timings? See the module docstring."""
    if not rewritten_us or plain_us is None:
        return None
    if decision_splits <= 1:
        return min(rewritten_us.values()) * (1.0 + min_gain) > plain_us
    if decision_splits not in rewritten_us:
        return None
    return rewritten_us[decision_splits] < plain_us


def measured_shapes(records: list[dict], timing: str):
    """Per shape: (name, M, N, K, bias), its plain time and {split count: rewritten time} under `timing`."""
    by_shape: dict[tuple, list[dict]] = {}
    for r in records:
        by_shape.setdefault((r["name"], r["M"], r["N"], r["K"], r["bias"]), []).append(r)
    for key, recs in by_shape.items():
        rewritten = {r["splits"]: r[f"rewritten_{timing}"] for r in recs if r[f"rewritten_{timing}"] is not None}
        yield key, recs[0][f"plain_{timing}"], rewritten


def summarize(records: list[dict], params: DeviceParams, dtype: str, timing: str) -> list[dict]:
    """One row per shape: the best measured split, auto's choice under `params`, and whether it was right."""
    rows = []
    for (name, m, n, k, bias), plain, rewritten in measured_shapes(records, timing):
        decision = decide(Shape(name, m, n, k, bias).problem(dtype), params)
        best_s = min(rewritten, key=rewritten.get) if rewritten else None
        rows.append(
            {
                "name": name,
                "M": m,
                "N": n,
                "K": k,
                "bias": bias,
                "auto_decision": decision.splits,
                "best_splits": best_s,
                "plain_us": plain,
                "best_rewritten_us": rewritten.get(best_s),
                "best_speedup": (plain / rewritten[best_s]) if best_s and plain else None,
                "decision_right": judge(decision.splits, plain, rewritten, params.min_gain),
            }
        )
    return rows


def observations(records: list[dict], dtype: str, timing: str):
    """(GemmProblem, splits, measured_us) for cost_model.fit: the plain GEMM once per shape, then each split."""
    seen = set()
    for r in records:
        p = Shape(r["name"], r["M"], r["N"], r["K"], r["bias"]).problem(dtype)
        if r["name"] not in seen and r[f"plain_{timing}"]:
            seen.add(r["name"])
            yield p, 1, r[f"plain_{timing}"]
        if r[f"rewritten_{timing}"]:
            yield p, r["splits"], r[f"rewritten_{timing}"]


NAMED_SHAPES = ("seed001", "resnet50 fc")  # seed 001's case and ResNet-50's classifier


def verdicts(records: list[dict], params: DeviceParams, dtype: str, timing: str) -> list[tuple[GemmProblem, dict[int, int]]]:
    """Per shape, what each decision `auto` could make (0 = decline, or a candidate split count) scores in the fit:
    1000 when `judge` calls it right, plus 1 for the named shapes (seed 001's, ResNet-50's classifier), else 0."""
    out = []
    for (name, m, n, k, bias), plain, rewritten in measured_shapes(records, timing):
        bonus = 1000 + name.startswith(NAMED_SHAPES)
        table = {s: bonus if judge(s, plain, rewritten, params.min_gain) is True else 0 for s in (0, *params.candidate_splits)}
        out.append((Shape(name, m, n, k, bias).problem(dtype), table))
    return out


def fit_to_records(records: list[dict], params: DeviceParams, dtype: str, timing: str) -> dict:
    """cost_model.fit on these timings, scored by the decisions it gets right. Every shape weighs the same;
    the named shapes (seed 001's, ResNet-50's classifier) only break ties: ranking them first made the fit
    worse on the shapes it had not seen (docs/split_k.md)."""
    fitted_params, log_rms = fit(list(observations(records, dtype, timing)), params, verdicts=verdicts(records, params, dtype, timing))
    rows = summarize(records, fitted_params, dtype, timing)
    return {
        "params": fitted_params.to_dict(),
        "log_rms_error": log_rms,
        "decisions_right": sum(r["decision_right"] is True for r in rows),
        "decisions_judged": sum(r["decision_right"] is not None for r in rows),
        "wrong": [r["name"] for r in rows if r["decision_right"] is False],
    }


def _rate(rows: list[dict]) -> float | None:
    judged = [r for r in rows if r["decision_right"] is not None]
    return sum(r["decision_right"] for r in judged) / len(judged) if judged else None


def heldout_split(records: list[dict]) -> tuple[list[str], list[str]]:
    """The shapes sorted by name, alternately into a fitting half (even positions) and a judged half (odd)."""
    names = sorted({r["name"] for r in records})
    return names[0::2], names[1::2]


def heldout_evaluation(records: list[dict], params: DeviceParams, dtype: str, timing: str) -> dict:
    """Fit the constants on one half of the shapes, judge `auto` with them on the other half (and the
    reverse): the right-decision rate on shapes the fit never saw."""
    halves = heldout_split(records)
    out = {"split": "shapes sorted by name; even positions fit, odd positions judged; then the reverse", "rounds": []}
    right = judged = 0
    for fit_names, judge_names in (halves, halves[::-1]):
        fit_recs = [r for r in records if r["name"] in set(fit_names)]
        judge_recs = [r for r in records if r["name"] in set(judge_names)]
        fitted = DeviceParams.from_dict(fit_to_records(fit_recs, params, dtype, timing)["params"])
        rows = summarize(judge_recs, fitted, dtype, timing)
        ok = sum(r["decision_right"] is True for r in rows)
        n = sum(r["decision_right"] is not None for r in rows)
        out["rounds"].append({"fit_shapes": fit_names, "judged_shapes": judge_names, "right": ok, "judged": n,
                              "wrong": [r["name"] for r in rows if r["decision_right"] is False],
                              "params": fitted.to_dict()})
        right, judged = right + ok, judged + n
    out["right"], out["judged"] = right, judged
    out["rate"] = right / judged if judged else None
    return out


def measured_evaluation(records: list[dict], params: DeviceParams) -> dict | None:
    """`--split-k measure` as the bench can judge it: decide from the first CUDA-graph timing of each candidate
    (what `measure` does on the target), judge against the second, independent one (`*_graph_us_repeat`).
    None for results files without the repeat timings (measured before they existed)."""
    if not records or records[0].get("plain_graph_us_repeat") is None:
        return None
    by_shape: dict[str, list[dict]] = {}
    for r in records:
        by_shape.setdefault(r["name"], []).append(r)
    right = judged = 0
    wrong = []
    for name, recs in sorted(by_shape.items()):
        timed = {r["splits"]: r["rewritten_graph_us"] for r in recs if r["rewritten_graph_us"]}
        best = min(timed, key=timed.get) if timed else 0
        decision = best if best and timed[best] * (1 + params.min_gain) <= recs[0]["plain_graph_us"] else 0
        again = {r["splits"]: r["rewritten_graph_us_repeat"] for r in recs if r.get("rewritten_graph_us_repeat")}
        verdict = judge(decision, recs[0]["plain_graph_us_repeat"], again, params.min_gain)
        if verdict is None:
            continue
        judged += 1
        right += verdict
        if not verdict:
            wrong.append(name)
    return {"decided_from": "first CUDA-graph timing", "judged_on": "second CUDA-graph timing", "right": right,
            "judged": judged, "rate": right / judged if judged else None, "wrong": wrong}


# ---- PyTorch side (imported lazily) -------------------------------------------------------------------


def _import_torch(device: str):
    try:
        import torch
    except ImportError:
        raise TrtfuseError("`trtfuse bench splitk` needs PyTorch (pip install torch); it is not installed here") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise TrtfuseError("`trtfuse bench splitk` needs a CUDA GPU visible to PyTorch (or pass --device cpu)")
    return torch


def _set_fp32_matmul(torch, tf32: bool) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_float32_matmul_precision("high" if tf32 else "highest")


def make_plain(torch, a, w, bias):
    if bias is None:
        return lambda: torch.matmul(a, w)
    return lambda: torch.addmm(bias, a, w)


def make_rewritten(torch, a, w, bias, splits: int):
    """The rewrite's op sequence; B is a constant, so it is padded and split here once, like the initializer."""
    m, k = a.shape
    n = w.shape[1]
    kp = padded_k(k, splits)
    k0 = kp // splits
    w_split = torch.nn.functional.pad(w, (0, 0, 0, kp - k)).reshape(splits, k0, n).contiguous()
    pad = kp - k

    def run():
        x = torch.nn.functional.pad(a, (0, pad)) if pad else a  # Pad
        if m == 1:
            x = x.reshape(splits, 1, k0)  # Reshape only: the transpose would move a size-1 axis
        else:
            x = x.reshape(m, splits, k0).transpose(0, 1).contiguous()  # Reshape + Transpose
        y = torch.matmul(x, w_split).sum(dim=0)  # batched MatMul + ReduceSum(axis -3)
        return y + bias if bias is not None else y  # Add, once

    return run


def _reps_for(estimate_us: float, budget_s: float, max_reps: int) -> int:
    return int(max(20, min(max_reps, budget_s * 1e6 / max(estimate_us, 1.0))))


def time_eager(torch, fn, device: str, max_reps: int, budget_s: float) -> float:
    """Median microseconds of one call."""
    for _ in range(5):
        fn()
    if device == "cpu":
        t0 = time.perf_counter()
        fn()
        reps = _reps_for((time.perf_counter() - t0) * 1e6, budget_s, max_reps)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    reps = _reps_for(start.elapsed_time(end) * 1e3, budget_s, max_reps)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def time_graph(torch, fn, max_reps: int, budget_s: float) -> float:
    """Median microseconds of one call, replayed from a CUDA graph of CALLS_PER_GRAPH calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # allocations settle before capture, as the CUDA-graph docs ask
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    reps = _reps_for(start.elapsed_time(end) * 1e3, budget_s, max(10, max_reps // CALLS_PER_GRAPH))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    median = statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)) / CALLS_PER_GRAPH
    del graph
    return median


def measure_shape(torch, shape: Shape, args, params: DeviceParams, candidates) -> list[dict]:
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device=args.device).manual_seed(0)
    a = torch.randn(shape.m, shape.k, device=args.device, dtype=dtype, generator=gen)
    w = torch.randn(shape.k, shape.n, device=args.device, dtype=dtype, generator=gen) / math.sqrt(shape.k)
    bias = torch.randn(shape.n, device=args.device, dtype=dtype, generator=gen) if shape.bias else None
    use_graphs = args.device == "cuda" and not args.no_graphs
    plain = make_plain(torch, a, w, bias)
    want = plain().double()
    plain_eager = time_eager(torch, plain, args.device, args.reps, args.budget)
    plain_graph = time_graph(torch, plain, args.reps, args.budget) if use_graphs else None
    problem = shape.problem(args.dtype)
    decision = decide(problem, params)
    records = []
    for splits in candidates:
        rewritten = make_rewritten(torch, a, w, bias, splits)
        got = rewritten().double()
        err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
        if err > MAX_REL_ERR[args.dtype]:
            raise TrtfuseError(f"{shape.name}, {splits} splits: rewritten result differs from plain (max rel err {err:.2g})")
        eager = time_eager(torch, rewritten, args.device, args.reps, args.budget)
        graph = time_graph(torch, rewritten, args.reps, args.budget) if use_graphs else None
        records.append(
            {
                "name": shape.name,
                "M": shape.m,
                "N": shape.n,
                "K": shape.k,
                "bias": shape.bias,
                "splits": splits,
                "plain_us": plain_eager,
                "rewritten_us": eager,
                "speedup": plain_eager / eager,
                "plain_graph_us": plain_graph,
                "rewritten_graph_us": graph,
                "speedup_graph": (plain_graph / graph) if use_graphs else None,
                "auto_decision": decision.splits,
                "auto_reason": decision.reason,
                "predicted_plain_us": predict_us(problem, params, 1),
                "predicted_rewritten_us": predict_us(problem, params, splits),
                "max_rel_err": err,
            }
        )
    if use_graphs:  # a second, independent graph timing: `measure` decides on the first and is judged on this one
        plain_again = time_graph(torch, plain, args.reps, args.budget)
        for r in records:
            r["plain_graph_us_repeat"] = plain_again
            r["rewritten_graph_us_repeat"] = time_graph(torch, make_rewritten(torch, a, w, bias, r["splits"]), args.reps, args.budget)
    for r in records:
        r["auto_right"] = judge(decision.splits, r["plain_us"], {x["splits"]: x["rewritten_us"] for x in records}, params.min_gain)
        if use_graphs:
            r["auto_right_graph"] = judge(
                decision.splits, r["plain_graph_us"], {x["splits"]: x["rewritten_graph_us"] for x in records}, params.min_gain
            )
    return records


# ---- CLI -----------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where PyTorch runs the GEMMs (default cuda)")
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    parser.add_argument("--tf32", action="store_true", help="let float32 GEMMs use TF32 tensor cores (default: IEEE fp32)")
    parser.add_argument("--quick", action="store_true", help="a 12-shape grid instead of 72 (plus the seed and classifier shapes)")
    parser.add_argument("--splits", default="2,4,8,16,32,64", help="split counts to time, comma-separated (default 2,4,8,16,32,64: all that auto may pick)")
    flags.reps(parser, 400, "most timed calls per measurement (default 400)")
    parser.add_argument("--budget", type=float, default=0.15, help="seconds of timing per measurement at most, roughly (default 0.15)")
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph timings")
    parser.add_argument("--params", help="cost-model parameters: h200, h100 or a JSON file (default: by device name)")
    parser.add_argument("--refit", metavar="RESULTS", help="no timing: judge and fit the timings of this results file again (needs -o)")


def _parse_splits(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(s) for s in text.split(",") if s.strip()}))
    except ValueError:
        raise TrtfuseError(f"--splits takes comma-separated integers, not '{text}'") from None
    if not values or min(values) < 2:
        raise TrtfuseError("--splits needs split counts >= 2")
    return values


def _measure(args) -> dict:
    from trtfuse.ui import progress

    candidates = _parse_splits(args.splits)
    if args.reps < 20 or args.budget <= 0:
        raise TrtfuseError("--reps must be >= 20 and --budget positive")
    torch = _import_torch(args.device)
    _set_fp32_matmul(torch, args.tf32)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu-{torch.get_num_threads()}t"
    params = params_for_device(device_name, args.params)
    records: list[dict] = []
    for shape in progress(sweep_shapes(args.quick), desc="splitk", unit="shape"):
        records += measure_shape(torch, shape, args, params, splits_to_time(shape.k, candidates))
    return {
        "benchmark": "splitk",
        "device": device_name,
        "date": datetime.date.today().isoformat(),
        "command": args.command_line,
        "torch": torch.__version__,
        "dtype": args.dtype,
        "tf32": args.tf32,
        "calls_per_graph": CALLS_PER_GRAPH,
        "cost_model": params.to_dict(),
        "records": records,
    }


def _load_for_refit(args) -> dict:
    """A results file's timings, to be judged and fitted again by the current cost model (no GPU needed)."""
    import json

    from trtfuse.io import check_not_same_file

    if not args.output:
        raise TrtfuseError("--refit needs -o/--output for the new results file")
    check_not_same_file(args.refit, args.output)
    try:
        with open(args.refit) as f:
            old = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise TrtfuseError(f"cannot read {args.refit} as a results file: {exc}") from None
    if not isinstance(old, dict) or old.get("benchmark") != "splitk" or not old.get("records"):
        raise TrtfuseError(f"{args.refit} is not a `trtfuse bench splitk` results file")
    params = params_for_device(old["device"], args.params)
    keep = ("device", "date", "command", "torch", "dtype", "tf32", "calls_per_graph", "records")
    return {"benchmark": "splitk", **{k: old.get(k) for k in keep}, "refit_command": args.command_line, "refit_from": str(args.refit), "cost_model": params.to_dict()}


def run(args) -> int:
    from trtfuse.ui import print_json, print_table

    result = _load_for_refit(args) if args.refit else _measure(args)
    records, dtype, device_name = result["records"], result["dtype"], result["device"]
    params = DeviceParams.from_dict(result["cost_model"])
    timings = ["us"] + (["graph_us"] if records[0]["plain_graph_us"] is not None else [])
    result["per_shape"] = {t: summarize(records, params, dtype, t) for t in timings}
    result["fitted"] = {t: fit_to_records(records, params, dtype, t) for t in timings}
    result["heldout"] = {t: heldout_evaluation(records, params, dtype, t) for t in timings}
    result["measured"] = measured_evaluation(records, params)
    result["right_decision_rates"] = {
        t: {"default": _rate(result["per_shape"][t]),
            "fitted_all_shapes": result["fitted"][t]["decisions_right"] / max(1, result["fitted"][t]["decisions_judged"]),
            "fitted_heldout": result["heldout"][t]["rate"]}
        for t in timings}
    if result["measured"]:
        result["right_decision_rates"]["measured"] = result["measured"]["rate"]
    from . import record_result

    out_path = record_result(record_name(dtype), device_name, result, args.output,
                             {"dtype": dtype, "shapes": len({(r["M"], r["N"], r["K"]) for r in records}),
                              "right_decision_rates": result["right_decision_rates"]})
    if args.json:
        print_json(result)
        return 0
    for timing in timings:
        label = "eager" if timing == "us" else f"CUDA graph of {CALLS_PER_GRAPH} calls"
        rows = result["per_shape"][timing]
        print(f"\nsplit-K on {device_name}, {dtype}, timing: {label} (cost model '{params.name}')")
        print_table(
            ["shape", "M", "N", "K", "auto", "best S", "plain us", "best split us", "speedup", "auto right"],
            [
                [r["name"], r["M"], r["N"], r["K"], r["auto_decision"], r["best_splits"], r["plain_us"], r["best_rewritten_us"], r["best_speedup"], r["decision_right"]]
                for r in rows
            ],
        )
        judged = [r for r in rows if r["decision_right"] is not None]
        wrong = [r["name"] for r in judged if not r["decision_right"]]
        print(f"cost model right on {len(judged) - len(wrong)}/{len(judged)} shapes" + (f"; wrong: {', '.join(wrong)}" if wrong else ""))
        f = result["fitted"][timing]
        fp = f["params"]
        print(
            f"fitted constants: tile {fp['tile_m']}x{fp['tile_n']}, kernel overhead {fp['kernel_overhead_us']} us, "
            f"per-SM DRAM {fp['sm_dram_bytes_per_s'] / 1e9:.0f} GB/s (log-RMS error {f['log_rms_error']:.2f}); "
            f"with them right on {f['decisions_right']}/{f['decisions_judged']}" + (f"; wrong: {', '.join(f['wrong'])}" if f["wrong"] else "")
        )
        h = result["heldout"][timing]
        print(f"held out (fit on half the shapes, judged on the other half, both ways): right on {h['right']}/{h['judged']}"
              f" ({100 * h['rate']:.1f} %)")
    if not result["measured"]:
        print("measured: not judged (these timings have no repeat CUDA-graph timing; a fresh `trtfuse bench splitk` on the GPU has)")
    else:
        m = result["measured"]
        print(f"measured (decided on one CUDA-graph timing, judged on a second): right on {m['right']}/{m['judged']}"
              f" ({100 * m['rate']:.1f} %)")
    print(f"\nwrote {out_path}")
    return 0
