"""Building FusedConv / FusedConvAdd nodes exactly as plugins/op_schema.py declares them.

Weights are quantized symmetric per output channel (docs/ops.md): w_scale[k] = max|w[k]| / 127,
w_int8 = clip(rint(w / w_scale), -127, 127), then packed by trtfuse.plugins.layout.pack_weight.
The node's `scale` input folds the input activation scale in: scale[k] = x_scale * w_scale[k].
"""

from __future__ import annotations

import numpy as np

from trtfuse.plugins import layout
from trtfuse.plugins.op_schema import DOMAIN, FUSED_CONV, FUSED_CONV_ADD, NAMESPACE, OpSpec


def quantize_weight(weight: np.ndarray, qmax: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """float [K, C, R, S] -> (int8 [K, C, R, S], float32 w_scale [K]); an all-zero filter gets scale 1.

    qmax: per output channel, the largest |integer| the channel's peak maps to (default 127). A quantized
    model's weight W_int8 * s_w (times a folded BN factor) with qmax = max|W_int8| gives back its own
    integers and s_w (times |a|) instead of a fresh max-calibrated quantization."""
    w = np.asarray(weight, dtype=np.float32)
    peak = np.max(np.abs(w.reshape(w.shape[0], -1)), axis=1)
    top = np.float32(127) if qmax is None else np.broadcast_to(np.asarray(qmax, np.float32).reshape(-1), peak.shape)
    w_scale = np.where((peak > 0) & (top > 0), peak / np.maximum(top, np.float32(1)), np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(w / w_scale.reshape(-1, 1, 1, 1)), -127, 127).astype(np.int8)
    return q, w_scale


def _padded(values: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros(length, dtype=np.float32)
    out[: len(values)] = values
    return out


def conv_plugin_node(
    name: str,
    x,
    output,
    weight: np.ndarray,
    bias: np.ndarray | None,
    conv_attrs: dict,
    x_scale: float,
    out_scale: float,
    relu: bool,
    residual=None,
    residual_scale: float | None = None,
    weight_qmax: np.ndarray | None = None,
):
    """A graphsurgeon node of FusedConv (residual None) or FusedConvAdd, with its constants.

    `x`, `residual` and `output` are int8 graphsurgeon Variables; everything else becomes initializers.
    """
    import onnx_graphsurgeon as gs

    spec: OpSpec = FUSED_CONV if residual is None else FUSED_CONV_ADD
    k, c, r, s = weight.shape
    k_pad = layout.round_up(k, 32)
    w_int8, w_scale = quantize_weight(weight, weight_qmax)
    bias = np.zeros(k, np.float32) if bias is None else np.asarray(bias, np.float32).reshape(-1)
    tensors = {
        "x": x,
        "weight": gs.Constant(f"{name}.weight_packed", layout.pack_weight(w_int8)),
        "scale": gs.Constant(f"{name}.scale", _padded((np.float64(x_scale) * w_scale.astype(np.float64)).astype(np.float32), k_pad)),
        "bias": gs.Constant(f"{name}.bias", _padded(bias, k_pad)),
        "out_scale": gs.Constant(f"{name}.out_scale", np.array([out_scale], np.float32)),
    }
    if residual is not None:
        tensors["residual"] = residual
        tensors["residual_scale"] = gs.Constant(f"{name}.residual_scale", np.array([residual_scale], np.float32))
    attrs = {
        "in_channels": int(c),
        "out_channels": int(k),
        "kernel_shape": [int(r), int(s)],
        "strides": [int(v) for v in conv_attrs["strides"]],
        "pads": [int(v) for v in conv_attrs["pads"]],
        "relu": int(bool(relu)),
    }
    assert tuple(attrs) == spec.attribute_names, "attribute set drifted from op_schema"
    attrs["plugin_namespace"] = NAMESPACE
    attrs["aot"] = 1
    return gs.Node(
        op=spec.name,
        name=name,
        domain=DOMAIN,
        attrs=attrs,
        inputs=[tensors[n] for n in spec.input_names],
        outputs=[output],
    )
