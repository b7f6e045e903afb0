"""`trtfuse serve` (a Triton Inference Server process serving a model), `trtfuse export-triton` (a Triton model
repository) and `trtfuse server` (LoadGen's Server scenario against Triton endpoints)."""

from __future__ import annotations

import time

from trtfuse import args as flags

from .cli import LOADGEN_DATA, loadgen_rows


def _preferred(text: str | None) -> list[int]:
    from trtfuse.errors import TrtfuseError

    if not text:
        return []
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise TrtfuseError(f"--preferred-batch {text!r}: comma-separated batch sizes, e.g. 8,16") from None


def register(sub) -> None:
    s = sub.add_parser("serve", help="serve a model on Triton Inference Server (KServe v2 HTTP/gRPC, metrics)",
                       description="Write a model repository whose model runs trtfuse's executor behind Triton's "
                       "Python backend, start Triton's server binary (unpacked from the nvidia-pytriton wheel into "
                       "a cache) on 127.0.0.1 with dynamic batching and one model instance per GPU, and serve until "
                       "Ctrl-C / SIGTERM (or --duration): then Triton refuses new requests, answers those it holds "
                       "and exits.")
    flags.model(s, "ONNX model (--backend cuda: a `rewrite --fuse all` model); --backend trt: an engine")
    flags.backend(s, ("cuda", "onnxruntime", "trt"), required=True)
    flags.gpus(s, None, "cuda/trt: GPUs, one model instance each (default 1)")
    flags.streams(s, 2, "cuda/trt: runners (CUDA graphs on their own streams) inside each instance (default 2)")
    s.add_argument("--instances", type=int, default=1, metavar="N",
                   help="cuda/trt: model instances per GPU, each its own process (default 1)")
    flags.threads(s, 0, "onnxruntime: intra-op threads (default: onnxruntime's choice)", metavar="N")
    flags.triton_batching(s, 64)
    s.add_argument("--port", type=int, metavar="P", help="HTTP port (default: a free one); gRPC and metrics default "
                   "to P+1 and P+2")
    s.add_argument("--grpc-port", type=int, metavar="P")
    s.add_argument("--metrics-port", type=int, metavar="P")
    s.add_argument("--repo", metavar="DIR", help="write the model repository here and keep it (default: a temporary one)")
    s.add_argument("--duration", type=float, metavar="S", help="stop by itself after S seconds (default: until a signal)")
    s.add_argument("--exit-timeout", type=int, default=30, metavar="S",
                   help="on shutdown, how long Triton waits for the requests it holds (default 30)")
    s.add_argument("--log", metavar="FILE", help="Triton's log (default: a temporary file, removed)")
    s.add_argument("--shm-mb", type=int, metavar="MB", help="the Python backend's shared-memory pool per instance, "
                   "start and growth step (default: two full batches of input images, at least 16)")
    flags.json_flag(s, "one JSON line when ready, one when stopped")
    s.set_defaults(func=serve)

    e = sub.add_parser("export-triton", help="write a Triton model repository (tensorrt_plan, or trtfuse's executors)",
                       description="Write REPO/NAME/config.pbtxt (validated against Triton's model-config schema) and "
                       "version 1. --backend trt (default): a standard Triton + TensorRT deployment, platform "
                       "tensorrt_plan; an engine is copied to 1/model.plan, for an ONNX model the command to build it "
                       "there is printed. --backend cuda|onnxruntime: trtfuse's executor behind the Python backend "
                       "(what `trtfuse serve` runs).")
    flags.model(e, "ONNX model or TensorRT engine")
    flags.output(e, "model repository folder (created if need be)", required=True, metavar="REPO")
    flags.backend(e, ("trt", "cuda", "onnxruntime"), default="trt")
    flags.gpus(e, 1, "one model instance per GPU, GPUs 0..N-1 (default 1)")
    flags.streams(e, 2, "cuda: runners per instance (default 2)")
    flags.triton_batching(e, 256)
    flags.json_flag(e)
    e.set_defaults(func=export_triton)

    v = sub.add_parser("server", help="MLPerf LoadGen Server scenario against Triton endpoints (p99 latency bound)",
                       description="Run LoadGen's Server scenario (Poisson arrivals, one sample per query) against one "
                       "or several Triton servers over gRPC; VALID when the p99 latency is within the bound "
                       "(MLPerf ResNet-50: 15 ms). --find-peak searches the highest VALID target QPS.")
    flags.endpoints(v)
    v.add_argument("--target-qps", type=float, default=100.0, help="LoadGen server_target_qps (default 100)")
    v.add_argument("--latency-bound-ms", type=float, default=15.0, help="p99 latency bound (default 15, MLPerf ResNet-50)")
    v.add_argument("--find-peak", action="store_true",
                   help="double the target from --target-qps until a run is INVALID, then bisect (--max-runs runs)")
    v.add_argument("--max-runs", type=int, default=6, metavar="N", help="--find-peak: runs at most (default 6)")
    v.add_argument("--peak-by", choices=("valid", "p99"), default="valid",
                   help="--find-peak: a run passes when LoadGen says VALID (default; its early stopping needs some "
                   "hundreds of queries per run) or when the measured p99 is within the bound")
    flags.data(v, "synthetic", None, metavar=LOADGEN_DATA)
    flags.count(v, 1024, "samples in the query sample library (default 1024)")
    flags.min_duration(v, 10.0, "LoadGen min duration per run (default 10)")
    flags.loadgen_logs(v, "server-logs")
    flags.output(v, "also write the result JSON here (atomically)")
    flags.json_flag(v, "print the result as JSON")
    v.set_defaults(func=server)


