"""`trtfuse run MODEL.onnx --backend cpu [--data default|FILE.npy] [--count N] [--reference FP32.onnx] [--json]`."""

from __future__ import annotations

BACKENDS = ("cpu", "cuda", "trt")
PLANNED = {"trt": "the TensorRT engine runner"}


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run a (rewritten) model on images and print its top-1 predictions",
        description="Run an ONNX model, rewritten (with trtfuse plugin nodes) or not, and print a logits summary "
        "and top-1 class per image. With --reference, also run an fp32 model on the same images and report "
        "logit cosine similarity and top-1 agreement.",
    )
    p.add_argument("model", help="ONNX model")
    p.add_argument("--backend", choices=BACKENDS, default="cpu", help="cpu (golden executor; default); cuda (trtfuse's kernels, "
                   "for --fuse all models); trt is planned")
    p.add_argument("--engine", choices=("ort", "reference"), default="ort",
                   help="cpu backend: run standard ops with onnxruntime (default) or onnx's ReferenceEvaluator")
    p.add_argument("--data", default="default", metavar="default|FILE.npy",
                   help="default: embedded held-out natural images; or a float32 [N, 3, H, W] .npy file")
    p.add_argument("--count", type=int, default=8, metavar="N", help="number of images (default 8)")
    p.add_argument("--reference", metavar="FP32.onnx", help="also run this model and compare logits")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.set_defaults(func=run)

    b = sub.add_parser("build", help="build a TensorRT engine from a rewritten model (needs TensorRT >= 10.9)",
                       description="Parse a rewritten ONNX model with TensorRT's ONNX parser, trtfuse's plugins "
                       "registered first, into a strongly typed network and write a serialized engine.")
    b.add_argument("model", help="rewritten ONNX model")
    b.add_argument("-o", "--output", required=True, help="engine file to write (atomically)")
    b.add_argument("--batch", default="1,8,256", metavar="N|MIN,OPT,MAX", help="optimization profile batch range (default 1,8,256)")
    b.add_argument("--timing-cache", metavar="F", help="read and update this timing cache")
    b.add_argument("--json", action="store_true", help="print the build summary as JSON")
    b.set_defaults(func=build)


def build(args) -> int:
    from trtfuse.runtime.trt_build import build_engine, parse_batch
    from trtfuse.ui import print_json, print_table

    summary = build_engine(args.model, args.output, parse_batch(args.batch), args.timing_cache)
    if args.json:
        print_json(summary)
    else:
        print_table(["field", "value"], [[k, v] for k, v in summary.items()])
    return 0


def _load_data(args, model):
    import numpy as np

    from trtfuse.errors import TrtfuseError
    from trtfuse.graph_passes.scales import model_images

    if args.count < 1:
        raise TrtfuseError("--count must be at least 1")
    if args.data == "default":
        return model_images(model, args.count, split="heldout")
    try:
        data = np.load(args.data, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise TrtfuseError(f"cannot read {args.data} as a .npy array ({exc})") from None
    if data.ndim != 4 or data.dtype != np.float32:
        raise TrtfuseError(f"{args.data}: need a float32 [N, C, H, W] array, got {data.dtype} {list(data.shape)}")
    return data[: args.count]


def _batches(model, images):
    from trtfuse.errors import TrtfuseError
    from trtfuse.graph_passes.scales import model_input_spec

    name, dims = model_input_spec(model)
    if len(dims) == 4 and any(d is not None and d != s for d, s in zip(dims[1:], images.shape[1:])):
        raise TrtfuseError(f"images are {list(images.shape[1:])}, model input {name!r} wants {dims[1:]}")
    batch = dims[0] if dims and dims[0] else len(images)
    if len(images) % batch:
        raise TrtfuseError(f"model has static batch {batch}: --count {len(images)} must be a multiple of it")
    return name, [images[i : i + batch] for i in range(0, len(images), batch)]


def _logits(model, images, engine, desc, backend="cpu"):
    import numpy as np

    from trtfuse.ui import progress

    name, batches = _batches(model, images)
    if backend == "cuda":
        from .gpu_runner import CudaRunner

        runner = CudaRunner(model, len(batches[0]))
        run_batch = runner.run
    else:
        from .cpu_executor import CpuExecutor

        executor = CpuExecutor(model, engine=engine)
        run_batch = lambda batch: executor.run({name: batch})[executor.output_names[0]]
    out = []
    for batch in progress(batches, desc=desc, unit="batch"):
        out.append(np.asarray(run_batch(batch), dtype=np.float32))
    logits = np.concatenate(out)
    return logits.reshape(len(images), -1)


def run(args) -> int:
    import time

    import numpy as np

    from trtfuse.errors import TrtfuseError
    from trtfuse.io import load_model
    from trtfuse.ui import print_json, print_table

    if args.backend == "trt":
        raise TrtfuseError(f"backend {args.backend!r} is not available yet ({PLANNED[args.backend]} is a later "
                           "issue): use --backend cpu")
    model = load_model(args.model)
    images = _load_data(args, model)
    start = time.perf_counter()
    logits = _logits(model, images, args.engine, "run", args.backend)
    seconds = time.perf_counter() - start
    rows = [{"image": i, "top1": int(np.argmax(l)), "top1_logit": float(np.max(l)),
             "logit_mean": float(l.mean()), "logit_std": float(l.std())} for i, l in enumerate(logits)]
    summary = {"model": args.model, "backend": args.backend, "engine": args.engine, "images": len(images),
               "seconds": round(seconds, 2), "images_per_s": round(len(images) / seconds, 2) if seconds else None}
    if args.reference:
        ref = _logits(load_model(args.reference), images, "ort", "reference")
        if ref.shape != logits.shape:
            raise TrtfuseError(f"reference logits are {list(ref.shape)}, model's are {list(logits.shape)}")
        cos = np.sum(ref * logits, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(logits, axis=1) + 1e-30)
        agree = np.argmax(ref, 1) == np.argmax(logits, 1)
        for row, c, a, r in zip(rows, cos, agree, np.argmax(ref, 1)):
            row.update(reference_top1=int(r), cosine=float(c), top1_agrees=bool(a))
        summary.update(reference=args.reference, cosine_mean=float(cos.mean()), cosine_min=float(cos.min()),
                       top1_agreement=float(agree.mean()))
    if args.json:
        print_json({"summary": summary, "images": rows})
    else:
        print_table(list(rows[0]), [list(r.values()) for r in rows])
        print()
        print_table(list(summary), [list(summary.values())])
    return 0
