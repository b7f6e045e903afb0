"""Chain a residual block's last conv with the next conv that reads its output: FusedConvAdd + FusedConv -> one
FusedConvAddConv node (plugins/op_schema.py).

Pattern: a FusedConvAdd 1x1 stride-1 unpadded conv (a bottleneck's conv3 with its residual add and ReLU) whose output
y is the `x` of a FusedConv 1x1 stride-1 unpadded conv (the next block's conv1). The pair becomes one node with both
outputs, y and the second conv's output, under their own names: y's other readers (the next block's residual, a
downsample conv, a DequantizeLinear) read it as before. On Hopper the chain kernel (plugins/chain_conv.py) runs the node:
y's tile goes from the first GEMM's epilogue to the second GEMM through shared memory instead of HBM. Everywhere else
the node runs as its two convs in turn (the GPU runner, the IPluginV3 plugin, the CPU executor), bit-identical.

Taken only where the chain kernel computes the pair and measured faster than the two conv kernels
(`chain_conv.refusal`, `Variant.in_runner`): ResNet-50's res2 and res3 pairs, res2's last into res3's first conv1.
Left alone, with the reason in the report: the channel counts the kernel is not built for (res4, res5), the pair it
computes but slower (res3's last into res4's first conv1), maps whose pixels do not come in 8-pixel groups, y of unknown
or dynamic C, H, W. A FusedConvAdd takes at most one partner (the first eligible reader in graph order); each FusedConv
is taken once.

The TensorRT QDP plugins embed one AOT kernel per node and have none for this op: `trtfuse build --plugins qdp`
refuses a model with chain nodes, `--plugins v3` runs them.
"""

from __future__ import annotations

import onnx

from trtfuse.plugins.op_schema import (DOMAIN, FUSED_CONV, FUSED_CONV_ADD, FUSED_CONV_ADD_CONV, NAMESPACE,
                                       POINTWISE_ATTRIBUTES, chain_attributes, chain_inputs, chained)

from .graph_utils import export_graph, import_graph, static_4d_reason
from .report import FUSED, REJECTED, Candidate

PASS_NAME = "chain"


def _pointwise(node) -> bool:
    return all(tuple(int(v) for v in node.attrs[k]) == want for k, want in POINTWISE_ATTRIBUTES.items())


def _shapes(first, second, y):
    """The two convs' ConvShapes at batch 1 (the kernel's refusals other than the 2^31-pixel bound do not depend on the
    batch; the runner checks that one at its own batch)."""
    from trtfuse.plugins.chain_conv import pair_shapes

    k, h, w = (int(d) for d in y.shape[1:])
    return pair_shapes(1, int(first.attrs["in_channels"]), h, w, k, int(second.attrs["out_channels"]))


def pair_refusal(first, second) -> str | None:
    """Why the FusedConvAdd `first` and the FusedConv `second` (reading first's output as x) are not chained, or None."""
    from trtfuse.plugins import chain_conv

    y = first.outputs[0]
    why = static_4d_reason(y, "output")
    if why:
        return why
    conv1, conv2 = _shapes(first, second, y)
    why = chain_conv.refusal(conv1, conv2)
    if why:
        return why
    if not chain_conv.variant_of(conv1, conv2.k).in_runner:
        return (f"the chain kernel for {conv1.c} -> {conv1.k} -> {conv2.k} channels measured slower than the two conv "
                "kernels (docs/design/chain-conv.md)")
    return None


def chain_node_name(first_name: str, second_name: str) -> str:
    return f"{first_name}+{second_name}"


def chain_conv_pairs(model, report: list | None = None):
    """`model` with every eligible FusedConvAdd + FusedConv pair as one FusedConvAddConv node: a new model, or `model`
    itself where nothing is chained (never modified)."""
    import onnx_graphsurgeon as gs

    graph = import_graph(model, infer_shapes=False)  # plugin tensors carry their shapes from the fusion pass
    taken: set[int] = set()
    pairs = []
    for first in graph.nodes:
        if first.op != FUSED_CONV_ADD.name or first.domain != DOMAIN or not _pointwise(first):
            continue
        y = first.outputs[0]
        readers = [n for n in y.outputs if n.op == FUSED_CONV.name and n.domain == DOMAIN and n.inputs[0] is y
                   and _pointwise(n) and id(n) not in taken]
        reasons = []
        for second in readers:
            why = pair_refusal(first, second)
            if why is None:
                taken.add(id(second))
                pairs.append((first, second))
                break
            reasons.append(why)
        else:
            if reasons and report is not None:
                report.append(Candidate(PASS_NAME, "conv-add+conv", [first.name, readers[0].name], REJECTED, reasons[0]))
    for first, second in pairs:
        y, z = first.outputs[0], second.outputs[0]
        attrs = {"in_channels": int(first.attrs["in_channels"]), "out_channels": int(first.attrs["out_channels"]),
                 "next_out_channels": int(second.attrs["out_channels"]), "relu": int(first.attrs["relu"]),
                 "next_relu": int(second.attrs["relu"])}
        assert tuple(attrs) == FUSED_CONV_ADD_CONV.attribute_names, "attribute set drifted from op_schema"
        inputs = chained(list(first.inputs), list(second.inputs))
        name = chain_node_name(first.name, second.name)
        for node in (first, second):
            node.inputs.clear()
            node.outputs.clear()
        graph.nodes.append(gs.Node(op=FUSED_CONV_ADD_CONV.name, name=name, domain=DOMAIN, inputs=inputs, outputs=[y, z],
                                   attrs={**attrs, "plugin_namespace": NAMESPACE, "aot": 0}))
        if report is not None:
            report.append(Candidate(PASS_NAME, "conv-add+conv", [first.name, second.name], FUSED,
                                    op=FUSED_CONV_ADD_CONV.name))
    return export_graph(graph, template=model) if pairs else model


def split_chain_node(node: onnx.NodeProto) -> tuple[onnx.NodeProto, onnx.NodeProto]:
    """A FusedConvAddConv node -> its FusedConvAdd and FusedConv nodes (named `<node>/conv` and `<node>/next`), which
    compute its two outputs: how the node runs where the chain kernel does not."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    y, z = node.output
    halves = zip((FUSED_CONV_ADD, FUSED_CONV), ("conv", "next"), chain_inputs(list(node.input), y), (y, z),
                 chain_attributes(attrs))
    return tuple(onnx.helper.make_node(spec.name, inputs, [output], name=f"{node.name}/{suffix}", domain=DOMAIN,
                                       plugin_namespace=NAMESPACE, aot=1, **{k: list(v) if isinstance(v, tuple) else v
                                                                             for k, v in a.items()})
                 for spec, suffix, inputs, output, a in halves)
