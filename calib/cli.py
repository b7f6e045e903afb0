"""`trtfuse calibrate` and `trtfuse evaluate`."""

from __future__ import annotations

import argparse
import os

from trtfuse import args as flags
from trtfuse.args import DATA_HELP


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="compute INT8 activation scales for a model (scales JSON for `rewrite --scales`)",
                       description="Run the fp32 model on the CPU over calibration images, histogram every activation "
                                   "the rewrite needs, and pick each tensor's INT8 scale.")
    flags.model(p, "the fp32 ONNX model (never modified)")
    flags.data(p, "default", DATA_HELP + " (default: default, calib split)")
    flags.count(p, 512, "number of calibration images (default 512)")
    p.add_argument("--method", default="entropy", choices=["max", "percentile", "entropy", "mse"],
                   help="threshold method (default entropy)")
    flags.percentile(p, "for --method percentile (default 99.99)")
    flags.fuse(p, "both", "the rewrite's fuse mode, which decides the tensors it needs; both (default): every tensor "
               "`rewrite --fuse residual` or `--fuse all` reads, so one scales file serves either", both=True)
    p.add_argument("--tensors", default="auto", choices=["auto", "rewrite", "broad"],
                   help="tensor set: the rewrite's list (rewrite), every Conv/BN/Add/Relu/pool activation (broad), "
                        "or the rewrite's list when available (auto, default)")
    flags.batch(p, 8, "images per ONNX Runtime run (default 8: larger batches cost memory and page faults, not speed)")
    flags.threads(p, 2, "ONNX Runtime intra-op threads (default 2)")
    flags.output(p, "scales JSON to write", required=True)
    p.add_argument("--cache", help="also write a TensorRT-style calibration cache text file")
    p.add_argument("--cache-version", default="8601", help="TensorRT version number in the cache header (default 8601)")
    flags.json_flag(p)
    p.set_defaults(func=run_calibrate)

    e = sub.add_parser("evaluate", help="compare an INT8 rewritten model with its fp32 original",
                       description="Run both models on held-out images: logit cosine, top-1 agreement, top-1 accuracy "
                                   "(with labels), and the SQNR of every fused layer. The reference runs on ONNX "
                                   "Runtime: given a quantized (Q/DQ) model, that is ONNX Runtime's own execution of "
                                   "its Q/DQ chain, the comparison for a rewrite that fused it with its own scales.")
    e.add_argument("fp32", help="the reference ONNX model: the fp32 original, or the Q/DQ model that was rewritten")
    e.add_argument("int8", help="the rewritten INT8 model (plugin nodes run on trtfuse's CPU executor)")
    flags.data(e, "default", DATA_HELP + " (default: default, heldout split)")
    flags.count(e, 64, "number of images (default 64)")
    flags.batch(e, 8, "images per run (default 8)")
    e.add_argument("--no-layers", action="store_true", help="skip the per-layer SQNR table (faster)")
    e.add_argument("--ort-optimization", choices=["all", "basic", "none"], default="all",
                   help="ONNX Runtime graph optimization level for the reference (default all, ORT's own default: "
                        "a Q/DQ model runs on ORT's integer kernels; none: the Q/DQ chain as written)")
    flags.output(e, "write the report as JSON")
    flags.json_flag(e, "print the report as JSON")
    e.set_defaults(func=run_evaluate)

    c = sub.add_parser("calibrate-compare", help="calibrate with every method, rewrite, evaluate, and rank the methods",
                       description="One statistics pass on calibration images, then for each method: scales, "
                                   "`rewrite --scales`, and `evaluate` on held-out images.")
    flags.model(c, "the fp32 ONNX model (never modified)")
    flags.data(c, "default", "calibration data: " + DATA_HELP + " (default: default, calib split)")
    flags.count(c, 512, "calibration images (default 512)")
    c.add_argument("--eval-data", default="default", help="evaluation data (default: default, heldout split)")
    c.add_argument("--eval-count", type=int, default=64, help="evaluation images (default 64)")
    c.add_argument("--methods", default="max,percentile,entropy,mse", help="comma-separated (default all four)")
    flags.percentile(c, "for the percentile method (default 99.99)")
    flags.fuse(c, "residual", "the rewrite's fuse mode")
    c.add_argument("--out-dir", help="also write each method's scales JSON and rewritten model here")
    flags.output(c, "write the comparison as JSON")
    flags.json_flag(c, "print the comparison as JSON")
    c.set_defaults(func=run_compare)


def _positive(name: str, value: int) -> None:
    from trtfuse.errors import TrtfuseError

    if value < 1:
        raise TrtfuseError(f"{name} must be at least 1, got {value}")


def _outputs(inputs: list, outputs: list) -> None:
    """Up front: every named output is writable and none of them is an input or another output."""
    from trtfuse.validate import check_output_file, check_outputs_distinct

    for flag, path in outputs:
        if path:
            check_output_file(path, flag)
    check_outputs_distinct([i for i in inputs if i and i != "default"], [p for _, p in outputs])


