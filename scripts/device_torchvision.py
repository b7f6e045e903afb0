"""Compare a `rewrite --fuse all` model run on trtfuse's kernels (`--backend cuda`) with the CPU golden
executor of the same model and with ONNX Runtime running the original (fp32 or Q/DQ) model; one JSON line
per model and a table. Used by scripts/device_torchvision.sh on a GPU machine.

    python scripts/device_torchvision.py ORIGINAL.onnx REWRITTEN.onnx LABEL [--count 8] [--batch 8]
"""

import argparse
import json

import numpy as np
import onnx
import onnxruntime as ort

from trtfuse.calib.data import default_images
from trtfuse.runtime.cpu_executor import run_model
from trtfuse.runtime.gpu_runner import CudaRunner


def cosine(a, b):
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("original")
    ap.add_argument("rewritten")
    ap.add_argument("label")
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    original, fused = onnx.load(args.original), onnx.load(args.rewritten)
    dims = [d.dim_value for d in fused.graph.input[0].type.tensor_type.shape.dim]
    batch = dims[0] or args.batch
    images = default_images(args.count, size=dims[2], split="heldout")
    in_name, out_name = fused.graph.input[0].name, fused.graph.output[0].name
    runner = CudaRunner(fused, batch)
    sess = ort.InferenceSession(args.original, providers=["CPUExecutionProvider"])
    gpu, cpu, ref = [], [], []
    for i in range(0, args.count, batch):
        x = images[i : i + batch]
        gpu.append(runner.run(x))
        cpu.append(run_model(fused, {in_name: x}, [out_name])[0])
        ref.append(sess.run(None, {original.graph.input[0].name: x})[0])
    gpu, cpu, ref = np.concatenate(gpu), np.concatenate(cpu), np.concatenate(ref)
    rel = float(np.max(np.abs(gpu - cpu)) / max(np.max(np.abs(cpu)), 1e-30))
    row = {
        "model": args.label,
        "images": int(args.count),
        "plugin_nodes": sum(n.domain == "trtfuse" for n in fused.graph.node),
        "cuda_vs_cpu_top1_identical": bool(np.array_equal(gpu.argmax(1), cpu.argmax(1))),
        "cuda_vs_cpu_max_rel_logit_diff": rel,
        "cuda_vs_cpu_ok": bool(np.array_equal(gpu.argmax(1), cpu.argmax(1)) and rel <= 1e-5),
        "cuda_vs_ort_cosine_mean": float(cosine(gpu, ref).mean()),
        "cuda_vs_ort_cosine_min": float(cosine(gpu, ref).min()),
        "cuda_vs_ort_top1_agreement": float(np.mean(gpu.argmax(1) == ref.argmax(1))),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
