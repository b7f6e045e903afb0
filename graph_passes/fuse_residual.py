"""Residual-block fusion: Conv -> Add -> ReLU (after BN folding) becomes one int8 FusedConvAdd node.

Pattern (mode "residual"): Add(Conv(x), shortcut) -> Relu, in either Add input order, where shortcut is
the block's shortcut: an identity (a tensor upstream of, or equal to, x) or a projection Conv whose
input is upstream of, or equal to, x. BatchNormalization after the Conv must have been folded first
(graph_passes.fold_bn); an unfoldable BN leaves no Conv -> Add edge, so the block is reported rejected.
The projection conv stays an fp32 Conv; its output is quantized into the `residual` input.

Mode "all": every Conv(+Add)(+Relu) becomes FusedConv (no Add) or FusedConvAdd, the projection
convs and the 3-channel stem included (the Add's other input need not be a shortcut, it only has to
have the same shape), so the whole conv trunk runs on the plugin kernels.

Rejected, with the reason in the report (the op cannot compute these):
  * group != 1, dilation != 1, auto_pad other than NOTSET, a weight or bias that is not constant;
  * non-4-D tensors, or C/H/W that are not static (the batch may be dynamic);
  * the conv output read by anything but the Add (the op never writes the pre-add value), or the
    Add output read by anything but the ReLU (the op never writes the pre-ReLU value);
  * a broadcasting Add (input shapes differ), a non-float32 conv input;
  * mode "residual" only: no ReLU after the Add, or the other Add input is not the block's shortcut;
  * a quantized (Q/DQ) model only: a tensor of the group or the conv's weight whose quantization the op
    cannot take (graph_passes/qdq.py says which: non-zero zero point, uint8, per-channel activations, two
    scales on one tensor, ...).

Boundaries: consecutive plugin nodes hand int8 tensors to each other directly. A plugin input that
comes from any other node (or the graph input) goes through QuantizeLinear (zero point 0, int8) and a
plugin output read by any other node (or a graph output) through DequantizeLinear, keeping the
original float tensor name. QuantizeLinear rounds half to even and saturates like the op does.
Activation scales are keyed by the original model's tensor names (graph_passes.scales).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from trtfuse.errors import TrtfuseError

from .graph_utils import (
    ancestors_include,
    constant_array,
    consumers,
    conv_attributes,
    export_graph,
    has_single_consumer,
    import_graph,
    is_graph_output,
    optional_input,
    producer,
    static_4d_reason,
)
from .plugin_node import conv_plugin_node
from .qdq import float16_conv_constants
from .report import FUSED, KEPT, REJECTED, Candidate

FUSE_MODES = ("residual", "all")
FUSED_OUTPUTS_KEY = "trtfuse.fused_outputs"  # metadata_props: JSON {plugin output name: fp32 tensor name}


@dataclass
class FusionGroup:
    kind: str
    conv: object
    add: object | None
    relu: object | None
    x: object  # float input tensor of the conv
    residual: object | None  # float tensor added in (the shortcut)
    output: object  # float tensor the fused node replaces (ReLU, Add or Conv output)
    shortcut_conv: str | None = None
    nodes: list = field(default_factory=list)

    @property
    def scale_tensors(self) -> list[str]:
        names = [self.x.name] + ([self.residual.name] if self.residual is not None else []) + [self.output.name]
        return list(dict.fromkeys(names))


# QuantizeLinear takes a float16 input (with a float16 scale) from opset 19: a float16 conv input fuses there.
FLOAT16_QDQ_OPSET = 19


def _conv_reject_reason(conv, opset: int | None = None) -> str | None:
    weight = constant_array(optional_input(conv, 1))
    if weight is None:
        return "conv weight is not a constant"
    if weight.ndim != 4:
        return f"non-4-D conv (weight is {weight.ndim}-D)"
    bias = optional_input(conv, 2)
    if bias is not None and constant_array(bias) is None:
        return "conv bias is not a constant"
    attrs = conv_attributes(conv, weight.shape)
    if attrs["group"] != 1:
        return f"group conv (group={attrs['group']}; the op supports groups=1)"
    if any(d != 1 for d in attrs["dilations"]):
        return f"dilated conv (dilations={attrs['dilations']}; the op supports 1)"
    auto_pad = attrs["auto_pad"]
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in ("NOTSET", ""):
        return f"auto_pad={auto_pad} (the op needs explicit pads)"
    for tensor, what in ((conv.inputs[0], "conv input"), (conv.outputs[0], "conv output")):
        reason = static_4d_reason(tensor, what)
        if reason:
            return reason
    dtype = conv.inputs[0].dtype
    if dtype is not None and np.dtype(dtype) == np.float16:
        # The op reads int8 either way; float16 only changes the boundary Q/DQ nodes' scale type.
        if opset is not None and opset < FLOAT16_QDQ_OPSET:
            return (f"conv input is float16 at opset {opset}: QuantizeLinear takes float16 from opset "
                    f"{FLOAT16_QDQ_OPSET}")
    elif dtype not in (None, np.float32):
        return f"conv input is {np.dtype(dtype).name}, not float32 or float16"
    return None


def _add_reject_reason(add) -> str | None:
    a, b = add.inputs
    for t in (a, b):
        reason = static_4d_reason(t, "Add input")
        if reason:
            return reason
    same_batch = a.shape[0] == b.shape[0] or not (isinstance(a.shape[0], int) and isinstance(b.shape[0], int))
    if list(a.shape[1:]) != list(b.shape[1:]) or not same_batch:
        return f"broadcasting Add ({list(a.shape)} + {list(b.shape)})"
    return None


def _shortcut_kind(conv, other) -> tuple[str | None, str | None]:
    """('identity'|'projection'|None, projection conv name) for the Add input beside the branch conv."""
    x = conv.inputs[0]
    if ancestors_include(x, other.name):
        return "identity", None
    proj = producer(other)
    if proj is not None and proj.op == "Conv" and proj is not conv and ancestors_include(x, proj.inputs[0].name):
        return "projection", proj.name
    return None, None


def _unfolded_bn(tensor):
    """The BatchNormalization producing `tensor` from a Conv output (fold_bn left it), else None."""
    bn = producer(tensor)
    if bn is None or bn.op != "BatchNormalization":
        return None
    conv = producer(bn.inputs[0])
    return bn if conv is not None and conv.op == "Conv" else None


def _relu_after(graph, tensor):
    readers = consumers(tensor)
    if len(readers) == 1 and readers[0].op == "Relu" and not is_graph_output(graph, tensor):
        return readers[0]
    return None


def _opset(graph) -> int | None:
    return getattr(graph, "opset", None)


def _try_add(graph, add, main_index: int, mode: str):
    """(group, None) or (None, reason) for Add with its input `main_index` as the branch conv."""
    conv = producer(add.inputs[main_index])
    other = add.inputs[1 - main_index]
    kind, proj = _shortcut_kind(conv, other)
    reason = _conv_reject_reason(conv, _opset(graph))
    if reason is None and not has_single_consumer(graph, conv.outputs[0], add):
        reason = "conv output has other readers besides the Add"
    reason = reason or _add_reject_reason(add)
    relu = _relu_after(graph, add.outputs[0])
    if reason is None and mode == "residual":
        if relu is None:
            readers = consumers(add.outputs[0])
            has_relu = any(n.op == "Relu" for n in readers)
            reason = "Add output has other readers besides the ReLU" if has_relu else "no ReLU after the Add"
        elif kind is None:
            reason = "the other Add input is not the block's shortcut (identity or projection of the block input)"
    nodes = [conv.name, add.name] + ([relu.name] if relu is not None else [])
    if reason:
        return None, reason, kind, nodes
    group_kind = f"residual-{kind}" if kind else "conv-add"
    output = relu.outputs[0] if relu is not None else add.outputs[0]
    group = FusionGroup(group_kind, conv, add, relu, conv.inputs[0], other, output, proj, nodes)
    return group, None, kind, nodes


def _qdq_reason(group: FusionGroup, qdq) -> str | None:
    """Why the model's quantization of this group is what the op cannot take (None: fine, or not a Q/DQ model)."""
    if qdq is None:
        return None
    if group.conv.name in qdq.weight_problems:
        return f"quantized model: {qdq.weight_problems[group.conv.name]}"
    roles = [(group.x, "input"), (group.residual, "residual"), (group.output, "output")]
    for tensor, role in roles:
        if tensor is not None and tensor.name in qdq.problems:
            return f"quantized model: {role} {tensor.name!r}: {qdq.problems[tensor.name]}"
    return None


