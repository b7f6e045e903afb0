"""NVIDIA's own `tensorrt.plugin` driving trtfuse's plugin registration, as TensorRT's ONNX parser and builder would.

TensorRT's builder cannot be installed here, but NVIDIA's plugin-side Python can: every TensorRT lean bindings
wheel on PyPI carries the real `tensorrt.plugin` package (Quickly Deployable Plugins) as
`tensorrt_lean_bindings/plugin/`, next to the lean runtime's extension module. This module makes a `tensorrt`
module out of one such wheel and loads NVIDIA's package as `tensorrt.plugin`, so that `import tensorrt.plugin`
in trtfuse's code gets NVIDIA's decorators, validation, creator and plugin classes, unchanged.

Real (from the wheel): the `plugin` package; the extension's PluginField, PluginFieldCollection, plugin registry,
DataType, Dims, DimensionOperation, QuickPluginCreationRequest, TensorRTPhase, Logger and the IPluginV3 /
IPluginV3Quick* / IPluginCreatorV3Quick base classes our plugins become.

Faked, because only the builder makes them (the lean extension either lacks the name or cannot construct it
from Python): TensorFormat and ITensor (absent), IDimensionExpr and IExprBuilder (no constructor: shape
expressions, evaluated here as trees over the input dims), DimsExprs and ISymExpr (hold IDimensionExpr
pointers), PluginTensorDesc and DynamicPluginTensorDesc (their `format` is a TensorFormat), and the objects
the builder passes into `get_launch_params` (launch parameters, the extra-argument setter).

What the parser and builder do is written from onnx-tensorrt (`loadFields`, the quick-plugin branch of the
plugin importer) and TensorRT's plugin documentation; `drive_node` says it step by step.

Run as a script inside an environment holding one lean bindings wheel (tests/test_trt_nvidia.py does that for
each TensorRT version): `python tests/nvidia_trt.py MODEL.onnx ... --json OUT [--gpu]`.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import json
import operator
import sys
import types
from pathlib import Path

import numpy as np

# ---- the `tensorrt` module: a lean bindings wheel plus the builder-only names ----


class TensorFormat(enum.IntEnum):
    """trt.TensorFormat, with TensorRT's member names and values (the lean extension has no TensorFormat)."""

    LINEAR = 0
    CHW2 = 1
    HWC8 = 2
    CHW4 = 3
    CHW16 = 4
    CHW32 = 5
    DHWC8 = 6
    CDHW32 = 7
    HWC = 8
    DLA_LINEAR = 9
    DLA_HWC4 = 10
    HWC16 = 11
    DHWC = 12


class ITensor:
    """trt.ITensor: a network tensor, which only the builder makes (NVIDIA's code uses it in isinstance checks)."""


class DimExpr:
    """trt.IDimensionExpr: a node of a shape expression; leaves are constants or named input dims ("N")."""

    def __init__(self, value=None, symbol=None, op=None, args=()):
        self.value, self.symbol, self.op, self.args = value, symbol, op, tuple(args)

    def is_constant(self) -> bool:
        return self.value is not None

    def get_constant_value(self) -> int:
        if self.value is None:
            raise RuntimeError("IDimensionExpr is not a build-time constant")
        return self.value

    def is_size_tensor(self) -> bool:
        return False

    def evaluate(self, env: dict) -> int:
        if self.value is not None:
            return self.value
        if self.symbol is not None:
            return env[self.symbol]
        return _apply(self.op, *(a.evaluate(env) for a in self.args))

    def __repr__(self):
        if self.value is not None:
            return str(self.value)
        if self.symbol is not None:
            return self.symbol
        return f"{self.op}({', '.join(map(repr, self.args))})"


def _floor_div(a, b):
    if b == 0:
        raise ZeroDivisionError("FLOOR_DIV by zero in a shape expression")
    return a // b


