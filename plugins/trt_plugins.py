"""Registration of trtfuse's ops with TensorRT's Quickly Deployable Plugins (`tensorrt.plugin`).

Thin by design: every answer comes from plugins/trt_contract.py (tested without TensorRT); this file
only wraps those answers in `trtp` objects. The decorated functions are generated from
plugins/op_schema.py, so the plugin's declared inputs and attributes are the rewrite's, by
construction: parameter names and annotations are set from the OpSpec (TensorRT reads a function's
signature to learn the plugin's inputs and attributes).

Written from NVIDIA's samples/python/quickly_deployable_plugins and the TensorRT 10.9+ Python API
reference; it runs only where `import tensorrt` works (docs/tensorrt.md says what was verified).
"""

from __future__ import annotations

import inspect
from typing import Tuple

import numpy as np

from ..errors import TrtfuseError
from . import trt_contract as tc
from .op_schema import FUSED_CONV, FUSED_CONV_ADD, OpSpec

MIN_TENSORRT = (10, 9)
_registered = False


def import_tensorrt():
    """tensorrt and tensorrt.plugin, or a one-line TrtfuseError saying what is missing."""
    try:
        import tensorrt as trt
    except Exception as exc:
        raise TrtfuseError(f"TensorRT is not installed or cannot load ({type(exc).__name__}): "
                           "install TensorRT >= 10.9 (pip install 'trtfuse[trt]') on a machine with its libraries") from None
    version = tuple(int(p) for p in trt.__version__.split(".")[:2])
    if version < MIN_TENSORRT:
        raise TrtfuseError(f"TensorRT {trt.__version__} is too old: trtfuse's plugins need >= 10.9 (aot_impl)")
    import tensorrt.plugin as trtp

    return trt, trtp


def _with_signature(fn, params: list[inspect.Parameter], return_annotation=inspect.Signature.empty):
    fn.__signature__ = inspect.Signature(params, return_annotation=return_annotation)
    fn.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not inspect.Parameter.empty}
    return fn


def _attr_params(spec: OpSpec) -> list[inspect.Parameter]:
    import numpy.typing as npt

    ann = {"INT": int, "INTS": npt.NDArray[np.int32]}
    return [inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ann[a.kind]) for a in spec.attributes]


def _attrs(spec: OpSpec, values) -> tc.ConvAttrs:
    return tc.ConvAttrs.from_dict(dict(zip(spec.attribute_names, values)))


def _register_conv(spec: OpSpec, trt, trtp) -> None:
    name = tc.qualified_name(spec)
    P = inspect.Parameter
    tensor_params = [P(t.name, P.POSITIONAL_OR_KEYWORD, annotation=trtp.TensorDesc) for t in spec.inputs]
    n_in, n_attr = len(spec.inputs), len(spec.attributes)

    def register_fn(*args):
        x = args[0]
        attrs = _attrs(spec, args[n_in:n_in + n_attr])
        n, k, oh, ow = tc.output_shape((x.shape_expr[0], attrs.in_channels, x.shape_expr[2], x.shape_expr[3]), attrs)
        return trtp.from_shape_expr((n, k, oh, ow), dtype=trt.int8)

    def autotune_fn(*args):
        attrs = _attrs(spec, args[n_in:n_in + n_attr])
        return [trtp.AutoTuneCombination(c.types, c.formats, list(c.tactics)) for c in tc.autotune(spec, attrs)]

    def aot_impl_fn(*args):
        x = args[0]
        attrs = _attrs(spec, args[n_in:n_in + n_attr])
        tactic = args[-1]
        launch = tc.aot_launch(spec, attrs, (x.shape_expr[0], attrs.in_channels, x.shape_expr[2], x.shape_expr[3]),
                               tactic, cdiv=trtp.cdiv)
        params = trtp.KernelLaunchParams()
        params.grid_x = launch.grid_x
        params.block_x = launch.block_x
        params.shared_mem = launch.shared_mem
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(v) for v in launch.extra_args])
        return launch.entry.encode(), tc.aot_ptx(tactic, _device_arch()), params, extra

    def impl_fn(*args):
        # JIT path (debugging): the same kernel through plugins/conv.py on TensorRT's stream.
        from .conv import ConvLaunch
        from .tactics import ConvShape

        inputs = args[:n_in]
        attrs = _attrs(spec, args[n_in:n_in + n_attr])
        outputs, stream, tactic = args[n_in + n_attr], args[n_in + n_attr + 1], args[n_in + n_attr + 2]
        ptr = lambda t: t.__cuda_array_interface__["data"][0]
        n, c, h, w = inputs[0].shape
        shape = ConvShape(int(n), attrs.in_channels, int(h), int(w), attrs.out_channels, *attrs.kernel_shape,
                          attrs.strides, attrs.pads)
        plan = ConvLaunch.plan(shape, tactic)
        plan.launch(*(ptr(t) for t in inputs[:5]), ptr(outputs[0]),
                    residual=ptr(inputs[5]) if n_in > 5 else 0, residual_scale=ptr(inputs[6]) if n_in > 5 else 0,
                    relu=bool(attrs.relu), stream=stream)

    attr_params = _attr_params(spec)
    outputs_param = P("outputs", P.POSITIONAL_OR_KEYWORD, annotation=Tuple[trtp.TensorDesc])
    trtp.register(name)(_with_signature(register_fn, tensor_params + attr_params, trtp.TensorDesc))
    trtp.autotune(name)(_with_signature(autotune_fn, tensor_params + attr_params + [outputs_param]))
    trtp.aot_impl(name)(_with_signature(aot_impl_fn, tensor_params + attr_params + [outputs_param, P("tactic", P.POSITIONAL_OR_KEYWORD, annotation=int)]))
    jit_tensors = [P(t.name, P.POSITIONAL_OR_KEYWORD, annotation=trtp.Tensor) for t in spec.inputs]
    trtp.impl(name)(_with_signature(impl_fn, jit_tensors + attr_params + [
        P("outputs", P.POSITIONAL_OR_KEYWORD, annotation=Tuple[trtp.Tensor]),
        P("stream", P.POSITIONAL_OR_KEYWORD, annotation=int), P("tactic", P.POSITIONAL_OR_KEYWORD, annotation=int)]))


def _device_arch() -> str:
    try:
        from .cuda_driver import compute_capability

        return compute_capability()
    except Exception:
        return "sm_80"  # PTX for sm_80 JIT-compiles on every later GPU


def register_all() -> None:
    """Register every trtfuse plugin with TensorRT (idempotent). Call before parsing a rewritten ONNX."""
    global _registered
    if _registered:
        return
    trt, trtp = import_tensorrt()
    for spec in (FUSED_CONV, FUSED_CONV_ADD):
        _register_conv(spec, trt, trtp)
    _registered = True
