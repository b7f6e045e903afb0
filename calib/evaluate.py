"""How close an INT8 rewritten model is to its fp32 original, on images neither was calibrated on.

Whole model: cosine similarity of the logits per image (mean and min), top-1 agreement, and top-1
accuracy of both when the data carries labels that are the model's classes (`data.labels_apply_to`: the
default data's photo labels count only for models of trtfuse.models, whose classifier is trained on them).

Per fused layer: SQNR = 10 log10(sum ref^2 / sum (ref - deq)^2) in dB, summed over all images, where
deq is the fused node's int8 output times its `out_scale` and ref is the fp32 tensor it replaces.
Which fp32 tensor a fused output replaces comes from `fused_output_map` (see there).

The fp32 model runs on ONNX Runtime; the INT8 model runs through `int8_executor`, which uses ONNX
Runtime when the model has no plugin nodes and trtfuse's CPU executor when it does. Both are plain
functions `(model, feeds, output_names) -> list of arrays`, so another runner (a GPU one) can be passed in.
"""

from __future__ import annotations

import json
from typing import Callable

import numpy as np

from trtfuse.errors import TrtfuseError

Executor = Callable[[object, dict, list], list]
FUSED_MAP_KEY = "trtfuse.fused_outputs"  # model metadata_props: JSON {fused node output: fp32 tensor name}
REWRITE_INT8_SUFFIX = "__int8"  # graph_passes.fuse_residual names a fused output `<fp32 tensor>__int8`


def _plugin_nodes(model):
    from trtfuse.plugins.op_schema import op_for_node

    return [n for n in model.graph.node if op_for_node(n.op_type, n.domain) is not None and n.domain]


