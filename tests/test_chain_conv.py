"""The chained 1x1 convs kernel (plugins/kernels/chain_conv.cu) without a GPU: which conv pairs it takes, its params
struct against the kernel's, and its data movement replayed on the CPU: the TMA boxes of plugins/chain_conv.py's tensor
maps, the ring slot and A tile layouts with their 32-byte swizzle, the wgmma accumulator layout, the epilogues' lane map
and store offsets, exactly as chain_conv.cu computes them, must give the golden pair (fused_conv_int8 twice) with every
output byte stored once, for every variant (res2's: an A tile per consumer warpgroup, W2 resident; res3's: GEMM1 in two
passes, the A tile written over the swizzled residual in its slot, W2 resident or streamed through its ring).
tests/test_chain_conv_gpu.py checks the kernel itself on Hopper."""

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
from test_wgmma_tiling import tma_box

from trtfuse.bench.conv_problem import ChainProblem
from trtfuse.plugins import chain_conv
from trtfuse.plugins.layout import pack_nchwv, pack_weight, unpack_chw32
from trtfuse.plugins.reference import fma_f32, folded_scales
from trtfuse.plugins.tactics import ConvShape

BM = chain_conv.TILE
RES2, RES3 = (64, 256), (128, 512)  # (K1, C1)


def pair(n: int, h: int, w: int, c2: int, first=RES2) -> tuple[ConvShape, ConvShape]:
    k1, c1 = first
    return ConvShape(n, k1, h, w, c1, 1, 1), ConvShape(n, c1, h, w, c2, 1, 1)


@pytest.mark.parametrize("key", list(chain_conv.VARIANTS), ids=lambda k: chain_conv.VARIANTS[k].name)
def test_resnet50_pairs_are_taken(key):
    """res2's at 56 x 56, res3's at 28 x 28 (224 x 224 images) and at 8 x 8 (64 x 64 images: one tile per image)."""
    k1, c1, c2 = key
    for n in (1, 8, 256):
        for side in ((56, 16) if c1 == 256 else (28, 8)):
            assert chain_conv.refusal(*pair(n, side, side, c2, (k1, c1))) is None


@pytest.mark.parametrize("conv1,conv2,reason", [
    (ConvShape(8, 256, 14, 14, 1024, 1, 1), ConvShape(8, 1024, 14, 14, 256, 1, 1), "64 -> 256 or 128 -> 512"),  # res4
    (ConvShape(8, 64, 56, 56, 256, 1, 1), ConvShape(8, 256, 56, 56, 256, 1, 1), "the kernel computes 64 or 128"),
    (ConvShape(8, 128, 28, 28, 512, 1, 1), ConvShape(8, 512, 28, 28, 64, 1, 1), "the kernel computes 128 or 256"),
    (ConvShape(8, 128, 28, 28, 512, 1, 1), ConvShape(8, 512, 28, 28, 1024, 1, 1, (2, 2)), "1x1 stride-1"),  # res4's downsample
    (ConvShape(8, 64, 56, 56, 256, 1, 1), ConvShape(8, 256, 56, 56, 64, 3, 3, (1, 1), (1, 1, 1, 1)), "1x1 stride-1"),
    (ConvShape(8, 64, 56, 56, 256, 1, 1), ConvShape(8, 256, 56, 56, 128, 1, 1, (2, 2)), "1x1 stride-1"),
    (ConvShape(8, 64, 56, 56, 256, 1, 1), ConvShape(8, 256, 28, 28, 64, 1, 1), "not conv 1's output"),
    (ConvShape(8, 128, 28, 28, 512, 1, 1), ConvShape(8, 256, 28, 28, 128, 1, 1), "not conv 1's output"),
    (ConvShape(8, 64, 7, 7, 256, 1, 1), ConvShape(8, 256, 7, 7, 64, 1, 1), "8-pixel groups"),
    (ConvShape(8, 128, 7, 7, 512, 1, 1), ConvShape(8, 512, 7, 7, 128, 1, 1), "8-pixel groups"),
])
def test_other_pairs_are_refused_saying_why(conv1, conv2, reason):
    why = chain_conv.refusal(conv1, conv2)
    assert why and reason in why, why


