"""The row-pipeline bottleneck block kernel (plugins/kernels/block_rows.cu) without a GPU: which blocks it takes, its
params struct and shared-memory budget against the kernel's, and its data movement and schedule replayed on the CPU.

The replay runs the kernel's roles (the TMA producer, the conv1 and conv2 warpgroups, each conv3 warpgroup) as coroutines over
one shared-memory array per CTA, interleaved in random orders, synchronised only by models of the kernel's mbarriers
(the arrival counts read from block_rows.cu, the waits by phase parity as PipelineState computes it). Every wait
asserts that its barrier is within one phase of the one it means (so the parity cannot alias a lap before or after),
and every ring slot carries the use it holds and the reads still owed to it: no slot is written, nor given back,
before its last reader is done. The TMA boxes of plugins/block_rows.py's tensor maps, the tiles' 32-byte swizzle, the
shifted copies of the a rows, the wgmma operand and accumulator layouts and the epilogues' lane map and store offsets
are as block_rows.cu computes them; y must equal the golden (fused_conv_int8 three times) with every byte stored
once. tests/test_block_rows_gpu.py checks the kernel itself on Hopper."""

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
from test_chain_conv import POISON, epilogue_lanes, map_view, requantize, sw32, wgmma_operand
from test_wgmma_tiling import tma_box

from trtfuse.bench.conv_problem import BlockProblem
from trtfuse.plugins import block_rows
from trtfuse.plugins.layout import pack_nchwv, pack_weight, unpack_chw32
from trtfuse.plugins.reference import folded_scales
from trtfuse.plugins.tactics import ConvShape

SOURCE = (Path(block_rows.__file__).parent / "kernels" / block_rows.SOURCE).read_text()
C, WIDTH, BM = block_rows.CHANNELS, block_rows.WIDTH, block_rows.TILE_ROWS
TILE = BM * 32
# conv3's warpgroups, and the channels of one of its passes, as the kernel has them
CONV3_WGS, CONV3_N = block_rows.CONV3_WGS, block_rows.CONV3_N


def block(n: int, h: int, w: int) -> tuple[ConvShape, ConvShape, ConvShape]:
    return (ConvShape(n, C, h, w, WIDTH, 1, 1), ConvShape(n, WIDTH, h, w, WIDTH, 3, 3, (1, 1), (1, 1, 1, 1)),
            ConvShape(n, WIDTH, h, w, C, 1, 1))


@pytest.mark.parametrize("n,h,w", [(1, 56, 56), (256, 56, 56), (8, 16, 16), (1, 1, 1), (2, 3, 64)])
def test_res2_blocks_are_taken(n, h, w):
    assert block_rows.refusal(*block(n, h, w)) is None


@pytest.mark.parametrize("shapes,reason", [
    (block(1, 56, 65), "over the 64 pixels"),
    (block(1, 8, 112), "over the 64 pixels"),
    ((ConvShape(1, 512, 28, 28, 128, 1, 1),) + block(1, 28, 28)[1:], "512 -> 128 channels"),  # res3's conv1
    ((block(1, 56, 56)[0], ConvShape(1, 64, 56, 56, 64, 3, 3, (2, 2), (1, 1, 1, 1)), block(1, 28, 28)[2]), "stride 2x2"),
    ((block(1, 56, 56)[0], ConvShape(1, 64, 56, 56, 64, 3, 3, (1, 1), (0, 0, 0, 0)), block(1, 54, 54)[2]), "pads (0, 0, 0, 0)"),
    ((block(1, 56, 56)[0], ConvShape(1, 64, 56, 56, 64, 1, 1), block(1, 56, 56)[2]), "the kernel runs 3x3"),
    ((block(1, 56, 56)[0], block(1, 28, 28)[1], block(1, 28, 28)[2]), "not its producer's output"),
    ((ConvShape(1, 3, 56, 56, 64, 1, 1),) + block(1, 56, 56)[1:], "vector layout"),
    (block(40000, 16, 16), "2^31"),
])
def test_other_blocks_are_refused_in_one_line(shapes, reason):
    why = block_rows.refusal(*shapes)
    assert why and reason in why and "\n" not in why, why