def _ceil_div(a, b):
    if b == 0:
        raise ZeroDivisionError("CEIL_DIV by zero in a shape expression")
    return -(-a // b)


_OPS = {"SUM": operator.add, "PROD": operator.mul, "MAX": max, "MIN": min, "SUB": operator.sub,
        "EQUAL": lambda a, b: int(a == b), "LESS": lambda a, b: int(a < b), "FLOOR_DIV": _floor_div,
        "CEIL_DIV": _ceil_div}


def _apply(op: str, a: int, b: int) -> int:
    return _OPS[op](a, b)


class ExprBuilder:
    """trt.IExprBuilder: constants, and operations that fold when both sides are constants (as TensorRT's do)."""

    def constant(self, value: int) -> DimExpr:
        if not isinstance(value, (int, np.integer)):
            raise TypeError(f"IExprBuilder.constant takes an int, got {type(value).__name__}")
        return DimExpr(value=int(value))

    def operation(self, op, first: DimExpr, second: DimExpr) -> DimExpr:
        for side in (first, second):
            if not isinstance(side, DimExpr):
                raise TypeError(f"IExprBuilder.operation takes IDimensionExprs, got {type(side).__name__}")
        name = op.name
        if first.is_constant() and second.is_constant():
            return DimExpr(value=_apply(name, first.value, second.value))
        return DimExpr(op=name, args=(first, second))


class DimsExprs(list):
    """trt.DimsExprs: `DimsExprs(rank)` or from a list of IDimensionExprs."""

    def __init__(self, arg=0):
        super().__init__([None] * arg if isinstance(arg, int) else list(arg))


class ISymExpr:
    """trt.ISymExpr: NVIDIA's SymExprImpl subclasses it and sets type, dtype and expr."""

    def __init__(self):
        self.type = self.dtype = self.expr = None


def _fake_descs(trt_real):
    class PluginTensorDesc:
        def __init__(self, dims=(), dtype=None, fmt=TensorFormat.LINEAR, scale=-1.0):
            self.dims = trt_real.Dims(tuple(dims))
            self.type = dtype if dtype is not None else trt_real.DataType.FLOAT
            self.format = fmt
            self.scale = scale

    class DynamicPluginTensorDesc:
        def __init__(self, desc, lo, hi, opt=None):
            self.desc = desc
            self.min, self.max = trt_real.Dims(tuple(lo)), trt_real.Dims(tuple(hi))
            self.opt = trt_real.Dims(tuple(opt if opt is not None else hi))

    return PluginTensorDesc, DynamicPluginTensorDesc


FAKED = ("TensorFormat", "ITensor", "IDimensionExpr", "IExprBuilder", "DimsExprs", "ISymExpr", "PluginTensorDesc",
         "DynamicPluginTensorDesc")


def load_tensorrt():
    """(trt, trtp): a `tensorrt` module over the installed lean bindings wheel, and NVIDIA's `tensorrt.plugin`.

    Registered in sys.modules, so trtfuse's `import tensorrt` / `import tensorrt.plugin` get exactly these."""
    if "tensorrt" in sys.modules:
        trt = sys.modules["tensorrt"]
        if not getattr(trt, "_trtfuse_lean_shim", False):
            raise RuntimeError("a real tensorrt module is already imported: this harness is for the lean wheels")
        return trt, importlib.import_module("tensorrt.plugin")
    lean = importlib.import_module("tensorrt_lean_bindings")
    trt = types.ModuleType("tensorrt")
    trt.__dict__.update({k: v for k, v in vars(lean).items() if not k.startswith("__")})
    trt.__version__ = lean.__version__
    trt.__file__ = lean.__file__
    trt.__path__ = list(lean.__path__)  # `import tensorrt.plugin` loads the wheel's plugin/ as tensorrt.plugin
    trt._trtfuse_lean_shim = True
    trt.TensorFormat, trt.ITensor, trt.IDimensionExpr, trt.IExprBuilder = TensorFormat, ITensor, DimExpr, ExprBuilder
    trt.DimsExprs, trt.ISymExpr = DimsExprs, ISymExpr
    trt.PluginTensorDesc, trt.DynamicPluginTensorDesc = _fake_descs(lean)
    sys.modules["tensorrt"] = trt
    trtp = importlib.import_module("tensorrt.plugin")
    return trt, trtp


# ---- what the ONNX parser does with a plugin node (onnx-tensorrt) ----

def parser_fields(trt, creator, node):
    """The PluginFieldCollection onnx-tensorrt's `loadFields` builds for `node`: for each field the creator
    declares (`field_names`, in its order), the node's attribute of that name, skipped when the node lacks it:
    INT -> one int32 (kINT32), INTS -> int32 array (kINT32), FLOAT(S) -> float32 (kFLOAT32), STRING -> its
    bytes with a NUL (kCHAR). Attributes the creator does not declare (plugin_namespace, aot) are not passed.

    Returns the collection and the arrays behind it: a PluginField points into its array without owning it (as
    the parser's fields point into its own storage), so the arrays must outlive the collection's use."""
    import onnx

    attrs = {a.name: a for a in node.attribute}
    fields, storage = [], []
    for declared in creator.field_names:
        a = attrs.get(declared.name)
        if a is None:
            continue
        if a.type == onnx.AttributeProto.INT:
            data, kind = np.array([a.i], np.int32), trt.PluginFieldType.INT32
        elif a.type == onnx.AttributeProto.INTS:
            data, kind = np.array(list(a.ints), np.int32), trt.PluginFieldType.INT32
        elif a.type == onnx.AttributeProto.FLOAT:
            data, kind = np.array([a.f], np.float32), trt.PluginFieldType.FLOAT32
        elif a.type == onnx.AttributeProto.FLOATS:
            data, kind = np.array(list(a.floats), np.float32), trt.PluginFieldType.FLOAT32
        elif a.type == onnx.AttributeProto.STRING:
            data, kind = np.frombuffer(a.s + b"\0", np.int8), trt.PluginFieldType.CHAR
        else:
            raise ValueError(f"{node.name}: attribute {a.name} of type {a.type} cannot be a plugin field")
        fields.append(trt.PluginField(declared.name, data, kind))
        storage.append(data)
    return trt.PluginFieldCollection(fields), storage


def creation_request(trt, node):
    """The parser's QuickPluginCreationRequest: the node's INT attribute `aot` asks strictly for AOT (non-zero)
    or JIT (0); without it, no preference (the network was made without PREFER_AOT/JIT flags)."""
    for a in node.attribute:
        if a.name == "aot":
            return trt.QuickPluginCreationRequest.STRICT_AOT if a.i else trt.QuickPluginCreationRequest.STRICT_JIT
    return trt.QuickPluginCreationRequest.UNKNOWN


def namespace_of(node) -> str:
    for a in node.attribute:
        if a.name == "plugin_namespace":
            return a.s.decode()
    return node.domain


# ---- what the builder does with the plugin ----

class LaunchParamsOut:
    """The builder's KernelLaunchParams that `get_launch_params` fills (each field an ISymExpr)."""

    grid_x = grid_y = grid_z = block_x = block_y = block_z = shared_mem = None


class SymExprSetter:
    """The builder's extra-argument setter: `nbSymExprs`, then one ISymExpr per index."""

    def __init__(self):
        self.nbSymExprs = 0
        self.exprs = {}

    def __setitem__(self, index, value):
        if not 0 <= index < self.nbSymExprs:
            raise IndexError(f"extra argument {index} set, nbSymExprs is {self.nbSymExprs}")
        self.exprs[index] = value


def _data_type(trt, name: str):
    return {"int8": trt.DataType.INT8, "float32": trt.DataType.FLOAT}[name]


def drive_node(trt, node, in_shapes: list, batch_range: tuple[int, int], env: dict) -> dict:
    """One plugin node through NVIDIA's code, in the order TensorRT's parser and builder call it.

    `in_shapes`: the node's input shapes with dim 0 of the activations symbolic ("N" where the network's batch is
    dynamic); `env` gives the symbols' values for evaluating the answers. Returns what TensorRT would have:
    output types and shapes, format combinations, tactics and, per tactic, the kernel's name and PTX, launch
    parameters and extra arguments, all evaluated at `env`."""
    registry = trt.get_plugin_registry()
    namespace = namespace_of(node)
    creator = registry.get_creator(node.op_type, "1", namespace)  # the parser looks plugins up by (op, "1", ns)
    if creator is None:
        raise LookupError(f"no creator for {namespace}::{node.op_type} v1 in the registry")
    fc, storage = parser_fields(trt, creator, node)
    # IPluginCreatorV3Quick::createPlugin takes the plugin's name and namespace (not the layer's name).
    plugin = creator.create_plugin(node.op_type, namespace, fc, trt.TensorRTPhase.BUILD, creation_request(trt, node))
    build = plugin.get_capability_interface(trt.PluginCapabilityType.BUILD)
    record = {"node": node.name, "op": node.op_type, "plugin_kind": type(plugin).__name__}

    # Output types: the builder passes the input types and ranks; shapes are placeholders here.
    in_types = [_data_type(trt, dtype) for dtype, _ in in_shapes]
    out_types = build.get_output_data_types(in_types, [len(shape) for _, shape in in_shapes])
    record["output_types"] = [t.name for t in out_types]

    # Output shapes: IDimensionExprs for the inputs (dim 0 of the activations symbolic where dynamic).
    builder = ExprBuilder()
    in_exprs = [DimsExprs([DimExpr(symbol=d) if isinstance(d, str) else builder.constant(d) for d in shape])
                for _, shape in in_shapes]
    out_exprs = build.get_output_shapes(in_exprs, [], builder)
    record["output_shapes"] = [[e.evaluate(env) for e in dims] for dims in out_exprs]
    record["output_dim0_symbolic"] = [not dims[0].is_constant() for dims in out_exprs]

    # Formats: the builder offers descriptors of the inputs and outputs, the plugin answers combinations.
    PTD, DPTD = trt.PluginTensorDesc, trt.DynamicPluginTensorDesc
    lo, hi = batch_range

    def concrete(shape, n):
        return [n if isinstance(d, str) else d for d in shape]

    def dyn(dtype, shape, fmt=TensorFormat.LINEAR):
        dims = [-1 if isinstance(d, str) else d for d in shape]
        return DPTD(PTD(dims, dtype, fmt), concrete(shape, lo), concrete(shape, hi))

    out_shape_syms = [[("N" if sym and j == 0 else v) for j, v in enumerate(shape)]
                      for shape, sym in zip(record["output_shapes"], record["output_dim0_symbolic"])]
    io = [dyn(t, s) for t, (_, s) in zip(in_types, in_shapes)] + [dyn(t, s) for t, s in zip(out_types, out_shape_syms)]
    n_in = len(in_shapes)
    combos = build.get_supported_format_combinations(io, n_in)
    width = n_in + len(out_types)
    if len(combos) % width:
        raise AssertionError(f"{len(combos)} descriptors is not a whole number of {width}-tensor combinations")
    record["combinations"] = [[(c.type.name, TensorFormat(c.format).name) for c in combos[i:i + width]]
                              for i in range(0, len(combos), width)]

    record["tactics"] = {}
    for combo in [combos[i:i + width] for i in range(0, len(combos), width)]:
        ins = [DPTD(PTD(io[j].desc.dims, c.type, c.format), io[j].min, io[j].max) for j, c in enumerate(combo[:n_in])]
        outs = [DPTD(PTD(io[n_in + j].desc.dims, c.type, c.format), io[n_in + j].min, io[n_in + j].max)
                for j, c in enumerate(combo[n_in:])]
        build.configure_plugin(ins, outs)
        tactics = build.get_valid_tactics()
        for tactic in tactics:
            # The builder times each tactic on a clone; the clone is configured and told its tactic.
            clone = plugin.clone()
            clone_build = clone.get_capability_interface(trt.PluginCapabilityType.BUILD)
            clone_build.configure_plugin(ins, outs)
            clone_build.set_tactic(tactic)
            aot = clone.get_capability_interface(trt.PluginCapabilityType.BUILD)
            params, setter, launch_builder = LaunchParamsOut(), SymExprSetter(), ExprBuilder()
            aot.get_launch_params(in_exprs, ins + outs, n_in, params, setter, launch_builder)
            name, ptx = aot.get_kernel([d.desc for d in ins], [d.desc for d in outs])
            launch = {f: getattr(params, f).expr.evaluate(env) for f in
                      ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared_mem")}
            extra = [setter.exprs[i].expr.evaluate(env) for i in range(setter.nbSymExprs)]
            extra_dtypes = [setter.exprs[i].dtype.name for i in range(setter.nbSymExprs)]
            kernel = name.decode() if isinstance(name, bytes) else name
            ptx = ptx if isinstance(ptx, bytes) else ptx.encode()
            record["tactics"][int(tactic)] = {
                "kernel": kernel, "ptx": ptx, "entry_params": entry_params(ptx, kernel),
                "launch": launch, "extra_args": extra, "extra_dtypes": extra_dtypes,
                "formats": [TensorFormat(c.format).name for c in combo]}
    return record


def entry_params(ptx: bytes, kernel: str) -> list[str] | None:
    """The parameter types of `.entry kernel(...)` in a PTX image ("u64", "u32"...), None if it has no such entry."""
    text = ptx.decode(errors="replace")
    start = text.find(f".entry {kernel}(")
    if start < 0:
        return None
    head = text[start:text.index(")", start)]
    return [line.split()[1].lstrip(".") for line in head.splitlines() if line.strip().startswith(".param")]


# ---- a rewritten model's plugin nodes, with their input shapes from a CPU run ----

def plugin_nodes(model):
    from trtfuse.plugins.op_schema import DOMAIN

    return [n for n in model.graph.node if n.domain == DOMAIN]


def node_values(model, images: np.ndarray) -> dict:
    """Every plugin node's input and output values from trtfuse's CPU executor (the golden reference)."""
    from trtfuse.runtime.cpu_executor import run_model

    nodes = plugin_nodes(model)
    inits = {i.name for i in model.graph.initializer}
    names = sorted({t for n in nodes for t in list(n.input) + list(n.output) if t not in inits})
    values = dict(zip(names, run_model(model, {model.graph.input[0].name: images}, names)))
    from onnx import numpy_helper

    values.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
    return values


def input_shapes(node, values: dict, activations: set) -> list:
    """(dtype, shape) per input, dim 0 symbolic ("N") for the activations (x, residual)."""
    out = []
    for j, name in enumerate(node.input):
        v = values[name]
        shape = list(v.shape)
        if j in activations:
            shape[0] = "N"
        out.append((v.dtype.name, shape))
    return out


def drive_model(trt, model, images: np.ndarray, batch_range=(1, 8)) -> list[dict]:
    from trtfuse.plugins.op_schema import OPS

    values = node_values(model, images)
    records = []
    for node in plugin_nodes(model):
        spec = OPS[node.op_type]
        acts = {j for j, t in enumerate(spec.inputs) if t.name in ("x", "residual")}
        rec = drive_node(trt, node, input_shapes(node, values, acts), batch_range, {"N": images.shape[0]})
        rec["actual_in_shapes"] = [list(values[n].shape) for n in node.input]
        rec["actual_out_shape"] = list(values[node.output[0]].shape)
        records.append(rec)
    return records


# ---- on a GPU: the PTX, launch parameters and extra arguments, launched as TensorRT would ----

def launch_on_gpu(model, images: np.ndarray, records: list[dict]) -> list[dict]:
    """Each (node, tactic): inputs from the CPU run in the formats TensorRT negotiated, output poisoned, the
    kernel launched from NVIDIA's answers; result against the CPU executor's output (the golden reference)."""
    import ctypes

    from trtfuse.bench.conv_problem import POISON, compare, passes_lsb_rule
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins.layout import pack_nchwv, unpack_nchwv

    values = node_values(model, images)
    by_name = {n.name: n for n in plugin_nodes(model)}
    cd.context(0)
    results = []
    modules = {}
    for rec in records:
        node = by_name[rec["node"]]
        golden = values[node.output[0]]
        for tactic, t in rec["tactics"].items():
            buffers = []
            for name, fmt in zip(node.input, t["formats"]):
                v = values[name]
                host = pack_nchwv(v, 4 if fmt == "CHW4" else 32) if fmt in ("CHW4", "CHW32") else np.ascontiguousarray(v)
                buf = cd.DeviceBuffer(host.nbytes)
                buf.upload(host)
                buffers.append(buf)
            n, k, oh, ow = golden.shape
            y_shape = (n, -(-k // 32), oh, ow, 32)
            y = cd.DeviceBuffer(int(np.prod(y_shape)))
            y.fill(POISON)
            key = (t["kernel"], t["ptx"])
            if key not in modules:
                modules[key] = cd.Module(t["ptx"])
            fn = modules[key].function(t["kernel"], t["launch"]["shared_mem"])
            args = ([ctypes.c_uint64(b.ptr) for b in buffers] + [ctypes.c_int32(v) for v in t["extra_args"]]
                    + [ctypes.c_uint64(y.ptr)])
            L = t["launch"]
            cd.launch(fn, (L["grid_x"], L["grid_y"], L["grid_z"]), (L["block_x"], L["block_y"], L["block_z"]),
                      L["shared_mem"], 0, [ctypes.addressof(a) for a in args])
            cd.check(cd._driver().cuCtxSynchronize())
            out = unpack_nchwv(y.download(y_shape, np.int8), k)
            stats = compare(out, golden)
            results.append({"node": rec["node"], "tactic": tactic, "ok": bool(passes_lsb_rule(stats)),
                            "max_diff": int(stats.get("max_abs_diff", -1)) if isinstance(stats, dict) else -1})
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="rewritten ONNX models (trtfuse rewrite)")
    p.add_argument("--images", required=True, help=".npy float32 [N, 3, H, W] to run the models on")
    p.add_argument("--json", required=True, help="where to write the records")
    p.add_argument("--gpu", action="store_true", help="also launch every (node, tactic) on the GPU")
    p.add_argument("--ptx-dir", help="write each distinct PTX image get_kernel returned here, as <sha>.ptx")
    args = p.parse_args(argv)

    import onnx

    trt, trtp = load_tensorrt()
    from trtfuse.plugins.tensorrt import qdp

    qdp.register_all()
    qdp.register_all()  # idempotent: a second call must not re-register
    images = np.load(args.images)
    report = {"tensorrt": trt.__version__, "plugin_module": trtp.__file__, "faked": list(FAKED), "models": {}}
    for path in args.models:
        model = onnx.load(path)
        records = drive_model(trt, model, images)
        entry = {"records": records}
        if args.gpu:
            entry["gpu"] = launch_on_gpu(model, images, records)
        report["models"][path] = entry
        if args.ptx_dir:
            import hashlib

            Path(args.ptx_dir).mkdir(parents=True, exist_ok=True)
            for rec in records:
                for t in rec["tactics"].values():
                    target = _ptx_directive(t["ptx"], ".target")
                    digest = hashlib.sha256(t["ptx"]).hexdigest()[:16]
                    (Path(args.ptx_dir) / f"{target}-{digest}.ptx").write_bytes(t["ptx"])

    def encode(o):
        if isinstance(o, bytes):
            return {"ptx_bytes": len(o), "ptx_version": _ptx_directive(o, ".version"), "ptx_target": _ptx_directive(o, ".target")}
        raise TypeError(type(o).__name__)

    Path(args.json).write_text(json.dumps(report, default=encode))
    return 0


def _ptx_directive(ptx: bytes, directive: str) -> str | None:
    for line in ptx.decode(errors="replace").splitlines():
        if line.startswith(directive + " "):
            return line.split()[1]
    return None


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