def test_every_variant_fits_and_the_kernel_checks_the_budget():
    """Each variant's shared memory fits sm_90's 227 KB, and the launcher's sum is what the kernel's Smem comes to
    (CHAIN_SMEM, compared by a static_assert in chain_conv.cu: tests/test_kernel_build.py compiles every variant)."""
    for v in chain_conv.VARIANTS.values():
        assert v.smem_bytes <= chain_conv.SHARED_LIMIT, v
        assert v.defines()["CHAIN_SMEM"] == v.smem_bytes
        assert (v.c1 <= 256) == (not v.a_in_slot)  # res2 keeps its A tiles (and its code); res3 writes y over the residual
    # res2's builds keep their defines (and so their compile cache keys and code)
    assert chain_conv.VARIANTS[64, 256, 64].defines() == {"CHAIN_K1": 64, "CHAIN_C1": 256, "CHAIN_C2": 64, "CHAIN_STAGES": 4,
                                                          "CHAIN_SMEM": 151112}
    assert [chain_conv.VARIANTS[k].smem_bytes for k in chain_conv.VARIANTS] == [151112, 168008, 219176, 220328]


def test_params_struct_mirrors_the_kernel():
    source = (Path(chain_conv.__file__).parent / "kernels" / chain_conv.SOURCE).read_text()
    body = re.search(r"struct ChainParams \{(.*?)\n\};", source, re.S).group(1)
    fields = []
    for line in body.splitlines():
        line = line.split("//")[0].strip().rstrip(";")
        if not line:
            continue
        ctype, names = re.match(r"(const float\*|int8_t\*|int|FastDivmod) (.*)", line).groups()
        for name in (s.strip() for s in names.split(",")):
            fields += [f"{name}_{part}" for part in ("d", "mul", "shr")] if ctype == "FastDivmod" else [name]
    assert [f for f, _ in chain_conv.ChainParamsStruct._fields_] == fields
    # padded to 8 bytes before the downsample's pointers, as the kernel's (its end falls on 8 bytes)
    assert ctypes.sizeof(chain_conv.ChainParamsStruct) == 9 * 8 + 7 * 4 + 6 * 4 + 4 + 3 * 8 + 4 + 4 * 4 + 3 * 4


def test_y_stored_at_stride_2_keeps_the_pixels_a_stride_2_conv_reads():
    """y_stride 2 stores y's pixels at even rows and columns: the map a 1x1 stride-2 unpadded conv's output has, odd
    sides included; params carry that map and the divisor by the width the kernel walks rows with."""
    from trtfuse.plugins.conv_shape import ConvShape

    for h, w in ((56, 56), (9, 8), (7, 7), (4, 6)):
        conv1, conv2 = pair(2, h, w, 128)
        ds = ConvShape(2, 256, h, w, 512, 1, 1, (2, 2))
        assert chain_conv.stored_y_hw(conv1, 2) == ds.out_hw
        assert chain_conv.stored_y_hw(conv1, 1) == (h, w)
        p = chain_conv.params(conv1, conv2, {}, (True, True), y_stride=2)
        assert (p.y_stride, p.w, p.y_w, p.y_hw, p.div_w_d) == (2, w, ds.out_hw[1], ds.out_hw[0] * ds.out_hw[1], w)
        whole = chain_conv.params(conv1, conv2, {}, (True, True))
        assert (whole.y_stride, whole.y_hw) == (1, h * w)


def test_grid_keeps_both_consumer_warpgroups_busy():
    conv1, _ = pair(2, 56, 56, 64)
    assert chain_conv.tiles(conv1) == 98 and chain_conv.grid(conv1, 132) == 49
    assert chain_conv.grid(pair(256, 56, 56, 64)[0], 132) == 132
    assert chain_conv.grid(conv1, 132, max_ctas=3) == 3 and chain_conv.grid(pair(1, 4, 6, 64)[0], 132) == 1