def test_budget_fits_and_mirrors_the_kernel():
    """smem_bytes is what the kernel's Smem comes to (BLOCK_ROWS_SMEM, compared by a static_assert in block_rows.cu:
    tests/test_kernel_build.py compiles it), and fits sm_90's 227 KB."""
    assert block_rows.smem_bytes() == 217272 <= block_rows.SHARED_LIMIT
    assert block_rows.defines() == {"BLOCK_ROWS_X_STAGES": 5, "BLOCK_ROWS_CONV3_WGS": block_rows.CONV3_WGS,
                                    "BLOCK_ROWS_CONV3_N": block_rows.CONV3_N, "BLOCK_ROWS_SMEM": 217272}
    for name in ("X_STAGES", "CONV3_WGS", "CONV3_N"):  # the kernel's defaults are the launcher's
        assert re.search(rf"#define BLOCK_ROWS_{name} {getattr(block_rows, name)}\n", SOURCE), name
    m = re.search(r"X_STAGES = BLOCK_ROWS_X_STAGES, A_STAGES = (\d+), B_STAGES = (\d+);", SOURCE)
    assert (int(m.group(1)), int(m.group(2))) == (block_rows.A_STAGES, block_rows.B_STAGES)
    assert Smem().BYTES + 1024 == block_rows.smem_bytes()


def test_params_struct_mirrors_the_kernel():
    body = re.search(r"struct BlockRowsParams \{(.*?)\n\};", SOURCE, re.S).group(1)
    fields = []
    for line in body.splitlines():
        line = line.split("//")[0].strip().rstrip(";")
        if line:
            _, names = re.match(r"(const float\*|int8_t\*|int) (.*)", line).groups()
            fields += [s.strip() for s in names.split(",")]
    assert [f for f, _ in block_rows.BlockRowsParamsStruct._fields_] == fields
    assert ctypes.sizeof(block_rows.BlockRowsParamsStruct) == 11 * 8 + 6 * 4


def test_grid_is_one_cta_per_image_up_to_the_sms():
    assert block_rows.grid(block(256, 56, 56)[0], 132) == 132 and block_rows.grid(block(3, 56, 56)[0], 132) == 3
    assert block_rows.grid(block(8, 56, 56)[0], 132, max_ctas=3) == 3


def test_tensor_maps_fit_tma_and_span_whole_rows():
    args = block_rows.tensor_map_args(block(2, 56, 56)[0])
    assert args["x"][2] == (32, 56, 1, 1, 1) and args["x"][4] == 32
    assert [args[w][0][0] for w in ("w1", "w2", "w3")] == [256, 576, 64]
    with pytest.raises(ValueError, match="x tensor map"):
        block_rows.tensor_map_args(block(1, 4, 300)[0])  # a 300-pixel row: a box over TMA's 256 elements


# ---- the replay ----

class Smem:
    """block_rows.cu's Smem offsets."""

    def __init__(self, x_stages=block_rows.X_STAGES, a_stages=block_rows.A_STAGES, b_stages=block_rows.B_STAGES):
        self.XS, self.AS, self.BS = x_stages, a_stages, b_stages
        self.W1 = 0
        self.W2 = self.W1 + 8 * WIDTH * 32
        self.W3 = self.W2 + 18 * WIDTH * 32
        self.X_SLOT = 8 * TILE
        self.X = self.W3 + 2 * C * 32
        self.A_COPY = 2 * TILE
        self.A_SLOT = 3 * self.A_COPY
        self.A = self.X + x_stages * self.X_SLOT
        self.ZERO = self.A + a_stages * self.A_SLOT
        self.B = self.ZERO + self.A_COPY
        self.FACTORS = self.B + b_stages * self.A_COPY
        self.BARS = self.FACTORS + 2 * (WIDTH + WIDTH + C) * 4
        self.BYTES = self.BARS + (2 * (x_stages + a_stages + b_stages) + 1) * 8


def tile_offset(m, j, q):
    """block_rows.cu: tile_offset."""
    return j * TILE + m * 32 + (((q >> 1) ^ ((m >> 2) & 1)) << 4) + ((q & 1) << 3)


