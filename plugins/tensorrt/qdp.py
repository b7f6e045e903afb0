"""Registration of trtfuse's ops with TensorRT's Quickly Deployable Plugins (`tensorrt.plugin`).

Thin by design: every answer comes from plugins/tensorrt/contract.py (tested without TensorRT); this file
only wraps those answers in `trtp` objects. The decorated functions are generated from
plugins/op_schema.py, so the plugin's declared inputs and attributes are the rewrite's, by
construction: parameter names and annotations are set from the OpSpec (TensorRT reads a function's
signature to learn the plugin's inputs and attributes).

Written from NVIDIA's samples/python/quickly_deployable_plugins and the TensorRT 10.9+ Python API
reference; it runs only where `import tensorrt` works (docs/tensorrt.md says what was verified).
"""

from __future__ import annotations

import inspect
from typing import List, Tuple, Union

import numpy as np
import numpy.typing as npt

from trtfuse.errors import TrtfuseError
from trtfuse.plugins.tensorrt import contract as tc
from trtfuse.plugins.op_schema import FUSED_CONV, FUSED_CONV_ADD, OpSpec

MIN_TENSORRT = (10, 9)
_registered: set[str] = set()  # plugin ids registered in this process
_failed: dict[str, str] = {}  # plugin id -> why its registration stopped half done


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def import_tensorrt():
    """tensorrt and tensorrt.plugin, or a one-line TrtfuseError saying what is missing."""
    try:
        import tensorrt as trt
    except Exception as exc:
        raise TrtfuseError(f"TensorRT is not installed or cannot load ({type(exc).__name__}): "
                           "install TensorRT >= 10.9 (pip install 'trtfuse[trt]') on a machine with its libraries") from None
    try:
        version = tuple(int(p) for p in trt.__version__.split(".")[:2])
    except (AttributeError, ValueError):
        raise TrtfuseError(f"cannot read TensorRT's version from {getattr(trt, '__file__', 'tensorrt')}") from None
    if version < MIN_TENSORRT:
        raise TrtfuseError(f"TensorRT {trt.__version__} is too old: trtfuse's plugins need >= 10.9 (aot_impl)")
    try:
        import tensorrt.plugin as trtp
    except Exception as exc:
        raise TrtfuseError(f"TensorRT {trt.__version__} has no usable tensorrt.plugin ({_first_line(exc)}): "
                           "build with --plugins v3, or install the full TensorRT >= 10.9") from None
    return trt, trtp


def _plugin_function(name: str, params: list[inspect.Parameter], body, return_annotation=inspect.Signature.empty):
    """A function whose signature is `params` (TensorRT reads it to learn the plugin's inputs and attributes),
    callable positionally or by keyword as TensorRT does (`register_function(*input_descs, **attrs)`), that
    hands `body` the arguments by name."""
    signature = inspect.Signature(params, return_annotation=return_annotation)

    def fn(*args, **kwargs):
        return body(signature.bind(*args, **kwargs).arguments)

    fn.__name__ = fn.__qualname__ = name
    fn.__signature__ = signature
    fn.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not inspect.Parameter.empty}
    if return_annotation is not inspect.Signature.empty:
        fn.__annotations__["return"] = return_annotation
    return fn


# Every attribute, INT and INTS alike, is declared an int32 array. TensorRT's ONNX parser passes an INT attribute
# as a one-element int32 field; `create_plugin` of TensorRT 10.9-11.1 turns an `int`-annotated field into
# `int(f.data)`, which NumPy >= 2.4 refuses for a one-element array (11.4 reads `f.data[0]`), while an array
# annotation is read as `f.data.astype(int32)` by every version. ConvAttrs.from_dict takes the arrays.
ATTRIBUTE_ANNOTATION = npt.NDArray[np.int32]


def _attr_params(spec: OpSpec) -> list[inspect.Parameter]:
    return [inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ATTRIBUTE_ANNOTATION)
            for a in spec.attributes]


def _attrs(spec: OpSpec, args: dict) -> tc.ConvAttrs:
    return tc.ConvAttrs.from_dict({name: args[name] for name in spec.attribute_names})


def _tensors(spec: OpSpec, args: dict) -> list:
    """The op's input tensors (descriptors or device tensors) in node-input order, from the arguments TensorRT
    passed by name: what OpSpec.bind and ConvLaunch.launch_op take."""
    return [args[name] for name in spec.input_names]


def _x_shape(spec: OpSpec, args: dict) -> tuple:
    """[N, C, H, W] of the activation input as shape expressions: never int(), which placeholders refuse."""
    x = spec.bind(_tensors(spec, args))["x"]
    return tuple(x.shape_expr[i] for i in range(4))