def find_fusion_groups(graph, mode: str, report: list | None = None, qdq=None) -> list[FusionGroup]:
    """Every fusable pattern of a BN-folded, shape-inferred graph (read only).

    qdq: the QdqInfo of a quantized model (graph_passes/qdq.py); groups it says the op cannot take are rejected."""
    if mode not in FUSE_MODES:
        raise TrtfuseError(f"unknown fuse mode {mode!r}: choose one of {', '.join(FUSE_MODES)}")
    report = report if report is not None else []
    groups: list[FusionGroup] = []
    claimed: set[int] = set()
    projection_convs: set[str] = set()
    for add in [n for n in graph.nodes if n.op == "Add"]:
        if len(add.inputs) != 2 or any(constant_array(t) is not None for t in add.inputs):
            continue
        orders = [i for i in (0, 1) if producer(add.inputs[i]) is not None and producer(add.inputs[i]).op == "Conv"]
        if not orders:
            unfolded = [_unfolded_bn(t) for t in add.inputs if _unfolded_bn(t) is not None]
            if unfolded:
                bn = unfolded[0]
                report.append(Candidate("fuse", "conv-add", [producer(bn.inputs[0]).name, bn.name, add.name], REJECTED,
                                        "BatchNormalization between the Conv and the Add could not be folded"))
            continue
        attempts = [_try_add(graph, add, i, mode) for i in orders]
        # Prefer reading the Add as branch + shortcut; among equals, input 0 as the branch.
        attempts.sort(key=lambda a: (a[0] is None, a[2] is None))
        group, reason, _, nodes = attempts[0]
        if group is not None:
            reason = _qdq_reason(group, qdq)
            group = None if reason else group
        elif qdq is not None:  # a quantization the op cannot take is the first thing to say
            conv = producer(add.inputs[orders[0]])
            relu = _relu_after(graph, add.outputs[0])
            tensors = [conv.inputs[0], *add.inputs, add.outputs[0]] + ([relu.outputs[0]] if relu is not None else [])
            bad = next((t for t in tensors if t.name in qdq.problems), None)
            if bad is not None:
                reason = f"quantized model: {bad.name!r}: {qdq.problems[bad.name]}"
        if group is None:
            report.append(Candidate("fuse", "conv-add", nodes, REJECTED, reason))
            continue
        groups.append(group)
        claimed.update(id(n) for n in (group.conv, group.add, group.relu) if n is not None)
        if group.shortcut_conv:
            projection_convs.add(group.shortcut_conv)
        op = "FusedConvAdd"
        report.append(Candidate("fuse", group.kind, nodes, FUSED, op=op,
                                extra={"shortcut_conv": group.shortcut_conv} if group.shortcut_conv else {}))
    for conv in [n for n in graph.nodes if n.op == "Conv" and id(n) not in claimed]:
        kind = "projection-conv" if conv.name in projection_convs else "conv"
        if mode == "residual":
            if conv.name in projection_convs:
                report.append(Candidate("fuse", kind, [conv.name], KEPT, "projection conv is fused only with --fuse all"))
            continue
        reason = _conv_reject_reason(conv, _opset(graph))
        relu = _relu_after(graph, conv.outputs[0])
        nodes = [conv.name] + ([relu.name] if relu is not None else [])
        if reason:
            report.append(Candidate("fuse", kind, nodes, REJECTED, reason))
            continue
        output = relu.outputs[0] if relu is not None else conv.outputs[0]
        group = FusionGroup(kind, conv, None, relu, conv.inputs[0], None, output, None, nodes)
        reason = _qdq_reason(group, qdq)
        if reason:
            report.append(Candidate("fuse", kind, nodes, REJECTED, reason))
            continue
        groups.append(group)
        report.append(Candidate("fuse", kind, nodes, FUSED, op="FusedConv"))
    return groups


