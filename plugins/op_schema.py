"""The single source of truth for every trtfuse plugin op.

The rewrite pass builds ONNX nodes from these specs, the CPU executor dispatches on them, the kernel
launchers read their inputs in this order, and the TensorRT registration declares exactly these
fields. Nothing else lists input names or attributes: change an op here and everything follows.

TensorRT ONNX parser rules that shape this (see ../shared/notes/tensorrt-facts.md):
  * node.op_type == plugin name; STRING attribute `plugin_namespace` names the namespace, and the
    node's domain is the namespace too (tried by TensorRT >= 10.10);
  * every registered attribute is present on the node; only INT / INTS attributes (STRING gets a NUL);
  * every node input, initializers included, becomes a plugin input tensor, in node-input order,
    which is also the AOT kernel's pointer-argument order;
  * a plugin has a fixed number of inputs, so "conv" and "conv + residual" are two ops of one family
    sharing the attributes, the golden reference and the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

NAMESPACE = "trtfuse"
DOMAIN = NAMESPACE  # ONNX domain of plugin nodes; opset_import needs ("trtfuse", OPSET_VERSION)
OPSET_VERSION = 1
PLUGIN_VERSION = "1"  # Quickly Deployable Plugins are always version "1"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: "int8", "float32"
    doc: str


@dataclass(frozen=True)
class AttrSpec:
    name: str
    kind: str  # "INT" or "INTS"
    doc: str


@dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attributes: tuple[AttrSpec, ...]
    doc: str
    # The input holding each int8 output's scale, in output order (none for float outputs).
    output_scales: tuple[str, ...] = ()
    # Attributes the TensorRT parser consumes itself; present on the node, not declared in `register`.
    parser_attributes: tuple[str, ...] = field(default=("plugin_namespace", "aot"))

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def adds_residual(self) -> bool:
        """Whether the op's (first) conv adds a residual input in its epilogue (ConvShape.residual)."""
        return "residual" in self.input_names

    @property
    def attribute_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    def bind(self, inputs: Sequence[T]) -> dict[str, T]:
        """The op's inputs by name, from values in node-input order (the order the ONNX node, TensorRT and the AOT
        kernel's pointer arguments use), so a launcher never indexes them by position."""
        if len(inputs) != len(self.inputs):
            raise ValueError(f"{self.name} takes {len(self.inputs)} inputs ({', '.join(self.input_names)}), got {len(inputs)}")
        return dict(zip(self.input_names, inputs))


_CONV_ATTRS = (
    AttrSpec("in_channels", "INT", "C, logical input channels"),
    AttrSpec("out_channels", "INT", "K, logical output channels"),
    AttrSpec("kernel_shape", "INTS", "[R, S]"),
    AttrSpec("strides", "INTS", "[stride_h, stride_w]"),
    AttrSpec("pads", "INTS", "ONNX order [pad_top, pad_left, pad_bottom, pad_right]"),
    AttrSpec("relu", "INT", "1: clamp at zero before requantizing"),
)

_X = TensorSpec("x", "int8", "activation [N, C, H, W]; physical format CHW32 (CHW4 when C <= 4)")
_W = TensorSpec("weight", "int8", "packed GEMM B matrix [K_pad, KG_pad] (see trtfuse.plugins.layout)")
_SCALE = TensorSpec("scale", "float32", "[K_pad] x_scale * w_scale[k]; zero for padding channels")
_BIAS = TensorSpec("bias", "float32", "[K_pad] folded BN/conv bias; zero for padding channels")
_OUT_SCALE = TensorSpec("out_scale", "float32", "[1] scale of the int8 output")
_RES = TensorSpec("residual", "int8", "shortcut [N, K, OH, OW]; physical format CHW32")
_RES_SCALE = TensorSpec("residual_scale", "float32", "[1] scale of the int8 shortcut")
_Y = TensorSpec("y", "int8", "output [N, K, OH, OW]; physical format CHW32, padding channels zero")

FUSED_CONV = OpSpec(
    name="FusedConv",
    inputs=(_X, _W, _SCALE, _BIAS, _OUT_SCALE),
    outputs=(_Y,),
    attributes=_CONV_ATTRS,
    doc="y = requant(relu?(conv(x, w) * scale + bias) / out_scale)",
    output_scales=("out_scale",),
)

FUSED_CONV_ADD = OpSpec(
    name="FusedConvAdd",
    inputs=(_X, _W, _SCALE, _BIAS, _OUT_SCALE, _RES, _RES_SCALE),
    outputs=(_Y,),
    attributes=_CONV_ATTRS,
    doc="y = requant(relu?(conv(x, w) * scale + bias + residual * residual_scale) / out_scale)",
    output_scales=("out_scale",),
)

