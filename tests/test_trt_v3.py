"""The IPluginV3 fallback plugins and their creators (plugins/tensorrt/v3.py).

On the CPU, with the lean runtime's Python module (`trtfuse[lean]`, in the `test` extra): our creators go
into the lean plugin registry, are looked up by (name, "1", "trtfuse") as TensorRT's ONNX parser looks them
up, and create plugins from the field collection the parser would build from each plugin node of a
`--fuse all` ResNet-50; the plugins' answers must equal the contract's (plugins/tensorrt/contract.py) and the shapes the CPU executor
produces. With the full `tensorrt` module, the same tests run against its registry too.
On a GPU: the created plugin's `enqueue`, called with real PluginTensorDesc objects, device pointers and a
stream handle as ints (as TensorRT calls it), must reproduce the golden reference for every node.
"""

import types

import numpy as np
import onnx
import pytest
from onnx import helper

from trtfuse.bench.layers import resnet50_layers
from trtfuse.errors import TrtfuseError
from trtfuse.graph_passes.pipeline import rewrite
from trtfuse.models.cache import load_cached_model
from trtfuse.plugins.tensorrt import contract as tc
from trtfuse.plugins.tensorrt import v3
from trtfuse.plugins.op_schema import DOMAIN, FUSED_CONV, FUSED_CONV_ADD_CONV, NAMESPACE, OPS, PLUGIN_VERSION, SPLIT_K_GEMM

_MODULES = {"lean": ("tensorrt_lean", "tensorrt_lean_bindings"), "full": ("tensorrt",)}


def _import(flavour):
    try:
        return v3.import_trt(_MODULES[flavour])[0], ""
    except TrtfuseError as exc:
        return None, str(exc)


@pytest.fixture(scope="module", params=["lean", "full"])
def trt(request):
    module, why = _import(request.param)
    if module is None:
        pytest.skip(f"{request.param} TensorRT Python module does not import here: {why}")
    v3.register_creators(module)
    return module


@pytest.fixture(scope="module")
def resnet50_all():
    """`rewrite --fuse all` ResNet-50 at 64x64, batch 2, and every plugin node's input and output values."""
    from trtfuse.runtime.cpu_executor import run_model

    model = load_cached_model("resnet50", image_size=64, batch=2)
    images = np.random.default_rng(0).normal(size=(2, 3, 64, 64)).astype(np.float32)
    out, _ = rewrite(model, "all", calib_images=images)
    nodes = [n for n in out.graph.node if n.domain == DOMAIN]
    names = sorted({t for n in nodes for t in list(n.input) + list(n.output)} - {i.name for i in out.graph.initializer})
    values = dict(zip(names, run_model(out, {out.graph.input[0].name: images}, names)))
    values.update({i.name: onnx.numpy_helper.to_array(i) for i in out.graph.initializer})
    return out, nodes, values


class _Dim:
    """Stands in for TensorRT's IDimensionExpr (no builder here): a constant or a symbolic batch."""

    def __init__(self, value=None):
        self.value = value

    def is_constant(self):
        return self.value is not None

    def get_constant_value(self):
        return self.value


def _desc(trt, type_name, format_name):
    # DataType is real; a format cannot be set on the lean module's PluginTensorDesc (its TensorFormat is
    # not exposed), so the format is a stand-in with the enum's `.name`, which is all the plugin reads.
    return types.SimpleNamespace(desc=types.SimpleNamespace(type=getattr(trt.DataType, type_name),
                                                            format=types.SimpleNamespace(name=format_name)))


def test_creators_are_found_as_the_parser_finds_them(trt):
    registry = trt.get_plugin_registry()
    for spec in OPS.values():
        creator = registry.get_creator(spec.name, PLUGIN_VERSION, NAMESPACE)
        assert creator is not None, spec.name
        assert (creator.name, creator.plugin_namespace, creator.plugin_version) == (spec.name, NAMESPACE, "1")
        assert [(f.name, f.type) for f in creator.field_names] == [(a.name, trt.PluginFieldType.INT32) for a in spec.attributes]
    assert v3.register_creators(trt) is v3.register_creators(trt)  # idempotent: no second registration


def test_node_fields_follow_the_onnx_parser(resnet50_all):
    _, nodes, _ = resnet50_all
    for node in nodes:
        spec = OPS[node.op_type]
        fields = v3.node_fields(spec, node)
        assert [f[0] for f in fields] == list(spec.attribute_names)  # creator order; no plugin_namespace / aot
        for (name, type_name, data), a in zip(fields, spec.attributes):
            assert type_name == "INT32" and data.dtype == np.int32
            want = helper.get_attribute_value(next(x for x in node.attribute if x.name == name))
            assert data.tolist() == ([want] if a.kind == "INT" else list(want))


