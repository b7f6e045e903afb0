"""The rewrite pipeline: an ordered list of passes, each a pure function model -> model.

`PASSES` is the list `trtfuse rewrite` runs; a new pass (e.g. split-K) is one more entry, reading its
options from `RewriteContext.options`. Each pass appends its candidates to `context.report`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from trtfuse.errors import TrtfuseError

from .fold_bn import fold_batchnorm
from .fuse_residual import FUSE_MODES, fuse_conv_blocks, required_activation_tensors
from .report import Candidate

DEFAULT_CALIB_IMAGES = 8


@dataclass
class RewriteContext:
    fuse_mode: str = "residual"
    scales: dict[str, float] | None = None
    report: list[Candidate] = field(default_factory=list)
    options: dict = field(default_factory=dict)  # per-pass options, e.g. {"split_k": 4}


def fold_bn_pass(model, ctx: RewriteContext):
    return fold_batchnorm(model, ctx.report)


def fuse_pass(model, ctx: RewriteContext):
    return fuse_conv_blocks(model, ctx.scales or {}, ctx.fuse_mode, ctx.report)


Pass = Callable[[object, RewriteContext], object]
PASSES: list[Pass] = [fold_bn_pass, fuse_pass]


def max_pass_scales(model, fuse_mode: str, count: int = DEFAULT_CALIB_IMAGES, images: np.ndarray | None = None):
    """Scales for every tensor the rewrite needs, from max|t|/127 over default calibration images."""
    from .scales import max_activation_scales, model_images

    names = required_activation_tensors(model, fuse_mode)
    if not names:
        return {}
    if images is None:
        images = model_images(model, count, split="calib")
    return max_activation_scales(model, names, images)


def rewrite(model, fuse_mode: str = "residual", scales: dict[str, float] | None = None,
            passes: list[Pass] | None = None, options: dict | None = None, calib_images: np.ndarray | None = None):
    """Run the pipeline on a copy of `model`; returns (rewritten model, report rows)."""
    if fuse_mode not in FUSE_MODES:
        raise TrtfuseError(f"unknown fuse mode {fuse_mode!r}: choose one of {', '.join(FUSE_MODES)}")
    if scales is None:
        scales = max_pass_scales(model, fuse_mode, images=calib_images)
    ctx = RewriteContext(fuse_mode, scales, [], dict(options or {}))
    for p in passes if passes is not None else PASSES:
        model = p(model, ctx)
    return model, ctx.report
