"""Is the access pattern of the wgmma epilogue what caps the residual 1x1 layers? Times
bench/probe_kernels/stream_probe.cu (no math, no tensor cores) on res3 conv3's output tensor at batch 256
(device only):

    python3 -m trtfuse.bench.stream_probe [--out FILE]

  flat                 y = r + 1 over the whole tensor (16-byte grid-stride): the pattern-free rate
  tiles a{A} s{S} ...  the kernel's tile walk and lane map: residual slice one tile ahead (a1) or waited
                       for at once (a0), 8- or 16-byte stores, `spin` clocks per tile for the main loop,
                       `x2` two CTAs per SM

Every variant's output is checked (y == r + 1 on every byte) before it is timed.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import sys

from trtfuse import args as flags
from ..io import atomic_write_json
from ..plugins.tactics import TACTICS_BY_ID, ConvShape
from . import PROBE_KERNEL_DIR

RES3_CONV3 = ConvShape(256, 128, 28, 28, 512, 1, 1)
# The pixel-major tiles whose walk the probe replays, by channel blocks per tile: w42 (128 pixels x 256
# channels), w41 (128 x 128).
TILE_TACTIC = {8: 42, 4: 41}


class ProbeGeometry(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("n", "kblocks", "oh", "ow", "th", "tiles_per_image", "ch_tiles", "tiles")]
    _fields_ += [("spin", ctypes.c_int64)]


def geometry(shape: ConvShape, blocks: int, spin: int) -> ProbeGeometry:
    """The kernel's own tile geometry (WgmmaTactic.geometry) for the tactic with `blocks` channel blocks per tile."""
    g = TACTICS_BY_ID[TILE_TACTIC[blocks]].geometry(shape)
    assert g.nb == 1, "the probe walks tiles of whole output rows of one image"
    oh, ow = shape.out_hw
    return ProbeGeometry(shape.n, shape.k // 32, oh, ow, g.th, g.tiles_per_image, g.ch_tiles, g.ctas, spin)


def main(argv=None) -> int:
    import torch

    from ..plugins import cuda_driver as cd
    from .kernels import graph_time_ms

    ap = argparse.ArgumentParser()
    flags.out(ap)
    ap.add_argument("--spin", type=int, nargs="+", default=[0, 2500], help="clocks per tile standing in for the main loop")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    torch.cuda.init()
    cd.context()
    sms = cd.device_attribute("MULTIPROCESSOR_COUNT")
    layer = RES3_CONV3
    nbytes = layer.n * layer.k * layer.out_hw[0] * layer.out_hw[1]
    r = torch.randint(-128, 128, (nbytes,), dtype=torch.int8, device="cuda")
    y = torch.empty_like(r)
    expected = (r.view(torch.uint8).to(torch.int16) + 1).remainder(256).to(torch.uint8)
    rows = []

    def record(label, launch_once):
        y.fill_(0x55)
        launch_once()
        torch.cuda.synchronize()
        if not torch.equal(y.view(torch.uint8), expected):
            raise SystemExit(f"stream_probe: {label} wrote a wrong or incomplete output")
        ms = graph_time_ms(torch, launch_once, 15)
        rows.append({"variant": label, "ms": round(ms, 4), "tb_per_s": round(2 * nbytes / ms / 1e9, 2)})
        print(f"{label:32s} {ms:8.4f} ms  {2 * nbytes / ms / 1e9:5.2f} TB/s (read + write)", flush=True)

    flat = cd.kernel_module("stream_probe.cu", include_dirs=(PROBE_KERNEL_DIR,)).function("probe_flat")
    n16 = ctypes.c_int64(nbytes // 16)
    rp, yp = ctypes.c_uint64(r.data_ptr()), ctypes.c_uint64(y.data_ptr())
    record("flat", lambda: cd.launch(flat, (sms * 4, 1, 1), (512, 1, 1), 0, torch.cuda.current_stream().cuda_stream,
                                     [ctypes.addressof(rp), ctypes.addressof(yp), ctypes.addressof(n16)]))
    smem = 2 * 8 * 16 * 32 * 8
    for blocks in (8, 4):
        for ahead in (1, 0):
            for store in (8, 16):
                fn = cd.kernel_module("stream_probe.cu", {"PROBE_AHEAD": ahead, "PROBE_STORE": store,
                                                          "PROBE_BLOCKS": blocks},
                                     include_dirs=(PROBE_KERNEL_DIR,)).function("probe_tiles", smem)
                for spin in args.spin:
                    for per_sm in (1, 2):
                        if blocks == 4 and (store == 16 or per_sm == 2):
                            continue
                        geo = geometry(layer, blocks, spin)
                        ctas = min(geo.tiles, sms * per_sm)
                        ctas -= ctas % geo.ch_tiles
                        label = f"tiles b{blocks} a{ahead} s{store} spin{spin}" + (" x2" if per_sm == 2 else "")
                        record(label, lambda fn=fn, geo=geo, ctas=ctas: cd.launch(
                            fn, (ctas, 1, 1), (256, 1, 1), smem, torch.cuda.current_stream().cuda_stream,
                            [ctypes.addressof(rp), ctypes.addressof(yp), ctypes.addressof(geo)]))
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "layer": "res3 conv3 output, batch 256", "bytes_each_way": nbytes,
              "command": "python3 -m trtfuse.bench.stream_probe" + (" " + " ".join(argv) if argv else ""), "rows": rows}
    if args.out:
        atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