def test_created_plugins_answer_the_contract_for_every_resnet50_node(trt, resnet50_all):
    _, nodes, values = resnet50_all
    registry = trt.get_plugin_registry()
    assert {n.op_type for n in nodes} == {"FusedConv", "FusedConvAdd"}
    for node in nodes:
        spec = OPS[node.op_type]
        creator = registry.get_creator(spec.name, PLUGIN_VERSION, NAMESPACE)
        plugin = creator.create_plugin(node.name, v3.fields_from_node(trt, spec, node), trt.TensorRTPhase.BUILD)
        attrs = tc.ConvAttrs.from_dict({a.name: helper.get_attribute_value(a) for a in node.attribute})
        assert plugin.logic.attrs == attrs, node.name
        assert (plugin.plugin_name, plugin.plugin_namespace, plugin.plugin_version, plugin.num_outputs) == (spec.name, NAMESPACE, "1", 1)
        assert plugin.get_capability_interface(trt.PluginCapabilityType.RUNTIME) is plugin
        x, y = values[spec.bind(node.input)["x"]], values[node.output[0]]
        # types
        in_types = [getattr(trt.DataType, "INT8" if values[i].dtype == np.int8 else "FLOAT") for i in node.input]
        assert plugin.get_output_data_types(in_types) == [trt.DataType.INT8] and y.dtype == np.int8
        # shapes: N symbolic, the rest static, against the CPU executor's output and the contract
        dims = plugin.logic.output_dims([_Dim(None)] + [_Dim(d) for d in x.shape[1:]], lambda v: v)
        assert dims[1:] == list(y.shape[1:]) and not dims[0].is_constant(), node.name
        assert tuple(dims[1:]) == tc.output_shape(x.shape, attrs)[1:]
        # formats: exactly the contract's (type, format) at every position, nothing else
        (combo,) = tc.autotune(spec, attrs)
        types_, formats = combo.types.split(", "), combo.formats.split(", ")
        n_io = len(spec.inputs) + len(spec.outputs)
        want = [("INT8" if t == "INT8" else "FLOAT", f) for t, f in zip(types_, formats)]
        in_out = [_desc(trt, t, f) for t, f in want]
        for pos in range(n_io):
            assert plugin.supports_format_combination(pos, in_out, len(spec.inputs)), (node.name, pos)
        assert formats[0] == ("CHW4" if x.shape[1] <= 4 else "CHW32") and formats[-1] == "CHW32"
        for pos, bad in [(0, ("INT8", "LINEAR")), (0, ("FLOAT", formats[0])), (0, ("INT8", "CHW4" if formats[0] == "CHW32" else "CHW32")),
                         (n_io - 1, ("INT8", "LINEAR")), (2, ("FLOAT", "CHW32"))]:
            trial = list(in_out)
            trial[pos] = _desc(trt, *bad)
            assert not plugin.supports_format_combination(pos, trial, len(spec.inputs)), (node.name, pos, bad)
        # tactics (the AOT ones without a GPU, the launcher's on one), timing-cache id, serialization round trip
        device = v3._detected_device()
        offered = tc.launcher_tactics(attrs, device) if device else list(combo.tactics)
        assert plugin.get_valid_tactics() == offered and offered[:len(combo.tactics)] == list(combo.tactics)
        assert plugin.get_workspace_size([], []) == 0
        plugin.set_tactic(combo.tactics[-1])
        copy = plugin.attach_to_context(None)
        assert copy is not plugin and copy.tactic == combo.tactics[-1] and copy.logic.attrs == attrs
        again = creator.create_plugin(node.name, plugin.get_fields_to_serialize(), trt.TensorRTPhase.RUNTIME)
        assert again.logic.attrs == attrs and again.timing_cache_id == plugin.timing_cache_id
        with pytest.raises(ValueError, match="not offered"):
            plugin.set_tactic(max(t.id for t in tc.TACTICS) + 1)


def test_plugins_with_different_attributes_do_not_share_timings(resnet50_all):
    _, nodes, _ = resnet50_all
    ids = {}
    for node in nodes:
        spec = OPS[node.op_type]
        attrs = v3.parse_fields(spec, v3.node_fields(spec, node))
        ids.setdefault(v3.ConvPluginLogic(spec, attrs).timing_cache_id, set()).add(
            (spec.name, tuple(sorted((k, str(v)) for k, v in attrs.items()))))
    assert all(len(v) == 1 for v in ids.values()) and len(ids) > 10


def _conv_node(**drop):
    attrs = dict(in_channels=64, out_channels=256, kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], relu=1)
    for k in drop:
        attrs.pop(k)
    return helper.make_node("FusedConv", ["x", "w", "s", "b", "o"], ["y"], name="n", domain=DOMAIN,
                            plugin_namespace=NAMESPACE, aot=1, **attrs)


def test_a_node_missing_a_field_is_refused_naming_it(trt):
    creator = trt.get_plugin_registry().get_creator("FusedConv", "1", NAMESPACE)
    fc = v3.fields_from_node(trt, FUSED_CONV, _conv_node(relu=None))
    assert [f.name for f in fc] == ["in_channels", "out_channels", "kernel_shape", "strides", "pads"]
    with pytest.raises(ValueError, match="'relu' is missing"):
        creator.create_plugin("n", fc, trt.TensorRTPhase.BUILD)


