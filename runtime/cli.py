"""`trtfuse run MODEL.onnx|ENGINE --backend cpu|cuda|trt [--data default|FILE.npy] [--count N] [--reference FP32.onnx] [--json]`,
`trtfuse build`, `trtfuse offline`."""

from __future__ import annotations

from trtfuse import args as flags

from .offline import DEFAULT_STREAMS


BACKENDS = ("cpu", "cuda", "trt")
TORCH_SECONDS_PER_BATCH = 5.0  # --compare-torch: timed at each batch torch_fp16_best tries
LOADGEN_DATA = "DIR|FILE|default|synthetic"  # what `offline` and `server` read as --data (runtime/offline.py load_samples)


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run a (rewritten) model on images and print its top-1 predictions",
        description="Run an ONNX model, rewritten (with trtfuse plugin nodes) or not, and print a logits summary "
        "and top-1 class per image. With --reference, also run an fp32 model on the same images and report "
        "logit cosine similarity and top-1 agreement.",
    )
    flags.model(p, "ONNX model; for --backend trt a serialized TensorRT engine (`trtfuse build`)")
    flags.backend(p, BACKENDS, default="cpu", help="cpu (golden executor; default); cuda (trtfuse's kernels, "
                  "for --fuse all models); trt (a TensorRT engine, trtfuse's plugins registered)")
    p.add_argument("--engine", choices=("ort", "reference"), default="ort",
                   help="cpu backend: run standard ops with onnxruntime (default) or onnx's ReferenceEvaluator")
    flags.data(p, "default", "default: embedded held-out natural images; a folder of JPEG/PNG images; or a float32 "
               "[N, 3, H, W] .npy file", metavar="default|DIR|FILE.npy")
    flags.count(p, 8, "number of images (default 8)", metavar="N")
    p.add_argument("--reference", metavar="FP32.onnx", help="also run this model and compare logits")
    flags.json_flag(p, "print results as JSON")
    p.set_defaults(func=run)

    b = sub.add_parser("build", help="build a TensorRT engine from a rewritten model (needs TensorRT >= 10.9)",
                       description="Parse a rewritten ONNX model with TensorRT's ONNX parser, trtfuse's plugins "
                       "registered first, into a strongly typed network and write a serialized engine.")
    flags.model(b, "rewritten ONNX model")
    flags.output(b, "engine file to write (atomically)", required=True)
    flags.batch(b, None, "optimization profile batch range of a dynamic-batch model (default 1,8,256); a static-batch "
                "model keeps its own batch", metavar="N|MIN,OPT,MAX", profile=True)
    b.add_argument("--timing-cache", metavar="F", help="read and update this timing cache")
    b.add_argument("--plugins", choices=("qdp", "v3"), default="qdp",
                   help="qdp: Quickly Deployable Plugins, AOT kernels embedded in the engine (mma.sync tactics); "
                   "v3: Python IPluginV3 plugins launching trtfuse's kernels, every tactic the GPU runs offered "
                   "(the wgmma ones on Hopper), trtfuse needed where the engine runs (default qdp)")
    b.add_argument("--version-compatible", action="store_true",
                   help="set BuilderFlag.VERSION_COMPATIBLE: the engine then also runs on the lean runtime "
                   "(tensorrt_lean) and on later TensorRT versions")
    flags.json_flag(b, "print the build summary as JSON")
    b.set_defaults(func=build)

    o = sub.add_parser("offline", help="MLPerf-style Offline run on MLPerf LoadGen (samples/s, latency, accuracy)",
                       description="Run LoadGen's Offline scenario on a model: samples preprocessed once and kept on "
                       "the device, one worker per GPU with --streams CUDA graphs in flight, each ending with the "
                       "top-1 of its images on the GPU; a launcher thread feeds the graphs while a completion thread "
                       "answers LoadGen. LoadGen's logs go to --log-dir.")
    flags.model_option(o, "ONNX model (for --backend cuda: a `rewrite --fuse all` model; "
                          "for --backend trt: a serialized engine from `trtfuse build`); not with --endpoint")
    flags.endpoints(o)
    flags.backend(o, ("cuda", "onnxruntime", "trt"), default="cuda")
    flags.data(o, "synthetic", "images folder (with val_map.txt for accuracy), .npy/.npz, default photos, or synthetic",
               metavar=LOADGEN_DATA)
    flags.count(o, None, "samples in the query sample library (default: 2048 on a GPU, 64 with onnxruntime)")
    flags.batch(o, None, "batch size (default: 256 on a GPU; with onnxruntime the model's static batch, else 8)")
    flags.gpus(o, "1", "GPUs, one worker each (default 1)", metavar="N|all", allow_all=True)
    flags.streams(o, DEFAULT_STREAMS, "--backend cuda/trt: runners (CUDA graphs on their own streams) per GPU (default %d)"
                  % DEFAULT_STREAMS)
    o.add_argument("--mode", choices=("performance", "accuracy"), default="performance")
    o.add_argument("--expected-qps", type=float, default=None,
                   help="LoadGen offline_expected_qps: the query holds 1.1 x this x --min-duration samples (default: "
                        "30000 on a GPU; with onnxruntime the rate measured in a short warm-up, so the run is short and valid)")
    flags.min_duration(o, None, "LoadGen min duration in seconds (default: 10 on a GPU, 4 with onnxruntime)")
    flags.loadgen_logs(o, "offline-logs")
    flags.autotune(o, "--backend cuda: time every tactic per conv on each GPU before the run (else the heuristic)")
    flags.plans(o, "--backend cuda: run the tuned plans a results file records (`plans` of `trtfuse bench e2e -o` "
                "or `trtfuse offline --autotune -o`, tuned at this batch or one dividing it) instead of tuning again")
    flags.unfuse(o, "--backend cuda: run this fusion of the GPU runner as the kernels it replaces (repeatable)")
    o.add_argument("--compare-torch", action="store_true",
                   help="also time PyTorch fp16 ResNet-50 (cuDNN, channels_last, CUDA graph) in the same run, at its best "
                   "batch: this run's or a halving of it down to 256 (one that does not fit in the GPU's memory is skipped)")
    o.add_argument("--scaling", action="store_true",
                   help="with --gpus N > 1: first run one GPU with the same settings in a process of its own (its "
                   "expected QPS 1/N of --expected-qps, logs in LOG_DIR/one-gpu, its record LOG_DIR/one-gpu.json), "
                   "and record scaling_vs_1gpu from the two runs")
    o.add_argument("--check-golden", action="store_true",
                   help="with --mode accuracy: also run every sample through the CPU golden executor and record how "
                   "often the answered top-1 equals its top-1 (golden_top1_agreement, golden_top1_mismatches)")
    o.add_argument("--compare-pipeline", action="store_true",
                   help="first feed the same workers directly, without LoadGen, for as many samples (samples/s: what "
                   "LoadGen's side of the run costs)")
    flags.answers(o, "the run's record says which ran")
    flags.output(o, "also write the result JSON here (atomically)")
    flags.json_flag(o, "print the result as JSON")
    o.set_defaults(func=offline)