def _gpu_list(backend: str, n: int | None) -> list[int]:
    from trtfuse.errors import TrtfuseError

    if backend == "onnxruntime":
        if n:
            raise TrtfuseError("--gpus: --backend onnxruntime runs on the CPU")
        return []
    n = 1 if n is None else n
    if n < 1:
        raise TrtfuseError(f"--gpus {n}: need at least 1")
    from trtfuse.plugins import cuda_driver as cd

    ok, why = cd.gpu_available()
    if not ok:
        raise TrtfuseError(f"--backend {backend} needs an NVIDIA GPU: {why}")
    have = cd.check(cd._driver().cuDeviceGetCount())
    if n > have:
        raise TrtfuseError(f"--gpus {n}: this machine has {have} GPU(s)")
    return list(range(n))


def _served_counts(metrics: str, model: str) -> dict:
    """Triton's per-model request counters from its Prometheus text."""
    out = {}
    for line in metrics.splitlines():
        for key in ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                    "nv_inference_exec_count"):
            if line.startswith(key + "{") and f'model="{model}"' in line:
                try:
                    out[key] = out.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
                except ValueError:
                    pass
    return out


def _batch_bytes(exported: dict) -> int:
    """Bytes of one full batch of the served model's fp32 input images."""
    import math

    return exported["max_batch_size"] * 4 * math.prod(exported["input_shape"][1:])


def _shm_bytes(exported: dict, shm_mb: int | None) -> int:
    """The Python backend's shared-memory pool (start and growth step): --shm-mb, else room for two full
    batches of input images (the batch's tensors pass through it), at least 16 MiB."""
    if shm_mb is not None:
        return shm_mb << 20
    return max(16 << 20, 2 * _batch_bytes(exported))


def _cuda_pool_bytes(exported: dict, instances_per_gpu: int) -> int:
    """Triton's CUDA memory pool per GPU, through which GPU input tensors (images a client put in CUDA shared
    memory) reach the Python backend's stubs: room for four full batches of fp32 images per instance, at least
    Triton's default 64 MiB."""
    return max(64 << 20, 4 * instances_per_gpu * _batch_bytes(exported))


