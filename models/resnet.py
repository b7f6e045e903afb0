"""ResNet topologies (torchvision's) and their emission as ONNX graphs with onnx.helper.

The architecture is a plain data description (`ResNetSpec`): the stem, then every residual block with its
main-path convolutions and optional projection shortcut. Both the weight synthesis (`weights.py`, which
runs the network in numpy) and the ONNX emitter below walk the same description, so they cannot disagree
about the topology.

Topology (torchvision.models.resnet, i.e. ResNet v1.5):
  conv1 7x7/2 (64) -> bn1 -> relu -> maxpool 3x3/2 pad 1
  -> layer1..layer4 with widths 64/128/256/512
       basic block (ResNet-18/34):      3x3 conv (stride s) -> BN -> ReLU -> 3x3 conv -> BN
       bottleneck (ResNet-50/101):      1x1 conv -> BN -> ReLU -> 3x3 conv (stride s) -> BN -> ReLU
                                        -> 1x1 conv (4x width) -> BN
       + shortcut: identity, or the projection 1x1 conv (stride s) -> BN in a stage's first block when
         the stride or the channel count changes; then Add -> ReLU
  -> global average pool -> flatten -> fc (1000 classes)
Names follow torchvision's module and state_dict names: nodes `layer1.0.conv1`, `layer1.0.bn1`,
`layer1.0.downsample.0` (projection conv), `layer1.0.downsample.1` (its BN), `fc`; initializers
`layer1.0.conv1.weight`, `layer1.0.bn1.running_mean`, ... Each node's output tensor is `<node>.out`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtfuse.errors import TrtfuseError

BN_EPSILON = 1e-5
NUM_CLASSES = 1000
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
DYNAMIC_BATCH_DIM = "N"

# arch -> (block kind, blocks per stage)
ARCHITECTURES: dict[str, tuple[str, tuple[int, int, int, int]]] = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
}
STAGE_WIDTHS = (64, 128, 256, 512)
EXPANSION = {"basic": 1, "bottleneck": 4}

CLASSIFIERS = ("gemm", "matmul")
POOLS = ("gap", "reducemean")
MIN_OPSET, MAX_OPSET = 13, 21


@dataclass(frozen=True)
class ConvBN:
    """A bias-free convolution followed by BatchNormalization (torchvision's conv + bn module pair)."""

    conv: str  # node / module name of the conv, e.g. "layer1.0.conv2"
    bn: str  # node / module name of its BN, e.g. "layer1.0.bn2"
    in_channels: int
    out_channels: int
    kernel: int
    stride: int

    @property
    def pad(self) -> int:
        return self.kernel // 2


@dataclass(frozen=True)
class Block:
    """One residual block: main path convs (ReLU after all but the last), optional projection, Add, ReLU."""

    name: str  # "layer3.5"
    main: tuple[ConvBN, ...]
    projection: ConvBN | None  # None: identity shortcut


@dataclass(frozen=True)
class ResNetSpec:
    arch: str
    block_kind: str
    stage_blocks: tuple[int, ...]
    stem: ConvBN
    blocks: tuple[Block, ...]
    feature_channels: int
    num_classes: int = NUM_CLASSES

    def conv_units(self) -> list[ConvBN]:
        """Every conv+BN pair in topological order (the order weights.py estimates them in)."""
        units = [self.stem]
        for block in self.blocks:
            units += list(block.main)
            if block.projection is not None:
                units.append(block.projection)
        return units


def resnet_spec(arch: str) -> ResNetSpec:
    if arch not in ARCHITECTURES:
        raise TrtfuseError(f"unknown architecture {arch!r}: choose one of {', '.join(ARCHITECTURES)}")
    kind, stage_blocks = ARCHITECTURES[arch]
    expansion = EXPANSION[kind]
    stem = ConvBN("conv1", "bn1", 3, 64, 7, 2)
    blocks: list[Block] = []
    in_ch = 64
    for stage, (width, count) in enumerate(zip(STAGE_WIDTHS, stage_blocks), start=1):
        out_ch = width * expansion
        for i in range(count):
            stride = 2 if (stage > 1 and i == 0) else 1
            name = f"layer{stage}.{i}"
            if kind == "basic":
                main = (
                    ConvBN(f"{name}.conv1", f"{name}.bn1", in_ch, width, 3, stride),
                    ConvBN(f"{name}.conv2", f"{name}.bn2", width, width, 3, 1),
                )
            else:  # v1.5: the stride sits on the 3x3 conv, not on the first 1x1
                main = (
                    ConvBN(f"{name}.conv1", f"{name}.bn1", in_ch, width, 1, 1),
                    ConvBN(f"{name}.conv2", f"{name}.bn2", width, width, 3, stride),
                    ConvBN(f"{name}.conv3", f"{name}.bn3", width, out_ch, 1, 1),
                )
            projection = None
            if stride != 1 or in_ch != out_ch:
                projection = ConvBN(f"{name}.downsample.0", f"{name}.downsample.1", in_ch, out_ch, 1, stride)
            blocks.append(Block(name, main, projection))
            in_ch = out_ch
    return ResNetSpec(arch, kind, stage_blocks, stem, tuple(blocks), in_ch)


def validate_options(*, opset: int, batch: int | None, classifier: str, pool: str, image_size: int) -> None:
    """Reject option values the emitter cannot honour, each with a one-line reason."""
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise TrtfuseError(f"opset must be an integer in {MIN_OPSET}..{MAX_OPSET}, not {opset!r}")
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise TrtfuseError(f"batch must be a positive integer (or dynamic), not {batch!r}")
    if classifier not in CLASSIFIERS:
        raise TrtfuseError(f"classifier must be one of {', '.join(CLASSIFIERS)}, not {classifier!r}")
    if pool not in POOLS:
        raise TrtfuseError(f"pool must be one of {', '.join(POOLS)}, not {pool!r}")
    if not isinstance(image_size, int) or image_size < 32 or image_size % 32:
        # Five stride-2 steps take the input down to 1/32; anything else leaves ragged feature maps.
        raise TrtfuseError(f"image size must be a multiple of 32 and at least 32, not {image_size!r}")


class _GraphBuilder:
    def __init__(self) -> None:
        self.nodes: list = []
        self.initializers: list = []

    def const(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, name: str, inputs: list[str], **attrs) -> str:
        from onnx import helper

        out = f"{name}.out"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out


def _fold_bn(weights: dict[str, np.ndarray], unit: ConvBN) -> tuple[np.ndarray, np.ndarray]:
    """Conv weight and bias with the BN folded in, as torch.onnx export does (computed in float64)."""
    w = weights[f"{unit.conv}.weight"].astype(np.float64)
    gamma = weights[f"{unit.bn}.weight"].astype(np.float64)
    beta = weights[f"{unit.bn}.bias"].astype(np.float64)
    mean = weights[f"{unit.bn}.running_mean"].astype(np.float64)
    var = weights[f"{unit.bn}.running_var"].astype(np.float64)
    scale = gamma / np.sqrt(var + BN_EPSILON)
    return (w * scale[:, None, None, None]).astype(np.float32), (beta - mean * scale).astype(np.float32)


def _emit_conv_bn(g: _GraphBuilder, weights, unit: ConvBN, x: str, fold_bn: bool) -> str:
    conv_attrs = dict(kernel_shape=[unit.kernel] * 2, strides=[unit.stride] * 2, pads=[unit.pad] * 4)
    if fold_bn:
        w, b = _fold_bn(weights, unit)
        inputs = [x, g.const(f"{unit.conv}.weight", w), g.const(f"{unit.conv}.bias", b)]
        return g.node("Conv", unit.conv, inputs, **conv_attrs)
    y = g.node("Conv", unit.conv, [x, g.const(f"{unit.conv}.weight", weights[f"{unit.conv}.weight"])], **conv_attrs)
    bn_inputs = [y] + [g.const(f"{unit.bn}.{p}", weights[f"{unit.bn}.{p}"]) for p in ("weight", "bias", "running_mean", "running_var")]
    return g.node("BatchNormalization", unit.bn, bn_inputs, epsilon=BN_EPSILON)


def emit_onnx(
    spec: ResNetSpec,
    weights: dict[str, np.ndarray],
    *,
    opset: int = 13,
    batch: int | None = 1,
    fold_bn: bool = False,
    classifier: str = "gemm",
    pool: str = "gap",
    image_size: int = 224,
    metadata: dict[str, str] | None = None,
):
    """The ONNX model of `spec` with `weights` (a torchvision-style state_dict of numpy arrays).

    batch=None gives a dynamic batch dimension named "N". The model is not checked here; callers do.
    """
    from onnx import TensorProto, helper

    validate_options(opset=opset, batch=batch, classifier=classifier, pool=pool, image_size=image_size)
    g = _GraphBuilder()
    x = _emit_conv_bn(g, weights, spec.stem, INPUT_NAME, fold_bn)
    x = g.node("Relu", "relu", [x])
    x = g.node("MaxPool", "maxpool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for block in spec.blocks:
        shortcut = x
        y = x
        for i, unit in enumerate(block.main, start=1):
            y = _emit_conv_bn(g, weights, unit, y, fold_bn)
            if i < len(block.main):
                y = g.node("Relu", f"{block.name}.relu{i}", [y])
        if block.projection is not None:
            shortcut = _emit_conv_bn(g, weights, block.projection, x, fold_bn)
        y = g.node("Add", f"{block.name}.add", [y, shortcut])
        x = g.node("Relu", f"{block.name}.relu{len(block.main)}", [y])

    if pool == "gap":
        x = g.node("GlobalAveragePool", "avgpool", [x])
        x = g.node("Flatten", "flatten", [x], axis=1)
    elif opset < 18:  # ReduceMean's axes is an attribute up to opset 17 and an input from opset 18
        x = g.node("ReduceMean", "avgpool", [x], axes=[2, 3], keepdims=0)
    else:
        x = g.node("ReduceMean", "avgpool", [x, g.const("avgpool.axes", np.array([2, 3], dtype=np.int64))], keepdims=0)

    fc_w, fc_b = weights["fc.weight"], weights["fc.bias"]
    if classifier == "gemm":
        g.node("Gemm", "fc", [x, g.const("fc.weight", fc_w), g.const("fc.bias", fc_b)], transB=1)
    else:  # the form some exporters give: weight stored pre-transposed, bias as a broadcast Add
        y = g.node("MatMul", "fc.matmul", [x, g.const("fc.weight_transposed", np.ascontiguousarray(fc_w.T))])
        g.node("Add", "fc.add", [y, g.const("fc.bias", fc_b)])
    g.nodes[-1].output[0] = OUTPUT_NAME

    batch_dim = DYNAMIC_BATCH_DIM if batch is None else batch
    graph = helper.make_graph(
        g.nodes,
        spec.arch,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [batch_dim, 3, image_size, image_size])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [batch_dim, spec.num_classes])],
        initializer=g.initializers,
    )
    opset_ids = [helper.make_opsetid("", opset)]
    model = helper.make_model(
        graph,
        opset_imports=opset_ids,
        producer_name="trtfuse.models",
        # The oldest IR version that carries this opset, so older runtimes and parsers accept the file.
        ir_version=helper.find_min_ir_version_for(opset_ids),
    )
    model.doc_string = (
        f"{spec.arch} (torchvision v1.5 topology) with synthetic weights made by trtfuse.models; "
        "BN statistics re-estimated on natural images, classifier trained on the default photos (see docs/models.md)."
    )
    if metadata:
        helper.set_model_props(model, {key: str(value) for key, value in metadata.items()})
    return model


def count_parameters(model) -> int:
    """Learned parameters: every float initializer except BN running statistics (as torchvision counts)."""
    running = set()
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            running.update(node.input[3:5])
    total = 0
    for init in model.graph.initializer:
        if init.name in running or init.data_type not in (1, 10, 11, 16):  # float, float16, double, bfloat16
            continue
        total += int(np.prod(init.dims, dtype=np.int64))
    return total
