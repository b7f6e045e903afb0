"""Validation shared by every subcommand: argument types, input and output paths, numbers.

Everything a user can get wrong is checked here, before any work starts, and reported as one line
(`trtfuse: error: ...`, exit 2). The CLI applies two layers:

* `harden(parser)` walks every (sub)parser once it is built: plain `type=int` / `type=float` options
  become checked types (finite numbers; counts, sizes, durations and rates in `POSITIVE` must be > 0),
  so a command cannot forget a range check and NaN never reaches the code. The flags several commands
  share are declared with their checked types already (trtfuse.args), so harden leaves them as they are.
* path checks (`check_input_file`, `check_output_file`, `check_output_dir`) that commands call up front
  and that `trtfuse.io` repeats at write time.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
from pathlib import Path

from .errors import TrtfuseError

# Destinations of a command's own options that are counts, sizes, durations or rates: they must be > 0. (--count,
# --batch, --streams, --seconds and the other shared flags get theirs from trtfuse.args.)
POSITIVE = {"calib_images", "eval_count", "expected_qps", "slots", "budget", "bn_images"}


def _number(text: str, kind: type, positive: bool, flag: str):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    if positive and value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}" if kind is int else f"must be greater than 0, got {text}")
    return value


def number_type(kind: type, positive: bool, flag: str = "value"):
    def parse(text: str):
        return _number(text, kind, positive, flag)

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    parse._trtfuse_checked = True
    return parse


def positive_int(flag: str = "value"):
    return number_type(int, True, flag)


def positive_float(flag: str = "value"):
    return number_type(float, True, flag)


def harden(parser: argparse.ArgumentParser) -> None:
    """Replace plain int/float option types by checked ones, recursively through subparsers."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                harden(sub)
            continue
        flag = action.option_strings[-1] if action.option_strings else action.dest
        if action.type in (int, float):
            action.type = number_type(action.type, action.dest in POSITIVE, flag)


# ---- paths -------------------------------------------------------------------------------------------

def _describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_input_file(path: str | os.PathLike, what: str = "model") -> Path:
    """An existing, readable regular file (a directory or a device is named as such)."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise TrtfuseError(f"no such {what} file: {path}") from None
    except OSError as exc:
        raise TrtfuseError(f"cannot read {what} {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        article = "an" if what[:1] in "aeiou" else "a"
        raise TrtfuseError(f"{what} {path} is {_describe(st.st_mode)}, not {article} {what} file")
    if not os.access(path, os.R_OK):
        raise TrtfuseError(f"cannot read {what} {path}: permission denied")
    return path


def _check_folder(folder: Path, what: str, path) -> None:
    if not folder.exists():
        raise TrtfuseError(f"{what} {path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise TrtfuseError(f"{what} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TrtfuseError(f"{what} {path}: folder {folder} is not writable")


def check_output_file(path: str | os.PathLike, what: str = "output") -> Path:
    """A path an output file may be written to (atomically, by rename): missing, or an existing regular
    file (through symlinks), in an existing writable folder. Returns the path to rename onto."""
    path = Path(path)
    if str(path) in ("", "."):
        raise TrtfuseError(f"{what}: empty path")
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    if target.exists() or target.is_symlink():
        try:
            mode = target.stat().st_mode
        except OSError as exc:
            raise TrtfuseError(f"{what} {path}: {exc.strerror}") from None
        if stat.S_ISDIR(mode):
            raise TrtfuseError(f"{what} {path} is a directory: give a file name")
        if not stat.S_ISREG(mode):
            raise TrtfuseError(f"{what} {path} exists and is {_describe(mode)}: refusing to replace it, give a file name")
    _check_folder(target.parent if str(target.parent) else Path("."), what, path)
    return target


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """A folder outputs may go into: an existing writable folder, or a missing one whose parent is."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise TrtfuseError(f"{what} {path} exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise TrtfuseError(f"{what} {path} is not writable")
        return path
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    _check_folder(parent, what, path)
    return path


def make_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    path = check_output_dir(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrtfuseError(f"cannot create {what} {path}: {exc.strerror}") from None
    return path


def check_outputs_distinct(inputs, outputs) -> None:
    """No output may be an input or another output (compared by path, and by inode where both exist)."""
    seen: dict[str, str] = {}
    for name in inputs:
        if name:
            seen[os.path.realpath(name)] = f"the input {name}"
    for name in outputs:
        if not name:
            continue
        real = os.path.realpath(name)
        if real in seen:
            raise TrtfuseError(f"refusing to overwrite {seen[real]} with output {name}: choose another path")
        seen[real] = f"the output {name}"
