"""The channel-major wgmma epilogue's paired staging (plugins/kernels/wgmma_epilogue.cuh), replayed on the CPU.

Without a residual, the thread holding accumulator rows c_lo and c_lo + 8 (c_lo = 16w + g) writes that pair of
one pixel as two adjacent bytes at 16w + 2g (requantize_to_paired_staging: `cells + lane / 4` from column c_lo),
and the deferred 16-byte stores restore the channel order with `unpair_16_channels`' four PRMTs. The selectors
are read from the kernel source, so a wrong one fails here, before any GPU run."""

import re

import numpy as np

from trtfuse.plugins.nvrtc import KERNEL_DIR


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte (sel >> 4i) & 7 of the 8 bytes b:a."""
    src = (b << 32) | a
    out = 0
    for i in range(4):
        k = (sel >> (4 * i)) & 0x7
        out |= ((src >> (8 * k)) & 0xFF) << (8 * i)
    return out


def unpair_selectors() -> list[tuple[str, str, int]]:
    source = (KERNEL_DIR / "wgmma_epilogue.cuh").read_text()
    body = source[source.index("int4 unpair_16_channels(int4 v)"):]
    body = body[:body.index("\n}\n")]
    calls = re.findall(r"prmt\(v\.([xyzw]), v\.([xyzw]), (0x[0-9a-fA-F]+)\)", body)
    assert len(calls) == 4, body
    return [(a, b, int(sel, 16)) for a, b, sel in calls]


def staged_position(channel: int) -> int:
    """Where requantize_to_paired_staging puts channel g + 8h of a 16-channel group: byte 2g + h."""
    g, h = channel % 8, channel // 8
    return 2 * g + h


def test_unpair_restores_channel_order():
    assert sorted(staged_position(c) for c in range(16)) == list(range(16))
    rng = np.random.default_rng(0)
    selectors = unpair_selectors()
    for _ in range(20):
        channels = rng.integers(0, 256, 16, dtype=np.uint8)
        staged = np.zeros(16, dtype=np.uint8)
        for c in range(16):
            staged[staged_position(c)] = channels[c]
        words = dict(zip("xyzw", staged.view("<u4").tolist()))
        out = [prmt(words[a], words[b], sel) for a, b, sel in selectors]
        assert np.array(out, dtype="<u4").view(np.uint8).tolist() == channels.tolist()
