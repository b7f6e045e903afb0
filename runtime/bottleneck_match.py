"""Which FusedConv -> FusedConv -> FusedConvAdd chains of a rewritten model the fused bottleneck kernel
(plugins/bottleneck.py) may run: graph walking only, no GPU, so the CPU tests check it on real rewritten ResNets.

A chain qualifies when conv1's output feeds conv2 alone, conv2's feeds conv3 alone (neither intermediate is read
by anything else, so keeping them on chip loses nothing), conv3's residual is conv1's own input (the identity block),
and the shapes are the ones the kernel is compiled for (bottleneck.refusal).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ..plugins import bottleneck
from ..plugins.op_schema import DOMAIN, op_for_node
from ..plugins.tactics import ConvShape


@dataclass(frozen=True)
class BottleneckChain:
    nodes: tuple  # (conv1, conv2, conv3) onnx NodeProtos
    shapes: tuple  # their ConvShapes
    relu: tuple  # their relu attributes

    def inputs(self, i: int) -> dict[str, str]:
        """Conv i's input tensor names by op_schema's input names (x, weight, scale, bias, out_scale, ...)."""
        node = self.nodes[i]
        return op_for_node(node.op_type, node.domain).bind(node.input)


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def node_conv_shape(node, in_shape) -> ConvShape:
    """The ConvShape of a FusedConv / FusedConvAdd node on an input of `in_shape` (N, C, H, W)."""
    a = _attrs(node)
    return ConvShape(*in_shape, a["out_channels"], *a["kernel_shape"], tuple(a["strides"]), tuple(a["pads"]),
                     residual=op_for_node(node.op_type, node.domain).adds_residual)


def _sole_user(tensor: str, consumers: dict, op_type: str):
    users = consumers.get(tensor, [])
    if len(users) != 1 or users[0].domain != DOMAIN or users[0].op_type != op_type or users[0].input[0] != tensor:
        return None
    return users[0]


def match_identity_bottleneck(conv1, consumers: dict, in_shape, graph_outputs=()) -> BottleneckChain | str:
    """The chain starting at FusedConv `conv1` (its input of logical shape `in_shape`, N C H W), or why there is none.
    `consumers`: tensor name -> the nodes reading it; `graph_outputs`: tensor names the graph returns (an intermediate
    among them must be materialized)."""
    if conv1.domain != DOMAIN or conv1.op_type != "FusedConv":
        return f"{conv1.name} is {conv1.op_type}, a block starts with a FusedConv"
    conv2 = _sole_user(conv1.output[0], consumers, "FusedConv")
    if conv2 is None:
        return f"{conv1.name}'s output does not feed one FusedConv alone"
    conv3 = _sole_user(conv2.output[0], consumers, "FusedConvAdd")
    if conv3 is None:
        return f"{conv2.name}'s output does not feed one FusedConvAdd alone"
    if {conv1.output[0], conv2.output[0]} & set(graph_outputs):
        return "an intermediate of the block is a graph output"
    if op_for_node(conv3.op_type, conv3.domain).bind(conv3.input)["residual"] != conv1.input[0]:
        return f"{conv3.name}'s residual is not the block input {conv1.input[0]} (a downsample block)"
    s1 = node_conv_shape(conv1, in_shape)
    s2 = node_conv_shape(conv2, (s1.n, s1.k, *s1.out_hw))
    s3 = node_conv_shape(conv3, (s2.n, s2.k, *s2.out_hw))
    why = bottleneck.refusal(s1, s2, s3)
    if why:
        return why
    return BottleneckChain((conv1, conv2, conv3), (s1, s2, s3), tuple(bool(_attrs(n)["relu"]) for n in (conv1, conv2, conv3)))