def run_calibrate(args: argparse.Namespace) -> int:
    from trtfuse.io import atomic_write_json, atomic_write_text, check_plain_model, load_model
    from trtfuse.ui import print_json, print_table

    from .calibrate import calibrate, check_method
    from .data import load_data
    from .scales import calibration_cache_text
    from .stats import input_name_and_size

    _positive("--count", args.count)
    _positive("--batch", args.batch)
    _positive("--threads", args.threads)
    check_method(args.method, args.percentile)
    _outputs([args.model, args.data], [("-o", args.output), ("--cache", args.cache)])
    model = load_model(args.model)
    check_plain_model(model, args.model, "model to calibrate")
    _, size = input_name_and_size(model)
    images = load_data(args.data, args.count, size=size or 224, split="calib")
    doc = calibrate(args.model, images, args.method, args.percentile, args.fuse, args.tensors, args.batch,
                    args.threads, show_progress=not args.json, model=model)
    atomic_write_json(args.output, doc)
    if args.cache:
        atomic_write_text(args.cache, calibration_cache_text(doc["activations"], args.method, args.cache_version))
    meta = doc["metadata"]
    summary = {"tensors": meta["tensors"], "selection": meta["selection"], "method": meta["method"],
               "images": meta["images"], "seconds": meta["seconds"], "cpu_seconds": meta["cpu_seconds"], "output": args.output, "cache": args.cache,
               "data": meta["data"]}
    if args.json:
        print_json(summary)
    else:
        print(f"data: {meta['data']}")
        print_table(["tensors", "selection", "method", "images", "seconds", "cpu s", "output"],
                    [[meta["tensors"], meta["selection"], meta["method"] + (f" {args.percentile}" if args.method == "percentile" else ""),
                      meta["images"], f"{meta['seconds']:.1f}", f"{meta['cpu_seconds']:.1f}", args.output + (f" (+ cache {args.cache})" if args.cache else "")]])
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from trtfuse.io import atomic_write_json, load_model
    from trtfuse.ui import print_json

    from .data import load_data
    from .evaluate import evaluate, print_report
    from .stats import input_name_and_size

    from trtfuse.io import check_plain_model

    _positive("--count", args.count)
    _positive("--batch", args.batch)
    _outputs([args.fp32, args.int8, args.data], [("-o", args.output)])
    fp32 = load_model(args.fp32)
    int8 = load_model(args.int8, check=False)
    check_plain_model(fp32, args.fp32, "first model (FP32)")
    _, size = input_name_and_size(fp32)
    images = load_data(args.data, args.count, size=size or 224, split="heldout")
    from trtfuse.graph_passes.qdq import has_qdq

    from .evaluate import OnnxRuntimeExecutor

    report = evaluate(fp32, int8, images, batch_size=args.batch, layers=not args.no_layers, show_progress=not args.json,
                      fp32_executor=OnnxRuntimeExecutor(optimization=args.ort_optimization))
    report["fp32_model"], report["int8_model"] = args.fp32, args.int8
    report["reference"] = (f"onnxruntime, graph optimization {args.ort_optimization}, "
                           + ("the Q/DQ model's own execution" if has_qdq(fp32) else "fp32 model"))
    if args.output:
        atomic_write_json(args.output, report)
    if args.json:
        print_json(report)
    else:
        print_report(report)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from trtfuse.errors import TrtfuseError
    from trtfuse.io import atomic_write_json, load_model
    from trtfuse.ui import print_json

    from .calibrate import check_method
    from .compare import compare_methods, print_comparison
    from .data import load_data
    from .stats import input_name_and_size

    _positive("--count", args.count)
    _positive("--eval-count", args.eval_count)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise TrtfuseError("--methods is empty")
    for m in methods:
        check_method(m, args.percentile)
    from trtfuse.io import check_plain_model
    from trtfuse.validate import check_output_dir

    _outputs([args.model, args.data, args.eval_data], [("-o", args.output)])
    if args.out_dir:
        check_output_dir(args.out_dir, "--out-dir")
        if not os.path.isdir(args.out_dir):
            raise TrtfuseError(f"--out-dir {args.out_dir}: no such folder (create it first)")
    model = load_model(args.model)
    check_plain_model(model, args.model, "model to calibrate")
    _, size = input_name_and_size(model)
    calib = load_data(args.data, args.count, size=size or 224, split="calib")
    held = load_data(args.eval_data, args.eval_count, size=size or 224, split="heldout")
    result = compare_methods(args.model, calib, held, methods, args.percentile, args.fuse, args.out_dir,
                             show_progress=not args.json)
    if args.output:
        atomic_write_json(args.output, result)
    if args.json:
        print_json(result)
    else:
        print_comparison(result)
    return 0
