"""Reading models defensively and writing every output atomically.

Outputs are written to a temporary file in the destination folder and renamed into place, so a
crash never leaves a half-written file, and the input model is never opened for writing.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import TrtfuseError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Write through a temporary file in the destination folder, then rename it onto `path`.

    An existing output that is not a regular file (a device such as /dev/null, a pipe, a directory) is
    refused: a rename would replace it. A symlink to a regular file is written through. The file gets
    the mode a plain open() would give it (0666 less the umask), or keeps an existing file's mode."""
    from .validate import check_output_file

    target = check_output_file(path)
    folder = target.parent if str(target.parent) else Path(".")
    try:
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
    except OSError as exc:
        raise TrtfuseError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise TrtfuseError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    return _atomic_write(path, write)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def check_not_same_file(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Refuse to overwrite the input model with an output."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and src.exists() and (os.path.samefile(src, dst) or os.path.realpath(src) == os.path.realpath(dst)):
        raise TrtfuseError(f"refusing to overwrite the input model {src}: choose another output path")


def load_model(path: str | os.PathLike, check: bool = True):
    """Load an ONNX model, turning every way it can be broken into a one-line TrtfuseError."""
    import onnx

    from .validate import check_input_file

    path = check_input_file(path, "model")
    try:
        model = onnx.load(str(path), load_external_data=True)
    except Exception as exc:  # protobuf raises DecodeError and others on truncated files
        raise TrtfuseError(f"cannot parse {path} as ONNX ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'truncated or not an ONNX file'})") from None
    if len(model.graph.node) == 0:
        raise TrtfuseError(f"{path} holds no graph nodes (truncated or not an ONNX model)")
    if check:
        try:
            onnx.checker.check_model(model)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TrtfuseError(f"{path} is not a valid ONNX model: {first}") from None
    return model


def save_model(model, path: str | os.PathLike, check: bool = True) -> Path:
    """Validate with onnx.checker, then write atomically."""
    import onnx

    from .validate import check_output_file

    check_output_file(path)  # before the checker, so a bad path is not blamed on the model
    if check:
        onnx.checker.check_model(model)
    data = model.SerializeToString()
    return atomic_write_bytes(path, data)


def plugin_ops(model) -> list[str]:
    """The trtfuse plugin node types in `model` (empty for a plain ONNX model)."""
    return sorted({n.op_type for n in model.graph.node if n.domain == "trtfuse"})


def check_plain_model(model, path, role: str) -> None:
    """Refuse a rewritten (int8, trtfuse plugin nodes) model where an ordinary fp32 model is needed."""
    ops = plugin_ops(model)
    if ops:
        raise TrtfuseError(f"{path} is a rewritten int8 model (trtfuse {', '.join(ops)} nodes); the {role} must be "
                           f"the original fp32 model")
