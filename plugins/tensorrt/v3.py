"""trtfuse's ops as Python IPluginV3 plugins with IPluginCreatorV3One creators.

How TensorRT calls them (TensorRT's IPluginV3One* API reference and developer guide, "Plugin lifecycle"):
  build: creator.create_plugin(name, fields, BUILD) -> get_capability_interface -> get_output_data_types ->
         get_output_shapes -> supports_format_combination (per position, many times) -> configure_plugin ->
         get_workspace_size -> get_valid_tactics; then, to time each tactic, on the plugin or on a clone():
         [configure_plugin] -> set_tactic(t) -> on_shape_change -> enqueue (repeated) -> ... the next tactic,
         possibly with no on_shape_change in between; finally get_fields_to_serialize for the engine.
  run:   creator.create_plugin(name, serialized fields, RUNTIME) -> set_tactic(chosen) -> attach_to_context
         (a clone per execution context) -> on_shape_change (when input shapes are set) -> enqueue (many times);
         a context may get set_tactic again without a shape change.
`set_tactic` chooses the kernel of the *subsequent* enqueue; `on_shape_change` only says the dims changed.
tests/test_trt_v3.py replays these sequences against the lean runtime's real base classes.

The fallback to plugins/tensorrt/qdp.py (Quickly Deployable Plugins): `tensorrt.plugin` imports the full
`tensorrt` module, so it cannot run on the lean runtime (`tensorrt-lean-cu13`, module `tensorrt_lean`,
or its bindings wheel's `tensorrt_lean_bindings`) nor where the full module lacks it. These classes
subclass whichever module they are given, so the same code registers into the full runtime's registry or
the lean one's (two libraries, two registries).

Written from NVIDIA's samples/python/python_plugin (the IPluginV3OneCore/Build/Runtime pattern) and
onnx-tensorrt's plugin importer (how fields are built from a node's attributes). Every answer comes from
plugins/tensorrt/contract.py and every field from plugins/op_schema.py: no list of attributes lives here.

What the ONNX parser does with a trtfuse node (onnx-tensorrt, onnxOpImporters.cpp `loadFields`): it
walks the creator's `field_names`, in order, and for each one the node carries it passes the attribute,
INT as one int32 (kINT32, length 1), INTS as an int32 array (kINT32, length n); a declared field the node
lacks is skipped with a warning; attributes the creator does not declare (`plugin_namespace`, `aot`) are
not passed. `node_fields` below builds exactly that list, so tests can feed creators what the parser would.
"""

from __future__ import annotations

import functools
import importlib

import numpy as np

from trtfuse.errors import TrtfuseError
from trtfuse.plugins.tensorrt import contract as tc
from trtfuse.plugins.op_schema import (FUSED_CONV, FUSED_CONV_ADD, FUSED_CONV_ADD_CONV, NAMESPACE, OPS, PLUGIN_VERSION,
                                       SPLIT_K_GEMM, OpSpec, chain_inputs)
from trtfuse.plugins.tactics import WGMMA_TACTICS, wgmma_enabled

# Module names to try, best first: the full runtime, then the lean runtime as the `tensorrt-lean-cu13`
# sdist wraps it, then the lean bindings wheel imported directly.
TRT_MODULES = ("tensorrt", "tensorrt_lean", "tensorrt_lean_bindings")
# TensorRT's DataType member for each op_schema dtype (contract speaks QDP strings: "FP32").
_DATA_TYPE = {"int8": "INT8", "float32": "FLOAT"}
_QDP_TYPE_TO_DATA_TYPE = {"INT8": "INT8", "FP32": "FLOAT"}
# Integer field types accepted when parsing: the parser sends INT32; other int widths are read exactly too
# (a field collection written by hand or by another serializer), floats and strings are refused.
_INT_FIELD_TYPES = ("INT8", "INT16", "INT32", "INT64")
# SplitKGemm is declared (op_schema) but its GPU kernel is not written (docs/split_k.md): creating the
# plugin fails at parse time, with this reason, rather than building an engine that cannot run.
NO_KERNEL = {SPLIT_K_GEMM.name: "has no GPU kernel yet (docs/split_k.md): rewrite with `trtfuse split-k --emit rewrite`"}


def import_trt(names=TRT_MODULES):
    """(module, its name): the first TensorRT Python module of `names` that imports, or a TrtfuseError."""
    errors = []
    for name in names:
        try:
            return importlib.import_module(name), name
        except Exception as exc:  # ImportError, or OSError when the module's libraries do not load
            errors.append(f"{name}: {type(exc).__name__}")
    raise TrtfuseError("no TensorRT runtime imports (" + ", ".join(errors) + "): install TensorRT >= 10.9 "
                       "(pip install 'trtfuse[trt]') or the lean runtime (pip install 'trtfuse[lean]')")


