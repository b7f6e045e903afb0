"""The TensorRT plugin contract, checked without TensorRT's builder (see docs/tensorrt.md):

* every plugin node of rewritten ResNet-50 against the op's declared fields (one source: op_schema);
* register/autotune answers for every such node as plain Python, against the shapes the CPU
  executor actually produces;
* on a GPU: the PTX, entry name, launch parameters and argument order that aot_impl returns, loaded
  with cuda-python and launched exactly as TensorRT would, equal the golden reference.
"""

import ctypes
import dataclasses

import numpy as np
import onnx
import pytest
from onnx import helper

from trtfuse.graph_passes.pipeline import rewrite
from trtfuse.models.cache import load_cached_model
from trtfuse.plugins.tensorrt import contract as tc
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
    names = sorted({OPS[n.op_type].bind(n.input)["x"] for n in nodes} | {n.output[0] for n in nodes})
    values = dict(zip(names, run_model(model, {model.graph.input[0].name: images}, names)))
    for node in nodes:
        spec = OPS[node.op_type]
        attrs = tc.ConvAttrs.from_dict({a.name: helper.get_attribute_value(a) for a in node.attribute})
        x, y = values[spec.bind(node.input)["x"]], values[node.output[0]]
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


# ---- launcher_tactics: what the IPluginV3 plugins (enqueue through ConvLaunch) offer ----
from trtfuse.bench.layers import resnet50_layers  # noqa: E402
from trtfuse.plugins.tactics import TACTICS_BY_ID, WGMMA_TACTICS, choose  # noqa: E402

H200 = tc.LaunchDevice("sm_90", 227 * 1024, 132)
A100 = tc.LaunchDevice("sm_80", 163 * 1024, 108)


def _attrs_of(shape: ConvShape) -> tc.ConvAttrs:
    return tc.ConvAttrs(shape.c, shape.k, (shape.r, shape.s), shape.stride, shape.pads, 1)


@pytest.mark.parametrize("name,shape", [(n, s) for n, s, _ in resnet50_layers(256)], ids=[n for n, _, _ in resnet50_layers(256)])
def test_launcher_tactics_on_hopper_add_the_wgmma_ones_that_handle_the_profile(name, shape, monkeypatch):
    monkeypatch.delenv("TRTFUSE_WGMMA", raising=False)
    attrs, hw = _attrs_of(shape), (shape.h, shape.w)
    aot = [t.id for t in tc.aot_tactics(attrs)]
    shape_free = tc.launcher_tactics(attrs, H200)
    assert shape_free[:len(aot)] == aot and all(TACTICS_BY_ID[i].family == "mma" for i in shape_free)
    for batches in ((256, 256), (1, 256), (3, 40), (256, 512), (8, 8)):
        ids = tc.launcher_tactics(attrs, H200, hw, batches, residual=shape.residual)
        assert set(shape_free) <= set(ids) and len(ids) == len(set(ids))
        # first: what our own runner picks at the largest batch, where the whole profile allows it
        best = choose(dataclasses.replace(shape, n=batches[1]), H200.sms, H200.arch)[0].id
        assert ids[0] == best or best not in ids
        for i in ids:
            t = TACTICS_BY_ID[i]
            if t.family == "wgmma":  # each wgmma tactic offered runs every batch of the profile
                assert all(t.geometry(dataclasses.replace(shape, n=n)) is not None for n in range(batches[0], batches[1] + 1))
        left_out = {t.id for t in WGMMA_TACTICS} - set(ids)
        for i in left_out:  # and each one left out misses some batch of it
            assert any(TACTICS_BY_ID[i].geometry(dataclasses.replace(shape, n=n)) is None
                       for n in range(batches[0], batches[1] + 1)), (name, batches, i)
    # at one batch the first is always `choose`'s pick: for the 3x3 layers at 256, a wgmma tactic
    at_256 = tc.launcher_tactics(attrs, H200, hw, (256, 256), residual=shape.residual)
    assert at_256[0] == choose(shape, H200.sms, H200.arch)[0].id
    if (shape.r, shape.c) == (3, shape.k) and shape.c >= 128:
        assert TACTICS_BY_ID[at_256[0]].family == "wgmma"
    # no wgmma before Hopper, nor with TRTFUSE_WGMMA=0
    assert all(TACTICS_BY_ID[i].family == "mma" for i in tc.launcher_tactics(attrs, A100, hw, (256, 256)))
    monkeypatch.setenv("TRTFUSE_WGMMA", "0")
    assert all(TACTICS_BY_ID[i].family == "mma" for i in tc.launcher_tactics(attrs, H200, hw, (256, 256)))


def test_tiles_without_residual_buffers_are_offered_only_to_convs_without_a_residual(monkeypatch):
    # a FusedConv plugin (no residual input) may take w59, a FusedConvAdd one may not: the kernel has no buffers for it
    monkeypatch.delenv("TRTFUSE_WGMMA", raising=False)
    res4_conv1 = ConvShape(256, 1024, 14, 14, 256, 1, 1)
    attrs = _attrs_of(res4_conv1)
    without = tc.launcher_tactics(attrs, H200, (14, 14), (256, 256), residual=False)
    assert without[0] == 59 and 55 in without
    with_residual = tc.launcher_tactics(attrs, H200, (14, 14), (256, 256), residual=True)
    assert 59 not in with_residual and 55 in with_residual


def test_stacked_image_tiles_are_offered_only_to_profiles_whose_smallest_batch_fills_them():
    # res5 first conv2: 4 images of 7 x 7 per tile (2 would leave over half the positions empty, 3 break the
    # 1024-byte windows), so a profile from batch 3 or less cannot take w66 / w68
    res5_first_conv2 = ConvShape(256, 512, 14, 14, 512, 3, 3, (2, 2), (1, 1, 1, 1))
    attrs, hw = _attrs_of(res5_first_conv2), (14, 14)
    assert {66, 68} <= set(tc.launcher_tactics(attrs, H200, hw, (4, 256)))
    assert not {66, 68} & set(tc.launcher_tactics(attrs, H200, hw, (3, 256)))


def test_launcher_tactics_keep_to_the_devices_shared_memory():
    attrs = tc.ConvAttrs(2048, 512, (3, 3), (1, 1), (1, 1, 1, 1), 1)
    small = tc.LaunchDevice("sm_90", 100 * 1024, 132)
    for device in (H200, small, A100):
        ids = tc.launcher_tactics(attrs, device, (7, 7), (256, 256))
        assert ids and all(TACTICS_BY_ID[i].shared_bytes(2048, (3, 3)) <= device.shared_limit for i in ids)
    assert set(tc.launcher_tactics(attrs, small, (7, 7), (256, 256))) < set(tc.launcher_tactics(attrs, H200, (7, 7), (256, 256)))


def test_checking_batches_up_to_256_then_the_largest_is_exact():
    # geometry depends on N only through min(N, images per tile <= 256): a longer walk finds nothing more
    shapes = [s for _, s, _ in resnet50_layers(1)] + [ConvShape(1, 64, 2, 2, 64, 3, 3, (1, 1), (1, 1, 1, 1)),
                                                      ConvShape(1, 128, 4, 4, 128, 3, 3, (2, 2), (1, 1, 1, 1))]
    for shape in shapes:
        for t in WGMMA_TACTICS:
            for batches in ((1, 600), (2, 300), (200, 520)):
                walked = all(t.geometry(dataclasses.replace(shape, n=n)) is not None for n in range(batches[0], batches[1] + 1))
                assert tc._handles_batches(t, shape, batches) == walked, (shape, t.id, batches)