def loadgen_rows(result: dict, keys: list[str]) -> list:
    """The summary table of a LoadGen run: `keys` of the result, LoadGen's verdict and latencies, the
    answer timeline and, against Triton, each endpoint's request counts."""
    s = result.get("loadgen_summary", {})
    rows = [[k, result.get(k)] for k in keys if k in result] + [[k, s.get(k)] for k in (
        "Result is", "Scheduled samples per second", "Min latency (ns)", "Mean latency (ns)", "50.00 percentile latency (ns)",
        "90.00 percentile latency (ns)", "99.00 percentile latency (ns)") if k in s]
    t = result.get("timeline") or {}
    rows += [[f"timeline: {k}", t[k]] for k in ("first_answer_ms", "steady_samples_per_s", "seconds_beyond_steady")
             if t.get(k) is not None]
    for c in result.get("requests", []):
        rows.append([f"requests {c['endpoint']}", f"sent {c['requests_sent']}, answered {c['requests_answered']}, "
                     f"failed {c['requests_failed']}, answered twice {c['answered_more_than_once']}"])
    if "top1_accuracy" in result:
        rows.append(["top1_accuracy", result["top1_accuracy"]])
    if "golden_top1_agreement" in result:
        rows.append(["top-1 equal to the CPU golden", f"{result['golden_checked'] - len(result['golden_top1_mismatches'])}"
                     f" of {result['golden_checked']}"])
    return rows


