"""The chained 1x1 convs kernel (plugins/kernels/chain_conv.cu) without a GPU: which conv pairs it takes, its params
struct against the kernel's, and its data movement replayed on the CPU: the TMA boxes of plugins/chain_conv.py's tensor
maps, the ring slot and A tile layouts with their 32-byte swizzle, the wgmma accumulator layout, the epilogues' lane map
and store offsets, exactly as chain_conv.cu computes them, must give the golden pair (fused_conv_int8 twice) with every
output byte stored once. tests/test_chain_conv_gpu.py checks the kernel itself on Hopper."""

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

K1, C1, BM = chain_conv.K1, chain_conv.C1, chain_conv.TILE


def pair(n: int, h: int, w: int, c2: int) -> tuple[ConvShape, ConvShape]:
    return ConvShape(n, K1, h, w, C1, 1, 1), ConvShape(n, C1, h, w, c2, 1, 1)


@pytest.mark.parametrize("c2", chain_conv.C2_CHOICES)
def test_resnet50_res2_pairs_are_taken(c2):
    for n in (1, 8, 256):
        assert chain_conv.refusal(*pair(n, 56, 56, c2)) is None


@pytest.mark.parametrize("conv1,conv2,reason", [
    (ConvShape(8, 128, 28, 28, 512, 1, 1), ConvShape(8, 512, 28, 28, 128, 1, 1), "channels"),  # res3 -> res3
    (ConvShape(8, K1, 56, 56, C1, 1, 1), ConvShape(8, C1, 56, 56, 256, 1, 1), "output channels"),
    (ConvShape(8, K1, 56, 56, C1, 1, 1), ConvShape(8, C1, 56, 56, 64, 3, 3, (1, 1), (1, 1, 1, 1)), "1x1 stride-1"),
    (ConvShape(8, K1, 56, 56, C1, 1, 1), ConvShape(8, C1, 56, 56, 128, 1, 1, (2, 2)), "1x1 stride-1"),
    (ConvShape(8, K1, 56, 56, C1, 1, 1), ConvShape(8, C1, 28, 28, 64, 1, 1), "not conv 1's output"),
    (ConvShape(8, K1, 7, 7, C1, 1, 1), ConvShape(8, C1, 7, 7, 64, 1, 1), "8-pixel groups"),
])
def test_other_pairs_are_refused_saying_why(conv1, conv2, reason):
    why = chain_conv.refusal(conv1, conv2)
    assert why and reason in why, why


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
    assert ctypes.sizeof(chain_conv.ChainParamsStruct) == 9 * 8 + 7 * 4 + 6 * 4 + 4  # padded to 8 bytes, as the kernel's


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
    """chain_conv.cu: a_tile_offset."""
    return b * BM * 32 + px * 32 + (((q >> 1) ^ ((px >> 2) & 1)) << 4) + ((q & 1) << 3)


def resident_weight(flat: np.ndarray, args, steps: int) -> np.ndarray:
    """The producer's weight boxes, one per k32 step at (32 j, 0, 0, 0, 0), as wgmma's B: [box row][GEMM-K]."""
    dims, strides, box, es, _ = args
    view = map_view(flat, dims, strides)
    return np.concatenate([tma_box(view, (32 * j, 0, 0, 0, 0), box, es).reshape(-1, 32) for j in range(steps)], axis=1)


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


