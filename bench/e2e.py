"""End-to-end throughput of INT8 ResNet-50 on trtfuse's kernels (`--backend cuda`) against PyTorch fp16
(cuDNN, channels_last, CUDA graph) in the same run. Used by `trtfuse offline` and on its own:

    trtfuse bench e2e --batch 256 [--streams 2] [--seconds 5] [--autotune]

Prints samples/s per backend and the per-layer time breakdown of one forward (each conv timed alone
through the same launch plans). Three figures for ours: the graph loop (`--streams` graphs launched and
synchronized round-robin), the same on one stream, and the Offline harness's pipeline without LoadGen
(time_offline_pipeline), which separates what the pipeline costs from what LoadGen adds.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import numpy as np

from trtfuse import args as flags
from trtfuse.errors import TrtfuseError


def build_fused_resnet50(batch: int, image_size: int = 224, calib: int = 8):
    from ..calib.data import default_images
    from ..graph_passes.pipeline import rewrite
    from ..models import build

    model = build("resnet50", image_size=image_size, batch=None)  # dynamic batch: calibrate on few images
    images = default_images(calib, image_size)
    fused, _ = rewrite(model, "all", calib_images=images)
    return model, fused


def launch_round(runners) -> int:
    """One forward on each runner, all in flight, then wait for them: the images run."""
    for r in runners:
        r.launch()
    for r in runners:
        r.stream.synchronize()
    return sum(r.batch for r in runners)


def time_runners(runners, seconds: float) -> float:
    """samples/s with len(runners) graphs in flight, round-robin, for about `seconds`."""
    launch_round(runners)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += launch_round(runners)
    return done / (time.perf_counter() - start)


TORCH_SMALLEST_BATCH = 256


def torch_batches(batch: int) -> list[int]:
    """The batches the PyTorch baseline is timed at: the run's and each halving of it down to 256 (a batch under 256:
    itself only)."""
    out = [batch]
    while out[-1] % 2 == 0 and out[-1] // 2 >= TORCH_SMALLEST_BATCH:
        out.append(out[-1] // 2)
    return out


def torch_fp16_best(batch: int, seconds: float) -> dict:
    """PyTorch fp16 at its own best batch no larger than the run's (torch_batches), `seconds` at each. A baseline at our
    batch alone would flatter us: on an H200 cuDNN runs batch 4096 about 30 % below batch 1024. Returns samples_per_s,
    the batch that gave it, and every batch's figure (None: that batch did not fit in the GPU's memory)."""
    by_batch = {b: torch_fp16_samples_per_s(b, seconds) for b in torch_batches(batch)}
    ran = {b: v for b, v in by_batch.items() if v is not None}
    if not ran:
        raise TrtfuseError(f"PyTorch fp16 ran out of GPU memory at every batch from {batch} down to "
                           f"{min(by_batch)}: the baseline cannot be timed on this GPU")
    best = max(ran, key=ran.get)
    return {"samples_per_s": ran[best], "batch": best, "by_batch": {str(b): v for b, v in by_batch.items()}}


def torch_fp16_samples_per_s(batch: int, seconds: float, image_size: int = 224) -> float | None:
    """samples/s of PyTorch fp16 ResNet-50 at `batch` for about `seconds`, or None where the batch does not fit in the
    GPU's memory."""
    import torch

    try:
        return _torch_fp16_rate(batch, seconds, image_size)
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        torch.cuda.empty_cache()  # the next batch torch_fp16_best tries, or our runners, get this memory back


def _torch_fp16_rate(batch: int, seconds: float, image_size: int) -> float:
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    net = torchvision.models.resnet50().cuda().half().eval().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, image_size, image_size, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    s = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(3):
            net(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g, stream=s):
        net(x)
    g.replay()
    torch.cuda.synchronize()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        g.replay()
        torch.cuda.synchronize()
        done += batch
    return done / (time.perf_counter() - start)


