"""On-disk cache of built models, so test suites and tools don't rebuild ResNet-50 again and again.

A model lives at `<cache>/models/<arch>-<key>.onnx`, where <cache> is $TRTFUSE_CACHE or ~/.cache/trtfuse
and <key> hashes the full option set, the weight recipe's version (`weights.WEIGHTS_RECIPE`) and the source
of everything that shapes the weights (this package's generator modules and the image data module), so
editing the generator invalidates old entries by itself; the explicit version also separates recipes whose
source hashes could not tell apart (a change of the data's photographs, say). Entries are written
atomically; concurrent builders at worst build twice.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

_GENERATOR_MODULES = ("resnet.py", "weights.py", "numpy_ops.py", "builder.py")


def cache_dir() -> Path:
    root = os.environ.get("TRTFUSE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "trtfuse"


def _generator_fingerprint() -> str:
    import trtfuse.calib.data as data

    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in [here / name for name in _GENERATOR_MODULES] + [Path(data.__file__)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(arch: str, options: dict) -> str:
    from .builder import resolve_options
    from .weights import WEIGHTS_RECIPE

    payload = json.dumps({"arch": arch, "options": resolve_options(options), "recipe": WEIGHTS_RECIPE,
                          "generator": _generator_fingerprint()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def cached_model_path(arch: str, progress=None, **options) -> Path:
    """Path of the cached ONNX file for (arch, options), building and storing it first if absent."""
    from trtfuse.io import save_model

    from .builder import build

    path = cache_dir() / "models" / f"{arch}-{cache_key(arch, options)}.onnx"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        save_model(build(arch, progress=progress, **options), path, check=False)  # build() already checked it
    return path


def load_cached_model(arch: str, **options):
    """The ModelProto for (arch, options), from the disk cache (built on first use)."""
    import onnx

    return onnx.load(str(cached_model_path(arch, **options)))