def card_rows(cards: list[dict] | None) -> list:
    """One summary row per GPU of a run: the SM clock its power cap left (the figure samples/s follows from card to
    card), its mean power and what held its clock down (runtime/nvml.py)."""
    rows = []
    for c in cards or []:
        held = ", ".join(f"{name} {100 * share:.0f} %" for name, share in c["clock_held_by"].items()) or "nothing"
        watts = (f"{c['watts_mean']:.0f} W" if c["watts_mean"] is not None
                 else f"{c['watts_median']:.0f} W (median reading; too short for the energy counter)")
        rows.append([f"card {c['gpu']}", f"SM {c['sm_mhz_median']:.0f} MHz (median), {watts}, clock held by {held}"])
    return rows


def offline(args) -> int:
    from trtfuse.errors import TrtfuseError
    from trtfuse.io import atomic_write_json
    from trtfuse.runtime.offline import option_refusal, run_offline
    from trtfuse.ui import print_json, print_table, progress

    from trtfuse.validate import check_input_file, check_output_dir, check_output_file, check_outputs_distinct

    if args.endpoint and args.model:
        raise TrtfuseError("--model and --endpoint exclude each other: with --endpoint the servers hold the model")
    if not args.endpoint and not args.model:
        raise TrtfuseError("name the model to run (--model) or the Triton servers to drive (--endpoint)")
    if args.model:
        check_input_file(args.model, "engine" if args.backend == "trt" else "model")
    why = option_refusal(args.backend, args.mode, autotune=args.autotune, plans=args.plans,
                         check_golden=args.check_golden, endpoint=bool(args.endpoint), unfuse=args.unfuse)
    if why:
        raise TrtfuseError(why)
    if args.plans:
        check_input_file(args.plans, "plans")
    if args.output:
        check_output_file(args.output, "-o")
    check_output_dir(args.log_dir, "--log-dir")
    check_outputs_distinct([args.model, args.data], [args.output, args.log_dir])
    gpu = args.backend in ("cuda", "trt") and not args.endpoint
    if args.compare_torch and not gpu:
        raise TrtfuseError("--compare-torch times PyTorch fp16 on a GPU: it goes with --backend cuda or trt")
    if args.scaling and not gpu:
        raise TrtfuseError("--scaling compares GPU counts: it goes with --backend cuda or trt and --model")
    count = args.count or (2048 if gpu else 64)
    min_duration = args.min_duration or (10.0 if gpu else 4.0)
    if args.endpoint:  # every server answers for the model before anything is shown or loaded
        from trtfuse.runtime.triton_client import check_endpoint, model_input

        for url in args.endpoint:
            model_input(check_endpoint(url), args.model_name)
    bar = progress(total=None, desc="offline", unit="img")
    try:
        if args.endpoint:
            from trtfuse.runtime.triton_client import run_triton

            # The servers hold the model: a request is --batch images (default 8), the rate LoadGen is told to
            # expect --expected-qps (default: what one CPU-served small model sustains, 200).
            result = run_triton(args.endpoint, "offline", args.data, count, args.batch or 8, args.mode, args.log_dir,
                                args.expected_qps or 200.0, min_duration, model=args.model_name,
                                max_in_flight=args.max_in_flight, progress_cb=bar.update,
                                shared_memory=args.shared_memory, answers=args.answers)
            result["backend"] = "triton"
        else:
            one_gpu = None
            autotune, plans = args.autotune, args.plans
            if args.scaling:
                from trtfuse.plugins import cuda_driver as cd
                from trtfuse.runtime.offline import run_one_gpu_baseline

                n = cd.device_count() if args.gpus == "all" else int(args.gpus)
                if n < 2:
                    raise TrtfuseError("--scaling compares one GPU with several: give --gpus 2 or more")
                one_gpu = run_one_gpu_baseline(args, count, min_duration, n)
                if autotune:  # the N-GPU run takes the plans the 1-GPU run tuned (its record carries them)
                    autotune, plans = False, one_gpu["record"]
            result = run_offline(args.model, args.backend, args.data, count, args.batch, args.gpus, args.mode,
                                 args.log_dir, args.expected_qps, min_duration, progress_cb=bar.update,
                                 autotune=autotune, streams=args.streams, compare_pipeline=args.compare_pipeline,
                                 check_golden=args.check_golden, plans=plans, answers=args.answers, unfuse=args.unfuse)
            if one_gpu is not None:
                # the same machine, the same invocation: the 1-GPU figure the N-GPU one is judged against
                result["one_gpu"] = {k: one_gpu.get(k) for k in ("samples_per_s", "result", "min_duration_s", "log_dir",
                                                                 "record", "timeline", "cards")}
                if result.get("samples_per_s") and one_gpu.get("samples_per_s"):
                    result["scaling_vs_1gpu"] = result["samples_per_s"] / one_gpu["samples_per_s"]
    finally:
        bar.close()
    if args.compare_torch:
        from trtfuse.bench.e2e import torch_fp16_best

        torch_best = torch_fp16_best(result.get("batch") or args.batch, TORCH_SECONDS_PER_BATCH)
        result["torch_fp16_samples_per_s"] = torch_best["samples_per_s"]
        result["torch_fp16_batch"], result["torch_fp16_by_batch"] = torch_best["batch"], torch_best["by_batch"]
        if result.get("samples_per_s"):
            result["speedup_vs_torch_fp16"] = result["samples_per_s"] / result["torch_fp16_samples_per_s"]
    import datetime

    from trtfuse.plugins import cuda_driver as cd

    result["date"] = datetime.date.today().isoformat()
    result["command"] = args.command_line
    result["device"] = (cd.device_name() if args.backend in ("cuda", "trt") and not args.endpoint
                        else "triton " + ", ".join(result["endpoints"]) if args.endpoint else "cpu")
    if args.output:
        atomic_write_json(args.output, result)
    if args.json:
        print_json(result)
    else:
        keys = ["backend", "endpoints", "batch", "gpus", "streams", "mode", "answers", "expected_qps", "samples_per_s",
                "samples_completed", "scaling_vs_1gpu", "pipeline_samples_per_s", "torch_fp16_samples_per_s",
                "torch_fp16_batch", "mj_per_sample"]
        rows = loadgen_rows(result, keys)
        from trtfuse.runtime.memory_plan import describe

        placed = describe(result.get("activation_bytes_per_runner"))
        if placed:  # what sharing memory by lifetime saves
            rows.append(["activations per runner", placed])
        rows += card_rows(result.get("cards"))
        if result.get("invalid_because"):
            rows.append(["INVALID because", result["invalid_because"]])
        print_table(["field", "value"], rows)
    if result.get("invalid_because"):
        from trtfuse.ui import warn

        warn(f"LoadGen judged the run INVALID: {result['invalid_because']} (its logs: {args.log_dir})")
    return 0


