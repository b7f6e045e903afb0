"""Constant folding: every subgraph whose inputs are all constants becomes one initializer.

Pattern: any node whose inputs are initializers, Constant-node outputs or outputs of such nodes: `Identity`
chains (torch.onnx.export shares one weight tensor between convs through Identity nodes), `Constant`
nodes, `Cast`, `Reshape`/`Unsqueeze` of constants, shape arithmetic on static shapes, and so on. The node
is evaluated once (onnx-graphsurgeon's `fold_constants`, which runs onnxruntime on the constant part)
and its output tensor becomes an initializer **of the same name**, so every later pass sees plain
constants (a conv bias behind an Identity is then "a constant") and every tensor name a user or a
scales file knows survives.

Not folded (kept as nodes, on purpose):
  * QuantizeLinear / DequantizeLinear: in a quantized model the int8 weight and its per-channel scale
    behind a DequantizeLinear are what the Q/DQ pass (graph_passes/qdq.py) reads; folding them into an
    fp32 weight would throw the model's own quantization away;
  * nodes with a non-constant input (nothing to evaluate at rewrite time);
  * results over 64 MiB (folding would bloat the model; none occurs in a ResNet).

Nothing is rejected: a node that cannot be evaluated (an op onnxruntime lacks) is left as it is.
"""

from __future__ import annotations

from .graph_utils import export_graph, import_graph
from .report import FOLDED, Candidate

NOT_FOLDED = frozenset({"QuantizeLinear", "DequantizeLinear"})
SIZE_LIMIT = 64 << 20


def _keep(node) -> bool:
    return node.op in NOT_FOLDED


def fold_constants(model, report: list | None = None):
    """Return a copy of `model` with its constant subgraphs folded into initializers (names kept)."""
    import logging

    import onnx_graphsurgeon as gs

    graph = import_graph(model, infer_shapes=False)
    before = [(n.op, n.name or n.outputs[0].name) for n in graph.nodes]
    # graphsurgeon logs every node it cannot fold at WARNING: that is not the user's business here
    gs_logger = gs.logger.G_LOGGER
    old_level = gs_logger.severity
    gs_logger.severity = gs_logger.ERROR
    logging.disable(logging.WARNING)
    try:
        graph.fold_constants(size_threshold=SIZE_LIMIT, should_exclude_node=_keep, error_ok=True)
    finally:
        gs_logger.severity = old_level
        logging.disable(logging.NOTSET)
    graph.cleanup()
    after = {n.name or n.outputs[0].name for n in graph.nodes}
    folded = [(op, name) for op, name in before if name not in after]
    if report is not None and folded:
        ops = sorted({op for op, _ in folded})
        report.append(Candidate("fold_constants", "constants", [f"{len(folded)} nodes"], FOLDED,
                                op=", ".join(ops)))
    return export_graph(graph, template=model)
