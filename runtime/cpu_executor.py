"""Run rewritten models (standard ONNX + trtfuse plugin nodes) on the CPU.

Plugin nodes (FusedConv, FusedConvAdd, and FusedConvAddConv as those two in turn; domain "trtfuse") always run
through the golden reference trtfuse.plugins.reference.fused_conv_int8, on logical NCHW int8 tensors. Two engines run the rest:

  * "ort" (default): the topologically sorted graph is cut into maximal runs of standard nodes;
    each run becomes one onnxruntime session (built once, reused), and plugin nodes run in numpy
    between them. onnxruntime's Conv / MaxPool / Gemm are orders of magnitude faster than the
    reference evaluator's numpy kernels, which matters for the fp32 parts at 224x224.
  * "reference": onnx.reference.ReferenceEvaluator with custom OpRun classes for the plugin ops:
    the ONNX project's executable specification, no compiled code, slow. Used to cross-check "ort".

docs/passes.md records the measured times of both on ResNet-50.
"""

from __future__ import annotations

import numpy as np

from trtfuse.errors import TrtfuseError
from trtfuse.plugins.op_schema import (DOMAIN, FUSED_CONV, FUSED_CONV_ADD, FUSED_CONV_ADD_CONV, OPS, chain_attributes,
                                       chain_inputs, op_for_node)
from trtfuse.plugins.reference import fused_conv_int8

ENGINES = ("ort", "reference")


def _attributes(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def run_plugin(op_type: str, inputs: list, attrs: dict) -> tuple[np.ndarray, ...]:
    """Execute one plugin node: inputs in op_schema order, attributes as on the node; its outputs in op_schema order."""
    spec = OPS[op_type]
    if len(inputs) != len(spec.inputs):
        raise TrtfuseError(f"{op_type} takes {len(spec.inputs)} inputs, node has {len(inputs)}")
    for value, tspec in zip(inputs, spec.inputs):
        if np.asarray(value).dtype != np.dtype(tspec.dtype):
            raise TrtfuseError(f"{op_type} input {tspec.name!r} must be {tspec.dtype}, got {np.asarray(value).dtype}")
    if spec is FUSED_CONV_ADD_CONV:  # its two convs in turn: the chain kernel is bit-identical to them
        first_attrs, second_attrs = chain_attributes(attrs)
        (y,) = run_plugin(FUSED_CONV_ADD.name, chain_inputs(inputs, None)[0], first_attrs)
        return y, run_plugin(FUSED_CONV.name, chain_inputs(inputs, y)[1], second_attrs)[0]
    named = spec.bind(inputs)
    return (fused_conv_int8(
        named["x"], named["weight"], named["scale"], named["bias"], named["out_scale"],
        named.get("residual"), named.get("residual_scale"),
        in_channels=int(attrs["in_channels"]), out_channels=int(attrs["out_channels"]),
        kernel_shape=list(attrs["kernel_shape"]), strides=list(attrs["strides"]), pads=list(attrs["pads"]),
        relu=int(attrs["relu"]),
    ),)


def _per_tensor(scale, zero_point) -> tuple[np.float32, int, np.dtype]:
    scale = np.asarray(scale)
    if scale.size != 1:
        raise TrtfuseError("the CPU reference engine supports per-tensor (De)QuantizeLinear only")
    zp = np.zeros((), np.uint8) if zero_point is None else np.asarray(zero_point)
    return np.float32(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]), zp.dtype


def _quantize_per_tensor(self, x, y_scale, y_zero_point=None, **_):
    scale, zp, dtype = _per_tensor(y_scale, y_zero_point)
    info = np.iinfo(dtype)
    q = np.rint(np.asarray(x, np.float32) / scale) + zp  # np.rint: round half to even, like the spec
    return (np.clip(q, info.min, info.max).astype(dtype),)


def _dequantize_per_tensor(self, x, x_scale, x_zero_point=None, **_):
    scale, zp, _dtype = _per_tensor(x_scale, x_zero_point)
    # the output has the scale's type (float16 in a float16 Q/DQ model), computed in float32 like onnxruntime
    y = (np.asarray(x).astype(np.int32) - zp).astype(np.float32) * scale
    return (y.astype(np.float16 if np.asarray(x_scale).dtype == np.float16 else np.float32),)


def _reference_op_classes():
    from onnx.reference.op_run import OpRun

    classes = []
    for spec in OPS.values():
        def _run(self, *inputs, _op=spec.name, **attrs):
            return run_plugin(_op, list(inputs), {a: getattr(self, a) for a in OPS[_op].attribute_names})

        classes.append(type(spec.name, (OpRun,), {"op_domain": DOMAIN, "_run": _run}))
    # onnx's reference ops implement (De)QuantizeLinear from opset 19 only; the rewrite emits them at
    # opset 13/17 with per-tensor scales, whose semantics never changed: these two cover exactly that
    # (and a float16 model's opset-19 float16 scales).
    classes.append(type("QuantizeLinear", (OpRun,), {"op_domain": "", "_run": _quantize_per_tensor}))
    classes.append(type("DequantizeLinear", (OpRun,), {"op_domain": "", "_run": _dequantize_per_tensor}))
    return classes


def _is_plugin(node) -> bool:
    return op_for_node(node.op_type, node.domain) is not None and node.domain not in ("", "ai.onnx")