def build(args) -> int:
    from trtfuse.runtime.trt_build import build_engine
    from trtfuse.ui import print_json, print_table

    summary = build_engine(args.model, args.output, args.batch, args.timing_cache, plugins=args.plugins,
                           version_compatible=args.version_compatible)
    if args.json:
        print_json(summary)
    else:
        print_table(["field", "value"], [[k, v] for k, v in summary.items()])
    return 0


def _load_data(args, dims):
    """Images for an input of `dims` ([N, C, H, W], None where dynamic)."""
    import os

    import numpy as np

    from trtfuse.errors import TrtfuseError
    from trtfuse.graph_passes.scales import input_images

    if args.count < 1:
        raise TrtfuseError("--count must be at least 1")
    if args.data == "default":
        return input_images(dims, args.count, split="heldout")
    if os.path.isdir(args.data):  # a folder of images, as calibrate and evaluate take it
        from trtfuse.calib.data import load_data

        size = dims[2] if len(dims) == 4 and dims[2] else 224
        return np.ascontiguousarray(load_data(args.data, args.count, size=size, split="heldout").all(), dtype=np.float32)
    if os.path.exists(args.data) and not os.path.isfile(args.data):
        raise TrtfuseError(f"cannot read --data {args.data}: not a regular file or a folder")
    try:
        data = np.load(args.data, allow_pickle=False)
    except FileNotFoundError:
        raise TrtfuseError(f"cannot read --data {args.data}: no such file or folder (give default, a folder of images or a .npy file)") from None
    except (OSError, ValueError) as exc:
        raise TrtfuseError(f"cannot read {args.data} as a .npy array ({exc})") from None
    if not isinstance(data, np.ndarray):
        raise TrtfuseError(f"--data {args.data}: a .npz archive; give a .npy array or a folder of images")
    if data.ndim != 4 or data.dtype != np.float32 or len(data) == 0:
        raise TrtfuseError(f"{args.data}: need a float32 [N, C, H, W] array, got {data.dtype} {list(data.shape)}")
    if not np.isfinite(data[: args.count]).all():
        raise TrtfuseError(f"{args.data}: the images hold NaN or infinite values")
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