def required_activation_tensors(model, fuse_mode: str, prepared: bool = False, qdq=None) -> list[str]:
    """Names (in `model`, the original fp32 model) of every activation the rewrite needs a scale for.

    The model is first brought to the form the fusion pass sees (constants folded, a quantized model's
    Q/DQ stripped, BN folded); `prepared=True` says that was done already. Tensor names survive all three."""
    if not prepared:
        model = prepare_for_fusion(model)
    graph = import_graph(model)
    names: list[str] = []
    for group in find_fusion_groups(graph, fuse_mode, qdq=qdq):
        names.extend(group.scale_tensors)
    return list(dict.fromkeys(names))


def prepare_for_fusion(model):
    """Constants folded, Q/DQ stripped (their scales dropped), BN folded: the float model the fusion pass matches."""
    from .fold_bn import fold_batchnorm
    from .fold_constants import fold_constants
    from .qdq import has_qdq, strip_qdq

    model = fold_constants(model)
    if has_qdq(model):
        model, _ = strip_qdq(model)
    return fold_batchnorm(model)


def _is_float16(tensor) -> bool:
    return tensor.dtype is not None and np.dtype(tensor.dtype) == np.float16


def _scalar(name: str, value, dtype) -> object:
    import onnx_graphsurgeon as gs

    return gs.Constant(name, np.array(value, dtype=dtype))


