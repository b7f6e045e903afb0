"""ONNX rewrites (onnx-graphsurgeon): BN folding, residual-block fusion into int8 plugin nodes, split-K.

    from trtfuse.graph_passes import rewrite, required_activation_tensors
    int8_model, report = rewrite(model, fuse_mode="residual", scales=None)   # None: max pass
    names = required_activation_tensors(model, "all")                       # what calibration must measure

docs/passes.md describes the passes, the scales file and the measured accuracy.
"""

_LAZY = {
    "rewrite": "pipeline",
    "PASSES": "pipeline",
    "required_activation_tensors": "fuse_residual",
    "fold_batchnorm": "fold_bn",
    "fuse_conv_blocks": "fuse_residual",
    "load_scales": "scales",
}


def __getattr__(name):  # keeps `trtfuse --help` free of numpy/onnx imports
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
