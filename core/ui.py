"""Terminal output shared by every subcommand: summary tables, progress bars, --json."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    rows = [["" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)) for v in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, v in enumerate(r):
            widths[i] = max(widths[i], len(v))
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], file=None) -> None:
    print(format_table(headers, rows), file=file or sys.stdout)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


def progress(iterable=None, total=None, desc: str = "", enabled: bool = True, unit: str = "it"):
    """A tqdm bar on stderr (silent when stderr is not a terminal and TRTFUSE_PROGRESS is unset)."""
    import os

    from tqdm import tqdm

    forced = os.environ.get("TRTFUSE_PROGRESS")
    disable = (not enabled) or (forced == "0") or (forced is None and not sys.stderr.isatty())
    return tqdm(iterable, total=total, desc=desc, disable=disable, unit=unit, file=sys.stderr, leave=False)


def warn(message: str) -> None:
    """One line on stderr for something the user should know that does not stop the command."""
    print(f"trtfuse: warning: {message}", file=sys.stderr)
