"""Image data for BN re-estimation, classifier training, calibration and evaluation.

The embedded default needs no download: the photographs that scikit-image ships, turned into many
distinct 224x224 views by random crops, scales and horizontal flips. `split` keeps calibration and
evaluation sets disjoint: they are drawn from different photographs.

Every default view is labelled with the class of the photograph it was cut from (`DEFAULT_PHOTOS`:
photo i is class i of the 1000 ImageNet-style outputs). The models' classifier is a linear probe trained
on the `train` split (models/weights.py), so `evaluate` can report top-1 accuracy on the default data.

| split     | photographs                 | views drawn with          | used for                                   |
|-----------|-----------------------------|---------------------------|--------------------------------------------|
| `calib`   | the 8 of `_CALIB_PHOTOS`    | rng stream (seed, 0)      | calibration; its first views: BN statistics |
| `heldout` | the 8 of `_HELDOUT_PHOTOS`  | rng stream (seed, 1)      | evaluation                                 |
| `train`   | all 16 (`DEFAULT_PHOTOS`)   | rng stream (seed, 2)      | training the models' classifier            |

Views of different splits are different random crops; `train` views cut from a held-out photo share
pixels with that photo's evaluation views (same class, different image: like ImageNet's train and val).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

# MLPerf ResNet-50 / torchvision ImageNet normalisation, RGB order.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255.0
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255.0

# Colour photographs in scikit-image (name -> loader in skimage.data). Held-out photos never feed
# calibration or BN statistics.
# Only images that ship inside the wheel (the rest need the optional downloader `pooch`).
_CALIB_PHOTOS = ("astronaut", "coffee", "rocket", "stereo_motorcycle", "immunohistochemistry", "camera", "coins", "grass")
_HELDOUT_PHOTOS = ("chelsea", "retina", "hubble_deep_field", "clock", "moon", "brick", "gravel", "horse")
# Class i of the default data is photo i of this tuple (calibration photos are classes 0-7, held-out 8-15).
DEFAULT_PHOTOS = _CALIB_PHOTOS + _HELDOUT_PHOTOS
# split -> (photographs, index of its random stream). The stream index separates the splits' crops even
# where they cut the same photographs (train and heldout), so no view is drawn twice.
_SPLITS = {"calib": (_CALIB_PHOTOS, 0), "heldout": (_HELDOUT_PHOTOS, 1), "train": (DEFAULT_PHOTOS, 2)}


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


def _split_photos(split: str) -> tuple[tuple[str, ...], int]:
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {', '.join(map(repr, _SPLITS))}, not {split!r}")
    return _SPLITS[split]


def default_labels(count: int, split: str = "calib") -> np.ndarray:
    """The class of each of the first `count` views of `split` (view i is cut from photo i mod #photos)."""
    names, _ = _split_photos(split)
    return np.array([DEFAULT_PHOTOS.index(names[i % len(names)]) for i in range(count)], dtype=np.int64)


def default_images(count: int, size: int = 224, seed: int = 0, split: str = "calib") -> np.ndarray:
    """`count` distinct natural-image views, [count, 3, size, size] float32, MLPerf-normalised.

    Each view is a random crop (35%..100% of the shorter side) of one photo, randomly flipped,
    then preprocessed like an ImageNet validation image. Deterministic in (count, size, seed, split);
    the first k views of a larger count are the k views of count k. `default_labels` gives their classes.
    """
    check_fits_in_memory(count, size)
    names, stream = _split_photos(split)
    photos = [_load_photo(n) for n in names]
    rng = np.random.default_rng([seed, stream])
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


# ---------------------------------------------------------------------------------------------------
# Loaders: what `--data` names (a folder of images, a .npy/.npz file, or "default"), as one object that
# hands out preprocessed NCHW float32 batches.

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".JPEG", ".JPG", ".PNG")


