"""The mma.sync kernel's epilogue index mappings, replayed on the CPU (plugins/kernels/fused_conv.cu,
conv_epilogue.cuh, mma_sm80.cuh), for every mma tactic's tile shape:

* OutputTile::for_each_vector (one pixel division per row, channel blocks stepped by OH*OW*32 bytes)
  visits exactly the (staging offset, global address) pairs of the per-vector form it replaced,
  with the same vectors masked (rows past M, channels past Kpad);
* WarpMma's channel order (B rows permuted within 16-channel groups) is a bijection, gives each
  thread 4 consecutive channels per n8 tile pair in the order requantize_pair packs them, and its
  ldmatrix row sets and the 4-byte staging accesses are free of shared-memory bank conflicts.
The GPU tests (tests/test_conv_kernel_gpu.py) check the kernel itself."""

import pytest

from trtfuse.plugins.tactics import TACTICS

MMA_SHAPES = sorted({(t.bm, t.bn, t.wm, t.wn, t.threads) for t in TACTICS})


def div_ohw(m, ohw):
    return m // ohw


def vectors_ref(bm, bn, nthreads, m0, n0, M, OHW, Kpad):
    """The per-vector form (for_each_vector_ref)."""
    stride = bn + 16
    out = []
    for tid in range(nthreads):
        for v in range(tid, bm * bn // 16, nthreads):
            block32, rem = v // (bm * 2), v % (bm * 2)
            row, half = rem // 2, rem % 2
            col = block32 * 32 + half * 16
            m, chan = m0 + row, n0 + col
            g = None
            if m < M and chan < Kpad:
                n = div_ohw(m, OHW)
                pix = m - n * OHW
                g = ((n * (Kpad // 32) + chan // 32) * OHW + pix) * 32 + half * 16
            out.append((tid, row * stride + col, g))
    return out


def vectors_new(bm, bn, nthreads, m0, n0, M, OHW, Kpad):
    """for_each_vector as the kernel computes it now."""
    stride, vectors, block_vectors = bn + 16, bm * bn // 16, 2 * bm
    assert block_vectors % nthreads == 0 or nthreads % block_vectors == 0
    iters = vectors // nthreads
    rows = block_vectors // nthreads if block_vectors % nthreads == 0 else 1
    row_step = nthreads // 2
    block_step = 1 if block_vectors % nthreads == 0 else nthreads // block_vectors
    out = []
    for tid in range(nthreads):
        half, row0 = tid % 2, (tid % block_vectors) // 2
        block0 = 0 if block_vectors % nthreads == 0 else tid // block_vectors
        blocks = (Kpad - n0) // 32
        block_bytes = OHW * 32
        row_g, row_ok = [], []
        for k in range(rows):
            m = m0 + row0 + k * row_step
            n = div_ohw(m, OHW)
            pix = m - n * OHW
            row_ok.append(m < M)
            row_g.append(((n * (Kpad // 32) + n0 // 32 + block0) * OHW + pix) * 32 + half * 16)
        for i in range(iters):
            k, b = i % rows, (i // rows) * block_step
            ok = row_ok[k] and block0 + b < blocks
            out.append((tid, (row0 + k * row_step) * stride + (block0 + b) * 32 + half * 16,
                        row_g[k] + b * block_bytes if ok else None))
    return out


@pytest.mark.parametrize("bm,bn,wm,wn,nthreads", MMA_SHAPES, ids=[f"{s[0]}x{s[1]}_w{s[2]}x{s[3]}" for s in MMA_SHAPES])
@pytest.mark.parametrize("n,ohw,k", [(2, 49, 96), (3, 196, 512), (1, 7, 32), (5, 3136, 256)])
def test_for_each_vector_matches_the_per_vector_form(bm, bn, wm, wn, nthreads, n, ohw, k):
    M, Kpad = n * ohw, (k + 31) // 32 * 32
    for m0 in range(0, M, bm):
        for n0 in range(0, Kpad, bn):
            ref = vectors_ref(bm, bn, nthreads, m0, n0, M, ohw, Kpad)
            new = vectors_new(bm, bn, nthreads, m0, n0, M, ohw, Kpad)
            assert sorted(ref, key=repr) == sorted(new, key=repr), (m0, n0)
            # every staging vector of the tile exactly once
            assert sorted(s for _, s, _ in new) == sorted({s for _, s, _ in new})
            assert len(new) == bm * bn // 16


def channel_of(ni, c):
    return (ni // 2) * 16 + (c // 2) * 4 + (ni % 2) * 2 + c % 2


def swizzle_64b_b(row, chunk):
    return row * 64 + ((chunk ^ ((row >> 2) & 3)) << 4)


@pytest.mark.parametrize("bm,bn,wm,wn,nthreads", MMA_SHAPES, ids=[f"{s[0]}x{s[1]}_w{s[2]}x{s[3]}" for s in MMA_SHAPES])
def test_warp_channel_order(bm, bn, wm, wn, nthreads):
    nt = bn // wn // 8
    assert nt % 2 == 0
    # a bijection of the warp's BN / WN channels
    assert sorted(channel_of(ni, c) for ni in range(nt) for c in range(8)) == list(range(bn // wn))
    for lane in range(32):
        q, t2 = lane % 4, (lane % 4) * 2
        for j in range(nt // 2):
            # requantize_pair: channel 4q + e of group j is (n8 tile 2j + e // 2, accumulator column e % 2)
            got = [channel_of(2 * j + e // 2, t2 + e % 2) for e in range(4)]
            assert got == [16 * j + 4 * q + e for e in range(4)], (lane, j)
    # ldmatrix.x4 of B: the 8 rows each 8-lane group addresses fall in 8 distinct 16-byte bank groups
    for nj in range(0, nt, 2):
        for ks in range(2):
            for grp in range(4):
                lanes = range(8 * grp, 8 * grp + 8)
                addrs = [swizzle_64b_b(channel_of(nj + lane // 16, lane % 8), 2 * ks + (lane // 8) % 2) for lane in lanes]
                assert len({(a % 128) // 16 for a in addrs}) == 8, (nj, ks, grp)
    # weight tile writes and reads agree on the layout: swizzle_64B_b is a bijection of each row's 4 chunks
    for row in range(bn):
        assert sorted(swizzle_64b_b(row, c) - row * 64 for c in range(4)) == [0, 16, 32, 48]


@pytest.mark.parametrize("bm,bn,wm,wn,nthreads", MMA_SHAPES, ids=[f"{s[0]}x{s[1]}_w{s[2]}x{s[3]}" for s in MMA_SHAPES])
def test_staging_words_are_bank_conflict_free(bm, bn, wm, wn, nthreads):
    """A warp's 4-byte residual reads / output writes of one (mi, h, j): 32 distinct banks."""
    stride = bn + 16
    for mi in range(bm // wm // 16):
        for h in range(2):
            for j in range(bn // wn // 16):
                addrs = [(mi * 16 + lane // 4 + h * 8) * stride + j * 16 + (lane % 4) * 4 for lane in range(32)]
                assert all(a % 4 == 0 for a in addrs)
                assert len({(a // 4) % 32 for a in addrs}) == 32
