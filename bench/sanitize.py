"""Small fused-conv launches for compute-sanitizer (memcheck, racecheck): every tactic, split-K,
residual and padding paths, the stem + max-pool kernel, the fused bottleneck block, the chain kernel (with the
downsample inside too), the network's tail (average pool, classifier, top-1), each checked against the golden reference.

    compute-sanitizer --tool memcheck python3 -m trtfuse.bench.sanitize [conv maxpool stem_pool bottleneck chain tail]

Named groups run only those (default: all).
"""

import sys

import numpy as np

from ..plugins.conv import ConvLaunch
from ..plugins.tactics import TACTICS, ConvShape
from .conv_problem import ConvProblem, DeviceConv, compare, passes_lsb_rule


def main(groups=None) -> int:
    groups = set(groups or GROUPS)
    unknown = groups - set(GROUPS)
    if unknown:
        print(f"sanitize: unknown group(s) {', '.join(sorted(unknown))}; known: {', '.join(GROUPS)}")
        return 2
    passed = [GROUPS[name]() for name in GROUPS if name in groups]
    return 0 if all(passed) else 1


def conv_cases() -> bool:
    """Every fused-conv tactic on a small shape (persistent ones also on one with more tiles than CTAs), split-K."""
    cases = []
    for t in TACTICS:
        c, in_vec = {4: (3, 0), 16: (12, 16), 32: (40, 0)}[t.vec]
        cases.append((ConvShape(1, c, 9, 7, 40, 3, 3, (2, 1), (1, 1, 1, 1), in_vec), True, t.id, 1))
        if t.persistent:  # more tiles than resident CTAs would be needed to loop; a wide shape gives several
            cases.append((ConvShape(4, c, 24, 24, 96, 1, 1, (1, 1), (0, 0, 0, 0), in_vec), True, t.id, 1))
    cases.append((ConvShape(1, 64, 5, 5, 64, 3, 3, (1, 1), (1, 1, 1, 1)), True, 4, 3))
    bad = 0
    for shape, res, tid, splits in cases:
        p = ConvProblem.random(shape, res, seed=1)
        out, _ = DeviceConv(p, ConvLaunch.plan(shape, tid, splits)).run_checked()
        stats = compare(out, p.golden())
        ok = passes_lsb_rule(stats)
        bad += not ok
        print(f"tactic {tid} splits {splits} {shape}: {'ok' if ok else 'MISMATCH'} {stats}")
    return not bad