def replay(problem: ChainProblem):
    """(y, z, y store counts, z store counts) as the kernel's CTAs compute and store them, logical NCHW."""
    conv1, conv2 = problem.convs
    sh, c2 = conv1.shape, conv2.shape.k
    hw, pixels = sh.h * sh.w, sh.n * sh.h * sh.w
    args = chain_conv.tensor_map_args(sh, c2)
    p = chain_conv.params(sh, conv2.shape, {}, (conv1.relu, conv2.relu))
    x_view = map_view(pack_nchwv(conv1.x, 32).ravel().astype(np.int64), *args["x"][:2])
    res_view = map_view(pack_nchwv(conv1.residual, 32).ravel().astype(np.int64), *args["res"][:2])
    w1 = resident_weight(pack_weight(conv1.w, 32).ravel().astype(np.int64), args["w1"], K1 // 32)
    w2 = resident_weight(pack_weight(conv2.w, 32).ravel().astype(np.int64), args["w2"], C1 // 32)
    a1, b1, rs = folded_scales(conv1.scale[:C1], conv1.bias[:C1], float(conv1.out_scale[0]), float(conv1.residual_scale[0]))
    a2, b2, _ = folded_scales(conv2.scale[:c2], conv2.bias[:c2], float(conv2.out_scale[0]), None)
    y, z = np.zeros(sh.n * C1 * hw, np.int64), np.zeros(sh.n * c2 * hw, np.int64)
    y_count, z_count = np.zeros_like(y), np.zeros_like(z)
    x_bytes = BM * K1
    last_box = p.N * p.groups_per_image - p.box_groups
    lanes1, lanes2 = epilogue_lanes(C1 // 32), epilogue_lanes(c2 // 32)

    def store(out, count, channels, val, px, b, q, i):  # an epilogue's 8-byte CHW32 pieces, the pixels past the batch not
        m = tile * BM + px
        ok = m < pixels
        n_img, pix = np.divmod(m, hw)
        off = (n_img * (channels // 32) * hw + pix) * 32 + 8 * q + b * hw * 32 + i
        out[off[ok]] = val[ok]
        np.add.at(count, off[ok], 1)

    for tile in range(p.tiles):
        # the producer's boxes into a ring slot: x with 32-byte swizzle, the residual as it lands
        slot = np.full(x_bytes + BM * C1, -1000, np.int64)
        for g in range(0, 8, p.box_groups):
            n, group = divmod(min(tile * 8 + g, last_box), p.groups_per_image)
            xb = tma_box(x_view, (0, 0, 0, group, n), args["x"][2], args["x"][3]).ravel()
            slot[sw32(g * K1 * 8 + np.arange(xb.size))] = xb
            rb = tma_box(res_view, (0, 0, 0, group, n), args["res"][2], args["res"][3]).ravel()
            slot[x_bytes + g * C1 * 8 + np.arange(rb.size)] = rb
        assert (slot != -1000).all(), "a slot byte the copy engine never wrote"
        # GEMM1: A = desc_kmajor(slot + 256 j, K1 * 8, 3), B = the W1 boxes
        acc1 = np.concatenate([wgmma_operand(slot, 256 * j, K1 * 8, BM) for j in range(K1 // 32)], axis=1) @ w1.T
        warp, lane, h, b, i, q, px, col = lanes1
        ch = 32 * b + 8 * q + i
        res = slot[x_bytes + (2 * warp + h) * C1 * 8 + b * 256 + (lane // 4) * 32 + 8 * q + i]
        val = requantize(acc1[px, col], a1[ch], b1[ch], res, rs, conv1.relu)
        store(y, y_count, C1, val, px, b, q, i)
        a_tile = np.full(BM * C1, -1000, np.int64)
        a_off = a_tile_offset(px, b, q) + i
        a_tile[a_off] = val
        assert (a_tile != -1000).all() and np.unique(a_off).size == a_off.size, "the A tile is every byte written once"
        # GEMM2: A = desc_kmajor_sw32(A tile + 2048 j), B = the W2 boxes
        acc2 = np.concatenate([wgmma_operand(a_tile, BM * 32 * j, 256, BM) for j in range(C1 // 32)], axis=1) @ w2.T
        warp, lane, h, b, i, q, px, col = lanes2
        ch = 32 * b + 8 * q + i
        val = requantize(acc2[px, col], a2[ch], b2[ch], None, None, conv2.relu)
        store(z, z_count, c2, val, px, b, q, i)

    def logical(flat, k):
        return unpack_chw32(flat.reshape(sh.n, k // 32, sh.h, sh.w, 32), k)

    return logical(y, C1), logical(z, c2), y_count, z_count


# 2 x 16 x 16 (8 whole tiles, 32-group images: boxes of 8 groups); 3 x 12 x 10 (360 pixels: boxes of 1 group, a last
# tile of 40 pixels whose boxes past the batch reload its last one); 1 x 4 x 6 (24 pixels, under one tile)
@pytest.mark.parametrize("n,h,w,c2", [(2, 16, 16, 64), (3, 12, 10, 128), (1, 4, 6, 64), (1, 28, 28, 128)],
                         ids=lambda v: str(v))
def test_replay_gives_the_golden_pair_storing_each_byte_once(n, h, w, c2):
    problem = ChainProblem.random(n, h, w, c2, seed=n * 100 + h + w)
    y, z, y_count, z_count = replay(problem)
    y_ref, z_ref = problem.golden()
    assert (y_count == 1).all() and (z_count == 1).all()
    assert np.array_equal(y, y_ref) and np.array_equal(z, z_ref)