def test_wrong_field_types_and_counts_are_refused(trt):
    creator = trt.get_plugin_registry().get_creator("FusedConv", "1", NAMESPACE)
    good = v3.node_fields(FUSED_CONV, _conv_node())
    as_float = [(n, "FLOAT32", d.astype(np.float32)) if n == "relu" else (n, t, d) for n, t, d in good]
    with pytest.raises(ValueError, match="'relu' is FLOAT32"):
        creator.create_plugin("n", v3._collection(trt, as_float), trt.TensorRTPhase.BUILD)
    two_values = [(n, t, np.array([64, 64], np.int32)) if n == "in_channels" else (n, t, d) for n, t, d in good]
    with pytest.raises(ValueError, match="'in_channels' is INT, got 2"):
        creator.create_plugin("n", v3._collection(trt, two_values), trt.TensorRTPhase.BUILD)
    assert creator.create_plugin("n", v3._collection(trt, good), trt.TensorRTPhase.BUILD).logic.attrs.in_channels == 64


def test_split_k_gemm_creator_refuses_until_its_kernel_exists(trt):
    node = helper.make_node(SPLIT_K_GEMM.name, ["a", "w", "b"], ["y"], domain=DOMAIN, splits=4,
                            plugin_namespace=NAMESPACE, aot=1)
    fields = v3.node_fields(SPLIT_K_GEMM, node)
    assert fields[0][0] == "splits" and fields[0][2].tolist() == [4]
    creator = trt.get_plugin_registry().get_creator(SPLIT_K_GEMM.name, "1", NAMESPACE)
    with pytest.raises(ValueError, match="no GPU kernel"):
        creator.create_plugin("n", v3._collection(trt, fields), trt.TensorRTPhase.BUILD)


def test_a_node_no_tactic_fits_is_refused_at_creation():
    attrs = dict(in_channels=8192, out_channels=64, kernel_shape=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), relu=1)
    assert not tc.autotune(FUSED_CONV, tc.ConvAttrs.from_dict(attrs))[0].tactics
    with pytest.raises(ValueError, match="no tactic fits"):
        v3.ConvPluginLogic(FUSED_CONV, attrs, device=None)
    assert v3.ConvPluginLogic(FUSED_CONV, attrs, device=H200).tactics  # our launcher opts in to 227 KB
    with pytest.raises(ValueError, match="under 40960 bytes"):
        v3.ConvPluginLogic(FUSED_CONV, attrs, device=tc.LaunchDevice("sm_90", 40 * 1024, 132))
    attrs["in_channels"] = 512
    assert v3.ConvPluginLogic(FUSED_CONV, attrs, device=None).tactics


H200 = tc.LaunchDevice("sm_90", 227 * 1024, 132)
RES4_FIRST_CONV2 = dict(in_channels=256, out_channels=256, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), relu=1)


def _dynamic_desc(trt, dims, lo, hi):
    d = trt.DynamicPluginTensorDesc()
    d.desc.dims = trt.Dims([-1, *dims[1:]])
    d.min, d.max, d.opt = trt.Dims([lo, *dims[1:]]), trt.Dims([hi, *dims[1:]]), trt.Dims([hi, *dims[1:]])
    return d


def _dynamic_descs(trt, spec, dims, lo, hi):
    """configure_plugin's inputs as TensorRT passes them, one per input of `spec`: x's dynamic batch range, then the
    constants' (their dims unread)."""
    return [_dynamic_desc(trt, dims, lo, hi)] + [_dynamic_desc(trt, [1, 1], 1, 1) for _ in spec.inputs[1:]]


def test_only_a_plugin_without_a_residual_input_offers_the_tiles_without_residual_buffers(trt):
    # res4 conv1 as TensorRT configures it: FusedConv offers w59 first (choose's pick), FusedConvAdd never (no buffers)
    from trtfuse.plugins.op_schema import FUSED_CONV_ADD

    ConvPlugin, _ = v3.plugin_classes(trt)
    res4_conv1 = dict(in_channels=1024, out_channels=256, kernel_shape=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0), relu=1)
    offered = {}
    for spec in (FUSED_CONV, FUSED_CONV_ADD):
        plugin = ConvPlugin(spec, res4_conv1, "res4_conv1", trt.TensorRTPhase.BUILD, device=H200)
        plugin.configure_plugin(_dynamic_descs(trt, spec, [256, 1024, 14, 14], 256, 256), [])
        offered[spec.name] = plugin.get_valid_tactics()
    assert offered["FusedConv"][0] == 59 and 59 not in offered["FusedConvAdd"] and 55 in offered["FusedConvAdd"]