def device_maxpool(x, k: int, stride: int, pad: int):
    """plugins/network_ops.maxpool on int8 NCHW `x` (packed to CHW32, output poisoned first):
    (its output unpacked to NCHW, the (OH, OW) the launcher returned)."""
    from ..plugins import cuda_driver as cd
    from ..plugins import network_ops
    from ..plugins.layout import pack_nchwv, round_up, unpack_nchwv

    n, c, h, w = x.shape
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    xb = cd.DeviceBuffer.from_array(pack_nchwv(x, 32))
    yb = cd.DeviceBuffer(n * round_up(c, 32) * oh * ow)
    yb.fill(0x5A)
    returned = network_ops.maxpool(xb.ptr, n, c, h, w, k, stride, pad, yb.ptr)
    return unpack_nchwv(yb.download((n, round_up(c, 32) // 32, oh, ow, 32), np.int8), c), returned


def maxpool_cases() -> bool:
    """The network max-pool (plugins/network_ops.py) on a small shape and several windows."""
    from ..plugins import reference as ref

    ok = True
    x = np.random.default_rng(1).integers(-128, 128, (2, 40, 9, 11), dtype=np.int8)
    for k, stride, pad in ((3, 2, 1), (2, 2, 0), (3, 1, 1)):
        same = np.array_equal(device_maxpool(x, k, stride, pad)[0], ref.maxpool_int8(x, k, stride, pad))
        ok &= same
        print(f"maxpool k{k} s{stride} p{pad}: {'ok' if same else 'MISMATCH'}")
    return ok


def stem_pool_cases() -> bool:
    """The fused stem + max-pool (plugins/stem.py) on small images: one whole tile, partial tiles, more tiles than
    resident CTAs (the persistent loop); every other tile the GPU runs (on Hopper the row tiles of stem_pool_rows.cu)."""
    from ..plugins import cuda_driver as cd
    from ..plugins import stem
    from .conv_problem import DeviceStemPool

    ok = True
    cases = [(use_wgmma, stem.POOL_TILE, shape) for use_wgmma in (None, False)  # the device's variant, and mma.sync
             for shape in ((1, 32, 56), (2, 9, 13), (300, 9, 13))]
    tiles = stem.pool_tiles(cd.compute_capability(cd.current_device()))
    cases += [(None, tile, (2, 37, 61)) for tile in tiles if tile != stem.POOL_TILE]
    for use_wgmma, tile, (n, h, w) in cases:
        p = ConvProblem.random(ConvShape(n, 3, h, w, 64, 7, 7, (2, 2), (3, 3, 3, 3)), False, seed=1)
        dev = DeviceStemPool(p, use_wgmma, tile)
        stats = compare(dev.run_checked()[0], dev.golden())
        ok &= passes_lsb_rule(stats)
        label = ("mma.sync" if use_wgmma is False else "default") + f" tile {stem.tile_name(tile)}"
        print(f"stem_pool {label} {n}x3x{h}x{w}: {'ok' if passes_lsb_rule(stats) else 'MISMATCH'} {stats}")
    # the row tiles with the next 1x1 conv inside (STEM_POOL_ROWS_CONV1): both outputs exact
    for tile in (t for t in tiles if t in stem.ROW_TILES):
        for n, h, w in ((1, 32, 56), (2, 37, 61), (300, 9, 13)):
            shape = ConvShape(n, 3, h, w, 64, 7, 7, (2, 2), (3, 3, 3, 3))
            ph, pw = stem.pooled_hw(shape)
            conv1 = ConvProblem.random(ConvShape(n, 64, ph, pw, 64, 1, 1, residual=False), False, seed=2)
            dev = DeviceStemPool(ConvProblem.random(shape, False, seed=1), tile=tile, conv1=conv1)
            pooled = compare(dev.run_checked()[0], dev.golden())
            stats = compare(dev.conv1_output()[0], dev.conv1.golden())
            good = pooled["exact_fraction"] == 1.0 and stats["exact_fraction"] == 1.0
            ok &= good
            print(f"stem_pool + conv1 tile {stem.tile_name(tile)} {n}x3x{h}x{w}: {'ok' if good else 'MISMATCH'} {stats}")
    return ok


def bottleneck_cases() -> bool:
    """The fused identity bottleneck (plugins/bottleneck.py) on small images: one whole tile, partial tiles, more tiles
    than resident CTAs (the persistent loop and, with two patch buffers, its prefetch)."""
    from ..plugins import bottleneck
    from ..plugins import cuda_driver as cd
    from .conv_problem import BottleneckProblem, DeviceBottleneck

    refused = bottleneck.device_refusal(cd.device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", cd.current_device()))
    if refused:
        print(f"bottleneck: skipped, {refused}")
        return True
    ok = True
    for n, h, w in ((1, 8, 14), (2, 9, 13), (150, 9, 13)):
        p = BottleneckProblem.random(n, h, w, seed=1)
        stats = compare(DeviceBottleneck(p).run_checked()[0], p.golden())
        ok &= passes_lsb_rule(stats)
        print(f"bottleneck {n}x256x{h}x{w}: {'ok' if passes_lsb_rule(stats) else 'MISMATCH'} {stats}")
    return ok


def chain_cases() -> bool:
    """The chain kernel (plugins/chain_conv.py) on Hopper: every build on a small map (a last tile of 8 pixels, one-group
    boxes) and on one whose CTAs walk several tiles, y stored whole and at stride 2, against the golden pair."""
    from ..plugins import chain_conv
    from .conv_problem import ChainProblem, DeviceChain

    refused = chain_conv.device_refusal()
    if refused:
        print(f"chain: skipped, {refused}")
        return True
    ok = True
    builds = [(key, 0) for key in chain_conv.VARIANTS] + [(key, v.ds_k) for key, v in chain_conv.DOWNSAMPLE_VARIANTS.items()]
    for (k1, c1, c2), ds_k in builds:
        for (n, h, w), max_ctas, y_stride in (((1, 9, 8), None, 1), ((2, 16, 16), 2, 1), ((1, 9, 8), None, 2), ((2, 16, 16), 2, 2)):
            problem = ChainProblem.random(n, h, w, c2, seed=1, k1=k1, c1=c1, ds_k=ds_k)
            y, z, _, _ = DeviceChain(problem, max_ctas=max_ctas, y_stride=y_stride).run_checked()
            y_ref, z_ref = problem.golden()
            same = np.array_equal(y, y_ref[:, :, ::y_stride, ::y_stride]) and np.array_equal(z, z_ref)
            ok &= same
            print(f"chain {k1}-{c1}-{c2}{f'-ds{ds_k}' if ds_k else ''} {n}x{h}x{w} y stride {y_stride}: {'ok' if same else 'MISMATCH'}")
    return ok


def tail_cases() -> bool:
    """The network's tail kernels (plugins/network_ops.py) on small ragged shapes: the int8 and fp32 average pools, the
    fp32 classifier (its vector loads and, on a misaligned x, its scalar ones), the top-1, and the classifier computing
    the top-1 in its own launch on either tile (its atomics and last-CTA decode)."""
    from ..plugins import cuda_driver as cd
    from ..plugins import network_ops
    from ..plugins import reference as ref
    from ..plugins.layout import pack_nchwv, round_up

    rng = np.random.default_rng(1)
    sync = lambda: cd.check(cd._driver().cuCtxSynchronize())
    ok = True
    n, c, h, w = 3, 40, 7, 5
    x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    s_in, s_out = np.array([0.05], np.float32), np.array([0.013], np.float32)
    xb, s_in_b, s_out_b = (cd.DeviceBuffer.from_array(a) for a in (pack_nchwv(x, 32), s_in, s_out))
    ab, fb = cd.DeviceBuffer(n * round_up(c, 32)), cd.DeviceBuffer(n * c * 4)
    ab.fill(0x5A)
    fb.fill(0x5A)
    network_ops.global_avgpool(xb.ptr, s_in_b.ptr, s_out_b.ptr, n, c, h, w, ab.ptr)
    network_ops.global_avgpool_f32(xb.ptr, s_in_b.ptr, n, c, h, w, fb.ptr)
    sync()
    same = np.array_equal(ab.download((n, round_up(c, 32)), np.int8)[:, :c], ref.global_avgpool_int8(x, s_in[0], s_out[0]))
    mean = x.astype(np.int64).sum(axis=(2, 3)).astype(np.float32) / np.float32(h * w) * s_in[0]
    same &= np.array_equal(fb.download((n, c), np.float32).view(np.int32), mean.view(np.int32))
    print(f"avgpool {n}x{c}x{h}x{w}: {'ok' if same else 'MISMATCH'}")
    ok &= same
    for (m, classes, k), offset in (((33, 70, 64), 0), ((9, 70, 48), 4), ((5, 7, 37), 0)):
        xs = rng.normal(size=(m, k)).astype(np.float32)
        ws = rng.normal(size=(classes, k)).astype(np.float32)
        bias = rng.normal(size=classes).astype(np.float32)
        xb = cd.DeviceBuffer.from_array(np.concatenate([np.zeros(offset // 4, np.float32), xs.ravel()]))
        wb, bb, yb = cd.DeviceBuffer.from_array(ws), cd.DeviceBuffer.from_array(bias), cd.DeviceBuffer(m * classes * 4)
        yb.fill(0xFF)
        network_ops.linear_f32(xb.ptr + offset, wb.ptr, bb.ptr, m, classes, k, yb.ptr)
        sync()
        logits = yb.download((m, classes), np.float32)
        same = np.array_equal(logits.view(np.uint32), ref.linear_f32(xs, ws, bias).view(np.uint32))
        tb = cd.DeviceBuffer(4 * m)
        tb.fill(0x7F)
        network_ops.argmax_rows(yb.ptr, m, classes, tb.ptr)
        sync()
        same &= np.array_equal(tb.download(m, np.int32), np.argmax(logits, axis=1))
        print(f"linear_f32 {m}x{classes}x{k} (x offset {offset} bytes) + top-1: {'ok' if same else 'MISMATCH'}")
        ok &= same
        keys, done = network_ops.linear_top1_scratch(m)  # the classifier ranking its own logits, twice on one scratch
        for tile in ("narrow", "wide"):
            for _ in range(2):
                yb.fill(0xFF)
                tb.fill(0x7F)
                network_ops.linear_f32(xb.ptr + offset, wb.ptr, bb.ptr, m, classes, k, yb.ptr, tile=tile, top1=tb.ptr,
                                       top1_keys=keys.ptr, row_block_done=done.ptr)
                sync()
                same = np.array_equal(yb.download((m, classes), np.float32).view(np.uint32), logits.view(np.uint32))
                same &= np.array_equal(tb.download(m, np.int32), np.argmax(logits, axis=1))
                same &= not keys.download(m, np.uint64).any() and not done.download(done.nbytes // 4, np.uint32).any()
                print(f"linear_f32 {m}x{classes}x{k} ({tile} tile) with its top-1 in the launch: {'ok' if same else 'MISMATCH'}")
                ok &= same
    return ok


GROUPS = {"conv": conv_cases, "maxpool": maxpool_cases, "stem_pool": stem_pool_cases, "bottleneck": bottleneck_cases,
          "chain": chain_cases, "tail": tail_cases}

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
