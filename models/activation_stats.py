"""How realistic a built model's activations and logits are, on held-out photographs (onnxruntime, CPU).

    python -m trtfuse.models.activation_stats resnet50 [--images 16] [--image-size 224]

prints, for every residual block output, its std, fraction of positive values and max, then the logits'
spread, the number of distinct top-1 classes, the mean top softmax probability, the gap between the two
largest logits in units of the image's logit std (median and 10th percentile: how far the top class stands
clear, which decides how easily a small error flips it) and the top-1 accuracy on the photo labels
(docs/models.md quotes it).
"""

from __future__ import annotations

import argparse

import numpy as np

from trtfuse import args as flags


def block_output_stats(model, images: np.ndarray) -> tuple[list[dict], np.ndarray]:
    """Per-block-output statistics and the logits of `model` (a dynamic- or matching-batch ModelProto)."""
    import onnx
    import onnxruntime as ort

    blocks = [n for n in model.graph.node if n.op_type == "Relu" and n.name.startswith("layer") and n.input[0].endswith(".add.out")]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, None) for n in blocks)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    logits, *acts = session.run(None, {model.graph.input[0].name: images})
    stats = [
        {"block": n.name, "std": float(a.std()), "positive": float((a > 0).mean()), "max": float(a.max())}
        for n, a in zip(blocks, acts)
    ]
    return stats, logits


def logit_summary(logits: np.ndarray, labels: np.ndarray | None = None) -> dict:
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    top = np.sort(logits, axis=1)
    gaps = (top[:, -1] - top[:, -2]) / logits.std(axis=1)
    return {
        "std_over_classes": float(logits.std(axis=1).mean()),
        "distinct_top1": len(set(logits.argmax(axis=1).tolist())),
        "images": int(logits.shape[0]),
        "mean_top_probability": float(probs.max(axis=1).mean()),
        "top2_gap_std_median": float(np.median(gaps)),
        "top2_gap_std_p10": float(np.percentile(gaps, 10)),
        "top1_accuracy": None if labels is None else float(np.mean(logits.argmax(axis=1) == labels)),
    }


def main(argv: list[str] | None = None) -> int:
    from trtfuse.calib.data import default_images, default_labels
    from trtfuse.ui import print_table

    from .cache import load_cached_model

    parser = argparse.ArgumentParser(prog="python -m trtfuse.models.activation_stats", description=__doc__.splitlines()[0])
    flags.arch(parser)
    parser.add_argument("--images", type=int, default=16)
    flags.image_size(parser)
    args = parser.parse_args(argv)
    model = load_cached_model(args.arch, batch=None, image_size=args.image_size)
    stats, logits = block_output_stats(model, default_images(args.images, size=args.image_size, split="heldout"))
    print_table(["block output", "std", "fraction > 0", "max"], [[s["block"], f"{s['std']:.2f}", f"{s['positive']:.2f}", f"{s['max']:.1f}"] for s in stats])
    summary = logit_summary(logits, default_labels(args.images, "heldout"))
    print(
        f"logits: std over classes {summary['std_over_classes']:.2f} (mean per image), "
        f"distinct top-1 {summary['distinct_top1']}/{summary['images']}, mean top softmax {summary['mean_top_probability']:.2f}, "
        f"top-2 gap / logit std: median {summary['top2_gap_std_median']:.2f}, 10th percentile {summary['top2_gap_std_p10']:.2f}, "
        f"top-1 accuracy (photo labels) {100 * summary['top1_accuracy']:.1f}%"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
