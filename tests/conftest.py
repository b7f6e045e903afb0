"""Suite-wide setup: the tests' model and kernel cache.

Tests build models (`trtfuse.models.cache`) and compile kernels (`plugins/nvrtc.py`) into $TRTFUSE_CACHE,
else ~/.cache/trtfuse, which a full run fills with over a gigabyte. Unless TRTFUSE_CACHE is set (to keep a
warm cache between runs on purpose), the suite uses a temporary folder of its own and removes it at the end,
so a test run leaves nothing in the user's home.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

_OWN_CACHE: str | None = None


def _terminate(signum, frame):
    raise KeyboardInterrupt


def pytest_configure(config):
    global _OWN_CACHE
    if not os.environ.get("TRTFUSE_CACHE"):
        _OWN_CACHE = tempfile.mkdtemp(prefix="trtfuse-test-cache-")
        os.environ["TRTFUSE_CACHE"] = _OWN_CACHE
        # a run stopped by SIGTERM (a CI timeout, `timeout`) ends like Ctrl-C, so the cache is still removed
        signal.signal(signal.SIGTERM, _terminate)


def pytest_unconfigure(config):
    global _OWN_CACHE
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
        os.environ.pop("TRTFUSE_CACHE", None)
        _OWN_CACHE = None