# ---- fields: ONNX node -> what the parser passes -> attributes ----

def node_fields(spec: OpSpec, node) -> list[tuple[str, str, np.ndarray]]:
    """(name, PluginFieldType name, data) per field, exactly as TensorRT's ONNX parser builds them from `node`."""
    import onnx

    attrs = {a.name: a for a in node.attribute}
    out = []
    for a in spec.attributes:  # the creator's field order
        if a.name not in attrs:
            continue  # the parser warns and passes nothing; create_plugin then refuses
        proto = attrs[a.name]
        if proto.type == onnx.AttributeProto.INT:
            out.append((a.name, "INT32", np.array([proto.i], np.int32)))
        elif proto.type == onnx.AttributeProto.INTS:
            out.append((a.name, "INT32", np.array(list(proto.ints), np.int32)))
        else:
            raise ValueError(f"{node.name}: attribute {a.name} is {onnx.AttributeProto.AttributeType.Name(proto.type)}, "
                             f"op_schema declares {a.kind}")
    return out


def parse_fields(spec: OpSpec, fields) -> dict:
    """Attributes from (name, type name, data) triples; every declared field must be there, with its kind."""
    got = {}
    for name, type_name, data in fields:
        got[name] = (type_name, np.asarray(data).reshape(-1))
    values = {}
    for a in spec.attributes:
        if a.name not in got:
            raise ValueError(f"{spec.name}: field {a.name!r} is missing (the node must carry every attribute op_schema declares)")
        type_name, data = got[a.name]
        if type_name not in _INT_FIELD_TYPES:
            raise ValueError(f"{spec.name}: field {a.name!r} is {type_name}, an integer field is expected")
        ints = tuple(int(v) for v in data)
        if a.kind == "INT":
            if len(ints) != 1:
                raise ValueError(f"{spec.name}: field {a.name!r} is INT, got {len(ints)} values")
            values[a.name] = ints[0]
        else:
            values[a.name] = ints
    extra = set(got) - set(spec.attribute_names)
    if extra:
        raise ValueError(f"{spec.name}: unknown field(s) {sorted(extra)}")
    return values


def attribute_fields(spec: OpSpec, attrs: dict) -> list[tuple[str, str, np.ndarray]]:
    """What a plugin serializes into the engine: the same triples the parser passed (INT32)."""
    return [(a.name, "INT32", np.array([attrs[a.name]] if a.kind == "INT" else list(attrs[a.name]), np.int32))
            for a in spec.attributes]


def _triples(trt, fc):
    return [(f.name, f.type.name, np.asarray(f.data)) for f in fc]


def _collection(trt, triples):
    return trt.PluginFieldCollection([trt.PluginField(n, d, getattr(trt.PluginFieldType, t)) for n, t, d in triples])


# ---- the plugin's answers, as plain Python (unit-tested) ----

_DETECT = object()


@functools.lru_cache(maxsize=1)
def _detected_device():
    return tc.detect_launch_device()


class _PluginAnswers:
    """What every trtfuse plugin answers alike: x's static dims, the exact (type, format) per position, the tactics it
    runs, its timing-cache id, and enqueue (a plan kept per runtime dims and tactic). Subclasses set spec, attrs,
    attrs_dict, types, formats and runnable, and give plan(dims, tactic) and launch(plan, inputs, outputs, stream)."""

    def static_dims(self, x_dims) -> list[int]:
        """x's C, H, W as ints (only the batch may vary); `x_dims` entries answer is_constant()/get_constant_value()
        (TensorRT's IDimensionExpr)."""
        if len(x_dims) != 4:
            raise ValueError(f"{self.spec.name}: x must be 4-D [N, C, H, W], got {len(x_dims)} dims")
        static = []
        for i in (1, 2, 3):
            if not x_dims[i].is_constant():
                raise ValueError(f"{self.spec.name}: x dim {i} must be static (only the batch may vary)")
            static.append(x_dims[i].get_constant_value())
        return static

    def supports(self, pos: int, type_name: str, format_name: str) -> bool:
        """supports_format_combination for in_out[pos]: exactly contract's type and format."""
        return self.types[pos] == type_name and self.formats[pos] == format_name

    def check_tactic(self, tactic: int) -> int:
        if tactic not in self.runnable:
            raise ValueError(f"{self.spec.name}: tactic {tactic} was not offered (offered {sorted(self.runnable)})")
        return tactic

    def cache_id(self) -> str:
        """Same op and attributes -> same kernel choice for the same shapes and formats: TensorRT shares timings."""
        return f"{self.spec.name}:" + ",".join(f"{k}={self.attrs_dict[k]}" for k in self.spec.attribute_names)

    def output_types(self) -> list[str]:
        return [_DATA_TYPE[t.dtype] for t in self.spec.outputs]

    def runtime_dims(self, x_dims) -> tuple[int, int, int, int]:
        """x's runtime dims as plain ints, its channels checked against the node's in_channels."""
        n, c, h, w = (int(d) for d in x_dims)
        if c != self.attrs.in_channels:
            raise ValueError(f"{self.spec.name}: x has {c} channels, the node says in_channels={self.attrs.in_channels}")
        return n, c, h, w

    def enqueue(self, x_dims, inputs, outputs, tactic: int, stream: int, plans: dict) -> None:
        """Launch on `stream` from device pointers (ints, as TensorRT passes them); no host synchronization.

        A plan is kept per (dims, tactic): TensorRT may change the tactic with no shape change in between (the
        builder times every tactic on one object; `set_tactic` names the tactic "of the subsequent enqueue")."""
        key = (tuple(int(d) for d in x_dims), int(tactic))
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = self.plan(*key)
        self.launch(plan, [int(p) for p in inputs], [int(p) for p in outputs], int(stream))


