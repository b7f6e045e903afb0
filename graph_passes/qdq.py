"""Quantized (Q/DQ) models in: read the model's own quantization, then strip its Q/DQ nodes.

Pattern, as ONNX Runtime's `quantize_static` (QDQ format), NVIDIA ModelOpt's ONNX PTQ and a
pytorch-quantization / torch QAT export write it:

  * activations: `t -> QuantizeLinear(s, zp) -> DequantizeLinear(s, zp) -> readers`. The readers read
    `t` again and the model's scale of `t` is recorded as its activation scale (the same key the scales
    file uses: the tensor name of the float tensor);
  * weights: `DequantizeLinear(W_int8 constant, s_w[k], zp, axis=0) -> Conv` (ORT, ModelOpt) or
    `QuantizeLinear(W_fp32 constant) -> DequantizeLinear -> Conv` (QAT export, the Q not folded). The
    DequantizeLinear is evaluated into the float weight `W_int8 * s_w` (exactly the values the model
    computes with) and the per-output-channel `max|W_int8|` is kept, so the fusion pass re-derives the
    very same integers and per-channel scales (times |a| of a BatchNormalization folded afterwards,
    which is how BN folds into a quantized conv);
  * any other DequantizeLinear of a constant (an ORT int32 bias quantized at x_scale * w_scale, BN
    parameters) becomes its float value.

Float16 Q/DQ models (ModelOpt's default high_precision_dtype="fp16") read the same way: float16 scales are
recorded as the float32 numbers they are (exactly), a dequantized conv weight is float32 (exact), and any
other dequantized constant keeps its DequantizeLinear's float16 output type.

The result is a float model plus `QdqInfo`; the fusion pass then fuses with the recorded scales (no
calibration). `--requantize` runs the same stripping but drops `QdqInfo`, so the scales are calibrated
anew. Nodes the rewrite does not fuse run in float in the rewritten model (the model's Q/DQ around them
are gone): they are never less precise than the model's fake-quantized ones.

What the fused op cannot take is recorded, per tensor or per conv, and the fusion pass rejects every
candidate that touches it, with this reason in the report:
  * a non-zero zero point (the op is symmetric), uint8 (the op is int8), per-channel activation scales
    (the op has one scale per activation tensor), a scale that is not a constant;
  * one tensor quantized with two different scales (e.g. a QAT residual quantizer beside the next
    conv's input quantizer): the op's int8 tensor has one scale, the other reader would need a
    requantize the op does not do;
  * a Q and its DQ with different scales (a requantize in the model itself);
  * conv weights quantized on an axis other than 0, with a non-zero zero point, as uint8, or using
    -128 (the op's weights are symmetric in [-127, 127]).
A QuantizeLinear whose output is read by anything but a DequantizeLinear is left in place (it is not a
fake-quantization pair); nothing is fused across it.

A Q whose zero point is the lowest integer of its type (ORT's asymmetric activations after a ReLU: int8 zero
point -128, uint8 zero point 0) clips every negative value to 0: ONNX Runtime's quantizer then drops the
ReLU node and leaves that clip to the Q. Stripping such a pair puts a `Relu` in its place, so the float
model computes what the quantized one did (the fusion pass then sees the ReLU again).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .graph_utils import constant_array, export_graph, import_graph

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class QdqInfo:
    """What the model's Q/DQ nodes said, keyed by float tensor names and conv node names."""

    scales: dict[str, float] = field(default_factory=dict)  # activation tensor -> per-tensor int8 scale, zp 0
    problems: dict[str, str] = field(default_factory=dict)  # activation tensor -> why the op cannot take it
    weight_qmax: dict[str, np.ndarray] = field(default_factory=dict)  # conv name -> per-channel max|W_int8|
    weight_problems: dict[str, str] = field(default_factory=dict)  # conv name -> why the op cannot take it
    activation_pairs: int = 0
    constant_dequantized: int = 0

    @property
    def quantized(self) -> bool:
        return bool(self.scales or self.problems or self.weight_qmax or self.weight_problems)