def test_configured_plugins_on_hopper_offer_the_wgmma_tactics_of_their_profile(trt):
    from trtfuse.plugins.tactics import TACTICS_BY_ID

    ConvPlugin, _ = v3.plugin_classes(trt)
    attrs = tc.ConvAttrs.from_dict(RES4_FIRST_CONV2)
    plugin = ConvPlugin(FUSED_CONV, RES4_FIRST_CONV2, "res4_first_conv2", trt.TensorRTPhase.BUILD, device=H200)
    before = plugin.get_valid_tactics()
    assert before == tc.launcher_tactics(attrs, H200) and all(TACTICS_BY_ID[i].family == "mma" for i in before)
    x = [256, 256, 28, 28]
    plugin.configure_plugin(_dynamic_descs(trt, FUSED_CONV, x, 4, 256), [])
    offered = plugin.get_valid_tactics()
    # a FusedConv has no residual: the tiles without residual buffers are offered to it too
    assert offered == tc.launcher_tactics(attrs, H200, (28, 28), (4, 256), residual=False) and offered[0] == 67  # choose's pick
    assert set(before) < set(offered) and {65, 66, 67, 68} <= set(offered)
    runtime = plugin.attach_to_context(None)  # the per-context clone keeps what the build configured
    assert runtime.get_valid_tactics() == offered
    # at runtime TensorRT sets the tactic it chose on a plugin it never configured
    fresh = ConvPlugin(FUSED_CONV, RES4_FIRST_CONV2, "res4_first_conv2", trt.TensorRTPhase.RUNTIME, device=H200)
    fresh.set_tactic(67)
    assert fresh.tactic == 67
    with pytest.raises(ValueError, match="channels"):
        plugin.configure_plugin(_dynamic_descs(trt, FUSED_CONV, [256, 128, 28, 28], 4, 256), [])
    # before Hopper, or without a GPU (the AOT tactics), configuring adds nothing
    for device in (tc.LaunchDevice("sm_80", 163 * 1024, 108), None):
        other = ConvPlugin(FUSED_CONV, RES4_FIRST_CONV2, "n", trt.TensorRTPhase.BUILD, device=device)
        first = other.get_valid_tactics()
        other.configure_plugin(_dynamic_descs(trt, FUSED_CONV, x, 4, 256), [])
        assert all(TACTICS_BY_ID[i].family == "mma" for i in other.get_valid_tactics())
        assert set(other.get_valid_tactics()) == set(first)
        with pytest.raises(ValueError, match="not offered"):
            other.set_tactic(67)


def test_import_trt_names_every_module_it_tried():
    with pytest.raises(TrtfuseError, match="no_such_trt_a: ModuleNotFoundError, no_such_trt_b: ModuleNotFoundError"):
        v3.import_trt(("no_such_trt_a", "no_such_trt_b"))


# ---- on a GPU: enqueue as TensorRT calls it ----
from trtfuse.plugins.cuda_driver import gpu_available  # noqa: E402

_gpu_ok, _gpu_why = gpu_available()


