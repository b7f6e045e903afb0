"""`trtfuse` console command: Polygraphy-style subcommands.

Each subcommand lives beside the code it drives (`trtfuse/models/cli.py`, `trtfuse/graph_passes/cli.py`,
...) and exposes `register(subparsers)`, which adds its parser and sets `func(args) -> int`.
Heavy imports happen inside `func`, so `trtfuse --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .errors import TrtfuseError

# Order here is the order `trtfuse --help` lists them: the workflow order.
SUBCOMMAND_MODULES = [
    "trtfuse.models.cli",
    "trtfuse.graph_passes.cli",
    "trtfuse.calib.cli",
    "trtfuse.runtime.cli",
    "trtfuse.runtime.triton_cli",
    "trtfuse.bench.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtfuse",
        description="INT8 residual-CNN toolkit: models -> rewrite -> calibrate -> build -> run/offline.",
    )
    parser.add_argument("--version", action="version", version=f"trtfuse {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for unexpected errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    debug = args.debug or os.environ.get("TRTFUSE_DEBUG") == "1"
    try:
        return int(args.func(args) or 0)
    except TrtfuseError as exc:
        print(f"trtfuse: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trtfuse: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an unexpected failure is still one line unless --debug
        if debug:
            raise
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"trtfuse: internal error: {type(exc).__name__}: {msg} (rerun with --debug for a traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