# ---- the replay ----

def map_view(flat: np.ndarray, dims, strides) -> np.ndarray:
    """A tensor map's view of a flat byte array, indexed [d4]..[d0] as tma_box expects."""
    full = (1, *strides)
    return np.lib.stride_tricks.as_strided(flat, shape=tuple(dims[::-1]), strides=[s * flat.itemsize for s in full[::-1]],
                                           writeable=False)


def sw32(offset):
    """CU_TENSOR_MAP_SWIZZLE_32B and wgmma's 32-byte swizzle (layout type 3) on a 1024-byte-aligned tile: address
    bit 4 XOR bit 7 (Swizzle<1,4,3>)."""
    return offset ^ (((offset >> 7) & 1) << 4)


def wgmma_operand(smem: np.ndarray, start: int, sbo: int, rows: int) -> np.ndarray:
    """rows x 32 bytes of a K-major 32-byte-swizzled operand as wgmma reads it from desc_kmajor(start, sbo, 3)."""
    r, c = np.arange(rows)[:, None], np.arange(32)[None, :]
    return smem[sw32(start + (r // 8) * sbo + (r % 8) * 32 + c)]


def requantize(acc, a, b, res, rs, relu: bool) -> np.ndarray:
    """docs/ops.md on single elements (the steps of reference.requantize_epilogue)."""
    v = fma_f32(acc.astype(np.float32), a, b)
    if res is not None:
        v = fma_f32(res.astype(np.float32), rs, v)
    if relu:
        v = np.maximum(v, np.float32(0))
    return np.clip(np.rint(v), -128, 127).astype(np.int64)


def a_tile_offset(px, b, q):
    """chain_conv.cu: a_tile_offset (a consumer warpgroup's own A tile)."""
    return b * BM * 32 + px * 32 + (((q >> 1) ^ ((px >> 2) & 1)) << 4) + ((q & 1) << 3)


def residual_offset(g, b, r, q, c1: int, swizzled: bool):
    """chain_conv.cu: residual_offset."""
    piece = (((q >> 1) ^ ((r >> 2) & 1)) << 4) + ((q & 1) << 3) if swizzled else 8 * q
    return g * c1 * 8 + b * 256 + r * 32 + piece


def weight_boxes(flat: np.ndarray, args, steps: int) -> list[np.ndarray]:
    """The producers' weight boxes, one per k32 step j at (32 j, 0, 0, 0, 0), each as wgmma's B: [box row][32]."""
    dims, strides, box, es, _ = args
    view = map_view(flat, dims, strides)
    return [tma_box(view, (32 * j, 0, 0, 0, 0), box, es).reshape(-1, 32) for j in range(steps)]


def epilogue_lanes(blocks: int):
    """Every (warp, lane, h, block, byte i) of a consumer warpgroup's epilogue, with its pixel, lane class q and the
    accumulator register requantize_8_channels reads: acc[4 (4b + i / 2) + 2h + i % 2]."""
    warp, lane, h, b, i = np.meshgrid(range(4), range(32), range(2), range(blocks), range(8), indexing="ij")
    q, px = lane % 4, 16 * warp + lane // 4 + 8 * h
    reg = 4 * (4 * b + i // 2) + 2 * h + i % 2
    # wgmma's m64nN accumulator layout (wgmma_s8.cuh): register reg of thread t is row 16 (t / 32) + (t % 32) / 4 +
    # 8 ((reg / 2) % 2), column 8 (reg / 4) + 2 (t % 4) + reg % 2
    t = 32 * warp + lane
    row, col = 16 * (t // 32) + (t % 32) // 4 + 8 * ((reg // 2) % 2), 8 * (reg // 4) + 2 * (t % 4) + reg % 2
    assert (row == px).all()
    return warp, lane, h, b, i, q, px, col


POISON = -1000  # no int8 value: a byte read before anything wrote it shows


def replay(problem: ChainProblem, max_ctas: int | None = None):
    """(y, z, y store counts, z store counts) as the kernel's CTAs compute and store them, logical NCHW."""
    conv1, conv2 = problem.convs
    sh, c2 = conv1.shape, conv2.shape.k
    k1, c1 = sh.c, sh.k
    ds = problem.downsample
    v = chain_conv.variant_of(sh, c2, ds is not None)
    n1 = min(c1, 256)  # GEMM1's channels per pass
    kt2 = c1 // 32
    hw, pixels = sh.h * sh.w, sh.n * sh.h * sh.w
    args = chain_conv.tensor_map_args(sh, c2, ds is not None)
    assert args["res"][4] == (32 if v.a_in_slot or ds else 0)
    p = chain_conv.params(sh, conv2.shape, {}, (conv1.relu, conv2.relu))
    x_view = map_view(pack_nchwv(conv1.x, 32).ravel().astype(np.int64), *args["x"][:2])
    # the downsample inside: the slot's second tile is x0's (ds_k channels, swizzled like x), never the residual
    res_c = v.ds_k or c1
    res_view = map_view(pack_nchwv(conv1.residual if ds is None else ds.x, 32).ravel().astype(np.int64), *args["res"][:2])
    if ds is not None:
        wds = np.concatenate(weight_boxes(pack_weight(ds.w, 32).ravel().astype(np.int64), args["wds"], v.ds_k // 32), axis=1)
        a0, b0, _ = folded_scales(ds.scale[:c1], ds.bias[:c1], float(ds.out_scale[0]), None)
    w1 = np.concatenate(weight_boxes(pack_weight(conv1.w, 32).ravel().astype(np.int64), args["w1"], k1 // 32), axis=1)
    w2_chunks = weight_boxes(pack_weight(conv2.w, 32).ravel().astype(np.int64), args["w2"], kt2)
    a1, b1, rs = folded_scales(conv1.scale[:c1], conv1.bias[:c1], float(conv1.out_scale[0]), float(conv1.residual_scale[0]))
    a2, b2, _ = folded_scales(conv2.scale[:c2], conv2.bias[:c2], float(conv2.out_scale[0]), None)
    y, z = np.zeros(sh.n * c1 * hw, np.int64), np.zeros(sh.n * c2 * hw, np.int64)
    y_count, z_count = np.zeros_like(y), np.zeros_like(z)
    x_bytes = BM * k1
    last_box = p.N * p.groups_per_image - p.box_groups
    lanes1, lanes2 = epilogue_lanes(n1 // 32), epilogue_lanes(c2 // 32)

    def store(out, count, channels, val, px, b, q, i):  # an epilogue's 8-byte CHW32 pieces, the pixels past the batch not
        m = tile * BM + px
        ok = m < pixels
        n_img, pix = np.divmod(m, hw)
        off = (n_img * (channels // 32) * hw + pix) * 32 + 8 * q + b * hw * 32 + i
        out[off[ok]] = val[ok]
        np.add.at(count, off[ok], 1)

    ctas = chain_conv.grid(sh, 132, max_ctas)
    for cta in range(ctas):
        # the streamed W2's ring (W2_STAGES chunks): its thread fills use u (chunk u % KT2) into slot u % W2_STAGES once
        # use u - W2_STAGES is released; the consumer waiting for use c has released every use up to c - 2
        w2_ring = np.full((max(v.w2_stages, 1), c2, 32), POISON, np.int64)
        filled, cta_tiles = 0, len(range(cta, p.tiles, ctas))
        for i, tile in enumerate(range(cta, p.tiles, ctas)):
            # the producer's boxes into a ring slot: x with 32-byte swizzle, the residual as it lands
            slot = np.full(x_bytes + BM * res_c, POISON, np.int64)
            for g in range(0, 8, p.box_groups):
                n, group = divmod(min(tile * 8 + g, last_box), p.groups_per_image)
                xb = tma_box(x_view, (0, 0, 0, group, n), args["x"][2], args["x"][3]).ravel()
                slot[sw32(g * k1 * 8 + np.arange(xb.size))] = xb
                rb = tma_box(res_view, (0, 0, 0, group, n), args["res"][2], args["res"][3]).ravel()
                at = x_bytes + g * res_c * 8 + np.arange(rb.size)  # x_bytes is 1024-aligned: the swizzle's phase is the box's
                slot[sw32(at) if v.a_in_slot or ds is not None else at] = rb
            assert (slot != POISON).all(), "a slot byte the copy engine never wrote"
            a_tile = np.full(BM * c1, POISON, np.int64)
            written = []
            if ds is not None:
                # GEMM0: A = desc_kmajor(slot + x_bytes + 256 j, ds_k * 8, 3), B = Wds; epilogue 0 into each thread's
                # registers: the residual bytes of the pixels and channels its epilogue 1 reads
                x0_op = np.concatenate([wgmma_operand(slot, x_bytes + 256 * j, v.ds_k * 8, BM) for j in range(v.ds_k // 32)],
                                       axis=1)
                acc0 = x0_op @ wds.T
                warp, lane, h, b, i8, q, px, col = lanes1
                ch = 32 * b + 8 * q + i8
                residual_words = requantize(acc0[px, col], a0[ch], b0[ch], None, None, ds.relu)
            for pss in range(c1 // n1):
                # GEMM1 pass: A = desc_kmajor(slot + 256 j, K1 * 8, 3), B = W1's box rows pss * N1 .. + N1
                x_op = np.concatenate([wgmma_operand(slot, 256 * j, k1 * 8, BM) for j in range(k1 // 32)], axis=1)
                acc1 = x_op @ w1[pss * n1:(pss + 1) * n1].T
                warp, lane, h, b, i8, q, px, col = lanes1
                cb = pss * (n1 // 32) + b
                ch = 32 * cb + 8 * q + i8
                r_off = x_bytes + residual_offset(2 * warp + h, cb, lane // 4, q, c1, v.a_in_slot) + i8
                res = slot[r_off] if ds is None else residual_words
                val = requantize(acc1[px, col], a1[ch], b1[ch], res, rs, conv1.relu)
                store(y, y_count, c1, val, px, cb, q, i8)
                if v.a_in_slot:  # over the residual bytes the same thread has just read
                    slot[r_off] = val
                    written.append(r_off.ravel())
                else:
                    a_tile[a_tile_offset(px, cb, q) + i8] = val
                    written.append((a_tile_offset(px, cb, q) + i8).ravel())
            written = np.concatenate(written)
            assert np.unique(written).size == written.size == BM * c1, "the A tile is every byte written once"
            if v.a_in_slot:
                assert np.array_equal(np.sort(written), x_bytes + np.arange(BM * c1)), "y over every residual byte"
                a_ops = [wgmma_operand(slot, x_bytes + 256 * j, c1 * 8, BM) for j in range(kt2)]
            else:
                a_ops = [wgmma_operand(a_tile, BM * 32 * j, 256, BM) for j in range(kt2)]
            # GEMM2: B = W2's k32 chunks, resident or from the streamed ring (each k32 step's wgmma done before its
            # chunk is released and loaded over)
            acc2 = np.zeros((BM, c2), np.int64)
            for j in range(kt2):
                if v.w2_stages:
                    use = i * kt2 + j
                    while filled < min(use - 1 + v.w2_stages, cta_tiles * kt2):
                        w2_ring[filled % v.w2_stages] = w2_chunks[filled % kt2]
                        filled += 1
                    acc2 += a_ops[j] @ w2_ring[use % v.w2_stages].T
                else:
                    acc2 += a_ops[j] @ w2_chunks[j].T
            warp, lane, h, b, i8, q, px, col = lanes2
            ch = 32 * b + 8 * q + i8
            val = requantize(acc2[px, col], a2[ch], b2[ch], None, None, conv2.relu)
            store(z, z_count, c2, val, px, b, q, i8)

    def logical(flat, k):
        return unpack_chw32(flat.reshape(sh.n, k // 32, sh.h, sh.w, 32), k)

    return logical(y, c1), logical(z, c2), y_count, z_count


# res2: 2 x 16 x 16 (8 whole tiles, 32-group images: boxes of 8 groups); 3 x 12 x 10 (360 pixels: boxes of 1 group, a
# last tile of 40 pixels whose boxes past the batch reload its last one); 1 x 4 x 6 (24 pixels, under one tile).
# res3: the same kinds of shape, 28 x 28 (12.25 tiles: boxes of 2 groups) and 8 x 8 (one tile an image), and CTAs
# walking several tiles (max_ctas), so the streamed W2's ring wraps round many times.
@pytest.mark.parametrize("n,h,w,c2,first,max_ctas", [
    (2, 16, 16, 64, RES2, None), (3, 12, 10, 128, RES2, None), (1, 4, 6, 64, RES2, None), (1, 28, 28, 128, RES2, None),
    (1, 28, 28, 128, RES3, None), (2, 8, 8, 256, RES3, None), (3, 12, 10, 256, RES3, 2), (1, 4, 6, 128, RES3, None),
    (1, 28, 28, 256, RES3, 3), (2, 8, 8, 128, RES3, 1),
], ids=lambda v: str(v))
def test_replay_gives_the_golden_pair_storing_each_byte_once(n, h, w, c2, first, max_ctas):
    k1, c1 = first
    problem = ChainProblem.random(n, h, w, c2, seed=n * 100 + h + w + c2, k1=k1, c1=c1)
    y, z, y_count, z_count = replay(problem, max_ctas)
    y_ref, z_ref = problem.golden()
    assert (y_count == 1).all() and (z_count == 1).all()
    assert np.array_equal(y, y_ref) and np.array_equal(z, z_ref)


@pytest.mark.parametrize("n,h,w,max_ctas,ds_relu", [(2, 16, 16, None, False), (3, 12, 10, 2, False), (1, 4, 6, None, True)],
                         ids=str)
def test_replay_with_the_downsample_inside_gives_the_golden_pair(n, h, w, max_ctas, ds_relu):
    """res2's first block (DOWNSAMPLE_VARIANTS): x0's tile in the slot, GEMM0 on Wds and epilogue 0 into the residual
    bytes each thread's epilogue 1 reads give the pair's golden outputs, the downsample's own golden output being the
    residual."""
    problem = ChainProblem.random(n, h, w, 64, seed=n * 100 + h + w, ds_k=64, ds_relu=ds_relu)
    y, z, y_count, z_count = replay(problem, max_ctas)
    y_ref, z_ref = problem.golden()
    assert (y_count == 1).all() and (z_count == 1).all()
    assert np.array_equal(y, y_ref) and np.array_equal(z, z_ref)


def test_downsample_variant_fits_and_is_refused_saying_why():
    v = chain_conv.DOWNSAMPLE_VARIANTS[64, 256, 64]
    assert v.smem_bytes <= chain_conv.SHARED_LIMIT and v.defines()["CHAIN_DS"] == 64 and v.name == "64-256-64-ds64"
    conv1, conv2 = pair(8, 56, 56, 64)
    ds = ConvShape(8, 64, 56, 56, 256, 1, 1, residual=False)
    assert chain_conv.downsample_refusal(conv1, conv2, ds) is None
    for bad, reason in ((ConvShape(8, 64, 112, 112, 256, 1, 1, (2, 2)), "1x1 stride-1"),  # res3-like strided downsample
                        (ConvShape(8, 128, 56, 56, 256, 1, 1), "the build computes 8x64x56x56 -> 256")):
        why = chain_conv.downsample_refusal(conv1, conv2, bad)
        assert why and reason in why, why
    why = chain_conv.downsample_refusal(*pair(8, 56, 56, 128), ds)
    assert why and "no build with a downsample" in why, why
    assert set(chain_conv.tensor_map_args(conv1, 64, downsample=True)) == {"x", "res", "w1", "w2", "wds"}

