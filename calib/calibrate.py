"""Calibration end to end: model + images -> histograms (one pass) -> thresholds -> scales document."""

from __future__ import annotations

import time
from pathlib import Path

from trtfuse.errors import TrtfuseError

from .calibrators import METHODS, amax_to_scale, compute_amax
from .scales import file_sha256, scales_document
from .stats import AbsHistogram, check_images_fit, collect_statistics
from .tensors import activation_tensors


def check_method(method: str, percentile: float) -> None:
    if method not in METHODS:
        raise TrtfuseError(f"unknown calibration method {method!r}; choose from {', '.join(METHODS)}")
    if not 0.0 < percentile <= 100.0:
        raise TrtfuseError(f"--percentile must be in (0, 100], got {percentile}")


def scales_from_histograms(hists: dict[str, AbsHistogram], method: str, percentile: float = 99.99,
                           show_progress: bool = False):
    """({tensor: scale}, {tensor: amax}) for one method; the histograms are reused, not consumed."""
    from trtfuse.ui import progress

    check_method(method, percentile)
    amax = {name: compute_amax(h, method, percentile)
            for name, h in progress(list(hists.items()), desc=f"{method} thresholds", enabled=show_progress, unit="tensor")}
    return {name: amax_to_scale(a) for name, a in amax.items()}, amax


def warn_zero_tensors(hists: dict[str, AbsHistogram], amax: dict[str, float]) -> list[str]:
    """Tensors that were 0 on every calibration image get a placeholder threshold: say so in one line."""
    from trtfuse.ui import warn

    zero = [name for name, h in hists.items() if h.absmax == 0.0]
    if zero:
        warn(f"{len(zero)} of {len(hists)} tensors were 0 on every calibration image (first: {zero[0]!r}); "
             f"they got amax {amax[zero[0]]:g} (scale {amax_to_scale(amax[zero[0]]):.4g}): check --data")
    return zero


def gather_statistics(model, images, fuse_mode: str = "residual", selection: str = "auto",
                      batch_size: int = 8, threads: int = 2, show_progress: bool = True):
    """(histograms, selection used, seconds) for every activation the rewrite needs."""
    check_images_fit(model, images)
    tensors, used = activation_tensors(model, fuse_mode, selection)
    if not tensors:
        convs = sum(n.op_type == "Conv" for n in model.graph.node)
        if convs and selection != "broad":
            raise TrtfuseError(f"the rewrite ({fuse_mode}) can fuse none of the model's {convs} Conv nodes, so there is "
                               f"nothing to calibrate for it (`trtfuse rewrite --report` says why each is rejected, e.g. "
                               f"dynamic spatial dims); --tensors broad calibrates every Conv/Add/Relu activation anyway")
        raise TrtfuseError("the model has no activation tensors to calibrate (no Conv/Add/Relu/... nodes)")
    start = time.perf_counter()
    hists = collect_statistics(model, images, tensors, batch_size=batch_size, threads=threads,
                               show_progress=show_progress)
    return hists, used, time.perf_counter() - start


def calibrate(model_path: str | Path, images, method: str = "entropy", percentile: float = 99.99,
              fuse_mode: str = "residual", selection: str = "auto", batch_size: int = 8,
              threads: int = 2, show_progress: bool = True, model=None) -> dict:
    """The scales document (see trtfuse.calib.scales) for the model at `model_path`."""
    from trtfuse import __version__
    from trtfuse.io import load_model

    check_method(method, percentile)
    start, cpu_start = time.perf_counter(), time.process_time()
    model = model if model is not None else load_model(model_path)
    hists, used, stat_seconds = gather_statistics(model, images, fuse_mode, selection, batch_size, threads,
                                                  show_progress)
    scales, amax = scales_from_histograms(hists, method, percentile, show_progress)
    warn_zero_tensors(hists, amax)
    metadata = {
        "method": method,
        "percentile": percentile if method == "percentile" else None,
        "images": images.count,
        "data": images.description,
        "model": str(model_path),
        "model_sha256": file_sha256(model_path),
        "tensors": len(scales),
        "selection": used,
        "fuse_mode": fuse_mode,
        "statistics_seconds": round(stat_seconds, 3),
        "seconds": round(time.perf_counter() - start, 3),
        "cpu_seconds": round(time.process_time() - cpu_start, 3),
        "trtfuse": __version__,
    }
    return scales_document(scales, amax, metadata)
