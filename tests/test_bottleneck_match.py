"""Which blocks of a rewritten ResNet-50 the GPU runner would run as the fused bottleneck kernel
(runtime/bottleneck_match.py): graph walking only, CPU."""

import numpy as np
import onnx
import pytest

from trtfuse.graph_passes.pipeline import rewrite
from trtfuse.models.cache import load_cached_model
from trtfuse.plugins.op_schema import DOMAIN
from trtfuse.runtime.bottleneck_match import BottleneckChain, match_identity_bottleneck


@pytest.fixture(scope="module")
def resnet50():
    model = load_cached_model("resnet50", image_size=64, batch=2)
    images = np.random.default_rng(0).normal(size=(2, 3, 64, 64)).astype(np.float32)
    fused, _ = rewrite(model, "all", calib_images=images)
    consumers = {}
    for node in fused.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return fused, consumers


def _in_channels(node):
    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "in_channels")


def _matches(fused, consumers):
    out = {}
    for node in fused.graph.node:
        if node.domain == DOMAIN and node.op_type == "FusedConv":
            # res2 runs at 16x16 for a 64-pixel image; other stages are refused on their widths before any size check
            out[node.name] = match_identity_bottleneck(node, consumers, (2, _in_channels(node), 16, 16))
    return out


def test_resnet50_res2_identity_blocks_are_the_only_matches(resnet50):
    fused, consumers = resnet50
    found = _matches(fused, consumers)
    taken = sorted(name for name, m in found.items() if isinstance(m, BottleneckChain))
    assert taken == ["layer1.1.conv1__fused", "layer1.2.conv1__fused"]
    chain = found["layer1.1.conv1__fused"]
    assert [n.name for n in chain.nodes] == ["layer1.1.conv1__fused", "layer1.1.conv2__fused", "layer1.1.conv3__fused"]
    assert chain.relu == (True, True, True)
    assert chain.inputs(2)["residual"] == chain.nodes[0].input[0]
    assert "not the block input" in found["layer1.0.conv1__fused"]  # the downsample block
    assert "512 -> 128 channels" in found["layer2.1.conv1__fused"]
    assert "does not feed one FusedConv alone" in found["layer1.1.conv2__fused"]  # a 3x3 starts no block


def test_an_intermediate_with_a_second_reader_or_as_graph_output_is_not_fused(resnet50):
    fused, consumers = resnet50
    conv1 = next(n for n in fused.graph.node if n.name == "layer1.1.conv1__fused")
    shape = (2, 256, 16, 16)
    assert isinstance(match_identity_bottleneck(conv1, consumers, shape), BottleneckChain)
    extra = onnx.helper.make_node("Identity", [conv1.output[0]], ["spy"])
    more = {**consumers, conv1.output[0]: consumers[conv1.output[0]] + [extra]}
    assert "does not feed one FusedConv alone" in match_identity_bottleneck(conv1, more, shape)
    conv2 = consumers[conv1.output[0]][0]
    assert "graph output" in match_identity_bottleneck(conv1, consumers, shape, (conv2.output[0],))