def layer_breakdown(runner, reps: int = 10) -> list[dict]:
    """Each step of the forward timed alone (events around `reps` launches on the runner's stream)."""
    from ..plugins import cuda_driver as cd

    timer = cd.Timer()
    out = []
    for label, step in runner.steps:
        launches = lambda: [step(runner.stream.handle) for _ in range(reps)]
        out.append({"step": label, "ms": statistics.median(timer.time(launches, runner.stream.handle, 5)) / reps})
    return out


_BLOCK_STEP = re.compile(r"layer(\d+)\.(\d+)\.(conv\d|downsample)")


def step_group(label: str) -> str:
    """The kind of layer a breakdown step is, for the per-batch table: stem, max-pool, "res3 conv2", ... ."""
    if label.startswith("quantize input"):
        return "input quantize"
    if label.startswith("conv1"):  # the stem, with its max-pool, and with res2's first conv1 inside (fuse_stem_conv)
        if "max-pool" not in label:
            return "stem 7x7/2 conv + ReLU"
        return "stem 7x7/2 conv + ReLU + max-pool 3x3/2" + (" + res2 first conv1" if _BLOCK_STEP.search(label) else "")
    block = _BLOCK_STEP.search(label)
    if block and label.endswith("(chain)"):  # a block's conv3 and the next block's conv1, one kernel
        return f"res{int(block.group(1)) + 1} conv3 + residual + next conv1"
    if block and label.endswith("(chain + downsample)"):  # and the stage's downsample computing its residual
        return f"res{int(block.group(1)) + 1} downsample + conv3 + residual + next conv1"
    if block:
        return f"res{int(block.group(1)) + 1} {block.group(3)}"
    if "maxpool" in label or "max-pool" in label:
        return "max-pool 3x3/2"
    return "average pool, classifier, top-1"


def per_batch_table(breakdown: list[dict], samples_per_s: float, batch: int) -> dict:
    """Every step's time summed per kind of layer, each kind weighted by how often it occurs in the forward, next to
    the batch time the run's throughput implies (batch / samples_per_s): where each microsecond of a batch goes."""
    rows: dict[str, dict] = {}
    for b in breakdown:
        row = rows.setdefault(step_group(b["step"]), {"group": step_group(b["step"]), "count": 0, "ms": 0.0})
        row["count"] += 1
        row["ms"] += b["ms"]
    total = sum(r["ms"] for r in rows.values())
    for r in rows.values():
        r["share"] = r["ms"] / total if total else None
    return {"rows": list(rows.values()), "sum_of_steps_ms": total,
            "batch_ms_in_flight": 1e3 * batch / samples_per_s if samples_per_s else None}


def time_offline_pipeline(plans_from, fused, streams: int, seconds: float, rate_hint: float | None, samples: int = 512,
                          options: dict | None = None) -> float:
    """samples/s of the Offline harness's GPU pipeline without LoadGen (runtime/offline.drive_workers) over
    `streams` runners in `trtfuse offline`'s form (int8 samples kept on the GPU, quantized_input) with
    `plans_from`'s plans, for about `seconds` (sized from `rate_hint` samples/s; None: from a first short run).
    Between the graph loop and LoadGen's figure: what the pipeline costs, and what LoadGen adds on top.
    options: CudaRunner's (unfused_options)."""
    from ..runtime.gpu_runner import CudaRunner
    from ..runtime.offline import _cuda_worker, drive_workers

    batch = plans_from.batch
    images = np.random.default_rng(1).normal(size=(samples, *image_shape(fused))).astype(np.float32)
    worker = _cuda_worker(lambda: CudaRunner(fused, batch, plans_from=plans_from, quantized_input=True, **(options or {})), batch, images,
                          0, streams)
    try:
        if rate_hint is None:  # a few batches after the warm-up: enough to size the timed run
            rate_hint = drive_workers([worker], batch, samples, 0)
        return drive_workers([worker], batch, samples, rate_hint * seconds)
    finally:
        worker.close()


