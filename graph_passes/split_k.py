"""Split-K: a MatMul or Gemm with a long K becomes S smaller GEMMs run as one batched MatMul + ReduceSum.

Pattern (seed 001): `Y = A @ B` with A [.., M, K] and B [.., K, N] (MatMul, any batch dims on either side,
B constant or computed), or `Y = alpha * A' @ B' + beta * C` (Gemm, transA/transB, C of any shape that
broadcasts to [M, N]). The rewrite, with K0 = K_pad / S:

    A [.., M, K] --Pad K--> [.., M, K_pad] --Reshape--> [.., M, S, K0] --Transpose--> [.., S, M, K0]
    B [.., K, N] --Pad K--> [.., K_pad, N] --Reshape--> [.., S, K0, N]
    MatMul -> [.., S, M, N] --ReduceSum(axis -3, keepdims 0)--> [.., M, N] (--Mul alpha) (--Add beta*C)

* alpha and the bias are applied once, after the reduction, never once per split.
* transA: A [K, M] is reshaped to [S, K0, M] and transposed to [S, M, K0] (one Transpose either way).
  transB: B [N, K] -> [N, S, K0] -> Transpose -> [S, K0, N]; a constant B is transposed, padded and
  reshaped here, once, into a new initializer, so constant weights cost nothing at run time.
* With a static M == 1 the transpose only moves a size-1 axis: A is reshaped straight to [.., S, 1, K0].
* K not divisible by S: K is zero-padded to K_pad = ceil(K / S) * S on both operands (a Pad node for a
  computed tensor, a pre-padded initializer for a constant B). Zeros add nothing to the sums, the
  padding is under S elements per row, and every split stays one slice of one batched MatMul; an uneven
  last split would need a second MatMul and a Concat.
* ReduceSum takes its axes as an input from opset 13 and as an attribute before; both are emitted.

emit="plugin" replaces the node by one `trtfuse::SplitKGemm` node instead (plugins/op_schema.py): the
hook for a split-K GEMM kernel with an in-kernel reduction and the bias fused. Executing such a model
needs that kernel (not part of this pass).

Rejected (left untouched; the report says why): a node outside the default domain, a 1-D operand, a K
that is not a static number, a non-float dtype, a model below opset 11 (Pad's pads input), forced splits
with K < 2 * S, for `auto` anything the cost model (cost_model.py) declines or cannot judge because
M, N or the batch dims are not static, and for `measure` what the timings (or, without a GPU, the cost
model) decline (split_k_measure.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from trtfuse.errors import TrtfuseError
from trtfuse.plugins.op_schema import DOMAIN, NAMESPACE, OPSET_VERSION, SPLIT_K_GEMM

from .cost_model import DeviceParams, GemmProblem, decide, device_params, padded_k

SplitMode = Union[str, int]  # "auto", "measure", "off" or a forced split count >= 2
FLOAT_DTYPES = {"float32", "float16", "bfloat16", "float64"}
MIN_OPSET = 11


def parse_split_mode(value: str | int) -> SplitMode:
    """`--split-k` value: 'auto', 'measure', 'off', or an integer split count >= 2."""
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    else:
        text = str(value).strip().lower()
        if text in ("auto", "measure", "off"):
            return text
        try:
            count = int(text)
        except ValueError:
            raise TrtfuseError(f"--split-k takes auto, measure, off or a split count >= 2, not '{value}'") from None
    if count < 2:
        raise TrtfuseError(f"--split-k needs a split count >= 2 (got {count}); use 'off' to disable")
    return count


@dataclass(frozen=True)
class NodeReport:
    node: str
    op_type: str
    shapes: str  # "[M, K] x [K, N]" as the model states them
    splits: int  # 0 when left untouched
    action: str  # "rewrite", "plugin" or "skip"
    reason: str


@dataclass
class SplitKResult:
    model: "object"  # onnx.ModelProto
    nodes: list[NodeReport] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return sum(r.action != "skip" for r in self.nodes)


class _Skip(Exception):
    """This node is left as it is, for the reason given."""


@dataclass
class _Gemm:
    """A MatMul or Gemm node with what the rewrite needs to know about it."""

    node: object
    a: object
    b: object
    c: object | None
    a_shape: list
    b_shape: list
    k: int
    dtype: np.dtype
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 1.0

    @property
    def is_gemm(self) -> bool:
        return self.node.op == "Gemm"

    @property
    def m(self):
        return self.a_shape[-1] if self.trans_a else self.a_shape[-2]

    @property
    def n(self):
        return self.b_shape[-2] if self.trans_b else self.b_shape[-1]

    @property
    def b_constant(self) -> bool:
        import onnx_graphsurgeon as gs

        return isinstance(self.b, gs.Constant)

    def describe_shapes(self) -> str:
        def fmt(shape):
            return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"

        return f"{fmt(self.a_shape)} x {fmt(self.b_shape)}"

    def problem(self) -> GemmProblem:
        """The cost model's view; raises _Skip when a dimension it needs is not static."""
        batch_a, batch_b = self.a_shape[:-2], self.b_shape[:-2]
        dims = {"M": self.m, "N": self.n, **{f"batch dim {i}": d for i, d in enumerate(batch_a + batch_b)}}
        dynamic = [name for name, d in dims.items() if not isinstance(d, int)]
        if dynamic:
            raise _Skip(f"auto needs static shapes ({', '.join(dynamic)} dynamic): fix them or force a split count")
        m, batch = self.m, 1
        if len(self.b_shape) == 2:
            m *= math.prod(batch_a)  # a 2-D B makes one GEMM over all of A's rows
        else:
            batch = math.prod(np.broadcast_shapes(tuple(batch_a), tuple(batch_b)))
        has_bias = self.c is not None and self.beta != 0.0
        return GemmProblem(
            m=m,
            n=self.n,
            k=self.k,
            batch=batch,
            dtype=str(self.dtype),
            a_transposed=self.trans_a,
            b_constant=self.b_constant,
            b_transposed=self.trans_b,
            alpha_scale=self.alpha != 1.0,
            has_bias=has_bias,
        )


