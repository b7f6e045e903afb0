"""From a histogram of |x| to a clipping threshold (amax); scale = amax / 127, symmetric, zero point 0.

  max         the exact absmax: nothing clips, outliers stretch the step for everyone.
  percentile  the |x| value below which `percentile` % of the elements lie (linear inside a bin).
  entropy     TensorRT's EntropyCalibrator2 method (Migacz, "8-bit Inference with TensorRT", 2017;
              NVIDIA pytorch-quantization `_compute_amax_entropy`): for every candidate threshold of
              i bins, i = 128 .. bins, P = the histogram's first i bins with everything beyond folded
              into bin i-1; Q = those i bins merged into 128 levels and spread back evenly over each
              level's non-empty bins; keep the i with the smallest KL(P || Q) (the last one on ties).
              As pytorch-quantization does, bin 0 is replaced by bin 1 first, so the exact zeros that a
              ReLU produces in bulk do not dominate the divergence.
  mse         the threshold minimizing the expected squared error of quantize-dequantize, each bin
              represented by its centre (pytorch-quantization `_compute_amax_mse`), over candidates at
              every bin edge from bin 128 on.

Every threshold is positive and at most the absmax. A tensor that was all zeros gets threshold 1.0:
zero is exact at any scale, and a unit scale keeps requantization multipliers tame.

Weights are quantized per output channel (`weight_scales`), symmetric: w_scale[k] = max|w[k]| / 127.
"""

from __future__ import annotations

import numpy as np

from .stats import AbsHistogram

INT8_MAX = 127
QUANT_LEVELS = 128  # non-negative int8 levels, the |x| side of a symmetric int8 quantizer
START_BIN = 128
METHODS = ("max", "percentile", "entropy", "mse")
ZERO_TENSOR_THRESHOLD = 1.0


def _finish(threshold: float, hist: AbsHistogram) -> float:
    if hist.absmax <= 0.0:
        return ZERO_TENSOR_THRESHOLD
    return float(min(max(threshold, np.finfo(np.float32).tiny), hist.absmax))


def amax_max(hist: AbsHistogram) -> float:
    return _finish(hist.absmax, hist)


def amax_percentile(hist: AbsHistogram, percentile: float = 99.99) -> float:
    if not 0.0 < percentile <= 100.0:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    if hist.absmax <= 0.0:
        return ZERO_TENSOR_THRESHOLD
    if percentile == 100.0:
        return _finish(hist.absmax, hist)
    counts = hist.counts.astype(np.float64)
    cdf = np.cumsum(counts)
    target = percentile / 100.0 * cdf[-1]
    b = int(np.searchsorted(cdf, target, side="left"))
    before = cdf[b - 1] if b > 0 else 0.0
    frac = (target - before) / counts[b] if counts[b] > 0 else 1.0
    return _finish((b + frac) * hist.bin_width, hist)


def _last_nonempty_bin(counts: np.ndarray) -> int:
    nz = np.flatnonzero(counts)
    return int(nz[-1]) + 1 if nz.size else 0


