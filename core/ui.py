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


PROGRESS_INTERVAL_S = 10.0  # piped output: one progress line at most this often


def progress(iterable=None, total=None, desc: str = "", enabled: bool = True, unit: str = "it"):
    """Progress on stderr: a tqdm bar on a terminal; when stderr is piped or redirected, a plain line every
    PROGRESS_INTERVAL_S seconds (`TRTFUSE_PROGRESS_INTERVAL` overrides) and one at the end, so a long step
    is never silent in a log. TRTFUSE_PROGRESS=0 turns both off, =1 forces the bar."""
    import os

    forced = os.environ.get("TRTFUSE_PROGRESS")
    if not enabled or forced == "0":
        from tqdm import tqdm

        return tqdm(iterable, total=total, disable=True)
    if forced == "1" or sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
    try:
        interval = float(os.environ.get("TRTFUSE_PROGRESS_INTERVAL", PROGRESS_INTERVAL_S))
    except ValueError:
        interval = PROGRESS_INTERVAL_S
    return LineProgress(iterable, total, desc, unit, interval)


class LineProgress:
    """The piped form of `progress`: the tqdm calls trtfuse uses (iterate, update, close, with)."""

    def __init__(self, iterable, total, desc: str, unit: str, interval: float):
        import time

        self.iterable, self.desc, self.unit, self.interval = iterable, desc or "progress", unit, interval
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.n = total, 0
        self._clock = time.monotonic
        self._start = self._last = self._clock()
        self._closed = False

    def _line(self, final: bool = False) -> None:
        elapsed = self._clock() - self._start
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        pct = f" ({100.0 * self.n / self.total:.0f}%)" if self.total else ""
        rate = f", {self.n / elapsed:.3g} {self.unit}/s" if elapsed > 0 and self.n else ""
        print(f"{self.desc}: {done} {self.unit}{pct}, {elapsed:.0f} s{rate}{' - done' if final else ''}",
              file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self._clock()
        if now - self._last >= self.interval:
            self._last = now
            self._line()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._clock() - self._start >= self.interval:  # short steps stay quiet
                self._line(final=True)

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

def warn(message: str) -> None:
    """One line on stderr for something the user should know that does not stop the command."""
    print(f"trtfuse: warning: {message}", file=sys.stderr)