@dataclass
class ImageSet:
    """Images ready for the model: `count` images of [3, size, size] float32, optionally labelled.

    `batches` produces arrays lazily so a folder of thousands of JPEGs is never decoded at once.
    `description` says in one line what was loaded and how it was interpreted.
    """

    count: int
    size: int
    description: str
    labels: np.ndarray | None
    _get: Callable[[int, int], np.ndarray]
    channels: int = 3
    # DEFAULT_LABEL_SPACE for the embedded default data, whose labels are classes only of the models that
    # trtfuse.models trains on them (see `labels_apply_to`); None for the user's own labels.
    label_space: str | None = None

    def batches(self, batch_size: int) -> Iterator[np.ndarray]:
        for start in range(0, self.count, batch_size):
            yield self._get(start, min(self.count, start + batch_size))

    def all(self) -> np.ndarray:
        return self._get(0, self.count)


def _fail(message: str):
    from trtfuse.errors import TrtfuseError

    raise TrtfuseError(message)


def read_image(path: Path) -> np.ndarray:
    """A JPEG/PNG file -> HWC uint8 RGB; one-line error when it cannot be decoded."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except Exception as exc:
        _fail(f"cannot read image {path}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'unreadable'}")


def read_val_map(path: Path) -> dict[str, int]:
    """MLPerf `val_map.txt`: one `filename label` pair per line."""
    labels: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            _fail(f"{path}:{lineno}: expected 'filename label', got {line.strip()!r}")
        labels[parts[0]] = int(parts[1])
    return labels


def load_image_folder(folder: str | os.PathLike, count: int | None = None, size: int = 224) -> ImageSet:
    """JPEG/PNG files of a folder (sorted by name, not recursive), MLPerf-preprocessed on demand.

    A `val_map.txt` beside the images (MLPerf ImageNet layout) supplies labels; with one present,
    every selected image must have an entry.
    """
    folder = Path(folder)
    if not folder.is_dir():
        _fail(f"no such data folder: {folder}")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in IMAGE_SUFFIXES)
    if not files:
        _fail(f"no JPEG or PNG images in {folder}")
    if count is not None:
        files = files[:count]
    labels = None
    val_map = folder / "val_map.txt"
    if val_map.is_file():
        table = read_val_map(val_map)
        missing = [p.name for p in files if p.name not in table]
        if missing:
            _fail(f"{val_map} has no label for {missing[0]} ({len(missing)} of {len(files)} images unlabelled)")
        labels = np.array([table[p.name] for p in files], dtype=np.int64)

    def get(start: int, stop: int) -> np.ndarray:
        return np.stack([preprocess_mlperf(read_image(p), size) for p in files[start:stop]])

    what = f"{len(files)} images from {folder}" + (" with val_map.txt labels" if labels is not None else "")
    return ImageSet(len(files), size, what + ", MLPerf preprocessing", labels, get)


def _as_nchw_float(arr: np.ndarray, source: str, size: int | None) -> tuple[np.ndarray, str]:
    """Accept preprocessed NCHW float32 or raw NHWC uint8 (then MLPerf-preprocess); say which it was."""
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4:
        _fail(f"{source}: expected a 4-D batch (N,3,H,W float or N,H,W,3 uint8), got shape {tuple(arr.shape)}")
    if arr.dtype == np.uint8:
        if arr.shape[-1] != 3:
            _fail(f"{source}: uint8 data must be raw images N,H,W,3 (RGB), got shape {tuple(arr.shape)}")
        target = size or 224
        out = np.stack([preprocess_mlperf(np.ascontiguousarray(img), target) for img in arr])
        return out, f"raw HWC uint8 images, MLPerf-preprocessed to {target}x{target}"
    if arr.dtype.kind != "f":
        _fail(f"{source}: dtype {arr.dtype} is neither float (preprocessed NCHW) nor uint8 (raw NHWC)")
    if arr.shape[1] != 3:
        _fail(f"{source}: float data must be preprocessed NCHW with 3 channels, got shape {tuple(arr.shape)}")
    if size is not None and arr.shape[2:] != (size, size):
        _fail(f"{source}: images are {arr.shape[2]}x{arr.shape[3]}, the model expects {size}x{size}")
    return np.ascontiguousarray(arr, dtype=np.float32), "preprocessed NCHW float, used as is"


def load_array_file(path: str | os.PathLike, count: int | None = None, size: int | None = None) -> ImageSet:
    """A .npy batch, or a .npz whose arrays are batches (concatenated in key order; a `labels` key
    holding a 1-D integer array supplies labels)."""
    path = Path(path)
    if not path.is_file():
        _fail(f"no such data file: {path}")
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as exc:
        _fail(f"cannot read {path} as numpy data: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    labels = None
    if isinstance(loaded, np.ndarray):
        arrays = [loaded]
    else:
        with loaded:
            keys = sorted(loaded.files)
            if "labels" in keys:
                labels = np.asarray(loaded["labels"]).astype(np.int64).reshape(-1)
                keys.remove("labels")
            arrays = [loaded[k] for k in keys]
        if not arrays:
            _fail(f"{path} holds no image arrays")
    converted = [_as_nchw_float(a, f"{path}", size) for a in arrays]
    data = np.concatenate([c[0] for c in converted])
    if len(data) == 0:
        _fail(f"{path} holds no images")
    if labels is not None and len(labels) != len(data):
        _fail(f"{path}: {len(labels)} labels for {len(data)} images")
    if count is not None:
        data = data[:count]
        labels = None if labels is None else labels[:count]
    if not np.isfinite(data).all():
        _fail(f"{path}: the images hold NaN or infinite values: give finite images")
    what = f"{len(data)} images from {path} ({converted[0][1]})"
    return ImageSet(len(data), data.shape[2], what, labels, lambda a, b: data[a:b])


DEFAULT_LABEL_SPACE = "trtfuse-default-photos"
# The first trtfuse.models weight recipe whose classifier is trained on the default data's photo classes.
_FIRST_LABELLED_RECIPE = 2


def labels_apply_to(images: ImageSet, model) -> bool:
    """Whether `images.labels` are classes of `model`'s output. The user's own labels are taken at their word;
    the default data's photo classes mean something only to a model of trtfuse.models whose classifier was
    trained on them (metadata `trtfuse.weights_recipe` >= 2), not to an ImageNet-trained ResNet."""
    if images.labels is None:
        return False
    if images.label_space != DEFAULT_LABEL_SPACE:
        return True
    props = {p.key: p.value for p in getattr(model, "metadata_props", [])}
    try:
        return int(props.get("trtfuse.weights_recipe", "0")) >= _FIRST_LABELLED_RECIPE
    except ValueError:
        return False


def check_fits_in_memory(count: int, size: int, what: str = "--count") -> None:
    """Refuse, before allocating, a float32 [count, 3, size, size] array larger than the machine's memory."""
    import os

    need = count * 3 * size * size * 4
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > total:
        _fail(f"{what} {count}: {count} images of 3x{size}x{size} need {need / 2**30:.1f} GiB, more than this "
              f"machine's {total / 2**30:.1f} GiB")


def load_default(count: int, size: int = 224, split: str = "calib", seed: int = 0) -> ImageSet:
    data = default_images(count, size=size, seed=seed, split=split)
    photos, _ = _split_photos(split)
    what = (f"{count} embedded default views ({split} split: crops/flips of {len(photos)} scikit-image photos, "
            "labelled by photo)")
    return ImageSet(count, size, what, default_labels(count, split), lambda a, b: data[a:b],
                    label_space=DEFAULT_LABEL_SPACE)


def load_data(spec: str, count: int | None = None, size: int = 224, split: str = "calib") -> ImageSet:
    """`--data` as the CLI takes it: `default`, a folder of images, or a .npy/.npz file."""
    if spec == "default":
        return load_default(512 if count is None else count, size=size, split=split)
    path = Path(spec)
    if path.is_dir():
        return load_image_folder(path, count, size)
    if path.suffix in (".npy", ".npz"):
        return load_array_file(path, count, size)
    if not path.exists():
        _fail(f"--data {spec}: no such file or folder (give a folder of images, a .npy/.npz file, or 'default')")
    _fail(f"--data {spec}: not a folder, .npy or .npz file")