def _tensor_descs(trt, inputs, output):
    """The PluginTensorDescs TensorRT hands `enqueue`: each input's type and dims, then the int8 output's."""
    in_desc = []
    for a in inputs:
        d = trt.PluginTensorDesc()
        d.type = trt.DataType.INT8 if a.dtype == np.int8 else trt.DataType.FLOAT
        d.dims = trt.Dims(list(a.shape))
        in_desc.append(d)
    out_desc = trt.PluginTensorDesc()
    out_desc.type, out_desc.dims = trt.DataType.INT8, trt.Dims(list(output.shape))
    return in_desc, out_desc


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok, reason=f"needs a CUDA GPU: {_gpu_why}")
def test_enqueue_with_tensorrt_descs_and_pointers_equals_golden(trt, resnet50_all):
    from trtfuse.bench.conv_problem import POISON, compare, passes_lsb_rule
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins.layout import channel_vector, pack_nchwv, unpack_chw32
    from trtfuse.plugins.reference import fused_conv_int8

    _, nodes, values = resnet50_all
    registry = trt.get_plugin_registry()
    stream = cd.Stream()
    tactics_run = set()
    for i, node in enumerate(nodes):
        spec = OPS[node.op_type]
        plugin = registry.get_creator(spec.name, "1", NAMESPACE).create_plugin(
            node.name, v3.fields_from_node(trt, spec, node), trt.TensorRTPhase.RUNTIME)
        tactic = plugin.get_valid_tactics()[i % len(plugin.get_valid_tactics())]  # every tactic, across nodes
        plugin.set_tactic(tactic)
        runtime = plugin.attach_to_context(None)  # TensorRT enqueues on the per-context clone
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in spec.attribute_names}
        args = [values[n] for n in node.input]
        golden = fused_conv_int8(*args, **attrs)
        # device operands in the formats the plugin declared: x CHW4/CHW32, residual CHW32, the rest linear
        x = args[0]
        bufs = [cd.DeviceBuffer.from_array(pack_nchwv(x, channel_vector(x.shape[1])))]
        bufs += [cd.DeviceBuffer.from_array(a) for a in args[1:5]]
        if len(args) > 5:
            bufs += [cd.DeviceBuffer.from_array(pack_nchwv(args[5], 32)), cd.DeviceBuffer.from_array(args[6])]
        y_shape = (golden.shape[0], -(-golden.shape[1] // 32), *golden.shape[2:], 32)
        y = cd.DeviceBuffer(int(np.prod(y_shape)))
        y.fill(POISON)
        in_desc, out_desc = _tensor_descs(trt, args, golden)
        runtime.on_shape_change(in_desc, [out_desc])
        runtime.enqueue(in_desc, [out_desc], [int(b.ptr) for b in bufs], [int(y.ptr)], 0, int(stream.handle))
        stream.synchronize()
        out = unpack_chw32(y.download(y_shape, np.int8), golden.shape[1])
        stats = compare(out, golden)
        assert passes_lsb_rule(stats), (node.name, tactic, stats)
        tactics_run.add(tactic)
    assert len(tactics_run) >= 3


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok, reason=f"needs a CUDA GPU: {_gpu_why}")
def test_every_tactic_a_configured_plugin_offers_equals_golden(trt):
    """ResNet-50's layers at 224 x 224, batch 2, on fresh random data: a build-phase plugin configured for the profile
    (2, 2), then every wgmma tactic it offers (on Hopper) and its first choice, enqueued as TensorRT would."""
    from trtfuse.bench.conv_problem import POISON, ConvProblem, compare, passes_lsb_rule
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins.layout import pack_nchwv, pack_weight, unpack_chw32
    from trtfuse.plugins.op_schema import FUSED_CONV_ADD
    from trtfuse.plugins.tactics import TACTICS_BY_ID, ConvShape

    ConvPlugin, _ = v3.plugin_classes(trt)
    stream = cd.Stream()
    wgmma_run = set()
    for i, (name, layer, has_res) in enumerate(resnet50_layers(2)):
        shape = ConvShape(2, layer.c, layer.h, layer.w, layer.k, layer.r, layer.s, layer.stride, layer.pads)
        spec = FUSED_CONV_ADD if has_res else FUSED_CONV
        attrs = dict(in_channels=shape.c, out_channels=shape.k, kernel_shape=(shape.r, shape.s), strides=shape.stride,
                     pads=shape.pads, relu=1)
        plugin = ConvPlugin(spec, attrs, name, trt.TensorRTPhase.BUILD)
        plugin.configure_plugin(_dynamic_descs(trt, spec, [2, shape.c, shape.h, shape.w], 2, 2), [])
        offered = plugin.get_valid_tactics()
        problem = ConvProblem.random(shape, has_res, seed=i)
        golden = problem.golden()
        bufs = [cd.DeviceBuffer.from_array(a) for a in (pack_nchwv(problem.x, shape.vec), pack_weight(problem.w, shape.vec),
                                                         problem.scale, problem.bias, problem.out_scale)]
        if has_res:
            bufs += [cd.DeviceBuffer.from_array(pack_nchwv(problem.residual, 32)), cd.DeviceBuffer.from_array(problem.residual_scale)]
        y_shape = (2, -(-shape.k // 32), *golden.shape[2:], 32)
        y = cd.DeviceBuffer(int(np.prod(y_shape)))
        args = [problem.x, problem.w, problem.scale, problem.bias, problem.out_scale]
        in_desc, out_desc = _tensor_descs(trt, args + ([problem.residual, problem.residual_scale] if has_res else []), golden)
        for tactic in [offered[0]] + [i for i in offered[1:] if TACTICS_BY_ID[i].family == "wgmma"]:
            plugin.set_tactic(tactic)
            runtime = plugin.attach_to_context(None)
            runtime.on_shape_change(in_desc, [out_desc])
            y.fill(POISON)
            runtime.enqueue(in_desc, [out_desc], [int(b.ptr) for b in bufs], [int(y.ptr)], 0, int(stream.handle))
            stream.synchronize()
            stats = compare(unpack_chw32(y.download(y_shape, np.int8), shape.k), golden)
            assert passes_lsb_rule(stats), (name, tactic, stats)
            if TACTICS_BY_ID[tactic].family == "wgmma":
                wgmma_run.add(tactic)
    if cd.compute_capability().startswith("sm_90"):
        assert len(wgmma_run) >= 30, sorted(wgmma_run)  # the tiles ResNet-50's layers take, windows and stride-2 ones included


# ---- the call order TensorRT documents for an IPluginV3 (plugins/tensorrt/v3.py's docstring), tactic changes included ----

class _RecordingPlan:
    def __init__(self, log, dims, tactic):
        self.log, self.dims, self.tactic = log, dims, tactic
        log.append(("plan", dims, tactic))

    def launch_op(self, op, inputs, y, *, relu, stream):
        assert op.bind(inputs) == {"x": 1, "weight": 2, "scale": 3, "bias": 4, "out_scale": 5} and y == 6  # by name
        self.log.append(("launch", self.dims, self.tactic, stream))


def _x_desc(trt, dims):
    d = trt.PluginTensorDesc()
    d.dims = trt.Dims(dims)
    d.type = trt.DataType.INT8
    return d


def _in_descs(trt, x_dims):
    """One desc per FusedConv input, as TensorRT hands them: x's, then the constants' (their dims unread)."""
    return [_x_desc(trt, x_dims)] + [_x_desc(trt, [1]) for _ in FUSED_CONV.inputs[1:]]


def test_the_documented_lifecycle_launches_the_tactic_last_set(trt, monkeypatch):
    log = []
    monkeypatch.setattr(v3.ConvPluginLogic, "plan", lambda self, dims, tactic: _RecordingPlan(log, dims, tactic))
    registry = trt.get_plugin_registry()
    creator = registry.get_creator("FusedConv", PLUGIN_VERSION, NAMESPACE)
    attrs = dict(in_channels=64, out_channels=64, kernel_shape=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), relu=1)
    fields = v3._collection(trt, v3.attribute_fields(FUSED_CONV, attrs))
    x4, x8 = [4, 64, 14, 14], [8, 64, 14, 14]
    out = [_x_desc(trt, x4)]
    ptrs, outs = [1, 2, 3, 4, 5], [6]

    # build: one plugin object times every tactic, with no shape change between tactics
    plugin = creator.create_plugin("conv", fields, trt.TensorRTPhase.BUILD)
    tactics = plugin.get_valid_tactics()
    assert len(tactics) >= 2
    plugin.on_shape_change(_in_descs(trt, x4), out)
    for t in tactics:
        plugin.set_tactic(t)
        plugin.enqueue(_in_descs(trt, x4), out, ptrs, outs, 0, 11)
        plugin.enqueue(_in_descs(trt, x4), out, ptrs, outs, 0, 11)
    assert [e[2] for e in log if e[0] == "launch"] == [t for t in tactics for _ in range(2)]
    assert [e[2] for e in log if e[0] == "plan"] == tactics  # one plan per tactic, reused for its second launch

    # serialization: the runtime gets its fields back and is told the chosen tactic before any shape
    chosen = tactics[-1]
    fields_back = plugin.get_fields_to_serialize()
    runtime = creator.create_plugin("conv", fields_back, trt.TensorRTPhase.RUNTIME)
    runtime.set_tactic(chosen)
    context = runtime.attach_to_context(None)
    assert context.tactic == chosen
    log.clear()
    context.on_shape_change(_in_descs(trt, x8), out)
    context.enqueue(_in_descs(trt, x8), out, ptrs, outs, 0, 12)
    context.set_tactic(tactics[0])  # a tactic change without a shape change
    context.enqueue(_in_descs(trt, x8), out, ptrs, outs, 0, 12)
    context.on_shape_change(_in_descs(trt, x4), out)  # and a shape change keeps the tactic
    context.enqueue(_in_descs(trt, x4), out, ptrs, outs, 0, 12)
    assert [e[1:3] for e in log if e[0] == "launch"] == [(tuple(x8), chosen), (tuple(x8), tactics[0]), (tuple(x4), tactics[0])]
    # clones (the builder's and each context's) carry the tactic and share no plans with their source
    clone = context.clone()
    assert clone.tactic == tactics[0] and clone.plans == {} and clone.plans is not context.plans


# ---- FusedConvAddConv: a block's last conv and the next conv, two outputs (graph_passes/chain_pairs.py) ----

@pytest.fixture(scope="module")
def resnet50_chained(resnet50_all):
    """The same model with res2's and res3's pairs chained, its FusedConvAddConv nodes, and every plugin value."""
    from trtfuse.graph_passes.chain_pairs import chain_conv_pairs

    model, _, values = resnet50_all
    chained = chain_conv_pairs(model)
    nodes = [n for n in chained.graph.node if n.op_type == FUSED_CONV_ADD_CONV.name]
    return chained, nodes, values


def _chain_plugin(trt, node, phase):
    creator = trt.get_plugin_registry().get_creator(FUSED_CONV_ADD_CONV.name, PLUGIN_VERSION, NAMESPACE)
    return creator, creator.create_plugin(node.name, v3.fields_from_node(trt, FUSED_CONV_ADD_CONV, node), phase)


def test_chain_plugins_answer_for_both_outputs(trt, resnet50_chained):
    _, nodes, values = resnet50_chained
    assert len(nodes) == 6
    for node in nodes:
        creator, plugin = _chain_plugin(trt, node, trt.TensorRTPhase.BUILD)
        assert isinstance(plugin.logic, v3.ChainPluginLogic) and plugin.num_outputs == 2
        x = values[FUSED_CONV_ADD_CONV.bind(node.input)["x"]]
        y, z = (values[o] for o in node.output)
        assert plugin.get_output_data_types([]) == [trt.DataType.INT8, trt.DataType.INT8]
        dims = plugin.logic.outputs_dims([_Dim(None)] + [_Dim(d) for d in x.shape[1:]], lambda v: v)
        assert [d[1:] for d in dims] == [list(y.shape[1:]), list(z.shape[1:])] and not dims[0][0].is_constant()
        # x, residual and both outputs CHW32; every constant linear, int8 weights and fp32 factors
        n_in = len(FUSED_CONV_ADD_CONV.inputs)
        want = [("INT8" if t.dtype == "int8" else "FLOAT", "CHW32" if t.name in ("x", "residual") else "LINEAR")
                for t in FUSED_CONV_ADD_CONV.inputs] + [("INT8", "CHW32")] * 2
        in_out = [_desc(trt, t, f) for t, f in want]
        assert all(plugin.supports_format_combination(pos, in_out, n_in) for pos in range(n_in + 2))
        for pos, bad in [(0, ("INT8", "LINEAR")), (n_in, ("INT8", "LINEAR")), (n_in + 1, ("FLOAT", "CHW32")),
                         (7, ("FLOAT", "LINEAR"))]:
            trial = list(in_out)
            trial[pos] = _desc(trt, *bad)
            assert not plugin.supports_format_combination(pos, trial, n_in), (node.name, pos, bad)
        # unconfigured: the two kernels only; configured on an H200 for its profile: the chain kernel first
        assert plugin.get_valid_tactics() == [tc.TWO_KERNELS_TACTIC]
        on_hopper = v3.ChainPluginLogic(FUSED_CONV_ADD_CONV, plugin.logic.attrs_dict, device=H200)
        on_hopper.configure(x.shape[2:], (1, 8))
        assert on_hopper.tactics == [tc.CHAIN_KERNEL_TACTIC, tc.TWO_KERNELS_TACTIC]
        elsewhere = v3.ChainPluginLogic(FUSED_CONV_ADD_CONV, plugin.logic.attrs_dict,
                                        device=tc.LaunchDevice("sm_89", 99 * 1024, 128))
        elsewhere.configure(x.shape[2:], (1, 8))
        assert elsewhere.tactics == [tc.TWO_KERNELS_TACTIC]
        plugin.set_tactic(tc.CHAIN_KERNEL_TACTIC)  # at runtime TensorRT sets its choice without configuring
        copy = plugin.attach_to_context(None)
        assert copy.tactic == tc.CHAIN_KERNEL_TACTIC and copy.logic.attrs == plugin.logic.attrs
        again = creator.create_plugin(node.name, plugin.get_fields_to_serialize(), trt.TensorRTPhase.RUNTIME)
        assert again.logic.attrs == plugin.logic.attrs and again.timing_cache_id == plugin.timing_cache_id
        with pytest.raises(ValueError, match="not offered"):
            plugin.set_tactic(3)


def test_a_chain_map_not_in_8_pixel_groups_offers_the_two_kernels():
    attrs = dict(in_channels=64, out_channels=256, next_out_channels=64, relu=1, next_relu=1)
    logic = v3.ChainPluginLogic(FUSED_CONV_ADD_CONV, attrs, device=H200)
    logic.configure((7, 7), (1, 8))
    assert logic.tactics == [tc.TWO_KERNELS_TACTIC]
    logic.configure((56, 56), (1, 256))
    assert logic.tactics == [tc.CHAIN_KERNEL_TACTIC, tc.TWO_KERNELS_TACTIC]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok, reason=f"needs a CUDA GPU: {_gpu_why}")
def test_chain_enqueue_of_every_tactic_equals_golden(trt, resnet50_chained):
    """Every FusedConvAddConv node, each tactic the GPU runs (the chain kernel on sm_90, the two kernels everywhere),
    enqueued as TensorRT calls it with both outputs poisoned: y and next_y against the CPU executor's."""
    from trtfuse.bench.conv_problem import POISON, compare, passes_lsb_rule
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins.layout import pack_nchwv, unpack_chw32

    _, nodes, values = resnet50_chained
    stream = cd.Stream()
    run = set()
    for node in nodes:
        _, plugin = _chain_plugin(trt, node, trt.TensorRTPhase.BUILD)
        args = [values[n] for n in node.input]
        named = FUSED_CONV_ADD_CONV.bind(args)
        plugin.configure_plugin(_dynamic_descs(trt, FUSED_CONV_ADD_CONV, list(named["x"].shape), 2, 2), [])
        bufs = [cd.DeviceBuffer.from_array(pack_nchwv(a, 32) if t.name in ("x", "residual") else a)
                for a, t in zip(args, FUSED_CONV_ADD_CONV.inputs)]
        goldens = [values[o] for o in node.output]
        shapes = [(g.shape[0], -(-g.shape[1] // 32), *g.shape[2:], 32) for g in goldens]
        outs = [cd.DeviceBuffer(int(np.prod(s))) for s in shapes]
        in_desc, y_desc = _tensor_descs(trt, args, goldens[0])
        _, z_desc = _tensor_descs(trt, [], goldens[1])
        for tactic in plugin.get_valid_tactics():
            plugin.set_tactic(tactic)
            runtime = plugin.attach_to_context(None)
            runtime.on_shape_change(in_desc, [y_desc, z_desc])
            for o in outs:
                o.fill(POISON)
            runtime.enqueue(in_desc, [y_desc, z_desc], [int(b.ptr) for b in bufs], [int(o.ptr) for o in outs], 0,
                            int(stream.handle))
            stream.synchronize()
            for o, s, g in zip(outs, shapes, goldens):
                stats = compare(unpack_chw32(o.download(s, np.int8), g.shape[1]), g)
                assert passes_lsb_rule(stats), (node.name, tactic, stats)
            run.add(tactic)
    assert tc.TWO_KERNELS_TACTIC in run
    if cd.compute_capability() == "sm_90":
        assert tc.CHAIN_KERNEL_TACTIC in run


def test_the_chain_plugin_lifecycle_launches_the_tactic_last_set(trt, monkeypatch):
    """TensorRT's documented call order on a FusedConvAddConv plugin built on an H200: configured for its profile it
    offers the chain kernel and the two kernels; each enqueue launches the tactic last set with all eleven inputs and
    both outputs, one launch plan per (dims, tactic); the runtime plugin launches the serialized choice."""
    log = []

    def plan(self, dims, tactic):
        log.append(("plan", tuple(dims), tactic))
        return lambda inputs, outputs, stream: log.append(("launch", tuple(dims), tactic, tuple(inputs), tuple(outputs), stream))

    monkeypatch.setattr(v3.ChainPluginLogic, "plan", plan)
    monkeypatch.setattr(v3, "_detected_device", lambda: H200)
    creator = trt.get_plugin_registry().get_creator(FUSED_CONV_ADD_CONV.name, PLUGIN_VERSION, NAMESPACE)
    attrs = dict(in_channels=64, out_channels=256, next_out_channels=64, relu=1, next_relu=1)
    fields = v3._collection(trt, v3.attribute_fields(FUSED_CONV_ADD_CONV, attrs))
    x4, x8 = [4, 64, 56, 56], [8, 64, 56, 56]
    in4 = [_x_desc(trt, x4)] + [_x_desc(trt, [1]) for _ in FUSED_CONV_ADD_CONV.inputs[1:]]
    in8 = [_x_desc(trt, x8)] + in4[1:]
    outs_desc = [_x_desc(trt, [4, 256, 56, 56]), _x_desc(trt, [4, 64, 56, 56])]
    ptrs, outs = list(range(1, 12)), [12, 13]

    plugin = creator.create_plugin("pair", fields, trt.TensorRTPhase.BUILD)
    assert plugin.get_valid_tactics() == [tc.TWO_KERNELS_TACTIC]  # before configure_plugin: no spatial dims yet
    plugin.configure_plugin(_dynamic_descs(trt, FUSED_CONV_ADD_CONV, x4, 1, 8), [])
    tactics = plugin.get_valid_tactics()
    assert tactics == [tc.CHAIN_KERNEL_TACTIC, tc.TWO_KERNELS_TACTIC]
    plugin.on_shape_change(in4, outs_desc)
    for t in tactics:
        plugin.set_tactic(t)
        plugin.enqueue(in4, outs_desc, ptrs, outs, 0, 11)
        plugin.enqueue(in4, outs_desc, ptrs, outs, 0, 11)
    launches = [e for e in log if e[0] == "launch"]
    assert [e[2] for e in launches] == [t for t in tactics for _ in range(2)]
    assert all(e[3] == tuple(ptrs) and e[4] == tuple(outs) and e[5] == 11 for e in launches)
    assert [e[2] for e in log if e[0] == "plan"] == tactics

    runtime = creator.create_plugin("pair", plugin.get_fields_to_serialize(), trt.TensorRTPhase.RUNTIME)
    runtime.set_tactic(tc.CHAIN_KERNEL_TACTIC)
    context = runtime.attach_to_context(None)
    log.clear()
    context.on_shape_change(in8, outs_desc)
    context.enqueue(in8, outs_desc, ptrs, outs, 0, 12)
    context.set_tactic(tc.TWO_KERNELS_TACTIC)
    context.enqueue(in8, outs_desc, ptrs, outs, 0, 12)
    assert [e[1:3] for e in log if e[0] == "launch"] == [(tuple(x8), tc.CHAIN_KERNEL_TACTIC), (tuple(x8), tc.TWO_KERNELS_TACTIC)]
    clone = context.clone()
    assert clone.tactic == tc.TWO_KERNELS_TACTIC and clone.plans == {} and clone.plans is not context.plans