def add_arguments(p) -> None:
    flags.batch(p, 256, "batch size (default 256)")
    flags.streams(p, 2, "runners (CUDA graphs) in flight (default 2)", metavar=None)
    flags.seconds(p, 5.0, "timed seconds per figure (default 5)")
    p.add_argument("--no-torch", action="store_true",
                   help="skip the PyTorch fp16 baseline (timed at its best batch: this run's or a halving down to 256; a batch "
                        "that does not fit in the GPU's memory is skipped)")
    flags.autotune(p, "time every tactic per conv when building the runner")
    flags.plans(p, "run the tuned plans a results file records (`bench e2e -o`, `offline -o`) instead of tuning; "
                "its batch must be this run's or divide it")
    p.add_argument("--no-fold-stem", action="store_true", help="run the stem on CHW4 instead of space-to-depth")
    flags.unfuse(p, "run this fusion of the GPU runner as the kernels it replaces (repeatable): the A/B of a fusion in "
                    "one command")
    flags.model_option(p, "time this model as `trtfuse rewrite --fuse all` wrote it instead of a ResNet-50 built and "
                          "rewritten here (with --no-torch or --pipeline-only)", metavar="REWRITTEN_ONNX")
    p.add_argument("--pipeline-only", action="store_true",
                   help="time only the Offline pipeline without LoadGen (what `trtfuse offline` would run, less LoadGen): "
                        "no graph loop, no per-step breakdown, no PyTorch; a card's figure in seconds")
    p.add_argument("--energy", action="store_true",
                   help="also read the board's energy counter (NVML) around each step run back to back and around the "
                        "forward in flight: millijoules per batch by kind of layer (bench/energy.py)")


def image_shape(model) -> tuple:
    """(C, H, W) of the model's image input (graph_passes.scales.model_input_spec's dims after the batch; None where
    a dimension is not fixed)."""
    from ..graph_passes.scales import model_input_spec

    return tuple(model_input_spec(model)[1][1:])


def load_rewritten(path: str):
    """`--model`: a model as `trtfuse rewrite --fuse all` wrote it (checked before any GPU work)."""
    from ..io import load_model

    model = load_model(path)
    if not any(node.op_type.startswith("FusedConv") for node in model.graph.node):
        raise TrtfuseError(f"{path} has no fused convolutions: give the output of `trtfuse rewrite --fuse all`")
    shape = image_shape(model)
    if len(shape) != 3 or any(d is None or d < 1 for d in shape):
        raise TrtfuseError(f"{path}: its input must be images [N, C, H, W] with C, H, W fixed, not {list(shape)}")
    return model


def _run_pipeline_only(args, given, options, fused) -> int:
    """--pipeline-only: the Offline pipeline without LoadGen on --plans' plans (else this run's own: autotuned with
    --autotune, the heuristic's otherwise), recorded with the command and the device."""
    import datetime
    from types import SimpleNamespace

    from ..plugins import cuda_driver as cd
    from ..runtime.gpu_runner import CudaRunner
    from ..ui import print_json, print_table, progress

    steps = progress(total=1, desc="e2e", unit="step")
    if given is not None:
        plans_from = SimpleNamespace(plans=given.plans, stem_pool_tile=given.stem_pool_tile, batch=args.batch)
    else:
        plans_from = CudaRunner(fused, args.batch, fold_stem=not args.no_fold_stem, autotune=args.autotune, use_graph=False,
                                **options)
    pipeline = time_offline_pipeline(plans_from, fused, args.streams, args.seconds, None, options=options)
    steps.update(1)
    steps.close()
    device = cd.device_name()
    result = {"device": device, "date": datetime.date.today().isoformat(), "command": args.command_line,
              "batch": args.batch, "streams": args.streams, "autotune": args.autotune, "plans_file": args.plans,
              "plans_tuned_at_batch": given.batch if given else None, "model": args.model, "unfused": list(args.unfuse),
              "offline_pipeline_samples_per_s": pipeline}
    from . import record_result

    path = record_result("e2e", device, result, getattr(args, "output", None),
                         {"offline_pipeline_samples_per_s": pipeline, "pipeline_only": True,
                          **({"unfused": result["unfused"]} if args.unfuse else {})})
    if getattr(args, "json", False):
        print_json(result)
    else:
        print_table(["measurement", "value"], [["samples/s (offline pipeline, no LoadGen)", f"{pipeline:,.0f}"],
                                               ["results", path]])
    return 0