class ConvPluginLogic(_PluginAnswers):
    """What a FusedConv / FusedConvAdd plugin answers, given its op and attributes; no TensorRT types.

    Its tactics are contract's `launcher_tactics` on the GPU it is created on (`enqueue` launches through
    ConvLaunch, not TensorRT's AOT path): before `configure` the shape-free ones (every mma.sync tactic the device
    runs), after it also the wgmma tactics handling the node at every batch of the profile. Without a GPU, the AOT
    tactics. `set_tactic` accepts any tactic the device runs (at runtime TensorRT sets the one it chose without
    configuring first)."""

    def __init__(self, spec: OpSpec, attrs: dict, device=_DETECT):
        self.spec, self.attrs_dict = spec, dict(attrs)
        self.attrs = tc.ConvAttrs.from_dict(attrs)
        (self.combination,) = tc.autotune(spec, self.attrs)
        self.types = [_QDP_TYPE_TO_DATA_TYPE[t] for t in self.combination.types.split(", ")]
        self.formats = self.combination.formats.split(", ")
        self.device = _detected_device() if device is _DETECT else device
        self.tactics = tc.launcher_tactics(self.attrs, self.device, residual=spec.adds_residual) if self.device else list(self.combination.tactics)
        if not self.tactics:  # every tactic's shared memory exceeds what the device (or TensorRT's AOT path) allows
            limit = self.device.shared_limit if self.device else tc.AOT_SHARED_LIMIT
            raise ValueError(f"{spec.name}: no tactic fits this node (in_channels={self.attrs.in_channels}, "
                             f"kernel {self.attrs.kernel_shape}) under {limit} bytes of shared memory")
        self.runnable = set(self.tactics) | {t.id for t in WGMMA_TACTICS if self.device and wgmma_enabled(self.device.arch)}
        self.timing_cache_id = self.cache_id()

    def configure(self, x_hw: tuple[int, int], batches: tuple[int, int]) -> None:
        """The build's input dims: spatial (static) and the profile's batch range (MIN, MAX)."""
        if self.device:
            self.tactics = tc.launcher_tactics(self.attrs, self.device, x_hw, batches, residual=self.spec.adds_residual)

    def output_dims(self, x_dims, constant) -> list:
        """[N, K, OH, OW] from x's dims: N passed through (it may be symbolic), the rest `constant(int)`.
        `x_dims` entries answer is_constant()/get_constant_value() (TensorRT's IDimensionExpr)."""
        n, k, oh, ow = tc.output_shape((None, *self.static_dims(x_dims)), self.attrs)
        return [x_dims[0], constant(k), constant(oh), constant(ow)]

    def outputs_dims(self, x_dims, constant) -> list[list]:
        """get_output_shapes: every output's dims (one output)."""
        return [self.output_dims(x_dims, constant)]

    def plan(self, x_dims, tactic: int):
        """The ConvLaunch for runtime dims of x (plain ints)."""
        from trtfuse.plugins.conv import ConvLaunch
        from trtfuse.plugins.tactics import ConvShape

        n, c, h, w = self.runtime_dims(x_dims)
        a = self.attrs
        shape = ConvShape(n, c, h, w, a.out_channels, *a.kernel_shape, a.strides, a.pads, residual=self.spec.adds_residual)
        return ConvLaunch.plan(shape, tactic, splits=1)  # splits=1: no workspace (get_workspace_size is 0)

    def launch(self, plan, inputs: list[int], outputs: list[int], stream: int) -> None:
        plan.launch_op(self.spec, inputs, outputs[0], relu=bool(self.attrs.relu), stream=stream)


