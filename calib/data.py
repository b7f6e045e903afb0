"""Image data for BN re-estimation, calibration and evaluation.

The embedded default needs no download: the colour photographs that scikit-image ships, turned into
many distinct 224x224 views by random crops, scales and horizontal flips. `split` keeps calibration
and evaluation sets disjoint: they are drawn from different photographs.
"""

from __future__ import annotations

import numpy as np

# MLPerf ResNet-50 / torchvision ImageNet normalisation, RGB order.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255.0
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255.0

# Colour photographs in scikit-image (name -> loader in skimage.data). Held-out photos never feed
# calibration or BN statistics.
# Only images that ship inside the wheel (the rest need the optional downloader `pooch`).
_CALIB_PHOTOS = ("astronaut", "coffee", "rocket", "stereo_motorcycle", "immunohistochemistry", "camera", "coins", "grass")
_HELDOUT_PHOTOS = ("chelsea", "retina", "hubble_deep_field", "clock", "moon", "brick", "gravel", "horse")


def _load_photo(name: str) -> np.ndarray:
    import skimage.data as d

    img = getattr(d, name)()
    if isinstance(img, tuple):  # stereo_motorcycle: (left, right, disparity)
        img = img[0]
    img = np.asarray(img)
    if img.dtype != np.uint8:  # horse is boolean
        img = (img.astype(np.float32) * (255.0 / max(float(img.max()), 1.0))).astype(np.uint8)
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    return np.ascontiguousarray(img[..., :3]).astype(np.uint8)


def _resize(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(img).resize((out_w, out_h), Image.BILINEAR))


def preprocess_mlperf(img: np.ndarray, size: int = 224) -> np.ndarray:
    """HWC uint8 RGB -> CHW float32: resize shorter side to 256/224*size, center crop, mean/std normalise."""
    h, w = img.shape[:2]
    short = int(round(size * 256 / 224))
    if h < w:
        nh, nw = short, max(short, int(round(w * short / h)))
    else:
        nh, nw = max(short, int(round(h * short / w))), short
    img = _resize(img, nh, nw)
    top, left = (nh - size) // 2, (nw - size) // 2
    crop = img[top : top + size, left : left + size].astype(np.float32)
    return ((crop - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1).copy()


def default_images(count: int, size: int = 224, seed: int = 0, split: str = "calib") -> np.ndarray:
    """`count` distinct natural-image views, [count, 3, size, size] float32, MLPerf-normalised.

    Each view is a random crop (35%..100% of the shorter side) of one photo, randomly flipped,
    then preprocessed like an ImageNet validation image. Deterministic in (count, size, seed, split).
    """
    names = {"calib": _CALIB_PHOTOS, "heldout": _HELDOUT_PHOTOS}.get(split)
    if names is None:
        raise ValueError(f"split must be 'calib' or 'heldout', not {split!r}")
    photos = [_load_photo(n) for n in names]
    rng = np.random.default_rng([seed, 0 if split == "calib" else 1])
    out = np.empty((count, 3, size, size), dtype=np.float32)
    for i in range(count):
        img = photos[i % len(photos)]
        h, w = img.shape[:2]
        side = int(min(h, w) * rng.uniform(0.35, 1.0))
        top = int(rng.integers(0, h - side + 1))
        left = int(rng.integers(0, w - side + 1))
        view = img[top : top + side, left : left + side]
        if rng.random() < 0.5:
            view = view[:, ::-1]
        out[i] = preprocess_mlperf(np.ascontiguousarray(view), size)
    return out
