"""`trtfuse models ARCH -o OUT.onnx [options]`: write a ResNet ONNX model built here (no download)."""

from __future__ import annotations

from trtfuse import args as flags



def register(sub) -> None:
    p = sub.add_parser(
        "models",
        help="build a ResNet ONNX model with synthetic, BN-re-estimated weights",
        description="Build ResNet-18/34/50/101 (torchvision v1.5 topology) as ONNX with deterministic synthetic "
        "weights whose BN statistics are re-estimated on natural images. Every variant computes the same function.",
    )
    flags.arch(p, "architecture")
    flags.output(p, "ONNX file to write (atomically)", required=True)
    p.add_argument("--opset", type=int, default=13, help="ONNX opset, 13..21 (default 13; 17 is the other common one)")
    batch = p.add_mutually_exclusive_group()
    flags.batch(batch, 1, "static batch size (default 1)", metavar="N")
    batch.add_argument("--dynamic-batch", action="store_true", help='dynamic batch dimension, dim_param "N"')
    p.add_argument("--fold-bn", action="store_true", help="fold BatchNormalization into Conv bias (as torch.onnx export does)")
    p.add_argument("--classifier", choices=("gemm", "matmul"), default="gemm", help="fc as Gemm(transB=1) (default) or MatMul+Add")
    p.add_argument("--pool", choices=("gap", "reducemean"), default="gap", help="GlobalAveragePool+Flatten (default) or ReduceMean over H,W")
    flags.image_size(p, 224, "input height = width, a multiple of 32, >= 32 (default 224)")
    flags.seed(p)
    p.add_argument("--bn-images", type=int, help="natural images for BN re-estimation (default: the library's, 32)")
    flags.json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    from trtfuse.io import save_model
    from trtfuse.ui import print_json, print_table, progress

    from .builder import build
    from .resnet import count_parameters, resnet_spec
    from .weights import synthesis_steps

    from trtfuse.validate import check_output_file

    check_output_file(args.output)  # fail before the build, not after it
    options = dict(
        opset=args.opset,
        batch=None if args.dynamic_batch else args.batch,
        fold_bn=args.fold_bn,
        classifier=args.classifier,
        pool=args.pool,
        image_size=args.image_size,
        seed=args.seed,
    )
    if args.bn_images is not None:
        options["bn_images"] = args.bn_images
    start = time.perf_counter()
    steps = synthesis_steps(resnet_spec(args.arch))
    with progress(total=steps, desc=f"{args.arch}: weights", unit="layer") as bar:
        model = build(args.arch, progress=lambda: bar.update(1), **options)
    save_model(model, args.output, check=False)  # build() ran the full checker already
    seconds = time.perf_counter() - start

    summary = {
        "arch": args.arch,
        "params": count_parameters(model),
        "nodes": len(model.graph.node),
        "convs": sum(n.op_type == "Conv" for n in model.graph.node),
        "bn": "folded" if args.fold_bn else "explicit",
        "opset": args.opset,
        "batch": "N (dynamic)" if args.dynamic_batch else args.batch,
        "image_size": args.image_size,
        "file": args.output,
        "seconds": round(seconds, 2),
    }
    if args.json:
        print_json(summary)
    else:
        print_table(list(summary), [list(summary.values())])
    return 0