def _typed_outputs_copy(model, names: list[str]):
    """Copy of `model` whose graph outputs also include `names`, with element types from shape inference."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    existing = {o.name for o in copy.graph.output}
    wanted = [n for n in names if n not in existing]
    if not wanted:
        return copy
    types = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(copy)
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
            types[vi.name] = vi.type.tensor_type.elem_type
    except Exception:
        pass
    for node in _plugin_nodes(copy):  # shape inference knows nothing of plugin ops; their outputs are int8
        types.update((name, onnx.TensorProto.INT8) for name in node.output)
    for name in wanted:
        copy.graph.output.append(onnx.helper.make_tensor_value_info(name, types.get(name, onnx.TensorProto.FLOAT), None))
    return copy


class OnnxRuntimeExecutor:
    """Runs plain ONNX models; caches one session per requested output set."""

    def __init__(self, threads: int = 2, optimization: str = "all"):
        self.threads, self.optimization = threads, optimization
        self._sessions: dict = {}

    def __call__(self, model, feeds: dict, output_names: list[str]) -> list:
        from .stats import make_session

        key = (id(model), tuple(output_names))
        from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

        if key not in self._sessions:
            self._sessions[key] = make_session(_typed_outputs_copy(model, output_names), self.threads, self.optimization)
        try:
            return self._sessions[key].run(output_names, feeds)
        except InvalidArgument as exc:  # wrong input shape/type: the user's data, not a crash
            raise TrtfuseError(f"onnxruntime rejected the input: {str(exc).strip().splitlines()[0]}") from None


class PluginModelExecutor:
    """Models with trtfuse plugin nodes, through trtfuse.runtime.cpu_executor.CpuExecutor (the golden
    reference for plugin nodes, ONNX Runtime for the rest). Intermediate tensors are requested by
    making them graph outputs of a copy; one executor is built per requested output set."""

    def __init__(self, engine: str = "ort"):
        try:
            from trtfuse.runtime.cpu_executor import CpuExecutor
        except ImportError:
            raise TrtfuseError("the INT8 model has trtfuse plugin nodes and this trtfuse has no CPU executor "
                               "(trtfuse.runtime.cpu_executor)") from None
        self._make = lambda model: CpuExecutor(model, engine)
        self._executors: dict = {}

    def __call__(self, model, feeds: dict, output_names: list[str]) -> list:
        key = (id(model), tuple(output_names))
        if key not in self._executors:
            self._executors[key] = self._make(_typed_outputs_copy(model, output_names))
        results = self._executors[key].run(feeds)
        return [results[n] for n in output_names]


def int8_executor(model) -> Executor:
    return PluginModelExecutor() if _plugin_nodes(model) else OnnxRuntimeExecutor()


def fused_output_map(int8_model, fp32_model) -> dict[str, tuple[str, str]]:
    """{fused node output: (fp32 tensor it replaces, out_scale initializer name)} for every plugin node.

    In order of preference: a JSON record under metadata_props[FUSED_MAP_KEY]; the fused output's own
    name when the fp32 model has it; the output of the DequantizeLinear reading it (the rewrite gives
    that the original float name); the rewrite's naming rule `<fp32 tensor>__int8` (for fused outputs
    read only by other plugin nodes, which have no DequantizeLinear).
    """
    from trtfuse.plugins.op_schema import op_for_node

    fp32_names = {o for n in fp32_model.graph.node for o in n.output}
    recorded = {}
    for prop in int8_model.metadata_props:
        if prop.key == FUSED_MAP_KEY:
            try:
                recorded = json.loads(prop.value)
            except json.JSONDecodeError:
                raise TrtfuseError(f"metadata {FUSED_MAP_KEY} of the INT8 model is not JSON") from None
    dq_of = {n.input[0]: n.output[0] for n in int8_model.graph.node if n.op_type == "DequantizeLinear"}
    out = {}
    for node in _plugin_nodes(int8_model):
        spec = op_for_node(node.op_type, node.domain)
        named = spec.bind(node.input)
        for y, scale in zip(node.output, spec.output_scales):  # a FusedConvAddConv has two int8 outputs
            out_scale = named[scale]
            original = recorded.get(y)
            if original is None and y in fp32_names:
                original = y
            if original is None and dq_of.get(y) in fp32_names:
                original = dq_of[y]
            if original is None and y.endswith(REWRITE_INT8_SUFFIX) and y[: -len(REWRITE_INT8_SUFFIX)] in fp32_names:
                original = y[: -len(REWRITE_INT8_SUFFIX)]
            if original is not None and original in fp32_names:
                out[y] = (original, out_scale)
    return out


def _initializer_value(model, name: str) -> float:
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.name == name:
            return float(numpy_helper.to_array(init).reshape(-1)[0])
    raise TrtfuseError(f"out_scale {name!r} of a fused node is not an initializer")


def sqnr_db(signal_energy: float, noise_energy: float) -> float:
    if noise_energy == 0.0:
        return float("inf")
    if signal_energy == 0.0:
        return float("-inf")
    return float(10.0 * np.log10(signal_energy / noise_energy))


def _cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.divide((a * b).sum(axis=1), denom, out=np.ones(len(a)), where=denom > 0)


def evaluate(fp32_model, int8_model, images, batch_size: int = 8, layers: bool = True,
             fp32_executor: Executor | None = None, int8_run: Executor | None = None,
             show_progress: bool = True) -> dict:
    """The report dict: whole-model agreement and, with `layers`, per fused layer SQNR."""
    from trtfuse.ui import progress

    from .stats import check_images_fit, input_name_and_size, padded_batches, static_batch_size

    check_images_fit(fp32_model, images)

    fp32_run = fp32_executor or OnnxRuntimeExecutor()
    int8_run = int8_run or int8_executor(int8_model)
    in32, _ = input_name_and_size(fp32_model)
    in8, _ = input_name_and_size(int8_model)
    out32, out8 = fp32_model.graph.output[0].name, int8_model.graph.output[0].name
    mapping = fused_output_map(int8_model, fp32_model) if layers else {}
    if layers and _plugin_nodes(int8_model) and not mapping:
        raise TrtfuseError("cannot tell which fp32 tensor any fused node replaces (no fused-output map, no "
                           "matching names): rerun with --no-layers")
    fused = sorted(mapping)
    out_scales = {y: _initializer_value(int8_model, mapping[y][1]) for y in fused}
    signal = dict.fromkeys(fused, 0.0)
    noise = dict.fromkeys(fused, 0.0)
    cosines, top32, top8 = [], [], []
    fixed = static_batch_size(fp32_model) or static_batch_size(int8_model)
    bar = progress(total=images.count, desc="evaluating", enabled=show_progress, unit="img")
    try:
        for batch, real in padded_batches(images, fixed or batch_size, fixed is not None):
            ref = fp32_run(fp32_model, {in32: batch}, [out32] + [mapping[y][0] for y in fused])
            got = int8_run(int8_model, {in8: batch}, [out8] + fused)
            logits32, logits8 = np.asarray(ref[0])[:real], np.asarray(got[0])[:real]
            if logits32.shape != logits8.shape:
                raise TrtfuseError(f"output shapes differ: fp32 {logits32.shape}, int8 {logits8.shape}")
            cosines.append(_cosine_rows(logits32, logits8))
            top32.append(logits32.reshape(real, -1).argmax(axis=1))
            top8.append(logits8.reshape(real, -1).argmax(axis=1))
            for y, r, q in zip(fused, ref[1:], got[1:]):
                r = np.asarray(r, np.float64)[:real]
                deq = np.asarray(q, np.float64)[:real] * out_scales[y]
                if r.shape != deq.shape:
                    raise TrtfuseError(f"fused output {y} has shape {deq.shape}, its fp32 tensor {r.shape}")
                signal[y] += float(np.sum(r * r))
                noise[y] += float(np.sum((r - deq) ** 2))
            bar.update(real)
    finally:
        bar.close()
    cos = np.concatenate(cosines)
    t32, t8 = np.concatenate(top32), np.concatenate(top8)
    report = {
        "images": int(images.count),
        "data": images.description,
        "logit_cosine_mean": float(cos.mean()),
        "logit_cosine_min": float(cos.min()),
        "top1_agreement": float(np.mean(t32 == t8)),
        "top1_accuracy_fp32": None,
        "top1_accuracy_int8": None,
        "layers": [{"fused_output": y, "fp32_tensor": mapping[y][0], "sqnr_db": sqnr_db(signal[y], noise[y])}
                   for y in _in_graph_order(int8_model, fused)],
    }
    from .data import labels_apply_to

    if labels_apply_to(images, fp32_model):
        labels = np.asarray(images.labels)[: len(t32)]
        report["top1_accuracy_fp32"] = float(np.mean(t32 == labels))
        report["top1_accuracy_int8"] = float(np.mean(t8 == labels))
    if report["layers"]:
        worst = min(report["layers"], key=lambda r: r["sqnr_db"])
        report["min_sqnr_db"], report["min_sqnr_layer"] = worst["sqnr_db"], worst["fp32_tensor"]
    return report


def _in_graph_order(model, names: list[str]) -> list[str]:
    wanted = set(names)
    return [o for n in model.graph.node for o in n.output if o in wanted]


def print_report(report: dict) -> None:
    from trtfuse.ui import print_table

    print(f"data: {report['data']}")
    if report.get("reference"):
        print(f"reference: {report['reference']}")
    if report["layers"]:
        print_table(["fused output", "fp32 tensor", "SQNR dB"],
                    [[r["fused_output"], r["fp32_tensor"], f"{r['sqnr_db']:.2f}"] for r in report["layers"]])
        print()
    rows = [["images", report["images"]],
            ["logit cosine mean", f"{report['logit_cosine_mean']:.5f}"],
            ["logit cosine min", f"{report['logit_cosine_min']:.5f}"],
            ["top-1 agreement", f"{100 * report['top1_agreement']:.2f}%"]]
    if report["top1_accuracy_fp32"] is not None:
        rows += [["top-1 accuracy fp32", f"{100 * report['top1_accuracy_fp32']:.2f}%"],
                 ["top-1 accuracy int8", f"{100 * report['top1_accuracy_int8']:.2f}%"]]
    if report.get("min_sqnr_db") is not None:
        rows.append(["lowest layer SQNR", f"{report['min_sqnr_db']:.2f} dB ({report['min_sqnr_layer']})"])
    print_table(["metric", "value"], rows)