class ChainPluginLogic(_PluginAnswers):
    """What a FusedConvAddConv plugin answers (graph_passes/chain_pairs.py): two int8 CHW32 outputs, y and next_y.

    Two tactics (contract.chain_tactics): the chain kernel (plugins/chain_conv.py) on an sm_90 GPU whose shared memory
    holds it, offered once configured where it takes the node at every batch of the profile; and the op's two convs as
    two launches through ConvLaunch (each on plugins/tactics.py's choice), on any GPU. Both give the same bits."""

    def __init__(self, spec: OpSpec, attrs: dict, device=_DETECT):
        self.spec, self.attrs_dict = spec, dict(attrs)
        self.attrs = tc.ChainAttrs.from_dict(attrs)
        self.types = [_DATA_TYPE[t.dtype] for t in (*spec.inputs, *spec.outputs)]
        self.formats = tc.input_formats(spec, self.attrs)
        self.device = _detected_device() if device is _DETECT else device
        self.tactics = tc.chain_tactics(self.attrs, self.device)
        # at runtime TensorRT sets the tactic it chose without configuring first
        self.runnable = {tc.TWO_KERNELS_TACTIC, tc.CHAIN_KERNEL_TACTIC}
        self.timing_cache_id = self.cache_id()

    def configure(self, x_hw: tuple[int, int], batches: tuple[int, int]) -> None:
        self.tactics = tc.chain_tactics(self.attrs, self.device, x_hw, batches)

    def outputs_dims(self, x_dims, constant) -> list[list]:
        """[N, out_channels, H, W] and [N, next_out_channels, H, W]: N passed through, the rest `constant(int)`."""
        shapes = tc.chain_output_shapes((None, *self.static_dims(x_dims)), self.attrs)
        return [[x_dims[0], *(constant(d) for d in shape[1:])] for shape in shapes]

    def plan(self, x_dims, tactic: int):
        """A launch(inputs, outputs, stream) for runtime dims of x (plain ints) and `tactic`."""
        from trtfuse.plugins import chain_conv
        from trtfuse.plugins.conv import ConvLaunch

        n, _, h, w = self.runtime_dims(x_dims)
        shapes = self.attrs.shapes(n, h, w)
        relu = (bool(self.attrs.relu), bool(self.attrs.next_relu))
        if tactic == tc.CHAIN_KERNEL_TACTIC:
            why = chain_conv.refusal(*shapes) or chain_conv.device_refusal()
            if why:
                raise ValueError(f"{self.spec.name}: the chain kernel cannot run this node: {why}")

            return lambda inputs, outputs, stream: chain_conv.launch_chain_op(shapes, inputs, *outputs, relu=relu,
                                                                              stream=stream)
        plans = [ConvLaunch.plan(shape, splits=1) for shape in shapes]  # splits=1: no workspace

        def two_kernels(inputs, outputs, stream):
            for plan, op, ins, out, r in zip(plans, (FUSED_CONV_ADD, FUSED_CONV), chain_inputs(inputs, outputs[0]), outputs, relu):
                plan.launch_op(op, ins, out, relu=r, stream=stream)
        return two_kernels

    def launch(self, plan, inputs: list[int], outputs: list[int], stream: int) -> None:
        plan(inputs, outputs, stream)


def plugin_logic(spec: OpSpec, attrs: dict, device=_DETECT):
    """The answers of the plugin of `spec`: ChainPluginLogic for FusedConvAddConv, ConvPluginLogic for the convs."""
    logic = ChainPluginLogic if spec is FUSED_CONV_ADD_CONV else ConvPluginLogic
    return logic(spec, attrs, device)


# ---- the TensorRT classes, built once per TensorRT module ----

_classes: dict[str, tuple] = {}


def _module_key(trt) -> str:
    # `tensorrt_lean` re-exports `tensorrt_lean_bindings`: one extension, one registry, one key.
    return trt.IPluginV3.__module__


