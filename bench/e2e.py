"""End-to-end throughput of INT8 ResNet-50 on trtfuse's kernels (`--backend cuda`) against PyTorch fp16
(cuDNN, channels_last, CUDA graph) in the same run. Used by `trtfuse offline` and on its own:

    python -m trtfuse.bench.e2e --batch 256 [--streams 2] [--seconds 5]

Prints samples/s per backend and the per-layer time breakdown of one forward (each conv timed alone
through the same launch plans).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def build_fused_resnet50(batch: int, image_size: int = 224, calib: int = 8):
    from ..calib.data import default_images
    from ..graph_passes.pipeline import rewrite
    from ..models import build

    model = build("resnet50", image_size=image_size, batch=None)  # dynamic batch: calibrate on few images
    images = default_images(calib, image_size)
    fused, _ = rewrite(model, "all", calib_images=images)
    return model, fused


def time_runners(runners, seconds: float) -> float:
    """samples/s with len(runners) graphs in flight, round-robin, for about `seconds`."""
    for r in runners:
        r.launch()
    for r in runners:
        r.stream.synchronize()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for r in runners:
            r.launch()
        for r in runners:
            r.stream.synchronize()
        done += sum(r.batch for r in runners)
    return done / (time.perf_counter() - start)


def torch_fp16_samples_per_s(batch: int, seconds: float, image_size: int = 224) -> float:
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--autotune", action="store_true", help="time every tactic per conv when building the runner")
    ap.add_argument("--no-fold-stem", action="store_true", help="run the stem on CHW4 instead of space-to-depth")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)

    from ..plugins import cuda_driver as cd
    from ..runtime.gpu_runner import CudaRunner

    t0 = time.perf_counter()
    _, fused = build_fused_resnet50(args.batch)
    prep_s = time.perf_counter() - t0
    runners = [CudaRunner(fused, args.batch, fold_stem=not args.no_fold_stem, autotune=args.autotune)]
    runners += [CudaRunner(fused, args.batch, fold_stem=not args.no_fold_stem, plans_from=runners[0])
                for _ in range(args.streams - 1)]
    images = np.random.default_rng(0).normal(size=(args.batch, 3, 224, 224)).astype(np.float32)
    for r in runners:
        r.load_input(images)
    ours = time_runners(runners, args.seconds)
    ours_one = time_runners(runners[:1], args.seconds / 2)
    breakdown = layer_breakdown(runners[0])
    torch_fp16 = None if args.no_torch else torch_fp16_samples_per_s(args.batch, args.seconds)
    total = sum(b["ms"] for b in breakdown)
    result = {"device": cd.device_name(), "batch": args.batch, "streams": args.streams, "autotune": args.autotune,
              "fold_stem": not args.no_fold_stem, "plans": {name: f"{p.tactic.name}/s{p.splits}" for name, p in runners[0].plans},
              "samples_per_s": ours, "samples_per_s_one_stream": ours_one,
              "torch_fp16_samples_per_s": torch_fp16, "forward_ms_sum_of_steps": total,
              "model_prep_seconds": prep_s, "breakdown": breakdown}
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
    convs = sorted(breakdown, key=lambda b: -b["ms"])[:8]
    print(json.dumps({k: v for k, v in result.items() if k != "breakdown"}, indent=1))
    print("top steps:", json.dumps(convs, indent=0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