def _tensor_types(model) -> dict[str, tuple[int, list]]:
    """name -> (onnx elem_type, dims with ints, dim_param strings or None), after shape inference."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # the checker-level message is enough for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrtfuseError(f"shape inference failed before split-K: {first}") from None
    types: dict[str, tuple[int, list]] = {}
    g = inferred.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        types[vi.name] = (t.elem_type, dims)
    for init in g.initializer:
        types[init.name] = (init.data_type, list(init.dims))
    return types


def _default_opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise TrtfuseError("model imports no default ONNX opset")


def _analyze(node, types) -> _Gemm:
    import onnx

    if node.domain not in ("", "ai.onnx", None):
        raise _Skip(f"op in domain '{node.domain}'")
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if node.op == "Gemm" and len(node.inputs) > 2 and node.inputs[2].name else None
    if a.name not in types or b.name not in types:
        raise _Skip("operand shapes unknown (shape inference found none)")
    elem_type, a_shape = types[a.name]
    b_shape = types[b.name][1]
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    if dtype.name not in FLOAT_DTYPES and str(dtype) != "bfloat16":
        raise _Skip(f"{dtype} GEMM: split-K is rewritten for floating-point types only")
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise _Skip("a 1-D operand (matrix-vector product)")
    g = _Gemm(node, a, b, c, list(a_shape), list(b_shape), 0, dtype)
    if node.op == "Gemm":
        g.trans_a = bool(node.attrs.get("transA", 0))
        g.trans_b = bool(node.attrs.get("transB", 0))
        g.alpha = float(node.attrs.get("alpha", 1.0))
        g.beta = float(node.attrs.get("beta", 1.0))
    k_a = a_shape[-2] if g.trans_a else a_shape[-1]
    k_b = b_shape[-1] if g.trans_b else b_shape[-2]
    k = k_a if isinstance(k_a, int) else k_b
    if not isinstance(k, int) or k <= 0:
        raise _Skip("K is not a static dimension")
    if isinstance(k_a, int) and isinstance(k_b, int) and k_a != k_b:
        raise _Skip(f"operands disagree on K ({k_a} vs {k_b})")
    g.k = k
    return g


class _Emitter:
    """Adds the nodes and constants of one rewrite to the graph, all named after the original node."""

    def __init__(self, graph, base: str, opset: int):
        self.graph, self.base, self.opset, self.count = graph, base, opset, 0

    def _name(self, what: str) -> str:
        self.count += 1
        return f"{self.base}/splitk/{what}_{self.count}"

    def const(self, what: str, values: np.ndarray):
        import onnx_graphsurgeon as gs

        return gs.Constant(self._name(what), np.ascontiguousarray(values))

    def op(self, op_type: str, inputs: list, attrs: dict | None = None, outputs: list | None = None, domain: str | None = None):
        name = self._name(op_type.lower())
        outs = outputs if outputs is not None else [name + "_out"]
        result = self.graph.layer(op=op_type, name=name, inputs=inputs, outputs=outs, attrs=attrs or {})
        if domain is not None:
            self.graph.nodes[-1].domain = domain
        return result[0]

    def ints(self, what: str, values) -> object:
        return self.const(what, np.asarray(values, dtype=np.int64))

    def reshape(self, x, shape):
        return self.op("Reshape", [x, self.ints("shape", shape)])

    def pad_axis(self, x, rank: int, axis: int, amount: int):
        pads = [0] * (2 * rank)
        pads[rank + axis] = amount  # ONNX pads: all begins, then all ends
        return self.op("Pad", [x, self.ints("pads", pads)])

    def reduce_sum(self, x, axis: int, output):
        if self.opset >= 13:
            return self.op("ReduceSum", [x, self.ints("axes", [axis])], {"keepdims": 0}, outputs=[output])
        return self.op("ReduceSum", [x], {"axes": [axis], "keepdims": 0}, outputs=[output])


def _split_a(e: _Emitter, g: _Gemm, splits: int):
    """A -> [.., S, M, K0]."""
    kp = padded_k(g.k, splits)
    k0 = kp // splits
    rank = len(g.a_shape)
    a = g.a
    if kp != g.k:
        a = e.pad_axis(a, rank, rank - 2 if g.trans_a else rank - 1, kp - g.k)
    m_is_one = g.m == 1
    if g.trans_a:  # Gemm: A is [K, M]
        if m_is_one:
            return e.reshape(a, [splits, 1, k0])  # [S, K0, 1] and [S, 1, K0] share one memory order
        return e.op("Transpose", [e.reshape(a, [splits, k0, -1])], {"perm": [0, 2, 1]})
    lead = [0] * (rank - 2)  # Reshape's 0 copies the input dim: dynamic batch dims pass through
    if m_is_one:
        return e.reshape(a, lead + [splits, 1, k0])
    split = e.reshape(a, lead + [0, splits, k0])  # [.., M, S, K0]
    perm = list(range(rank - 2)) + [rank - 1, rank - 2, rank]
    return e.op("Transpose", [split], {"perm": perm})


def _split_b_constant(e: _Emitter, g: _Gemm, splits: int, cache: dict):
    key = (g.b.name, g.trans_b, splits)
    if key not in cache:
        kp = padded_k(g.k, splits)
        w = np.asarray(g.b.values)
        if g.trans_b:
            w = w.T  # Gemm's B is 2-D
        if kp != g.k:
            pad = [(0, 0)] * w.ndim
            pad[-2] = (0, kp - g.k)
            w = np.pad(w, pad)
        w = w.reshape(w.shape[:-2] + (splits, kp // splits, w.shape[-1]))
        cache[key] = e.const("b", w.astype(g.dtype, copy=False))
    return cache[key]


def _split_b(e: _Emitter, g: _Gemm, splits: int, cache: dict):
    """B -> [.., S, K0, N]."""
    if g.b_constant:
        return _split_b_constant(e, g, splits, cache)
    kp = padded_k(g.k, splits)
    k0 = kp // splits
    rank = len(g.b_shape)
    b = g.b
    if kp != g.k:
        b = e.pad_axis(b, rank, rank - 1 if g.trans_b else rank - 2, kp - g.k)
    if g.trans_b:  # Gemm: B is [N, K]
        return e.op("Transpose", [e.reshape(b, [0, splits, k0])], {"perm": [1, 2, 0]})
    return e.reshape(b, [0] * (rank - 2) + [splits, k0, -1])


def _scalar(g: _Gemm, value: float) -> np.ndarray:
    return np.asarray(value, dtype=g.dtype)


def _rewrite(graph, g: _Gemm, splits: int, opset: int, cache: dict) -> None:
    y = g.node.outputs[0]
    g.node.outputs.clear()  # the old node becomes dead and graph.cleanup() drops it
    e = _Emitter(graph, g.node.name or f"{g.node.op}_{y.name}", opset)
    partial = e.op("MatMul", [_split_a(e, g, splits), _split_b(e, g, splits, cache)])
    has_alpha = g.is_gemm and g.alpha != 1.0
    has_bias = g.c is not None and g.beta != 0.0
    out = y if not (has_alpha or has_bias) else e._name("reduced")
    out = e.reduce_sum(partial, -3, out)
    if has_alpha:
        out = e.op("Mul", [out, e.const("alpha", _scalar(g, g.alpha))], outputs=[y if not has_bias else e._name("scaled")])
    if has_bias:
        import onnx_graphsurgeon as gs

        if isinstance(g.c, gs.Constant):
            bias = e.const("bias", (np.asarray(g.c.values) * _scalar(g, g.beta)).astype(g.dtype)) if g.beta != 1.0 else g.c
        else:
            bias = g.c if g.beta == 1.0 else e.op("Mul", [g.c, e.const("beta", _scalar(g, g.beta))])
        e.op("Add", [out, bias], outputs=[y])


def _plugin_operands(g: _Gemm) -> tuple[np.ndarray, np.ndarray]:
    """(b [K, N] with transB applied and alpha folded in, bias [N] = beta * C); _Skip when the op cannot say it."""
    import onnx_graphsurgeon as gs

    if g.dtype != np.float32:
        raise _Skip(f"plugin op {SPLIT_K_GEMM.name} is float32 only (node is {g.dtype})")
    if not g.b_constant or len(g.b_shape) != 2:
        raise _Skip(f"plugin op {SPLIT_K_GEMM.name} needs a constant 2-D B")
    if g.trans_a:
        raise _Skip(f"plugin op {SPLIT_K_GEMM.name} takes A untransposed")
    w = np.asarray(g.b.values, dtype=np.float32)
    w = w.T if g.trans_b else w
    if g.alpha != 1.0:
        w = w * np.float32(g.alpha)
    n = w.shape[1]
    bias = np.zeros(n, dtype=np.float32)
    if g.c is not None and g.beta != 0.0:
        if not isinstance(g.c, gs.Constant):
            raise _Skip(f"plugin op {SPLIT_K_GEMM.name} needs a constant bias")
        c = np.asarray(g.c.values, dtype=np.float32)
        if c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1):
            raise _Skip(f"plugin op {SPLIT_K_GEMM.name} takes a bias per column only (C is {list(c.shape)})")
        bias = np.broadcast_to(c.reshape(-1) * np.float32(g.beta), (n,)).astype(np.float32)
    return np.ascontiguousarray(w), bias


def _emit_plugin(graph, g: _Gemm, splits: int, opset: int) -> None:
    w, bias = _plugin_operands(g)
    y = g.node.outputs[0]
    g.node.outputs.clear()
    e = _Emitter(graph, g.node.name or f"{g.node.op}_{y.name}", opset)
    attrs = {"splits": int(splits), "plugin_namespace": NAMESPACE, "aot": 1}
    inputs = {"a": g.a, "weight": e.const("weight", w), "bias": e.const("bias", bias)}
    e.op(SPLIT_K_GEMM.name, [inputs[name] for name in SPLIT_K_GEMM.input_names], attrs, outputs=[y], domain=DOMAIN)


def split_k(model, splits: SplitMode = "auto", device: str | DeviceParams | None = None, emit: str = "rewrite",
            gpu="detect", measure_cache=None) -> SplitKResult:
    """Return a new model with eligible MatMul/Gemm nodes split along K, and a report per node.

    splits: "off" (nothing changes), "auto" (the cost model picks per node), or a count forced on every
    node with a static K >= 2 * count, or "measure" (time the candidates on the GPU and cache the answer:
    split_k_measure.py; the cost model where there is no GPU). device: cost-model parameters ('h200', 'h100',
    a JSON file). gpu: "detect" (PyTorch's CUDA device, if any), None, or a (device name, timer) pair.
    emit: "rewrite" (standard ONNX ops) or "plugin" (one trtfuse::SplitKGemm node per GEMM).
    The input model is not modified.
    """
    import onnx
    import onnx_graphsurgeon as gs

    mode = parse_split_mode(splits)
    if emit not in ("rewrite", "plugin"):
        raise TrtfuseError(f"split-K emit must be 'rewrite' or 'plugin', not '{emit}'")
    dev = device_params(device)
    out_model = onnx.ModelProto()
    out_model.CopyFrom(model)
    if mode == "off":
        return SplitKResult(out_model, [])
    opset = _default_opset(model)
    types = _tensor_types(out_model)
    if mode == "measure":
        from .split_k_measure import measure_decision, torch_gpu_timer

        gpu = torch_gpu_timer() if gpu == "detect" else gpu
    graph = gs.import_onnx(out_model)
    reports: list[NodeReport] = []
    b_cache: dict = {}
    for node in [n for n in graph.nodes if n.op in ("MatMul", "Gemm")]:
        name = node.name or f"{node.op}({node.outputs[0].name})"
        shapes = ""
        try:
            g = _analyze(node, types)
            shapes = g.describe_shapes()
            if opset < MIN_OPSET:
                raise _Skip(f"opset {opset} < {MIN_OPSET}: Pad takes its pads as an input from opset 11")
            if mode == "auto":
                decision = decide(g.problem(), dev, fused=(emit == "plugin"))
                if not decision.accepted:
                    raise _Skip(decision.reason)
                count, reason = decision.splits, decision.reason
            elif mode == "measure":
                count, reason = measure_decision(g.problem(), dev, gpu, measure_cache)
                if not count:
                    raise _Skip(reason)
            else:
                if g.k < 2 * mode:
                    raise _Skip(f"K={g.k} < 2 x {mode} splits")
                count, reason = mode, f"forced {mode} splits"
            if emit == "plugin":
                _emit_plugin(graph, g, count, opset)
            else:
                _rewrite(graph, g, count, opset, b_cache)
            reports.append(NodeReport(name, node.op, shapes, count, emit, reason))
        except _Skip as skip:
            reports.append(NodeReport(name, node.op, shapes, 0, "skip", str(skip)))
    if not any(r.action != "skip" for r in reports):
        return SplitKResult(out_model, reports)
    graph.cleanup().toposort()
    result = gs.export_onnx(graph)
    result.ir_version = model.ir_version
    del result.metadata_props[:]
    result.metadata_props.extend(model.metadata_props)
    if emit == "plugin" and not any(imp.domain == DOMAIN for imp in result.opset_import):
        result.opset_import.append(onnx.helper.make_opsetid(DOMAIN, OPSET_VERSION))
    return SplitKResult(result, reports)


def add_split_k_arguments(parser) -> None:
    """The split-K options of `trtfuse rewrite`, in one place for whichever command runs the pass."""
    parser.add_argument(
        "--split-k",
        default="off",
        metavar="auto|measure|off|N",
        help="split MatMul/Gemm along K: auto (cost model), measure (time the candidates on this machine's GPU, "
        "cached; the cost model without a GPU), off (default), or N splits on every eligible node",
    )
    parser.add_argument(
        "--split-k-emit",
        choices=("rewrite", "plugin"),
        default="rewrite",
        help="rewrite: standard ONNX ops; plugin: trtfuse::SplitKGemm nodes (need the split-K kernel to run)",
    )
    parser.add_argument(
        "--split-k-params",
        default="h200",
        metavar="DEVICE|JSON",
        help="cost-model parameters for auto: h200 (default), h100, a JSON of DeviceParams or a bench splitk results file",
    )


def split_k_from_args(model, args) -> SplitKResult:
    return split_k(model, args.split_k, device=args.split_k_params, emit=args.split_k_emit)