class CpuExecutor:
    """`CpuExecutor(model).run({input_name: array})` -> {output_name: array}."""

    def __init__(self, model, engine: str = "ort", extra_outputs=()):
        if engine not in ENGINES:
            raise TrtfuseError(f"unknown CPU engine {engine!r}: choose one of {', '.join(ENGINES)}")
        self.model = model
        self.engine = engine
        # graph outputs, then any intermediate tensors the caller wants to see (e.g. per-layer comparisons)
        self.output_names = list(dict.fromkeys([o.name for o in model.graph.output] + list(extra_outputs)))
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self._input_dims = {
            i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input if i.name not in inits and i.type.tensor_type.HasField("shape")
        }
        if engine == "reference":
            from onnx.reference import ReferenceEvaluator

            self._evaluator = ReferenceEvaluator(model, new_ops=_reference_op_classes())
        else:
            self._build_segments()

    # -- ort engine ---------------------------------------------------------------------------------
    def _build_segments(self) -> None:
        import onnx
        from onnx import numpy_helper

        graph = self.model.graph
        self._initializers = {i.name: i for i in graph.initializer}
        self._constants = {}  # plugin-node initializers as numpy, decoded once
        try:
            typed = onnx.shape_inference.infer_shapes(self.model)
        except Exception:
            typed = self.model
        self._types = {}
        for vi in list(typed.graph.value_info) + list(typed.graph.input) + list(typed.graph.output):
            if vi.type.tensor_type.elem_type:
                self._types[vi.name] = vi.type.tensor_type.elem_type
        for node in graph.node:  # plugin outputs: int8 by schema even where inference stops
            if _is_plugin(node):
                self._types.update((name, onnx.TensorProto.INT8) for name in node.output)
        nodes = list(graph.node)
        steps: list = []
        run: list = []
        for node in nodes:
            if _is_plugin(node):
                if run:
                    steps.append(("ort", run))
                    run = []
                steps.append(("plugin", node))
                for name in node.input:
                    if name in self._initializers and name not in self._constants:
                        self._constants[name] = numpy_helper.to_array(self._initializers[name])
            else:
                run.append(node)
        if run:
            steps.append(("ort", run))
        # Which tensors each later step (or the graph output) still needs, to pick segment outputs.
        needed_after = [set(self.output_names)]
        for kind, item in reversed(steps):
            later = set(needed_after[-1])
            for n in item if kind == "ort" else [item]:
                later.update(i for i in n.input if i)
            needed_after.append(later)
        needed_after = list(reversed(needed_after))[1:]
        self._steps = []
        for (kind, item), after in zip(steps, needed_after):
            if kind == "plugin":
                self._steps.append(("plugin", item, _attributes(item)))
            else:
                self._steps.append(("ort", self._segment_session(item, after), None))

    def _segment_session(self, nodes, needed_after):
        import onnx
        import onnxruntime as ort

        produced = [o for n in nodes for o in n.output if o]
        produced_set = set(produced)
        inputs, inits = [], []
        for n in nodes:
            for name in n.input:
                if not name or name in produced_set or name in inputs or any(i.name == name for i in inits):
                    continue
                if name in self._initializers:
                    inits.append(self._initializers[name])
                else:
                    inputs.append(name)
        outputs = [o for o in produced if o in needed_after]

        def vi(name):
            return onnx.helper.make_tensor_value_info(name, self._types.get(name, onnx.TensorProto.FLOAT), None)

        g = onnx.helper.make_graph(nodes, "segment", [vi(i) for i in inputs], [vi(o) for o in outputs], inits)
        opsets = [o for o in self.model.opset_import if o.domain in ("", "ai.onnx", "ai.onnx.ml")]
        m = onnx.helper.make_model(g, opset_imports=opsets)
        m.ir_version = self.model.ir_version
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess, inputs, outputs

    def _run_segments(self, feeds: dict) -> dict:
        values = dict(feeds)
        for kind, item, attrs in self._steps:
            if kind == "plugin":
                args = [self._constants[n] if n in self._constants else values[n] for n in item.input]
                values.update(zip(item.output, run_plugin(item.op_type, args, attrs)))
            else:
                sess, inputs, outputs = item
                if outputs:
                    values.update(zip(outputs, sess.run(outputs, {n: values[n] for n in inputs})))
        return {name: values[name] for name in self.output_names}

    # -- public ---------------------------------------------------------------------------------------
    def run(self, feeds: dict) -> dict:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise TrtfuseError(f"missing model input {missing[0]!r}")
        for name, dims in self._input_dims.items():
            shape = np.shape(feeds[name])
            if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape)):
                want = ["?" if d is None else d for d in dims]
                raise TrtfuseError(f"input {name!r} has shape {list(shape)}, the model expects {want}")
        if self.engine == "reference":
            outs = self._evaluator.run(self.output_names, feeds)
            return dict(zip(self.output_names, outs))
        return self._run_segments(feeds)


_EXECUTORS: dict = {}


def run_model(model, feeds: dict, output_names: list) -> list:
    """Executor-style entry (trtfuse.calib): run `model`, return `output_names` (graph outputs or any
    intermediate tensor). The executor for (model, names) is built once and reused."""
    key = (id(model), tuple(output_names))
    entry = _EXECUTORS.get(key)
    if entry is None or entry[0] is not model:  # id() may be reused after the model is freed
        if len(_EXECUTORS) > 8:
            _EXECUTORS.clear()
        entry = _EXECUTORS[key] = (model, CpuExecutor(model, extra_outputs=output_names))
    values = entry[1].run(feeds)
    return [values[name] for name in output_names]