def arrival_counts() -> dict:
    """Each ring barrier's arrival count, as the kernel initialises it."""
    assert re.search(r"constexpr int CONV3_WARPS = 4 \* CONV3_WGS;", SOURCE)
    counts = {f"{ring}_{kind}": 4 * CONV3_WGS if c == "CONV3_WARPS" else int(c) for ring, kind, c in
              re.findall(r"mbar_init\(rings\.(\w)\.(full|empty)0 \+ 8 \* s, (\d+|CONV3_WARPS)\)", SOURCE)}
    assert len(counts) == 6 and "mbar_init(rings.weights_full, 1)" in SOURCE
    return counts


class Barrier:
    def __init__(self, count: int):
        self.count, self.arrived, self.phase = count, 0, 0  # phase: completed phases

    def arrive(self, k: int):
        self.arrived += k
        assert self.arrived <= self.count, "more arrivals than the barrier's count in one phase"
        if self.arrived == self.count:
            self.arrived, self.phase = 0, self.phase + 1


class Ring:
    """A ring's barriers and what its slots hold: use u fills slot u % S; full completes once per round, empty too."""

    def __init__(self, name: str, stages: int, counts: dict):
        self.name, self.S = name, stages
        self.full = [Barrier(counts[f"{name}_full"]) for _ in range(stages)]
        self.empty = [Barrier(counts[f"{name}_empty"]) for _ in range(stages)]
        self.holds = [None] * stages  # the use a slot holds
        self.owed = [0] * stages  # reads still owed to that use

    def wait(self, bars, target: int, parity: int):
        """A predicate for mbar_wait(bar, parity) that means "target phases have completed": the hardware's parity
        test, asserted to agree with the count it stands for."""
        def ready():
            assert target - 1 <= bars.phase <= target, f"{self.name}: a parity wait {bars.phase - target:+d} phases off"
            done = (bars.phase & 1) != parity
            assert done == (bars.phase >= target)
            return done
        return ready

    def wait_full(self, u):  # PipelineState: parity (u / S) & 1, round u / S completes phase u / S + 1
        return self.wait(self.full[u % self.S], u // self.S + 1, (u // self.S) & 1)

    def wait_empty(self, u):  # the opposite parity: round 0 finds every slot free
        return self.wait(self.empty[u % self.S], u // self.S, ((u // self.S) & 1) ^ 1)

    def fill(self, u: int, reads: int):
        s = u % self.S
        assert self.owed[s] == 0, f"{self.name} slot {s} written with {self.owed[s]} reads of use {self.holds[s]} owed"
        self.holds[s], self.owed[s] = u, reads

    def read(self, u: int):
        assert self.holds[u % self.S] == u, f"{self.name}: use {u} read from a slot holding {self.holds[u % self.S]}"

    def done_reading(self, u: int):
        self.read(u)
        self.owed[u % self.S] -= 1
        assert self.owed[u % self.S] >= 0

    def release(self, u: int, arrivals: int):
        """One reader's arrivals on the slot's empty barrier; the one that completes its phase frees the slot, which
        must then owe no reads (a slot several roles read is given back by each, once done with it)."""
        self.read(u)
        bar = self.empty[u % self.S]
        phase = bar.phase
        bar.arrive(arrivals)
        assert bar.phase == phase or self.owed[u % self.S] == 0, f"{self.name}: use {u} given back with reads owed"


class Cta:
    """One CTA's shared memory, barriers and the roles of block_rows.cu as generators: each yields a predicate
    that must hold before it goes on (an mbarrier wait), or None (a point where another role may run)."""

    def __init__(self, problem, cta: int, ctas: int, sm: Smem):
        conv1, conv2, conv3 = problem.convs
        sh = conv1.shape
        self.n_img, self.H, self.W = sh.n, sh.h, sh.w
        self.images = list(range(cta, sh.n, ctas))
        self.sm = sm
        self.smem = np.full(sm.BYTES, POISON, np.int64)
        self.smem[sm.A:sm.B] = 0  # the prologue's zero fill: the a ring and the zero tile
        counts = arrival_counts()
        self.x, self.a, self.b = Ring("x", sm.XS, counts), Ring("a", sm.AS, counts), Ring("b", sm.BS, counts)
        self.weights = Barrier(1)
        args = block_rows.tensor_map_args(sh)
        self.args = args
        self.x_view = map_view(pack_nchwv(conv1.x, 32).ravel().astype(np.int64), *args["x"][:2])
        self.w_flat = [pack_weight(c.w, 32).ravel().astype(np.int64) for c in problem.convs]
        self.f = [folded_scales(c.scale[:c.shape.k], c.bias[:c.shape.k], float(c.out_scale[0]),
                                None if c.residual_scale is None else float(c.residual_scale[0])) for c in problem.convs]
        self.relu = [c.relu for c in problem.convs]
        self.y = np.zeros(sh.n * C * sh.h * sh.w, np.int64)
        self.y_count = np.zeros_like(self.y)

    # -- the producer thread --
    def produce(self):
        sm = self.sm
        for name, at, steps, rows in (("w1", sm.W1, 8, WIDTH), ("w2", sm.W2, 18, WIDTH), ("w3", sm.W3, 2, C)):
            dims, strides, box, es, _ = self.args[name]
            view = map_view(self.w_flat[int(name[1]) - 1], dims, strides)
            for j in range(steps):
                b = tma_box(view, (32 * j, 0, 0, 0, 0), box, es).ravel()
                assert b.size == rows * 32
                self.smem[sw32(at + j * rows * 32 + np.arange(b.size))] = b
        self.weights.arrive(1)
        u = 0
        for n in self.images:
            for r in range(self.H):
                yield self.x.wait_empty(u)
                # read by conv1 (its wgmmas) and each conv3 warpgroup (the residual)
                self.x.fill(u, 1 + CONV3_WGS)
                slot = sm.X + (u % sm.XS) * sm.X_SLOT
                for j in range(8):
                    b = tma_box(self.x_view, (0, 0, r, j, n), *self.args["x"][2:4]).ravel()
                    assert b.size == self.W * 32
                    self.smem[sw32(slot + j * TILE + np.arange(b.size))] = b
                self.x.full[u % sm.XS].arrive(1)  # the arrive_expect_tx and its bytes
                u += 1
                yield None

    def operand(self, start: int, rows: int = BM) -> np.ndarray:
        return wgmma_operand(self.smem, start, 256, rows)

    def weights_ready(self):
        return lambda: self.weights.phase >= 1

    # -- conv1 --
    def conv1(self):
        sm = self.sm
        yield self.weights_ready()
        u = 0
        w1 = np.concatenate([self.operand(sm.W1 + j * WIDTH * 32, WIDTH) for j in range(8)], axis=1)
        a1, b1, _ = self.f[0]
        warp, lane, h, jb, i, q, px, col = epilogue_lanes(WIDTH // 32)
        for n in self.images:
            for k in range(self.H):
                yield self.x.wait_full(u)
                self.x.read(u)
                slot = sm.X + (u % sm.XS) * sm.X_SLOT
                xa = np.concatenate([self.operand(slot + j * TILE) for j in range(8)], axis=1)
                assert (xa[:self.W] != POISON).all(), "a pixel of the row the copy engine never wrote"
                acc = xa @ w1.T
                self.x.done_reading(u)
                yield None
                yield self.a.wait_empty(u)
                # read by conv2 for rows k - 1 .. k + 1 inside the image
                self.a.fill(u, min(k + 1, self.H - 1) - max(k - 1, 0) + 1)
                ch = 32 * jb + 8 * q + i
                val = requantize(acc[px, col], a1[ch], b1[ch], None, None, self.relu[0])
                val = np.where(px < self.W, val, 0)
                at = sm.A + (u % sm.AS) * sm.A_SLOT
                for s in range(3):
                    m = px + 1 - s
                    ok = (m >= 0) & (m < BM)
                    self.smem[at + s * sm.A_COPY + tile_offset(m[ok], jb[ok], q[ok]) + i[ok]] = val[ok]
                self.a.full[u % sm.AS].arrive(128)
                u += 1
                yield None

    # -- conv2 --
    def conv2(self):
        sm = self.sm
        yield self.weights_ready()
        w2 = [self.operand(sm.W2 + j * WIDTH * 32, WIDTH) for j in range(18)]
        a2, b2, _ = self.f[1]
        warp, lane, h, jb, i, q, px, col = epilogue_lanes(WIDTH // 32)
        row0, u = 0, 0
        for n in self.images:
            for r in range(self.H):
                tap_row = []
                for dr in range(3):
                    k = r + dr - 1
                    if 0 <= k < self.H:
                        yield self.a.wait_full(row0 + k)
                        self.a.read(row0 + k)
                        tap_row.append(sm.A + ((row0 + k) % sm.AS) * sm.A_SLOT)
                    else:
                        tap_row.append(None)
                acc = np.zeros((BM, WIDTH), np.int64)
                for c in range(2):
                    for tap in range(9):
                        dr, ds = divmod(tap, 3)
                        tile = sm.ZERO if tap_row[dr] is None else tap_row[dr] + ds * sm.A_COPY
                        acc += self.operand(tile + c * TILE) @ w2[9 * c + tap].T
                for k in range(max(r - 1, 0), min(r + 1, self.H - 1) + 1):
                    self.a.done_reading(row0 + k)
                yield None
                if r > 0:
                    self.a.release(row0 + r - 1, 4)
                if r == self.H - 1:
                    self.a.release(row0 + r, 4)
                yield self.b.wait_empty(u)
                self.b.fill(u, CONV3_WGS)
                ch = 32 * jb + 8 * q + i
                val = requantize(acc[px, col], a2[ch], b2[ch], None, None, self.relu[1])
                at = sm.B + (u % sm.BS) * sm.A_COPY
                self.smem[at + tile_offset(px, jb, q) + i] = val
                self.b.full[u % sm.BS].arrive(128)
                u += 1
                yield None
            row0 += self.H

    # -- conv3, warpgroup g: channels [g C / CONV3_WGS, (g + 1) C / CONV3_WGS) --
    def conv3(self, g: int):
        sm = self.sm
        yield self.weights_ready()
        w3 = np.concatenate([self.operand(sm.W3 + j * C * 32, C) for j in range(2)], axis=1)
        a3, b3, rs = self.f[2]
        c3 = C // CONV3_WGS
        passes = c3 // CONV3_N
        warp, lane, h, jb, i, q, px, col = epilogue_lanes(CONV3_N // 32)
        plane = self.H * self.W * 32
        u = 0
        for n in self.images:
            for r in range(self.H):
                yield self.b.wait_full(u)
                yield self.x.wait_full(u)
                self.b.read(u)
                self.x.read(u)
                b_slot = sm.B + (u % sm.BS) * sm.A_COPY
                residual = sm.X + (u % sm.XS) * sm.X_SLOT
                bt = np.concatenate([self.operand(b_slot + j * TILE) for j in range(2)], axis=1)
                for pss in range(passes):
                    c0 = g * c3 + pss * CONV3_N
                    acc = bt @ w3[c0:c0 + CONV3_N].T
                    if pss == passes - 1:
                        self.b.done_reading(u)
                        self.b.release(u, 4)
                        yield None
                    j = c0 // 32 + jb
                    ch = 32 * j + 8 * q + i
                    res = self.smem[residual + tile_offset(px, j, q) + i]
                    ok = px < self.W
                    assert (res[ok] != POISON).all()
                    val = requantize(acc[px, col], a3[ch], b3[ch], res, rs, self.relu[2])
                    off = (n * 8 + j) * plane + (r * self.W + px) * 32 + 8 * q + i
                    self.y[off[ok]] = val[ok]
                    np.add.at(self.y_count, off[ok], 1)
                self.x.done_reading(u)
                self.x.release(u, 4)
                u += 1
                yield None

    def run(self, rng: np.random.Generator):
        """The roles interleaved at random, each step of one that can go on."""
        roles = [self.produce(), self.conv1(), self.conv2()] + [self.conv3(g) for g in range(CONV3_WGS)]
        waiting = [None] * len(roles)
        live = set(range(len(roles)))
        while live:
            ready = [k for k in sorted(live) if waiting[k] is None or waiting[k]()]
            assert ready, "deadlock: every role waits on a barrier"
            k = ready[rng.integers(len(ready))]
            try:
                waiting[k] = next(roles[k])
            except StopIteration:
                live.discard(k)
        for ring in (self.x, self.a, self.b):
            assert all(o == 0 for o in ring.owed), f"{ring.name}: reads owed at the end"


def replay(problem, max_ctas=None, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """(y logical NCHW, store counts per byte) as the kernel's CTAs compute and store them."""
    sh = problem.convs[0].shape
    ctas = block_rows.grid(sh, 132, max_ctas)
    rng = np.random.default_rng(seed)
    y = np.zeros(sh.n * C * sh.h * sh.w, np.int64)
    count = np.zeros_like(y)
    for cta in range(ctas):
        c = Cta(problem, cta, ctas, Smem())
        c.run(rng)
        y += c.y
        count += c.y_count
    return unpack_chw32(y.reshape(sh.n, C // 32, sh.h, sh.w, 32), C), count


# 56 x 56 (res2 at 224 x 224); two 8 x 8 images through one CTA (the rings wrap round across images); 5 x 7 (odd, a
# row under one 8-pixel group); one pixel (conv2's taps are all but one the zero tile, the one row is its own last
# reader); 64-pixel rows (no junk rows: the right border is copy 2's never-written row 63); three images over two
# CTAs.
@pytest.mark.parametrize("n,h,w,max_ctas,seeds", [
    (1, 56, 56, None, 1), (2, 8, 8, 1, 3), (1, 5, 7, None, 3), (1, 1, 1, None, 2), (1, 3, 64, None, 2), (3, 4, 6, 2, 3),
    (2, 2, 5, 1, 3),
], ids=str)
def test_replay_gives_the_golden_block_storing_each_byte_once(n, h, w, max_ctas, seeds):
    problem = BlockProblem.random(n, h, w, seed=n * 1000 + h * 10 + w)
    assert block_rows.refusal(*problem.shapes) is None
    ref = problem.golden()
    for seed in range(seeds):
        y, count = replay(problem, max_ctas, seed)
        assert (count == 1).all()
        assert np.array_equal(y, ref), f"schedule seed {seed}"


def test_replay_without_relu_on_conv2():
    from dataclasses import replace

    problem = BlockProblem.random(1, 4, 9, seed=5)
    c1, c2, c3 = problem.convs
    c2 = replace(c2, relu=False)
    from trtfuse.bench.conv_problem import fused_conv_golden

    problem = BlockProblem((c1, c2, replace(c3, x=fused_conv_golden(c2))), fused_conv_golden)
    y, count = replay(problem, seed=1)
    assert (count == 1).all() and np.array_equal(y, problem.golden())


def test_the_replay_catches_an_early_release():
    """The checks bite: were conv2 to give a[r] back after row r (a row early), conv1 could write over a row that
    conv2's next row still reads."""

    class EarlyRelease(Cta):
        def __init__(self, *args):
            super().__init__(*args)
            release = self.a.release
            self.a.release = lambda u, arrivals: release(u + 1 if u + 1 < self.H else u, arrivals)

    problem = BlockProblem.random(1, 6, 4, seed=3)
    with pytest.raises(AssertionError, match="given back with reads owed"):
        EarlyRelease(problem, 0, 1, Smem()).run(np.random.default_rng(0))


def test_three_a_slots_would_do_four_let_conv1_run_ahead():
    """conv2's window is three a rows: a ring of three is still correct (conv1 then waits for every conv2 row), two
    deadlock."""
    problem = BlockProblem.random(1, 5, 3, seed=4)
    c = Cta(problem, 0, 1, Smem(a_stages=3))
    c.run(np.random.default_rng(1))
    with pytest.raises(AssertionError, match="deadlock"):
        Cta(problem, 0, 1, Smem(a_stages=2)).run(np.random.default_rng(1))