def fuse_conv_blocks(model, scales: dict[str, float], fuse_mode: str = "residual", report: list | None = None,
                     qdq=None):
    """Return a copy of the (BN-folded) `model` with every fusable pattern replaced by a plugin node.

    qdq: a quantized model's QdqInfo: its weights keep their own integers and per-channel scales."""
    import onnx
    import onnx_graphsurgeon as gs

    from trtfuse.plugins.op_schema import DOMAIN, OPSET_VERSION

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 13:
        raise TrtfuseError(f"model opset {opset} is too old: the rewrite emits QuantizeLinear/DequantizeLinear at opset >= 13")
    graph = import_graph(model)
    groups = find_fusion_groups(graph, fuse_mode, report, qdq)
    missing = [n for g in groups for n in g.scale_tensors if n not in scales]
    if missing:
        raise TrtfuseError(f"no activation scale for {len(set(missing))} tensors the rewrite needs (first: {missing[0]!r}): "
                           f"the scales file was calibrated for another fuse mode; rerun `trtfuse calibrate MODEL "
                           f"--fuse {fuse_mode} -o SCALES.json` (the default, --fuse both, covers every mode)")

    # A float16 tensor is quantized and dequantized with a float16 scale (a DequantizeLinear outputs its
    # scale's type): its scale is taken at float16 precision for the plugin node too, so both sides use one
    # value. A quantized model's float16 scale is exactly that value already; a calibrated one is rounded.
    scales = dict(scales)
    float16_tensors = {t.name for g in groups for t in (g.x, g.residual, g.output) if t is not None and _is_float16(t)}
    for name in float16_tensors:
        s16 = np.float16(scales[name])
        if not np.isfinite(s16) or s16 <= 0:
            raise TrtfuseError(f"scale {scales[name]:.6g} of float16 tensor {name!r} has no positive float16 value")
        scales[name] = float(s16)

    def scale_constant(name: str, suffix: str):
        dtype = np.float16 if name in float16_tensors else np.float32
        return _scalar(f"{name}__{suffix}", scales[name], dtype)

    int8_of: dict[str, object] = {}
    for group in groups:
        y = group.output
        int8_of[y.name] = gs.Variable(f"{y.name}__int8", dtype=np.int8, shape=y.shape)

    quantized: dict[str, object] = {}

    def int8_input(tensor):
        if tensor.name in int8_of:
            return int8_of[tensor.name]
        if tensor.name not in quantized:
            q = gs.Variable(f"{tensor.name}__quant", dtype=np.int8, shape=tensor.shape)
            graph.nodes.append(gs.Node("QuantizeLinear", name=f"{tensor.name}__quantize",
                                       inputs=[tensor, scale_constant(tensor.name, "qscale"),
                                               _scalar(f"{tensor.name}__qzero", 0, np.int8)], outputs=[q]))
            quantized[tensor.name] = q
        return quantized[tensor.name]

    plugin_specs = []
    for i, group in enumerate(groups):
        conv = group.conv
        weight = constant_array(conv.inputs[1])
        bias_t = optional_input(conv, 2)
        spec = dict(
            name=f"{conv.name or f'conv{i}'}__fused",
            weight=weight.astype(np.float32),
            bias=None if bias_t is None else constant_array(bias_t).astype(np.float32),
            conv_attrs=conv_attributes(conv, weight.shape),
            x_scale=scales[group.x.name],
            out_scale=scales[group.output.name],
            relu=group.relu is not None,
            residual_scale=scales[group.residual.name] if group.residual is not None else None,
            weight_qmax=qdq.weight_qmax.get(conv.name) if qdq is not None else None,
        )
        plugin_specs.append((group, spec))
    for group, _ in plugin_specs:
        for node in (group.conv, group.add, group.relu):
            if node is not None:
                node.inputs.clear()
                node.outputs.clear()
    for group, spec in plugin_specs:
        residual = int8_input(group.residual) if group.residual is not None else None
        graph.nodes.append(conv_plugin_node(x=int8_input(group.x), output=int8_of[group.output.name],
                                            residual=residual, **spec))
    for group in groups:
        y = group.output
        if consumers(y) or is_graph_output(graph, y):
            graph.nodes.append(gs.Node("DequantizeLinear", name=f"{y.name}__dequantize",
                                       inputs=[int8_of[y.name], scale_constant(y.name, "dqscale"),
                                               _scalar(f"{y.name}__dqzero", 0, np.int8)], outputs=[y]))
    # a float16 conv left unfused gets its weight and bias back in float16 (qdq.float16_conv_constants)
    out = float16_conv_constants(export_graph(graph, template=model))
    fused_map = {int8_of[g.output.name].name: g.output.name for g in groups}
    if fused_map:  # which fp32 tensor each plugin output stands for (calibration compares them per layer)
        entry = next((p for p in out.metadata_props if p.key == FUSED_OUTPUTS_KEY), None) or out.metadata_props.add()
        entry.key, entry.value = FUSED_OUTPUTS_KEY, json.dumps(fused_map)
    if groups and not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(DOMAIN, OPSET_VERSION))
    return out