def serve(args) -> int:
    import json
    import shutil
    import signal
    import sys
    import tempfile
    import threading

    from trtfuse.errors import TrtfuseError
    from trtfuse.runtime import triton_repo, triton_server
    from trtfuse.ui import print_table, progress

    if args.shm_mb is not None and args.shm_mb < 1:
        raise TrtfuseError("--shm-mb must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise TrtfuseError("--duration must be positive")
    gpus = _gpu_list(args.backend, args.gpus)
    http, grpc, metrics = args.port, args.grpc_port, args.metrics_port
    if http is not None:
        grpc = grpc if grpc is not None else http + 1
        metrics = metrics if metrics is not None else http + 2
    stop = threading.Event()
    got = []

    def on_signal(signum, frame):
        got.append(signal.Signals(signum).name)
        stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    own_repo = args.repo is None
    repo = tempfile.mkdtemp(prefix="trtfuse-triton-repo-") if own_repo else args.repo
    server = None
    try:
        exported = triton_repo.export_python(args.model, repo, args.backend, name=args.name, max_batch=args.max_batch,
                                             preferred=_preferred(args.preferred_batch),
                                             queue_delay_us=args.max_queue_delay_us, gpus=gpus, streams=args.streams,
                                             threads=args.threads, instances_per_gpu=args.instances)
        bar = progress(total=None, desc="starting tritonserver", unit="step")
        install = triton_server.locate()
        bar.update()
        server = triton_server.TritonServer(repo, install, http_port=http, grpc_port=grpc, metrics_port=metrics,
                                            log_path=args.log, exit_timeout_s=args.exit_timeout, gpu_metrics=bool(gpus),
                                            python_shm_bytes=_shm_bytes(exported, args.shm_mb),
                                            cuda_pool_bytes={g: _cuda_pool_bytes(exported, args.instances) for g in gpus})
        started = time.monotonic()
        server.start()
        bar.close()
        ready = {"event": "ready", "model": args.name, "backend": args.backend, "http": server.http_url,
                 "grpc": server.grpc_url, "metrics": server.metrics_url, "instances": exported["instances"],
                 "max_batch_size": exported["max_batch_size"], "preferred_batch_size": exported["preferred_batch_size"],
                 "max_queue_delay_us": exported["max_queue_delay_us"], "repository": repo if not own_repo else None,
                 "pid": server.proc.pid, "seconds_to_ready": round(time.monotonic() - started, 2)}
        if args.json:
            print(json.dumps(ready), flush=True)
        else:
            print_table(["field", "value"], [[k, v] for k, v in ready.items() if k != "event" and v is not None])
            print("serving; Ctrl-C or SIGTERM stops (requests in flight are answered first)", flush=True)
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while not stop.is_set():
            if server.proc.poll() is not None:
                raise TrtfuseError(f"tritonserver exited by itself with status {server.proc.returncode}: {server.log_tail()}")
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop.wait(0.2)
        try:
            counts = _served_counts(server.metrics(), args.name)
        except OSError:
            counts = {}
        status = server.stop()
        final = {"event": "stopped", "reason": got[0] if got else "duration", "exit_status": status,
                 "served_seconds": round(time.monotonic() - started, 2), **counts}
        if args.json:
            print(json.dumps(final), flush=True)
        else:
            print_table(["field", "value"], [[k, v] for k, v in final.items() if k != "event"])
        if status != 0:
            raise TrtfuseError(f"tritonserver exited with status {status}: {server.log_tail()}")
        return 0
    finally:
        if server is not None:
            server.stop()
            server.cleanup()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if own_repo:
            shutil.rmtree(repo, ignore_errors=True)
        sys.stdout.flush()


def export_triton(args) -> int:
    from trtfuse.errors import TrtfuseError
    from trtfuse.runtime import triton_repo
    from trtfuse.ui import print_json, print_table

    gpus = list(range(args.gpus))
    common = dict(name=args.name, max_batch=args.max_batch, preferred=_preferred(args.preferred_batch),
                  queue_delay_us=args.max_queue_delay_us)
    if args.backend == "trt":
        if not gpus:
            raise TrtfuseError("--backend trt: a tensorrt_plan model runs on GPUs, --gpus must be at least 1")
        out = triton_repo.export_plan(args.model, args.output, gpus=gpus, **common)
    else:
        out = triton_repo.export_python(args.model, args.output, args.backend,
                                        gpus=gpus if args.backend == "cuda" else [], streams=args.streams, **common)
    if args.json:
        print_json(out)
    else:
        print_table(["field", "value"], [[k, v] for k, v in out.items()])
    return 0


def server(args) -> int:
    import datetime
    from pathlib import Path

    from trtfuse.errors import TrtfuseError
    from trtfuse.io import atomic_write_json
    from trtfuse.runtime.offline import load_samples
    from trtfuse.runtime.triton_client import find_peak, model_input, run_triton
    from trtfuse.ui import print_json, print_table, progress

    if not args.endpoint:
        raise TrtfuseError("--endpoint: name at least one Triton gRPC endpoint (`trtfuse serve` prints it)")
    if args.count < 1 or args.target_qps <= 0 or args.min_duration <= 0 or args.max_runs < 1 or args.max_in_flight < 1:
        raise TrtfuseError("--count, --target-qps, --min-duration, --max-runs and --max-in-flight must be positive")
    if args.latency_bound_ms <= 0:
        raise TrtfuseError("--latency-bound-ms must be positive")
    from trtfuse.runtime.triton_client import check_endpoint

    _, dims, _, _ = model_input(check_endpoint(args.endpoint[0]), args.model_name)
    samples = load_samples(args.data, args.count, size=dims[-1]) if len(dims) == 3 else None
    bar = progress(total=None, desc="server", unit="query")
    runs_done = [0]

    def run_at(qps):
        log_dir = Path(args.log_dir) / f"qps-{qps:.1f}" if args.find_peak else Path(args.log_dir)
        r = run_triton(args.endpoint, "server", args.data, args.count, 1, "performance", str(log_dir), qps,
                       args.min_duration, model=args.model_name, max_in_flight=args.max_in_flight,
                       latency_bound_ms=args.latency_bound_ms, progress_cb=bar.update, samples=samples,
                       shared_memory=args.shared_memory)
        runs_done[0] += 1
        return r

    if args.find_peak:
        last = {}

        def run_and_keep(qps):
            last[qps] = run_at(qps)
            return last[qps]

        peak = find_peak(run_and_keep, args.target_qps, args.max_runs,
                         key="valid" if args.peak_by == "valid" else "p99_within_bound")
        best = last[peak["peak_qps"]] if peak["peak_qps"] is not None else last[peak["runs"][-1]["target_qps"]]
        result = dict(best, **peak)
    else:
        result = run_at(args.target_qps)
    bar.close()
    result.update(latency_bound_ms=args.latency_bound_ms, date=datetime.date.today().isoformat(),
                  command=args.command_line, device="triton " + ", ".join(result["endpoints"]))
    if args.output:
        atomic_write_json(args.output, result)
    if args.json:
        print_json(result)
    else:
        keys = ["endpoints", "scenario", "latency_bound_ms", "samples_per_s", "samples_issued", "samples_completed",
                "p99_latency_ms", "p99_within_bound", "early_stopping_satisfied", "valid", "peak_criterion", "peak_qps",
                "lowest_failing_qps"]
        print_table(["field", "value"], loadgen_rows(result, keys))
        if args.find_peak:
            print()
            cols = ["target_qps", "valid", "p99_within_bound", "p99_latency_ms", "completed_samples_per_s"]
            print_table(cols, [[r[c] for c in cols] for r in result["runs"]])
    return 0
