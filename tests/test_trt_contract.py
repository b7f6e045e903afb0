"""The TensorRT plugin contract, checked without TensorRT's builder (see docs/tensorrt.md):

* every plugin node of rewritten ResNet-50 against the op's declared fields (one source: op_schema);
* register/autotune answers for every such node as plain Python, against the shapes the CPU
  executor actually produces;
* on a GPU: the PTX, entry name, launch parameters and argument order that aot_impl returns, loaded
  with cuda-python and launched exactly as TensorRT would, equal the golden reference.
"""

import ctypes

import numpy as np
import onnx
import pytest
from onnx import helper

from trtfuse.graph_passes.pipeline import rewrite
from trtfuse.models.cache import load_cached_model
from trtfuse.plugins import trt_contract as tc
from trtfuse.plugins.op_schema import DOMAIN, FUSED_CONV, FUSED_CONV_ADD, NAMESPACE, OPS
from trtfuse.plugins.tactics import ConvShape


@pytest.fixture(scope="module", params=["residual", "all"])
def rewritten_resnet50(request):
    model = load_cached_model("resnet50", image_size=64, batch=2)
    images = np.random.default_rng(0).normal(size=(2, 3, 64, 64)).astype(np.float32)
    out, _ = rewrite(model, request.param, calib_images=images)
    return out, images


def _plugin_nodes(model):
    return [n for n in model.graph.node if n.domain == DOMAIN]


def test_every_plugin_node_matches_its_declared_fields(rewritten_resnet50):
    model, _ = rewritten_resnet50
    nodes = _plugin_nodes(model)
    assert nodes
    kinds = {"INT": onnx.AttributeProto.INT, "INTS": onnx.AttributeProto.INTS}
    for node in nodes:
        spec = OPS[node.op_type]
        attrs = {a.name: a for a in node.attribute}
        assert attrs["plugin_namespace"].type == onnx.AttributeProto.STRING
        assert helper.get_attribute_value(attrs["plugin_namespace"]).decode() == NAMESPACE
        assert helper.get_attribute_value(attrs["aot"]) == 1
        assert set(attrs) == set(spec.attribute_names) | set(spec.parser_attributes), node.name
        for a in spec.attributes:
            assert attrs[a.name].type == kinds[a.kind], (node.name, a.name)
        assert len(node.input) == len(spec.inputs) and all(node.input), node.name
        assert len(node.output) == len(spec.outputs)


def test_register_and_autotune_for_every_resnet50_node(rewritten_resnet50):
    from trtfuse.runtime.cpu_executor import run_model

    model, images = rewritten_resnet50
    nodes = _plugin_nodes(model)
    names = sorted({n.input[0] for n in nodes} | {n.output[0] for n in nodes})
    values = dict(zip(names, run_model(model, {model.graph.input[0].name: images}, names)))
    for node in nodes:
        spec = OPS[node.op_type]
        attrs = tc.ConvAttrs.from_dict({a.name: helper.get_attribute_value(a) for a in node.attribute})
        x, y = values[node.input[0]], values[node.output[0]]
        assert x.dtype == np.int8 and y.dtype == np.int8
        assert tc.output_shape(x.shape, attrs) == y.shape, node.name
        (combo,) = tc.autotune(spec, attrs)
        types, formats = combo.types.split(", "), combo.formats.split(", ")
        assert len(types) == len(formats) == len(spec.inputs) + len(spec.outputs)
        assert types[0] == "INT8" and types[-1] == "INT8" and formats[-1] == "CHW32"
        assert formats[0] == ("CHW4" if attrs.in_channels <= 4 else "CHW32")
        assert combo.tactics and all(t > 0 for t in combo.tactics)
        for t in combo.tactics:
            launch = tc.aot_launch(spec, attrs, x.shape, t)
            assert launch.shared_mem <= tc.AOT_SHARED_LIMIT
            assert len(launch.extra_args) == len(tc.EXTRA_ARG_NAMES)
            oh, ow = y.shape[2:]
            tactic = tc.TACTICS_BY_ID[t]
            assert launch.grid_x == -(-x.shape[0] * oh * ow // tactic.bm) * -(-(-(-attrs.out_channels // 32) * 32) // tactic.bn)


def test_aot_entries_take_node_inputs_then_ints_then_output():
    ptx = tc.aot_ptx(4).decode(errors="replace")
    for spec in (FUSED_CONV, FUSED_CONV_ADD):
        entry = tc.AOT_ENTRY[spec.name]
        head = ptx[ptx.index(f".entry {entry}("):]
        params = head[: head.index(")")].count(".param")
        assert params == len(spec.inputs) + len(tc.EXTRA_ARG_NAMES) + len(spec.outputs)
        assert head.count(".param .u64", 0, head.index(")")) == len(spec.inputs) + len(spec.outputs)


# ---- on a GPU: launch the AOT PTX exactly as TensorRT would ----
from trtfuse.plugins.cuda_driver import gpu_available  # noqa: E402

_ok, _why = gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _ok, reason=f"needs a CUDA GPU: {_why}")
@pytest.mark.parametrize("shape,has_res", [
    (ConvShape(2, 64, 14, 14, 256, 1, 1), True),
    (ConvShape(2, 64, 14, 14, 64, 3, 3, (2, 2), (1, 1, 1, 1)), False),
    (ConvShape(2, 3, 32, 32, 64, 7, 7, (2, 2), (3, 3, 3, 3)), False),
])
def test_aot_ptx_launched_as_tensorrt_would_equals_golden(shape, has_res):
    from trtfuse.bench.conv_problem import ConvProblem, DeviceConv, compare, passes_lsb_rule
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins.conv import ConvLaunch
    from trtfuse.plugins.layout import unpack_chw32

    spec = FUSED_CONV_ADD if has_res else FUSED_CONV
    attrs = tc.ConvAttrs(shape.c, shape.k, (shape.r, shape.s), shape.stride, shape.pads, 1)
    problem = ConvProblem.random(shape, has_res)
    dev = DeviceConv(problem, ConvLaunch.plan(shape))  # only for its device buffers
    golden = problem.golden()
    for tactic in tc.autotune(spec, attrs)[0].tactics:
        launch = tc.aot_launch(spec, attrs, (shape.n, shape.c, shape.h, shape.w), tactic)
        module = cd.Module(tc.aot_ptx(tactic, cd.compute_capability()))
        fn = module.function(launch.entry, launch.shared_mem)
        inputs = [dev.x, dev.w, dev.scale, dev.bias, dev.out_scale] + ([dev.res, dev.res_scale] if has_res else [])
        args = [ctypes.c_uint64(b.ptr) for b in inputs] + [ctypes.c_int32(v) for v in launch.extra_args] + [ctypes.c_uint64(dev.y.ptr)]
        dev.y.fill(0x5A)
        cd.launch(fn, (launch.grid_x, 1, 1), (launch.block_x, 1, 1), launch.shared_mem, 0, [ctypes.addressof(a) for a in args])
        cd.check(cd._driver().cuCtxSynchronize())
        out = unpack_chw32(dev.y.download(dev.y_shape, np.int8), shape.k)
        assert passes_lsb_rule(compare(out, golden)), (tactic, shape)
