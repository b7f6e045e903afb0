"""Why an INT8 model disagrees with its fp32 original: is it the scales, the rewrite, or the network?

`qdq_emulation`: the fp32 model with QuantizeLinear -> DequantizeLinear (the same scales, zero point
0, int8) after every scaled tensor, run on ONNX Runtime. When its agreement matches the rewritten
model's, the rewrite and executor are faithful and the loss comes from quantizing those tensors.

`perturbation_gain`: Gaussian noise at a fixed SQNR (say 30 dB, about what 8-bit quantization of a
ReLU activation gives) added to one tensor, the rest of the network run in fp32, and the SQNR of the
logits measured. A network that attenuates noise gives logits SQNR above the injected level; one
that amplifies it (a "chaotic" deep net) gives less, and no choice of scales can undo that.

    python -m trtfuse.calib.sensitivity MODEL.onnx SCALES.json [--count 32]
"""

from __future__ import annotations

import argparse

import numpy as np

from trtfuse import args as flags


def _sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref.astype(np.float64) - got) ** 2)))


def _agreement(ref: np.ndarray, got: np.ndarray) -> dict:
    a, b = ref.reshape(len(ref), -1), got.reshape(len(got), -1)
    cos = np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"logit_cosine_mean": float(cos.mean()), "top1_agreement": float(np.mean(a.argmax(1) == b.argmax(1))),
            "logits_sqnr_db": _sqnr_db(a, b)}


def qdq_model(model, scales: dict[str, float]):
    """Copy of the fp32 model where every tensor in `scales` is read through Q -> DQ (int8, zero point 0)."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = list(m.graph.node)
    del m.graph.node[:]
    graph_inputs = [i.name for i in m.graph.input]

    def fake_quant(name):
        m.graph.initializer.extend([numpy_helper.from_array(np.array(scales[name], np.float32), f"{name}__fq_scale"),
                                    numpy_helper.from_array(np.array(0, np.int8), f"{name}__fq_zero")])
        m.graph.node.extend([
            helper.make_node("QuantizeLinear", [name, f"{name}__fq_scale", f"{name}__fq_zero"], [f"{name}__fq_q"]),
            helper.make_node("DequantizeLinear", [f"{name}__fq_q", f"{name}__fq_scale", f"{name}__fq_zero"], [f"{name}__fq"])])

    for name in graph_inputs:
        if name in scales:
            fake_quant(name)
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in scales:
                node.input[i] = f"{name}__fq"
        m.graph.node.append(node)
        for name in node.output:
            if name in scales:
                fake_quant(name)
    return m


def qdq_emulation(model, scales: dict[str, float], images: np.ndarray) -> dict:
    from .stats import input_name_and_size, make_session

    name, _ = input_name_and_size(model)
    ref = make_session(model).run(None, {name: images})[0]
    got = make_session(qdq_model(model, scales)).run(None, {name: images})[0]
    return _agreement(ref, got)


def _tail_from(model, tensor: str):
    """The part of the model after `tensor`, or None when that part also reads other activations."""
    import onnx
    from onnx.utils import Extractor

    tail = Extractor(onnx.shape_inference.infer_shapes(model)).extract_model([tensor], [model.graph.output[0].name])
    known = {tensor} | {i.name for i in tail.graph.initializer} | {o for n in tail.graph.node for o in n.output}
    return tail if all(i in known for n in tail.graph.node for i in n.input if i) else None


def quantization_sqnr_db(model, tensor: str, scale: float, images: np.ndarray) -> float:
    """SQNR of int8 quantize-dequantize of this one tensor with this scale (no upstream error)."""
    from .stats import input_name_and_size, make_session, model_with_outputs

    name, _ = input_name_and_size(model)
    value = make_session(model_with_outputs(model, [tensor])).run([tensor], {name: images})[0]
    return _sqnr_db(value, np.clip(np.rint(value / np.float32(scale)), -128, 127) * np.float32(scale))


def perturbation_gain(model, tensor: str, images: np.ndarray, noise_db: float = 30.0, seed: int = 0) -> dict:
    """Logits agreement when `tensor` carries Gaussian noise at `noise_db` SQNR."""
    from .stats import input_name_and_size, make_session, model_with_outputs

    name, _ = input_name_and_size(model)
    out = model.graph.output[0].name
    logits, value = make_session(model_with_outputs(model, [tensor])).run([out, tensor], {name: images})
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(value.shape).astype(np.float32)
    noise *= np.sqrt(np.mean(value.astype(np.float64) ** 2) / 10 ** (noise_db / 10)) / noise.std()
    tail = model if tensor == name else _tail_from(model, tensor)
    if tail is None:
        from trtfuse.errors import TrtfuseError

        raise TrtfuseError(f"{tensor} does not cut the network (later nodes also read earlier tensors)")
    perturbed = make_session(tail).run([out], {tensor: value + noise})[0]
    return {"tensor": tensor, "noise_sqnr_db": noise_db, **_agreement(logits, perturbed)}


def main(argv=None) -> int:
    from trtfuse.io import load_model
    from trtfuse.ui import print_table

    from .data import load_default
    from .scales import read_scales
    from .stats import input_name_and_size

    parser = argparse.ArgumentParser(prog="python -m trtfuse.calib.sensitivity", description=__doc__.split("\n\n")[0])
    flags.model(parser)
    parser.add_argument("scales")
    flags.count(parser, 32, "held-out images (default 32)")
    parser.add_argument("--noise-db", type=float, default=30.0)
    parser.add_argument("--probes", help="comma-separated tensors to perturb (default: input + 4 spread out)")
    args = parser.parse_args(argv)
    model = load_model(args.model)
    scales = read_scales(args.scales)
    name, size = input_name_and_size(model)
    images = load_default(args.count, size or 224, split="heldout").all()
    emu = qdq_emulation(model, scales, images)
    print(f"Q/DQ emulation of {len(scales)} tensors on {args.count} held-out images: cosine {emu['logit_cosine_mean']:.5f}, "
          f"top-1 agreement {100 * emu['top1_agreement']:.1f}%, logits SQNR {emu['logits_sqnr_db']:.1f} dB")
    if args.probes:
        probes = [p for p in args.probes.split(",") if p]
    else:  # the input and a few scaled tensors that cut the network, spread evenly through it
        cuts = [o for n in model.graph.node for o in n.output if o in scales and _tail_from(model, o) is not None]
        probes = [name] + [cuts[i] for i in sorted(set(np.linspace(0, len(cuts) - 1, min(5, len(cuts))).round().astype(int)))]
    rows = []
    for t in probes:
        r = perturbation_gain(model, t, images, args.noise_db)
        own = quantization_sqnr_db(model, t, scales[t], images) if t in scales else None
        rows.append([t, "" if own is None else f"{own:.1f}", f"{args.noise_db:.0f}", f"{r['logits_sqnr_db']:.1f}", f"{r['logits_sqnr_db'] - args.noise_db:+.1f}",
                     f"{r['logit_cosine_mean']:.5f}", f"{100 * r['top1_agreement']:.1f}%"])
    print_table(["noise added to", "its int8 SQNR dB", "noise SQNR dB", "logits SQNR dB", "gain dB", "cosine", "top-1 agree"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