def has_qdq(model) -> bool:
    return any(n.op_type in QDQ_OPS and (n.domain or "") in ("", "ai.onnx") for n in model.graph.node)


def _qparams(node):
    """(scale array, zero-point array or None, zero-point dtype, axis) of a Q or DQ node; scale None if not constant."""
    scale = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    zp_t = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].name else None
    zp = constant_array(zp_t) if zp_t is not None else None
    if zp is not None:
        dtype = zp.dtype
    else:
        out_dtype = int(node.attrs.get("output_dtype", 0)) if node.op == "QuantizeLinear" else 0
        dtype = np.dtype(np.int8) if out_dtype == 3 else np.dtype(np.uint8)  # ONNX: no zero point means uint8
    return scale, zp, np.dtype(dtype), int(node.attrs.get("axis", 1))


def _activation_problem(scale, zp, dtype) -> str | None:
    if scale is None:
        return "its Q/DQ scale is not a constant"
    if scale.size != 1:
        return f"per-channel activation scales ({scale.size} values; the op has one scale per activation tensor)"
    if dtype != np.int8:
        return f"{dtype.name} activations (the op is int8)"
    if zp is not None and np.any(zp != 0):
        return f"non-zero zero point {int(np.asarray(zp).reshape(-1)[0])} (the op is symmetric)"
    if not np.isfinite(scale).all() or float(scale.reshape(-1)[0]) <= 0:
        return f"scale {float(scale.reshape(-1)[0])} is not a positive number"
    return None


def _clips_negatives(zp, dtype) -> bool:
    """Whether Q's zero point is its type's lowest integer, so every negative input saturates to 0."""
    if zp is None or not np.issubdtype(dtype, np.integer):
        return dtype == np.uint8 and zp is None  # no zero point: uint8, zero 0
    return bool(np.all(np.asarray(zp).astype(np.int64) == np.iinfo(dtype).min))


