"""ResNet ONNX models made here with onnx + numpy, no downloads.

    from trtfuse.models import build, cached_model_path
    model = build("resnet50")                                   # onnx.ModelProto, BN explicit, opset 13, batch 1
    model = build("resnet50", fold_bn=True, batch=None, opset=17, classifier="matmul", pool="reducemean")
    path = cached_model_path("resnet18", image_size=64)        # built once, then reused from the disk cache

Architectures: resnet18, resnet34, resnet50, resnet101 (torchvision v1.5 topology, see resnet.py).
Weights: synthetic and deterministic, BN statistics re-estimated on natural images, the classifier a
probe trained on the trunk's features of the default photos (see weights.py).
All variants of one (arch, seed, image_size, bn_images) share the same weights and compute the same
function; only the graph form differs.
"""

from __future__ import annotations

from .cache import cache_dir, cached_model_path, load_cached_model
from .resnet import ARCHITECTURES, CLASSIFIERS, POOLS, count_parameters
from .builder import build, build_weights, default_options

__all__ = [
    "ARCHITECTURES",
    "CLASSIFIERS",
    "POOLS",
    "build",
    "build_weights",
    "cache_dir",
    "cached_model_path",
    "count_parameters",
    "default_options",
    "load_cached_model",
]