def run(args) -> int:
    """`trtfuse bench e2e`: INT8 ResNet-50 (`--fuse all`) on our kernels against PyTorch fp16, same run."""
    import datetime

    from ..plugins import cuda_driver as cd
    from ..runtime.gpu_runner import CudaRunner, unfused_options
    from ..runtime.memory_plan import describe
    from ..ui import print_json, print_table, progress

    options = unfused_options(args.unfuse)
    if args.batch < 1 or args.streams < 1 or args.seconds <= 0:
        raise TrtfuseError("--batch and --streams must be at least 1 and --seconds positive")
    given = None
    if args.plans:
        from ..runtime.gpu_runner import load_plans

        if args.autotune:
            raise TrtfuseError("--plans runs a results file's tuned plans: not with --autotune")
        given = load_plans(args.plans, args.batch)  # checks the file too
    if args.pipeline_only and args.energy:
        raise TrtfuseError("--energy reads the graph loop and each step: not with --pipeline-only")
    if args.model and not (args.pipeline_only or args.no_torch):
        raise TrtfuseError("--model times a given model, PyTorch's baseline is torchvision's ResNet-50: add --no-torch")
    rewritten = load_rewritten(args.model) if args.model else None
    ok, why = cd.gpu_available()
    if not ok:
        raise TrtfuseError(f"trtfuse bench e2e needs an NVIDIA GPU: {why}")
    if args.energy:
        from ..runtime.nvml import nvml_refusal

        why = nvml_refusal(cd.current_device())
        if why:
            raise TrtfuseError(f"--energy reads NVML's energy counter, which is not readable here: {why}")
    t0 = time.perf_counter()
    fused = rewritten if rewritten is not None else build_fused_resnet50(args.batch)[1]
    prep_s = time.perf_counter() - t0
    if args.pipeline_only:
        return _run_pipeline_only(args, given, options, fused)
    steps = progress(total=6 if args.energy else 5, desc="e2e", unit="step")
    runners = [CudaRunner(fused, args.batch, fold_stem=not args.no_fold_stem, autotune=args.autotune, plans_from=given,
                          **options)]
    runners += [CudaRunner(fused, args.batch, fold_stem=not args.no_fold_stem, plans_from=runners[0], **options)
                for _ in range(args.streams - 1)]
    images = np.random.default_rng(0).normal(size=(args.batch, *image_shape(fused))).astype(np.float32)
    for r in runners:
        r.load_input(images)
    steps.update(1)
    ours = time_runners(runners, args.seconds)
    ours_one = time_runners(runners[:1], args.seconds / 2)
    steps.update(1)
    pipeline = time_offline_pipeline(runners[0], fused, args.streams, args.seconds, ours, options=options)
    steps.update(1)
    breakdown = layer_breakdown(runners[0])
    steps.update(1)
    energy = None
    if args.energy:
        from ..runtime.nvml import Nvml
        from .energy import forward_energy, per_batch_energy, step_energy

        meter = Nvml(cd.current_device())
        forward = forward_energy(runners, meter, args.seconds)
        by_step = step_energy(runners[0], meter)
        energy = {"forward": forward, "steps": by_step, "per_batch": per_batch_energy(by_step, args.batch, forward)}
        steps.update(1)
    torch_best = {} if args.no_torch else torch_fp16_best(args.batch, args.seconds)
    torch_fp16 = torch_best.get("samples_per_s")
    steps.update(1)
    steps.close()
    device, date = cd.device_name(), datetime.date.today().isoformat()
    result = {"device": device, "date": date, "command": args.command_line,
              "batch": args.batch, "streams": args.streams, "autotune": args.autotune, "plans_file": args.plans,
              "plans_tuned_at_batch": given.batch if given else None,
              "fold_stem": not args.no_fold_stem, "unfused": list(args.unfuse), "plans": runners[0].plan_names(),
              "activation_bytes_per_runner": runners[0].activation_bytes,
              "samples_per_s": ours, "samples_per_s_one_stream": ours_one,
              "offline_pipeline_samples_per_s": pipeline,
              "torch_fp16_samples_per_s": torch_fp16,
              "torch_fp16_batch": torch_best.get("batch"), "torch_fp16_by_batch": torch_best.get("by_batch"),
              "speedup_vs_torch_fp16": ours / torch_fp16 if torch_fp16 else None,
              "forward_ms_sum_of_steps": sum(b["ms"] for b in breakdown),
              "model": args.model, "model_prep_seconds": prep_s, "breakdown": breakdown,
              "per_batch": per_batch_table(breakdown, ours, args.batch)}
    if energy:
        result["energy"] = energy
    from . import record_result

    path = record_result("e2e", device, result, getattr(args, "output", None),
                         {**{k: result[k] for k in ("samples_per_s", "samples_per_s_one_stream", "offline_pipeline_samples_per_s",
                                                    "torch_fp16_samples_per_s", "torch_fp16_batch", "forward_ms_sum_of_steps")},
                          **({"unfused": result["unfused"]} if args.unfuse else {}),
                          **({"forward_mj_per_image": energy["forward"]["mj_per_image"],
                              "forward_watts": energy["forward"]["watts"]} if energy else {})})
    if getattr(args, "json", False):
        print_json(result)
    else:
        table = result["per_batch"]
        print_table(["kind of layer", "count", "ms per batch", "share"],
                    [[r["group"], r["count"], f"{r['ms']:.3f}", f"{100 * r['share']:.1f} %"] for r in table["rows"]])
        print(f"steps timed alone sum to {table['sum_of_steps_ms']:.3f} ms; with {args.streams} graphs in flight a batch "
              f"takes {table['batch_ms_in_flight']:.3f} ms")
        if energy:
            e, fwd = energy["per_batch"], energy["forward"]
            print_table(["kind of layer", "count", "mJ per batch", "mJ per image", "share", "W", "SM MHz"],
                        [[r["group"], r["count"], f"{r['mj']:.1f}", f"{r['mj_per_image']:.3f}", f"{100 * r['share']:.1f} %",
                          f"{r['watts']:.0f}", f"{r['sm_mhz']:.0f}"] for r in e["rows"]])
            print(f"steps run alone sum to {e['sum_of_steps_mj']:.1f} mJ a batch; the forward in flight: "
                  f"{e['forward_mj_per_batch']:.1f} mJ a batch ({fwd['mj_per_image']:.3f} mJ an image) at "
                  f"{fwd['watts']:.0f} W, SM {fwd['sm_mhz']:.0f} MHz, {fwd['samples_per_s']:,.0f} samples/s")
        fmt = lambda v: "-" if v is None else f"{v:,.0f}"
        print_table(["measurement", "value"], [
            ["samples/s (ours, %d streams)" % args.streams, fmt(ours)], ["samples/s (ours, 1 stream)", fmt(ours_one)],
            ["samples/s (offline pipeline, no LoadGen)", fmt(pipeline)],
            ["samples/s (PyTorch fp16)", fmt(torch_fp16) + (f" (batch {torch_best['batch']})" if torch_best else "")],
            ["speedup", "-" if not torch_fp16 else f"{ours / torch_fp16:.2f}x"],
            ["forward ms (sum of steps)", f"{result['forward_ms_sum_of_steps']:.3f}"],
            ["activations per runner", describe(runners[0].activation_bytes) or "-"], ["results", path]])
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=run.__doc__)
    add_arguments(ap)
    flags.output(ap, "results file (default: ./bench-results/e2e-<device>.json, or $TRTFUSE_RESULTS_DIR)")
    flags.json_flag(ap, "print the record as JSON")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except TrtfuseError as exc:
        print(f"trtfuse: error: {exc}", file=__import__("sys").stderr)
        raise SystemExit(2)
