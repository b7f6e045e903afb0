"""Which activation tensors need a scale: the rewrite's own list when it has one, a broad fallback otherwise.

The rewrite (trtfuse.graph_passes) knows exactly which tensors its fused nodes and Q/DQ boundaries
read; it exposes that as `required_activation_tensors(model, fuse_mode)`. When that function is not
available, every float activation that enters or leaves a Conv, BatchNormalization, Add, Relu, MaxPool
or GlobalAveragePool node is calibrated: a superset of anything a residual-CNN rewrite can ask for.
"""

from __future__ import annotations

from typing import Callable

FUSE_MODES = ("residual", "all")  # "both": the union, what a scales file for any `rewrite --fuse` needs
QUANTIZABLE_NEIGHBOURS = ("Conv", "BatchNormalization", "Add", "Relu", "MaxPool", "GlobalAveragePool")


def broad_activation_tensors(model, fuse_mode: str | None = None) -> list[str]:
    """Inputs and outputs of the ops above that are activations (not initializers, not Constant outputs)."""
    graph = model.graph
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    names: list[str] = []
    seen: set[str] = set()
    for node in graph.node:
        if node.op_type not in QUANTIZABLE_NEIGHBOURS:
            continue
        # Conv's weight/bias and BN's parameters are inputs 1+; only input 0 is an activation for those.
        inputs = list(node.input) if node.op_type == "Add" else list(node.input[:1])
        for name in inputs + list(node.output):
            if name and name not in constants and name not in seen:
                seen.add(name)
                names.append(name)
    return names


def rewrite_tensor_function() -> Callable | None:
    """The rewrite's `required_activation_tensors`, or None when this build of trtfuse lacks it."""
    try:
        from trtfuse import graph_passes
    except ImportError:
        return None
    func = getattr(graph_passes, "required_activation_tensors", None)
    if func is None:
        try:
            from trtfuse.graph_passes import fuse_residual  # where the pass is expected to live
        except ImportError:
            return None
        func = getattr(fuse_residual, "required_activation_tensors", None)
    return func


def activation_tensors(model, fuse_mode: str = "residual", selection: str = "auto") -> tuple[list[str], str]:
    """(tensor names, which selection produced them).

    selection: "rewrite" (the pass's list; error if unavailable), "broad" (the fallback above), or
    "auto" (the pass's list when it exists, else broad).
    """
    from trtfuse.errors import TrtfuseError

    if selection not in ("auto", "rewrite", "broad"):
        raise TrtfuseError(f"tensor selection must be auto, rewrite or broad, not {selection!r}")
    func = rewrite_tensor_function() if selection != "broad" else None
    if func is not None:
        modes = FUSE_MODES if fuse_mode == "both" else (fuse_mode,)
        names = [n for mode in modes for n in func(model, mode)]
        return list(dict.fromkeys(names)), f"rewrite ({fuse_mode})"
    if selection == "rewrite":
        raise TrtfuseError("this trtfuse has no graph_passes.required_activation_tensors; use --tensors broad")
    return broad_activation_tensors(model), "broad"