def _trt_logits(trt_engine, images):
    import numpy as np

    from trtfuse.errors import TrtfuseError
    from trtfuse.ui import progress

    from .trt_runner import TrtRunner, batch_for

    batch = batch_for(trt_engine.input, len(images))
    if len(images) % batch:
        raise TrtfuseError(f"the engine runs batches of {batch}: --count {len(images)} must be a multiple of it")
    runner = TrtRunner(trt_engine, batch)
    out = [np.asarray(runner.run(images[i : i + batch]), dtype=np.float32)
           for i in progress(range(0, len(images), batch), desc="run", unit="batch")]
    return np.concatenate(out).reshape(len(images), -1)


def run(args) -> int:
    import os
    import time

    import numpy as np

    from trtfuse.errors import TrtfuseError
    from trtfuse.io import load_model
    from trtfuse.ui import print_json, print_table

    from trtfuse.validate import check_input_file

    if args.backend != "trt" or os.path.lexists(args.model):  # (a missing engine: the engine runner's own message)
        check_input_file(args.model, "engine" if args.backend == "trt" else "model")  # a FIFO would block a read
    if args.reference:
        check_input_file(args.reference, "--reference model")
    if args.backend == "trt":
        from .trt_runner import TrtEngine

        trt_engine = TrtEngine(args.model)
        images = _load_data(args, trt_engine.input_dims)
        start = time.perf_counter()
        logits = _trt_logits(trt_engine, images)
        engine = f"{trt_engine.module_name} {trt_engine.trt.__version__}, {trt_engine.plugins} plugins"
    else:
        from trtfuse.graph_passes.scales import model_input_spec

        model = load_model(args.model)
        images = _load_data(args, model_input_spec(model)[1])
        start = time.perf_counter()
        logits = _logits(model, images, args.engine, "run", args.backend)
        engine = args.engine
    seconds = time.perf_counter() - start
    rows = [{"image": i, "top1": int(np.argmax(l)), "top1_logit": float(np.max(l)),
             "logit_mean": float(l.mean()), "logit_std": float(l.std())} for i, l in enumerate(logits)]
    summary = {"model": args.model, "backend": args.backend, "engine": engine, "images": len(images),
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
