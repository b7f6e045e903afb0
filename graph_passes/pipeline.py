"""The rewrite pipeline: an ordered list of passes, each a pure function model -> model.

`PASSES` is the list `trtfuse rewrite` runs: fold constants, read and strip a quantized model's Q/DQ,
fold BN, fuse, and (option "chain") chain each residual block's last conv with the next conv. A new pass is one more entry, reading its options from `RewriteContext.options`. Each
pass appends its candidates to `context.report`.

Scales: a scales file (`scales=`) wins for a float model; a quantized (Q/DQ) model brings its own
(`qdq_pass` records them; a scales file is then refused unless `requantize`); what neither gives comes
from a max pass over default calibration images, run on the model as the fusion pass sees it (the
tensor names are the original model's: every pass keeps them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from trtfuse.errors import TrtfuseError

from .chain_pairs import chain_conv_pairs
from .fold_bn import fold_batchnorm
from .fold_constants import fold_constants
from .fuse_residual import FUSE_MODES, fuse_conv_blocks, required_activation_tensors
from .qdq import QdqInfo, has_qdq, strip_qdq
from .report import FOLDED, Candidate

DEFAULT_CALIB_IMAGES = 8


@dataclass
class RewriteContext:
    fuse_mode: str = "residual"
    scales: dict[str, float] | None = None  # None: the model's own (Q/DQ) and/or a max pass
    report: list[Candidate] = field(default_factory=list)
    options: dict = field(default_factory=dict)  # per-pass options, e.g. {"chain": True, "requantize": True}
    calib_images: np.ndarray | None = None
    calib_count: int = DEFAULT_CALIB_IMAGES
    qdq: QdqInfo | None = None  # what a quantized model's Q/DQ said (None: a float model, or --requantize)
    scales_source: str = ""
    max_pass_tensors: int = 0  # how many scales the max pass supplied


def fold_constants_pass(model, ctx: RewriteContext):
    return fold_constants(model, ctx.report)


def qdq_pass(model, ctx: RewriteContext):
    if not has_qdq(model):
        return model
    requantize = bool(ctx.options.get("requantize"))
    if ctx.scales is not None and not requantize:
        raise TrtfuseError("the model is quantized (Q/DQ) and carries its own scales: drop --scales, "
                           "or pass --requantize to discard the model's Q/DQ and use the scales file")
    model, info = strip_qdq(model)
    what = f"{info.activation_pairs} activation Q/DQ pairs, {info.constant_dequantized} constant DequantizeLinear"
    if requantize:
        ctx.report.append(Candidate("qdq", "requantize", [what], FOLDED, op="model Q/DQ discarded: calibrated anew"))
    else:
        ctx.qdq = info
        ctx.report.append(Candidate("qdq", "model scales", [what], FOLDED,
                                    op=f"{len(info.scales)} activation scales, {len(info.weight_qmax)} quantized conv weights"))
    return model


def fold_bn_pass(model, ctx: RewriteContext):
    return fold_batchnorm(model, ctx.report)


def fuse_pass(model, ctx: RewriteContext):
    names = required_activation_tensors(model, ctx.fuse_mode, prepared=True, qdq=ctx.qdq)
    if ctx.scales is not None:
        scales = ctx.scales
        ctx.scales_source = ctx.scales_source or "scales file"
    else:
        scales = dict(ctx.qdq.scales) if ctx.qdq is not None else {}
        missing = [n for n in names if n not in scales and (ctx.qdq is None or n not in ctx.qdq.problems)]
        if missing:
            scales.update(max_pass_scales(model, ctx.fuse_mode, ctx.calib_count, ctx.calib_images, names=missing))
        ctx.max_pass_tensors = len(missing)
        count = len(ctx.calib_images) if ctx.calib_images is not None else ctx.calib_count
        if ctx.qdq is not None:
            used = sum(n in ctx.qdq.scales for n in names)
            ctx.scales_source = f"the model's Q/DQ ({used} tensors)" + (
                f" + max pass over {count} default calibration images for {len(missing)} tensors the model leaves in float"
                if missing else "")
        else:
            ctx.scales_source = f"max pass over {count} default calibration images"
    return fuse_conv_blocks(model, scales, ctx.fuse_mode, ctx.report, qdq=ctx.qdq)


def chain_pass(model, ctx: RewriteContext):
    if not ctx.options.get("chain"):
        return model
    return chain_conv_pairs(model, ctx.report)


Pass = Callable[[object, RewriteContext], object]
PASSES: list[Pass] = [fold_constants_pass, qdq_pass, fold_bn_pass, fuse_pass, chain_pass]


def max_pass_scales(model, fuse_mode: str, count: int = DEFAULT_CALIB_IMAGES, images: np.ndarray | None = None,
                    names: list[str] | None = None):
    """Scales for every tensor the rewrite needs (or `names`), from max|t|/127 over default calibration images."""
    from .scales import max_activation_scales, model_images

    if names is None:
        names = required_activation_tensors(model, fuse_mode)
    if not names:
        return {}
    if images is None:
        images = model_images(model, count, split="calib")
    return max_activation_scales(model, names, images)


def run_pipeline(model, fuse_mode: str = "residual", scales: dict[str, float] | None = None,
                 passes: list[Pass] | None = None, options: dict | None = None, calib_images: np.ndarray | None = None,
                 calib_count: int = DEFAULT_CALIB_IMAGES):
    """Run the pipeline on a copy of `model`; returns (rewritten model, context: report, scales source, ...)."""
    if fuse_mode not in FUSE_MODES:
        raise TrtfuseError(f"unknown fuse mode {fuse_mode!r}: choose one of {', '.join(FUSE_MODES)}")
    ctx = RewriteContext(fuse_mode, scales, [], dict(options or {}), calib_images, calib_count)
    for p in passes if passes is not None else PASSES:
        model = p(model, ctx)
    return model, ctx


def rewrite(model, fuse_mode: str = "residual", scales: dict[str, float] | None = None,
            passes: list[Pass] | None = None, options: dict | None = None, calib_images: np.ndarray | None = None):
    """Run the pipeline on a copy of `model`; returns (rewritten model, report rows)."""
    model, ctx = run_pipeline(model, fuse_mode, scales, passes, options, calib_images)
    return model, ctx.report


def summary_reason(report: list[Candidate], model, fuse_mode: str) -> str:
    """Why a rewrite fused nothing, in one sentence ('' when something was fused)."""
    from collections import Counter

    from .report import FUSED, KEPT, REJECTED

    if any(c.status == FUSED for c in report):
        return ""
    convs = sum(n.op_type == "Conv" for n in model.graph.node)
    rejected = [c for c in report if c.status == REJECTED]
    if rejected:
        import re

        # group by the reason with the tensor names taken out ("input 'x': non-zero zero point" for every x)
        reason, n = Counter(re.sub(r"'[^']*'", "'...'", c.reason) for c in rejected).most_common(1)[0]
        return f"every candidate was rejected ({len(rejected)}); most often ({n}x): {reason}"
    if not convs:
        return "the model has no Conv node left to fuse"
    if fuse_mode == "residual":
        kept = [c for c in report if c.status == KEPT]
        return (f"no Conv -> Add -> ReLU residual block among the {convs} convs"
                + (f" ({len(kept)} kept in fp32)" if kept else "") + "; --fuse all fuses every conv")
    return f"none of the {convs} convs matched a fusion pattern"
