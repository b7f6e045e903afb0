"""Small onnx-graphsurgeon helpers shared by the passes: copying, constants, conv attributes, shapes.

Every pass starts from `import_graph(model)`, which copies the caller's model first, so a pass never
mutates what it was given, and runs ONNX shape inference so tensors carry static shapes where the
model allows them.
"""

from __future__ import annotations

import numpy as np

from trtfuse.errors import TrtfuseError


def copy_model(model):
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def import_graph(model, infer_shapes: bool = True):
    """A graphsurgeon graph of a copy of `model` (shape-inferred when possible)."""
    import onnx
    import onnx_graphsurgeon as gs

    model = copy_model(model)
    if infer_shapes:
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception as exc:  # inference is a convenience: an unsupported op must not stop the pass
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TrtfuseError(f"ONNX shape inference failed: {first}") from None
    return gs.import_onnx(model)


def export_graph(graph, template=None):
    """Export a graphsurgeon graph, keeping the template model's metadata (producer, ir_version)."""
    import onnx_graphsurgeon as gs

    graph.cleanup().toposort()
    model = gs.export_onnx(graph)
    if template is not None:
        model.ir_version = template.ir_version
        model.producer_name = template.producer_name or model.producer_name
        model.producer_version = template.producer_version
        del model.metadata_props[:]
        model.metadata_props.extend(template.metadata_props)
    return model


def constant_array(tensor) -> np.ndarray | None:
    """The value of a constant tensor (initializer or Constant-node output), else None."""
    import onnx_graphsurgeon as gs

    if tensor is None:
        return None
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    if len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant":
        value = tensor.inputs[0].attrs.get("value")
        if isinstance(value, gs.Constant):
            return np.asarray(value.values)
    return None


def producer(tensor):
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def consumers(tensor) -> list:
    return list(tensor.outputs)


def is_graph_output(graph, tensor) -> bool:
    return any(t is tensor or t.name == tensor.name for t in graph.outputs)


def has_single_consumer(graph, tensor, node) -> bool:
    """True when `node` is the only reader of `tensor` and the tensor is not a graph output."""
    readers = consumers(tensor)
    return len(readers) == 1 and readers[0] is node and not is_graph_output(graph, tensor)


def optional_input(node, index: int):
    """node.inputs[index], or None when absent or the empty-name placeholder."""
    if index >= len(node.inputs):
        return None
    t = node.inputs[index]
    return None if (t is None or t.name == "") else t


def conv_attributes(node, weight_shape) -> dict:
    """Normalised Conv attributes: kernel_shape, strides, pads (ONNX order), dilations, group, auto_pad."""
    spatial = len(weight_shape) - 2
    attrs = node.attrs
    return {
        "kernel_shape": [int(v) for v in attrs.get("kernel_shape", weight_shape[2:])],
        "strides": [int(v) for v in attrs.get("strides", [1] * spatial)],
        "pads": [int(v) for v in attrs.get("pads", [0] * (2 * spatial))],
        "dilations": [int(v) for v in attrs.get("dilations", [1] * spatial)],
        "group": int(attrs.get("group", 1)),
        "auto_pad": attrs.get("auto_pad", "NOTSET"),
    }


def static_4d_reason(tensor, what: str) -> str | None:
    """Why `tensor` is not a 4-D tensor with static C, H, W (batch may be dynamic); None if it is."""
    shape = tensor.shape
    if shape is None:
        return f"{what} {tensor.name!r} has unknown shape"
    if len(shape) != 4:
        return f"{what} {tensor.name!r} is {len(shape)}-D, not 4-D"
    if not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape[1:]):
        return f"{what} {tensor.name!r} has dynamic channel/spatial dims {list(shape)}"
    return None


def ancestors_include(start, target_name: str, limit: int = 100_000) -> bool:
    """Whether the tensor named `target_name` is `start` or lies upstream of it."""
    stack, seen = [start], set()
    while stack and len(seen) < limit:
        t = stack.pop()
        if t.name == target_name:
            return True
        if t.name in seen:
            continue
        seen.add(t.name)
        for node in t.inputs:
            stack.extend(i for i in node.inputs if i is not None and i.name)
    return False