# A residual block's last conv and the next conv that reads its output, as one op (graph_passes/chain_pairs.py): the
# runner's and the IPluginV3 plugin's chain kernel (plugins/chain_conv.py) on Hopper, else the two conv kernels in turn.
# Both convs are 1x1, stride 1, unpadded; both outputs are written (y is the next block's residual too).
FUSED_CONV_ADD_CONV = OpSpec(
    name="FusedConvAddConv",
    inputs=(_X, _W, _SCALE, _BIAS, _OUT_SCALE, _RES, _RES_SCALE,
            TensorSpec("next_weight", "int8", "packed GEMM B matrix of the next conv [next_K_pad, K_pad]"),
            TensorSpec("next_scale", "float32", "[next_K_pad] out_scale * next_w_scale[k]; zero for padding channels"),
            TensorSpec("next_bias", "float32", "[next_K_pad] the next conv's folded BN/conv bias"),
            TensorSpec("next_out_scale", "float32", "[1] scale of the int8 next output")),
    outputs=(_Y, TensorSpec("next_y", "int8", "the next conv of y [N, next_K, H, W]; physical format CHW32")),
    attributes=(*_CONV_ATTRS[:2], AttrSpec("next_out_channels", "INT", "next_K, logical channels of next_y"),
                _CONV_ATTRS[5], AttrSpec("next_relu", "INT", "1: clamp next_y at zero before requantizing")),
    doc="y = FusedConvAdd(x, weight, scale, bias, out_scale, residual, residual_scale) and "
        "next_y = FusedConv(y, next_weight, next_scale, next_bias, next_out_scale), both 1x1 stride 1 unpadded",
    output_scales=("out_scale", "next_out_scale"),
)

# The conv attributes of both convs of a FusedConvAddConv (1x1, stride 1, unpadded): implied, not attributes of its own.
POINTWISE_ATTRIBUTES = {"kernel_shape": (1, 1), "strides": (1, 1), "pads": (0, 0, 0, 0)}
_NEXT_INPUTS = ("weight", "scale", "bias", "out_scale")


def chain_attributes(attrs: dict) -> tuple[dict, dict]:
    """A FusedConvAddConv's attributes -> those of its FusedConvAdd and of its FusedConv."""
    first = {"in_channels": attrs["in_channels"], "out_channels": attrs["out_channels"], **POINTWISE_ATTRIBUTES, "relu": attrs["relu"]}
    second = {"in_channels": attrs["out_channels"], "out_channels": attrs["next_out_channels"], **POINTWISE_ATTRIBUTES,
              "relu": attrs["next_relu"]}
    return first, second


def chain_inputs(inputs: Sequence[T], y: T) -> tuple[list[T], list[T]]:
    """A FusedConvAddConv's inputs (node order) and its output y -> the inputs of its FusedConvAdd and of its
    FusedConv, each in that op's node order."""
    named = FUSED_CONV_ADD_CONV.bind(inputs)
    second = {"x": y, **{n: named[f"next_{n}"] for n in _NEXT_INPUTS}}
    return [named[n] for n in FUSED_CONV_ADD.input_names], [second[n] for n in FUSED_CONV.input_names]


def chained(first_inputs: Sequence[T], second_inputs: Sequence[T]) -> list[T]:
    """The inverse of chain_inputs: a FusedConvAdd's and a FusedConv's inputs -> the FusedConvAddConv's (the FusedConv's
    x, the first op's y, is dropped)."""
    first, second = FUSED_CONV_ADD.bind(first_inputs), FUSED_CONV.bind(second_inputs)
    named = {**first, **{f"next_{n}": second[n] for n in _NEXT_INPUTS}}
    return [named[n] for n in FUSED_CONV_ADD_CONV.input_names]


# Split-K GEMM (graph_passes/split_k.py, emit="plugin"; docs/split_k.md). Its kernel is not written yet.
SPLIT_K_GEMM = OpSpec(
    name="SplitKGemm",
    inputs=(
        TensorSpec("a", "float32", "[..., M, K] row-major; every leading dim is more GEMM rows"),
        TensorSpec("weight", "float32", "[K, N] row-major: Gemm's B with transB applied and alpha folded in"),
        TensorSpec("bias", "float32", "[N] beta * C broadcast over rows; zeros when the GEMM has no bias"),
    ),
    outputs=(TensorSpec("y", "float32", "[..., M, N]"),),
    attributes=(AttrSpec("splits", "INT", "S: K is cut into S slices of ceil(K/S), the last one shorter"),),
    doc="y = sum over s = 0..S-1, in that order, of a[..., K_s] @ weight[K_s, :], then + bias once",
)

OPS: dict[str, OpSpec] = {op.name: op for op in (FUSED_CONV, FUSED_CONV_ADD, FUSED_CONV_ADD_CONV, SPLIT_K_GEMM)}


def op_for_node(op_type: str, domain: str | None = None) -> OpSpec | None:
    if domain not in (None, "", DOMAIN):
        return None
    return OPS.get(op_type)