def kl_divergences(counts: np.ndarray, start_bin: int = START_BIN, levels: int = QUANT_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """(candidate bin counts i, KL(P_i || Q_i)) for i = start_bin .. len(counts); see the module doc."""
    bins = counts.astype(np.float64).copy()
    if bins.size > 1:
        bins[0] = bins[1]
    tail = np.concatenate([np.cumsum(bins[::-1])[::-1], [0.0]])  # tail[i] = sum(bins[i:])
    nonempty = (bins > 0).astype(np.float64)
    candidates = np.arange(start_bin, bins.size + 1)
    out = np.full(candidates.size, np.inf)
    for n, i in enumerate(candidates):
        p = bins[:i].copy()
        p[-1] += tail[i]
        level = (np.arange(i) * levels) // i  # bin j of the candidate range -> one of `levels` levels
        level_sum = np.bincount(level, weights=bins[:i], minlength=levels)
        level_nonempty = np.bincount(level, weights=nonempty[:i], minlength=levels)
        per_bin = np.divide(level_sum, level_nonempty, out=np.zeros(levels), where=level_nonempty > 0)
        q = per_bin[level] * nonempty[:i]
        p_total, q_total = p.sum(), q.sum()
        if p_total <= 0 or q_total <= 0:
            continue
        mask = p > 0
        if np.any(q[mask] == 0):  # P has mass where Q has none: infinite divergence
            continue
        pn, qn = p[mask] / p_total, q[mask] / q_total
        out[n] = float(np.sum(pn * np.log(pn / qn)))
    return candidates, out


def amax_entropy(hist: AbsHistogram, start_bin: int = START_BIN) -> float:
    if hist.absmax <= 0.0:
        return ZERO_TENSOR_THRESHOLD
    # Bins beyond the last non-empty one change nothing but the threshold's units: search up to it.
    used = max(_last_nonempty_bin(hist.counts), min(start_bin, hist.bins))
    candidates, kl = kl_divergences(hist.counts[:used], min(start_bin, used))
    if not np.isfinite(kl).any():
        return _finish(hist.absmax, hist)
    best = len(kl) - 1 - int(np.argmin(kl[::-1]))  # last minimum: prefer the wider range on ties
    return _finish(candidates[best] * hist.bin_width, hist)


def quantization_mse(counts: np.ndarray, centres: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Mean squared error of symmetric int8 quantize-dequantize of the bin centres, per threshold."""
    counts = counts.astype(np.float64)
    total = counts.sum()
    errors = np.empty(thresholds.size)
    chunk = max(1, (1 << 22) // max(1, centres.size))  # bound the [thresholds x bins] temporary
    for start in range(0, thresholds.size, chunk):
        t = thresholds[start : start + chunk, None]
        step = t / INT8_MAX
        q = np.clip(np.rint(centres[None, :] / step), -INT8_MAX, INT8_MAX) * step
        errors[start : start + chunk] = ((q - centres[None, :]) ** 2 @ counts) / total
    return errors


def amax_mse(hist: AbsHistogram, start_bin: int = START_BIN) -> float:
    if hist.absmax <= 0.0:
        return ZERO_TENSOR_THRESHOLD
    used = max(_last_nonempty_bin(hist.counts), min(start_bin, hist.bins))
    width = hist.bin_width
    centres = (np.arange(used) + 0.5) * width
    thresholds = np.arange(min(start_bin, used), used + 1) * width
    errors = quantization_mse(hist.counts[:used], centres, thresholds)
    return _finish(float(thresholds[int(np.argmin(errors))]), hist)


def compute_amax(hist: AbsHistogram, method: str, percentile: float = 99.99) -> float:
    if method == "max":
        return amax_max(hist)
    if method == "percentile":
        return amax_percentile(hist, percentile)
    if method == "entropy":
        return amax_entropy(hist)
    if method == "mse":
        return amax_mse(hist)
    raise ValueError(f"unknown calibration method {method!r}; choose from {', '.join(METHODS)}")


def amax_to_scale(amax: float) -> float:
    return float(amax) / INT8_MAX


def weight_scales(weight: np.ndarray) -> np.ndarray:
    """Per-output-channel symmetric int8 scales of a conv weight [K, C, R, S] (or any [K, ...]).

    w_scale[k] = max|w[k]| / 127; an all-zero channel gets scale 1.0 (its int8 weights are all 0 anyway)."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim < 2:
        raise ValueError(f"expected a weight [K, ...] with an output-channel axis, got shape {w.shape}")
    amax = np.abs(w.reshape(w.shape[0], -1)).max(axis=1)
    return np.where(amax > 0, amax / np.float32(INT8_MAX), np.float32(1.0)).astype(np.float32)


def quantize_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, per-channel scales): w_int8[k] = clip(rint(w[k] / w_scale[k]), -127, 127)."""
    w = np.asarray(weight, dtype=np.float32)
    scales = weight_scales(w)
    q = np.clip(np.rint(w / scales.reshape((-1,) + (1,) * (w.ndim - 1))), -INT8_MAX, INT8_MAX)
    return q.astype(np.int8), scales
