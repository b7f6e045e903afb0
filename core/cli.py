"""`trtfuse` console command: Polygraphy-style subcommands.

Each subcommand lives beside the code it drives (`trtfuse/models/cli.py`, `trtfuse/graph_passes/cli.py`,
...) and exposes `register(subparsers)`, which adds its parser and sets `func(args) -> int`.
Heavy imports happen inside `func`, so `trtfuse --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys

from . import __version__
from . import args as flags
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
# The order `trtfuse --help` lists the subcommands in: the README's workflow order.
WORKFLOW = ["models", "calibrate", "rewrite", "evaluate", "calibrate-compare", "run", "build", "offline", "bench"]
# Serving on Triton Inference Server (README's "Serving" section), listed after the workflow.
SERVING = ["serve", "server", "export-triton"]


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`trtfuse: error: ...`, exit 2) like every other error."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        sub = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        where = f"{sub}: " if sub else ""
        hint = f"trtfuse {sub} --help" if sub else "trtfuse --help"
        self.exit(2, f"trtfuse: error: {where}{message} (see {hint})\n")


def _add_debug_everywhere(parser: argparse.ArgumentParser) -> None:
    """--debug after the subcommand too (`trtfuse rewrite m.onnx --debug`), not only before it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                if "--debug" not in sub._option_string_actions:
                    flags.debug(sub, after_subcommand=True)
                _add_debug_everywhere(sub)


def build_parser() -> argparse.ArgumentParser:
    from .validate import harden

    parser = Parser(
        prog="trtfuse",
        description="INT8 residual-CNN toolkit. Workflow: models -> calibrate -> rewrite -> evaluate -> run "
        "(cpu | cuda) -> build (TensorRT) -> offline (MLPerf LoadGen); bench for benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"trtfuse {__version__}")
    flags.debug(parser, "show tracebacks for unexpected errors (before or after the subcommand)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    rank = {name: i for i, name in enumerate(WORKFLOW + SERVING)}
    sub._choices_actions.sort(key=lambda a: rank.get(a.dest, len(rank)))
    _add_debug_everywhere(parser)
    harden(parser)
    return parser


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _interrupted() -> int:
    print("trtfuse: interrupted", file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        # Ctrl-C stops every command, even one started where SIGINT was ignored (a background job of a script)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while parsing or importing
        return _interrupted()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, a usage error (already printed in one line)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    # What a record calls its command: this call's arguments, whether they came from the shell or from a caller
    # of main() (the way the console script or `python -m trtfuse.cli` was started is not part of it).
    args.command_line = shlex.join(["trtfuse", *(sys.argv[1:] if argv is None else argv)])
    if not getattr(args, "func", None):
        parser.print_help()
        print("trtfuse: error: give a subcommand (see the list above)", file=sys.stderr)
        return 2
    debug = args.debug or os.environ.get("TRTFUSE_DEBUG") == "1"
    try:
        return int(args.func(args) or 0)
    except TrtfuseError as exc:
        print(f"trtfuse: error: {_first_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted()
    except MemoryError as exc:
        if debug:
            raise
        detail = _first_line(exc)
        print(f"trtfuse: error: out of memory{': ' + detail if detail else ''} (ask for fewer images: --count, --batch)",
              file=sys.stderr)
        return 2
    except BrokenPipeError:  # `trtfuse ... | head`: the reader left, nothing to report
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 141
    except OSError as exc:
        # A file the user named or the environment refused (permissions, a full disk, a missing folder):
        # theirs to fix, so one line and exit 2 - but only when the error names the file.
        if exc.filename is None or debug:
            if debug:
                raise
            return _internal(exc)
        print(f"trtfuse: error: {exc.filename}: {exc.strerror or _first_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # an unexpected failure is still one line unless --debug
        if debug:
            raise
        return _internal(exc)


def _internal(exc: BaseException) -> int:
    print(f"trtfuse: internal error: {type(exc).__name__}: {_first_line(exc)} (rerun with --debug for a traceback)",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
