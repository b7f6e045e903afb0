"""`build(arch, **options) -> onnx.ModelProto`: synthesize (or reuse) the weights, emit the chosen graph form."""

from __future__ import annotations

import json

import numpy as np

from trtfuse.errors import TrtfuseError

from .resnet import emit_onnx, resnet_spec, validate_options
from .weights import CLASSIFIER_VIEWS_PER_CLASS, DEFAULT_BN_IMAGES, WEIGHTS_RECIPE, synthesize_weights


def default_options() -> dict:
    """Every option of `build` with its default value (the cache key is built from this full set)."""
    return dict(
        opset=13,
        batch=1,  # None: dynamic batch dimension "N"
        fold_bn=False,
        classifier="gemm",
        pool="gap",
        image_size=224,
        seed=0,
        bn_images=DEFAULT_BN_IMAGES,
    )


def resolve_options(options: dict) -> dict:
    unknown = set(options) - set(default_options())
    if unknown:
        raise TrtfuseError(f"unknown model option(s): {', '.join(sorted(unknown))}")
    resolved = {**default_options(), **options}
    validate_options(**{k: resolved[k] for k in ("opset", "batch", "classifier", "pool", "image_size")})
    if not isinstance(resolved["seed"], int) or resolved["seed"] < 0:
        raise TrtfuseError(f"seed must be a non-negative integer, not {resolved['seed']!r}")
    if not isinstance(resolved["bn_images"], int) or resolved["bn_images"] < 2:
        raise TrtfuseError(f"bn_images must be an integer >= 2 (BN variance needs a batch), not {resolved['bn_images']!r}")
    resolved["fold_bn"] = bool(resolved["fold_bn"])
    return resolved


# In-process memo of synthesized weights, so the variants of one model share one synthesis.
_WEIGHTS_MEMO: dict[tuple, dict[str, np.ndarray]] = {}
_WEIGHTS_MEMO_SIZE = 6


def _synthesize(arch: str, seed: int, image_size: int, bn_images: int, progress) -> dict[str, np.ndarray]:
    from trtfuse.calib.data import DEFAULT_PHOTOS, default_images, default_labels

    spec = resnet_spec(arch)
    # The image seed is fixed: the data is part of the generator, the weight seed is the user's knob.
    images = default_images(bn_images, size=image_size, seed=0, split="calib")
    # The classifier's training set: the first views of the train split, which cycles through every default
    # photograph, so each class gets CLASSIFIER_VIEWS_PER_CLASS views (see calib/data.py for the splits).
    train_count = CLASSIFIER_VIEWS_PER_CLASS * len(DEFAULT_PHOTOS)
    train = default_images(train_count, size=image_size, seed=0, split="train")
    weights = synthesize_weights(spec, images, train, default_labels(train_count, "train"), seed=seed, progress=progress)
    for array in weights.values():
        array.setflags(write=False)  # shared by every variant built in this process
    return weights


def build_weights(arch: str, *, seed: int = 0, image_size: int = 224, bn_images: int = DEFAULT_BN_IMAGES, progress=None) -> dict[str, np.ndarray]:
    """The synthetic state_dict for (arch, seed, image_size, bn_images), memoised in-process (read-only arrays).

    `progress`, if given, is called `weights.synthesis_steps(spec)` times (not at all on a memo hit).
    """
    resnet_spec(arch)  # rejects unknown archs before any work
    key = (arch, seed, image_size, bn_images)
    if key not in _WEIGHTS_MEMO:
        if len(_WEIGHTS_MEMO) >= _WEIGHTS_MEMO_SIZE:
            _WEIGHTS_MEMO.pop(next(iter(_WEIGHTS_MEMO)))  # oldest first
        _WEIGHTS_MEMO[key] = _synthesize(arch, seed, image_size, bn_images, progress)
    return _WEIGHTS_MEMO[key]


def build(arch: str, progress=None, **options):
    """The ONNX ModelProto of `arch` with the given options (see `default_options`), checked with
    onnx.checker (full_check) before it is returned."""
    import onnx

    opts = resolve_options(options)
    spec = resnet_spec(arch)
    weights = build_weights(arch, seed=opts["seed"], image_size=opts["image_size"], bn_images=opts["bn_images"], progress=progress)
    metadata = {"trtfuse.arch": arch, "trtfuse.options": json.dumps(opts, sort_keys=True), "trtfuse.weights_recipe": WEIGHTS_RECIPE}
    model = emit_onnx(
        spec,
        weights,
        opset=opts["opset"],
        batch=opts["batch"],
        fold_bn=opts["fold_bn"],
        classifier=opts["classifier"],
        pool=opts["pool"],
        image_size=opts["image_size"],
        metadata=metadata,
    )
    onnx.checker.check_model(model, full_check=True)
    return model