def _broadcast(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    if values.size == 1:
        return values.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = values.size
    return values.reshape(shape)


def _weight_problem(q: np.ndarray, zp, dtype, axis: int, scale) -> str | None:
    if scale is None:
        return "weight scale is not a constant"
    if dtype != np.int8:
        return f"{dtype.name} weights (the op's weights are int8)"
    if zp is not None and np.any(zp != 0):
        return "weights with a non-zero zero point (the op's weights are symmetric)"
    if scale.size != 1 and axis % q.ndim != 0:
        return f"weights quantized per channel on axis {axis} (the op scales per output channel, axis 0)"
    if q.size and int(q.min()) < -127:
        return "weights use -128 (the op's weights are symmetric in [-127, 127])"
    return None


def strip_qdq(model) -> tuple[object, QdqInfo]:
    """A float copy of `model` without its Q/DQ pairs, and what they said (see the module docstring)."""
    import onnx_graphsurgeon as gs

    graph = import_graph(model, infer_shapes=False)
    info = QdqInfo()
    for i, node in enumerate(graph.nodes):
        if not node.name:
            node.name = f"{node.op}_{i}"

    def replace_uses(old, new) -> None:
        for reader in list(old.outputs):
            for j, t in enumerate(reader.inputs):
                if t is old:
                    reader.inputs[j] = new
        for j, t in enumerate(graph.outputs):
            if t is old:
                graph.outputs[j] = new

    def detach(node) -> None:
        node.inputs.clear()
        node.outputs.clear()

    # 1. QuantizeLinear of a constant (a QAT export's weight): evaluate it into its integers.
    for node in [n for n in graph.nodes if n.op == "QuantizeLinear" and (n.domain or "") in ("", "ai.onnx")]:
        value = constant_array(node.inputs[0])
        scale, zp, dtype, axis = _qparams(node)
        if value is None or scale is None:
            continue
        info_range = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
        if info_range is None:
            continue
        z = 0 if zp is None else _broadcast(zp.astype(np.int64), axis, value.ndim)
        # ONNX: saturate(round_half_to_even(x / scale) + zp). For a float16 weight and scale (a ModelOpt fp16
        # model) ONNX Runtime computes x / scale in float32 on the upcast values. Dividing in float64 gives the
        # same integers: with x = A * 2^p and scale = B * 2^r (|A|, B < 2^11), a quotient that is not exactly a
        # half-integer misses the nearest one by at least 2^-12 (or 1/|A| of itself), i.e. by more than 2^-19 of
        # itself up to 128, while rounding the quotient moves it by at most 2^-24 (float32) or 2^-53 (float64)
        # of itself; exact half-integers up to 128 are exact in both. tests/test_exporters.py compares the
        # integers with onnxruntime's own QuantizeLinear on the float16 fixture's weights.
        q = np.rint(value.astype(np.float64) / _broadcast(scale.astype(np.float64), axis, value.ndim)) + z
        q = np.clip(q, info_range.min, info_range.max).astype(dtype)
        out = node.outputs[0]
        const = gs.Constant(f"{out.name}__value", q)
        replace_uses(out, const)
        detach(node)

    # 2. DequantizeLinear of a constant: its float value; a conv weight also keeps its integers' range.
    for node in [n for n in graph.nodes if n.op == "DequantizeLinear" and (n.domain or "") in ("", "ai.onnx") and n.inputs]:
        q = constant_array(node.inputs[0])
        if q is None:
            continue
        scale, zp, dtype, axis = _qparams(node)
        if scale is None:
            continue
        z = 0 if zp is None else _broadcast(zp.astype(np.int64), axis, q.ndim)
        value = (q.astype(np.int64) - z) * _broadcast(scale.astype(np.float64), axis, q.ndim)
        out = node.outputs[0]
        conv_weight = any(r.op == "Conv" and len(r.inputs) > 1 and r.inputs[1] is out for r in out.outputs)
        # A DequantizeLinear outputs its scale's type (float16 in a ModelOpt fp16 model): the constant keeps it
        # so its readers stay type-consistent. A conv weight is the exception: it stays float32, where
        # W_int8 * s_w is exact (8 + 11 significant bits), so the fusion pass re-derives the model's very
        # integers and scales from it; fuse_conv_blocks gives a float16 conv it leaves unfused its weight back
        # in float16 (the rounded product, which is what the model's DequantizeLinear computes).
        value = value.astype(np.float32 if conv_weight or scale.dtype != np.float16 else np.float16)
        for reader in list(out.outputs):
            if reader.op == "Conv" and len(reader.inputs) > 1 and reader.inputs[1] is out:
                problem = _weight_problem(q, zp, np.dtype(q.dtype), axis, scale)
                if problem:
                    info.weight_problems[reader.name] = problem
                else:
                    mag = np.abs(q.astype(np.int64))
                    info.weight_qmax[reader.name] = mag.reshape(mag.shape[0], -1).max(axis=1) if mag.ndim >= 2 else mag
        const = gs.Constant(f"{out.name}__value", value)
        replace_uses(out, const)
        detach(node)
        info.constant_dequantized += 1

    # 3. Activation pairs t -> Q -> DQ -> readers: the readers read t.
    for qnode in [n for n in graph.nodes if n.op == "QuantizeLinear" and (n.domain or "") in ("", "ai.onnx") and n.outputs]:
        qout = qnode.outputs[0]
        readers = list(qout.outputs)
        if not readers or any(r.op != "DequantizeLinear" for r in readers) or any(t is qout for t in graph.outputs):
            continue  # not a fake-quantization pair: leave it
        t = qnode.inputs[0]
        scale, zp, dtype, _ = _qparams(qnode)
        problem = _activation_problem(scale, zp, dtype)
        for dq in readers:
            dscale, dzp, _, _ = _qparams(dq)
            same = (dscale is not None and scale is not None and dscale.shape == scale.shape and np.array_equal(dscale, scale)
                    and (dzp is None) == (zp is None) and (zp is None or np.array_equal(dzp, zp)))
            if not same and problem is None:
                problem = "its QuantizeLinear and DequantizeLinear scales differ (a requantize in the model)"
        if problem is None:
            s = float(scale.reshape(-1)[0])
            if t.name in info.scales and info.scales[t.name] != s:
                problem = (f"quantized with two scales ({info.scales[t.name]:.6g} and {s:.6g}): "
                           "the op's int8 tensor has one, the other reader would need a requantize")
            else:
                info.scales[t.name] = s
        if problem is not None:
            info.problems[t.name] = problem
        if _clips_negatives(zp, dtype):
            relu_out = gs.Variable(f"{t.name}__relu", dtype=t.dtype or np.float32)
            graph.nodes.append(gs.Node("Relu", name=f"{qnode.name}__relu", inputs=[t], outputs=[relu_out]))
            for table in (info.scales, info.problems):  # the Q's values are the clipped ones
                if t.name in table:
                    table[relu_out.name] = table[t.name]
            t = relu_out
        for dq in readers:
            out = dq.outputs[0]
            if any(o is out for o in graph.outputs) and not any(i is t for i in graph.inputs):
                # a graph output keeps its name: t takes it (ORT renames the float tensor before its Q)
                if t.name in info.scales:
                    info.scales[out.name] = info.scales.pop(t.name)
                if t.name in info.problems:
                    info.problems[out.name] = info.problems.pop(t.name)
                t.name, t.dtype, t.shape = out.name, out.dtype or np.float32, out.shape
            replace_uses(out, t)
            detach(dq)
        detach(qnode)
        info.activation_pairs += 1
    for name in info.problems:
        info.scales.pop(name, None)
    return export_graph(graph, template=model), info


def float16_conv_constants(model):
    """`model` with every float32 weight and bias of a Conv whose input is float16 turned float16.

    strip_qdq keeps a dequantized conv weight in float32 (W_int8 * s_w exactly, for the fusion); a float16
    conv that is then run as a float node (left unfused, or in the max pass that calibrates a float16 model)
    needs them in its input's type, as ONNX's Conv binds one type to all three. The float16 values are the
    rounded products, what the model's own DequantizeLinear computes. Returns `model` itself when no conv
    needs it."""
    import onnx
    from onnx import numpy_helper

    if not any(n.op_type == "Conv" for n in model.graph.node) or not has_float16(model):
        return model
    types = elem_types(model)
    float16_convs = [n for n in model.graph.node if n.op_type == "Conv" and n.input
                     and types.get(n.input[0]) == onnx.TensorProto.FLOAT16]
    inits = {i.name: i for i in model.graph.initializer}
    todo = [(n, j) for n in float16_convs for j in (1, 2)
            if len(n.input) > j and n.input[j] in inits and inits[n.input[j]].data_type == onnx.TensorProto.FLOAT]
    if not todo:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name: i for i in out.graph.initializer}
    nodes = {id(n): c for n, c in zip(model.graph.node, out.graph.node)}
    for node, j in todo:
        name = node.input[j]
        new = f"{name}__float16"
        if new not in inits:
            inits[new] = numpy_helper.from_array(numpy_helper.to_array(inits[name]).astype(np.float16), new)
            out.graph.initializer.append(inits[new])
        nodes[id(node)].input[j] = new
    used = {i for n in out.graph.node for i in n.input}
    keep = [i for i in out.graph.initializer if i.name in used or any(o.name == i.name for o in out.graph.output)]
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    return out


def has_float16(model) -> bool:
    """Whether any float16 tensor can occur: a float16 initializer, graph input or Cast to float16 (a cheap
    look that spares a float model the shape inference of elem_types)."""
    import onnx

    f16 = onnx.TensorProto.FLOAT16
    return (any(i.data_type == f16 for i in model.graph.initializer)
            or any(i.type.tensor_type.elem_type == f16 for i in model.graph.input)
            or any(n.op_type == "Cast" and any(a.name == "to" and a.i == f16 for a in n.attribute) for n in model.graph.node))


def elem_types(model) -> dict[str, int]:
    """Tensor name -> ONNX element type, from the graph's declarations and shape inference."""
    import onnx

    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an inference failure leaves the declared types
        typed = model
    types = {i.name: i.data_type for i in typed.graph.initializer}
    for vi in list(typed.graph.input) + list(typed.graph.value_info) + list(typed.graph.output):
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types