def plugin_classes(trt):
    """(ConvPlugin, Creator) subclassing `trt`'s IPluginV3 interfaces (one pair per module)."""
    key = _module_key(trt)
    if key in _classes:
        return _classes[key]

    class ConvPlugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        def __init__(self, spec: OpSpec, attrs: dict, layer_name: str = "", phase=None, device=_DETECT):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.logic = plugin_logic(spec, attrs, device)
            self.plugin_name, self.plugin_namespace, self.plugin_version = spec.name, NAMESPACE, PLUGIN_VERSION
            self.num_outputs = len(spec.outputs)
            self.timing_cache_id = self.logic.timing_cache_id
            self.layer_name, self.phase = layer_name, phase
            self.tactic = self.logic.tactics[0]
            self.plans = {}  # (runtime x dims, tactic) -> ConvLaunch, or a FusedConvAddConv's launch

        # core
        def get_capability_interface(self, capability):
            return self  # one object implements core, build and runtime

        def clone(self):
            other = ConvPlugin(self.logic.spec, self.logic.attrs_dict, self.layer_name, self.phase, self.logic.device)
            other.tactic, other.logic.tactics = self.tactic, list(self.logic.tactics)
            return other

        # build
        def get_output_data_types(self, input_types):
            return [getattr(trt.DataType, t) for t in self.logic.output_types()]

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            x = self.logic.spec.bind(inputs)["x"]
            return [trt.DimsExprs(dims) for dims in self.logic.outputs_dims(x, expr_builder.constant)]

        def supports_format_combination(self, pos, in_out, num_inputs):
            desc = in_out[pos].desc
            return self.logic.supports(pos, desc.type.name, desc.format.name)

        def configure_plugin(self, inp, out):
            # dims[1] is -1 only if the network lost the static channel count: refuse at build time.
            x = self.logic.spec.bind(inp)["x"]
            dims = x.desc.dims
            if dims[1] != self.logic.attrs.in_channels:
                raise ValueError(f"{self.layer_name}: x has {dims[1]} channels, the node says {self.logic.attrs.in_channels}")
            self.logic.configure((dims[2], dims[3]), (x.min[0], x.max[0]))

        def get_valid_tactics(self):
            return list(self.logic.tactics)

        def get_workspace_size(self, input_desc, output_desc):
            return 0  # tactics run unsplit (no split-K workspace)

        # runtime
        def set_tactic(self, tactic):
            self.tactic = self.logic.check_tactic(int(tactic))

        def on_shape_change(self, inp, out):
            self.plans.clear()

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            # Reads dims only: in the lean module a PluginTensorDesc's format cannot be read from Python.
            self.logic.enqueue(list(self.logic.spec.bind(input_desc)["x"].dims), inputs, outputs, self.tactic, stream, self.plans)

        def attach_to_context(self, resource_context):
            return self.clone()

        def get_fields_to_serialize(self):
            return _collection(trt, attribute_fields(self.logic.spec, self.logic.attrs_dict))

    class Creator(trt.IPluginCreatorV3One):
        def __init__(self, spec: OpSpec):
            trt.IPluginCreatorV3One.__init__(self)
            self.spec = spec
            self.name, self.plugin_namespace, self.plugin_version = spec.name, NAMESPACE, PLUGIN_VERSION
            self.field_names = _collection(trt, [(a.name, "INT32", np.array([], np.int32)) for a in spec.attributes])

        def create_plugin(self, name, fc, phase):
            attrs = parse_fields(self.spec, _triples(trt, fc))
            if self.spec.name in NO_KERNEL:
                raise ValueError(f"{NAMESPACE}::{self.spec.name} {NO_KERNEL[self.spec.name]}")
            return ConvPlugin(self.spec, attrs, name, phase)

    _classes[key] = (ConvPlugin, Creator)
    return ConvPlugin, Creator


# Registries keep raw pointers to the Python creators: they must live as long as the process.
_creators: dict[str, list] = {}


def register_creators(trt=None) -> list:
    """Register one creator per op of op_schema into `trt`'s plugin registry (idempotent per module)."""
    if trt is None:
        trt, _ = import_trt()
    key = _module_key(trt)
    if key in _creators:
        return _creators[key]
    _, Creator = plugin_classes(trt)
    registry = trt.get_plugin_registry()
    creators = []
    for spec in OPS.values():
        creator = Creator(spec)
        if not registry.register_creator(creator, NAMESPACE):
            raise TrtfuseError(f"another {NAMESPACE}::{spec.name} v{PLUGIN_VERSION} creator is already registered "
                               f"in {trt.__name__} (tensorrt.plugin's?): register one plugin flavour per process")
        creators.append(creator)
    _creators[key] = creators
    return creators


def fields_from_node(trt, spec: OpSpec, node):
    """The PluginFieldCollection TensorRT's ONNX parser would hand our creator for `node`."""
    return _collection(trt, node_fields(spec, node))