def _register_conv(spec: OpSpec, trt, trtp) -> None:
    name = tc.qualified_name(spec)
    P = inspect.Parameter
    tensor_params = [P(t.name, P.POSITIONAL_OR_KEYWORD, annotation=trtp.TensorDesc) for t in spec.inputs]
    attr_params = _attr_params(spec)
    outputs_param = P("outputs", P.POSITIONAL_OR_KEYWORD, annotation=Tuple[trtp.TensorDesc])
    tactic_param = P("tactic", P.POSITIONAL_OR_KEYWORD, annotation=int)

    def register(args):
        shape = tc.output_shape(_x_shape(spec, args), _attrs(spec, args))
        return trtp.from_shape_expr(shape, dtype=trt.int8)

    def autotune(args):
        return [trtp.AutoTuneCombination(c.types, c.formats, list(c.tactics)) for c in tc.autotune(spec, _attrs(spec, args))]

    def aot_impl(args):
        tactic = int(args["tactic"])
        launch = tc.aot_launch(spec, _attrs(spec, args), _x_shape(spec, args), tactic, cdiv=trtp.cdiv)
        params = trtp.KernelLaunchParams()
        params.grid_x = launch.grid_x
        params.block_x = launch.block_x
        params.shared_mem = launch.shared_mem
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(v) for v in launch.extra_args])
        return launch.entry, tc.aot_ptx(tactic, aot_arch()), params, extra

    def impl(args):
        # JIT path (a node with aot=0, for debugging): the same kernel through plugins/conv.py on TensorRT's stream.
        from trtfuse.plugins.conv import ConvLaunch
        from trtfuse.plugins.tactics import ConvShape

        attrs = _attrs(spec, args)
        tensors = _tensors(spec, args)
        ptr = lambda t: t.__cuda_array_interface__["data"][0]
        n, c, h, w = (int(d) for d in spec.bind(tensors)["x"].shape)
        shape = ConvShape(n, attrs.in_channels, h, w, attrs.out_channels, *attrs.kernel_shape, attrs.strides, attrs.pads,
                          residual=spec.adds_residual)
        plan = ConvLaunch.plan(shape, int(args["tactic"]))
        plan.launch_op(spec, [ptr(t) for t in tensors], ptr(args["outputs"][0]), relu=bool(attrs.relu), stream=args["stream"])

    aot_return = Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymIntExprs]
    trtp.register(name)(_plugin_function(f"{spec.name}_register", tensor_params + attr_params, register, trtp.TensorDesc))
    trtp.autotune(name)(_plugin_function(f"{spec.name}_autotune", tensor_params + attr_params + [outputs_param], autotune,
                                         List[trtp.AutoTuneCombination]))
    trtp.aot_impl(name)(_plugin_function(f"{spec.name}_aot_impl", tensor_params + attr_params + [outputs_param, tactic_param],
                                         aot_impl, aot_return))
    jit_tensors = [P(t.name, P.POSITIONAL_OR_KEYWORD, annotation=trtp.Tensor) for t in spec.inputs]
    trtp.impl(name)(_plugin_function(f"{spec.name}_impl", jit_tensors + attr_params + [
        P("outputs", P.POSITIONAL_OR_KEYWORD, annotation=Tuple[trtp.Tensor]),
        P("stream", P.POSITIONAL_OR_KEYWORD, annotation=int), tactic_param], impl))


def aot_arch() -> str:
    """The architecture the AOT PTX targets: the build machine's GPU (TensorRT builds an engine for the GPU it
    runs on), or sm_80 without one (PTX for sm_80 JIT-compiles on every later GPU)."""
    try:
        from trtfuse.plugins.cuda_driver import compute_capability, gpu_available

        if gpu_available()[0]:
            return compute_capability()
    except Exception:
        pass
    return "sm_80"


def register_all() -> None:
    """Register every trtfuse plugin with TensorRT (idempotent). Call before parsing a rewritten ONNX.

    NVIDIA's decorators validate each function as it is registered; should one refuse, the error is one line
    naming the plugin, and a later call says that this process cannot register it again (TensorRT keeps the
    half-made definition)."""
    trt, trtp = import_tensorrt()
    for spec in (FUSED_CONV, FUSED_CONV_ADD):
        name = tc.qualified_name(spec)
        if name in _registered:
            continue
        if name in _failed:
            raise TrtfuseError(f"{name} cannot be registered again in this process (the first attempt failed: "
                               f"{_failed[name]})")
        try:
            _register_conv(spec, trt, trtp)
        except Exception as exc:
            _failed[name] = _first_line(exc)
            raise TrtfuseError(f"TensorRT {trt.__version__}'s tensorrt.plugin refused {name}: {_failed[name]}") from None
        _registered.add(name)
