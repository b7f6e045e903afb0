"""`trtfuse rewrite IN.onnx -o OUT.onnx [--fuse residual|all] [--chain] [--scales F] [--requantize] [--report F] [--json]`."""

from __future__ import annotations

from trtfuse import args as flags


def register(sub) -> None:
    p = sub.add_parser(
        "rewrite",
        help="fold BN and fuse residual blocks into int8 plugin nodes",
        description="Fold BatchNormalization into Conv, then replace each Conv->Add->ReLU residual block (or, with "
        "--fuse all, every Conv(+Add)(+ReLU)) by one int8 FusedConv/FusedConvAdd node, with Quantize/Dequantize "
        "at the boundary to the rest of the graph. Constant subgraphs (Identity, Cast, Constant, ...) are folded "
        "first. A quantized (Q/DQ) model is fused with its own scales. Prints every candidate, fused or rejected, "
        "and why.",
    )
    flags.model(p, "input ONNX model (never modified)")
    flags.output(p, "rewritten ONNX model to write (atomically)", required=True)
    flags.fuse(p, "residual", "residual: residual blocks only (default); all: every conv of the trunk")
    flags.scales(p, "activation scales JSON (trtfuse-scales-v1); default: a max pass over default calibration images")
    p.add_argument("--requantize", action="store_true",
                   help="quantized (Q/DQ) model: discard its Q/DQ and calibrate anew (--scales or the max pass) "
                   "instead of fusing with the model's own scales")
    p.add_argument("--chain", action="store_true",
                   help="after fusing, run each residual block's last 1x1 conv and the next 1x1 conv that reads its output "
                   "as one FusedConvAddConv node where the chain kernel takes the pair (ResNet-50's res2 and res3): for "
                   "`build --plugins v3` and `--backend cuda` (the CUDA runner chains a --fuse all model itself); "
                   "`build --plugins qdp` refuses it")
    p.add_argument("--calib-images", type=int, default=8, metavar="N",
                   help="images for the max pass when --scales is not given (default 8)")
    p.add_argument("--report", metavar="F", help="write the candidate table as JSON")
    flags.json_flag(p, "print the summary as JSON instead of tables")
    from .split_k import add_split_k_arguments

    add_split_k_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    from trtfuse.errors import TrtfuseError
    from trtfuse.io import atomic_write_json, load_model, save_model
    from trtfuse.ui import print_json, print_table, progress

    from .pipeline import PASSES, run_pipeline, summary_reason
    from .report import FUSED, REJECTED
    from .scales import load_scales
    from .split_k import split_k_from_args

    from trtfuse.io import check_plain_model
    from trtfuse.validate import check_output_file, check_outputs_distinct

    check_output_file(args.output)
    if args.report:
        check_output_file(args.report, "--report")
    check_outputs_distinct([args.model, args.scales], [args.output, args.report])
    start = time.perf_counter()
    model = load_model(args.model)
    check_plain_model(model, args.model, "rewrite's input")
    scales = load_scales(args.scales) if args.scales else None
    with progress(total=1, desc="rewrite", unit="pass") as bar:
        rewritten, ctx = run_pipeline(model, args.fuse, scales, passes=PASSES, options={"requantize": args.requantize, "chain": args.chain},
                                      calib_count=args.calib_images)
        bar.update(1)
    report = ctx.report
    scales_source = args.scales if args.scales else ctx.scales_source
    split_k_nodes = split_k_from_args(rewritten, args)  # last: it only touches MatMul/Gemm
    rewritten = split_k_nodes.model
    if not any(c.status == FUSED for c in report):
        from trtfuse.ui import warn

        warn(f"no block was fused: {summary_reason(report, model, args.fuse)}; {args.output} holds the model with "
             "its constants folded and BatchNormalization folded, nothing else")
    try:
        save_model(rewritten, args.output)
    except TrtfuseError:
        raise
    except Exception as exc:  # a checker failure here is our bug, but say it in one line
        raise TrtfuseError(f"rewritten model failed onnx.checker: {str(exc).strip().splitlines()[0]}") from None
    seconds = time.perf_counter() - start

    rows = [c.as_dict() for c in report]
    plugin_ops = [n.op_type for n in rewritten.graph.node if n.domain == "trtfuse"]
    summary = {
        "input": args.model,
        "output": args.output,
        "fuse": args.fuse,
        "scales": scales_source,
        "fused_residual_blocks": sum(c.status == FUSED and c.kind.startswith("residual") for c in report),
        "projection_shortcuts": sum(c.status == FUSED and c.kind == "residual-projection" for c in report),
        "chained_pairs": sum(c.status == FUSED and c.pass_name == "chain" for c in report),
        "plugin_nodes": len(plugin_ops),
        "rejected": sum(c.status == REJECTED for c in report),
        "split_k_nodes": split_k_nodes.changed,
        "why_none_fused": summary_reason(report, model, args.fuse) if not plugin_ops else "",
        "nodes_before": len(model.graph.node),
        "nodes_after": len(rewritten.graph.node),
        "seconds": round(seconds, 2),
    }
    if not summary["why_none_fused"]:
        del summary["why_none_fused"]
    split_rows = [vars(r) for r in split_k_nodes.nodes]
    if args.report:
        atomic_write_json(args.report, {"summary": summary, "candidates": rows, "split_k": split_rows})
    if args.json:
        print_json({"summary": summary, "candidates": rows, "split_k": split_rows})
    else:
        print_table(["pass", "kind", "nodes", "status", "op / reason"], [c.row() for c in report])
        if split_rows:
            print()
            print_table(["split-K node", "op", "shapes", "splits", "action", "reason"], [list(r.values()) for r in split_rows])
        print()
        print_table(list(summary), [list(summary.values())])
    return 0
