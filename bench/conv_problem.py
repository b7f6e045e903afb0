"""A fused-conv problem on fresh random data: host operands, golden output, and one kernel run with
the output poisoned first. Shared by the GPU tests and `trtfuse bench kernels`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..plugins.layout import pack_nchwv, pack_weight, round_up, unpack_chw32
from ..plugins.reference import conv_int8_accumulate, requantize_epilogue
from ..plugins.tactics import ConvShape

POISON = 0x5A  # an int8 value (90) the kernel must overwrite everywhere


@dataclass
class ConvProblem:
    shape: ConvShape
    x: np.ndarray  # int8 logical NCHW
    w: np.ndarray  # int8 [K, C, R, S]
    scale: np.ndarray  # float32 [Kpad]
    bias: np.ndarray
    out_scale: np.ndarray  # float32 [1]
    residual: np.ndarray | None
    residual_scale: np.ndarray | None
    relu: bool

    @classmethod
    def random(cls, shape: ConvShape, has_residual: bool, relu: bool = True, seed=None) -> "ConvProblem":
        """`shape`'s `residual` becomes has_residual: the problem's shape says whether it has one."""
        shape = dataclasses.replace(shape, residual=has_residual)
        rng = np.random.default_rng(seed)
        kp = round_up(shape.k, 32)
        oh, ow = shape.out_hw
        x = rng.integers(-128, 128, (shape.n, shape.c, shape.h, shape.w), dtype=np.int8)
        w = rng.integers(-127, 128, (shape.k, shape.c, shape.r, shape.s), dtype=np.int8)
        # Scales sized so outputs spread over the int8 range and saturate at the tails.
        std = 128 * 73 * np.sqrt(shape.c * shape.r * shape.s)
        scale = np.zeros(kp, np.float32)
        scale[: shape.k] = rng.uniform(0.5, 1.5, shape.k) / std
        bias = np.zeros(kp, np.float32)
        bias[: shape.k] = rng.normal(0, 0.3, shape.k)
        res = rng.integers(-128, 128, (shape.n, shape.k, oh, ow), dtype=np.int8) if has_residual else None
        return cls(shape, x, w, scale, bias, np.array([rng.uniform(0.01, 0.03)], np.float32), res,
                   np.array([rng.uniform(0.002, 0.01)], np.float32) if has_residual else None, relu)

    def folded(self) -> "ConvProblem":
        """The same problem as the space-to-depth stem runs it (plugins/stem.py): same outputs, exactly."""
        from ..plugins import stem

        fc = stem.fold(self.shape)
        return ConvProblem(fc.shape, stem.fold_input(self.x), stem.fold_weight(self.w, fc), self.scale, self.bias,
                           self.out_scale, self.residual, self.residual_scale, self.relu)

    def golden(self) -> np.ndarray:
        """docs/ops.md on the CPU (plugins/reference.py). bench/kernels.py's golden_on_device gives the same bits on the
        GPU, for batch 256."""
        sh = self.shape
        return requantize_epilogue(conv_int8_accumulate(self.x, self.w, sh.stride, sh.pads), self.scale, self.bias,
                                   float(self.out_scale[0]), self.residual,
                                   None if self.residual_scale is None else float(self.residual_scale[0]), self.relu)


class DeviceConv:
    """The problem's operands on the GPU in kernel layouts, and a launch that poisons y first."""

    def __init__(self, problem: ConvProblem, launch):
        from ..plugins import cuda_driver as cd

        self.p, self.launch_plan = problem, launch
        sh = problem.shape
        oh, ow = sh.out_hw
        self.kp = round_up(sh.k, 32)
        self.x = cd.DeviceBuffer.from_array(pack_nchwv(problem.x, sh.vec))
        self.w = cd.DeviceBuffer.from_array(pack_weight(problem.w, sh.vec))
        self.scale = cd.DeviceBuffer.from_array(problem.scale)
        self.bias = cd.DeviceBuffer.from_array(problem.bias)
        self.out_scale = cd.DeviceBuffer.from_array(problem.out_scale)
        self.res = cd.DeviceBuffer.from_array(pack_nchwv(problem.residual, 32)) if problem.residual is not None else None
        self.res_scale = cd.DeviceBuffer.from_array(problem.residual_scale) if problem.residual is not None else None
        self.y_shape = (sh.n, self.kp // 32, oh, ow, 32)
        self.y = cd.DeviceBuffer(int(np.prod(self.y_shape)))
        self.ws = None
        if launch.workspace_bytes:
            self.ws = cd.DeviceBuffer(launch.workspace_bytes)
            self.ws.fill(0)

    def run(self, stream=None) -> None:
        self.launch_plan.launch(self.x.ptr, self.w.ptr, self.scale.ptr, self.bias.ptr, self.out_scale.ptr, self.y.ptr,
                                residual=self.res.ptr if self.res else 0,
                                residual_scale=self.res_scale.ptr if self.res_scale else 0, relu=self.p.relu,
                                workspace=self.ws.ptr if self.ws else 0, stream=stream)

    def run_checked(self) -> np.ndarray:
        """Poison y, launch, synchronize; return (logical int8 output, raw CHW32 output)."""
        from ..plugins import cuda_driver as cd

        self.y.fill(POISON)
        self.run()
        cd.check(cd._driver().cuCtxSynchronize())
        raw = self.y.download(self.y_shape, np.int8)
        return unpack_chw32(raw, self.p.shape.k), raw


def compare(out: np.ndarray, ref: np.ndarray) -> dict:
    diff = np.abs(out.astype(np.int32) - ref.astype(np.int32))
    return {"elements": int(ref.size), "exact_fraction": float((diff == 0).mean()), "max_abs_diff": int(diff.max(initial=0))}


def passes_lsb_rule(stats: dict) -> bool:
    """docs/ops.md: >= 99.9% of elements exact and none off by more than 1."""
    return stats["exact_fraction"] >= 0.999 and stats["max_abs_diff"] <= 1


class DeviceStemPool:
    """A space-to-depth stem problem (ConvProblem of the original 7x7/2 conv, no residual) on the GPU as the fused
    stem + max-pool kernel runs it (plugins/stem.py: launch_stem_pool); golden() is the conv's golden then the
    3x3/2 max-pool. conv1: a 1x1 64 -> 64 ConvProblem on the pooled output, computed inside (stem.conv1_refusal); its
    x is replaced by the pooled golden (pooled_golden where given: bench kernels computes it on the device)."""

    def __init__(self, problem: ConvProblem, use_wgmma: bool | None = None, tile: tuple[int, int] | None = None,
                 conv1: ConvProblem | None = None, pooled_golden: np.ndarray | None = None):
        from dataclasses import replace

        from ..plugins import cuda_driver as cd
        from ..plugins import stem

        self.p, self.use_wgmma, self.tile = problem, use_wgmma, tile or stem.POOL_TILE
        folded = problem.folded()
        self.x = cd.DeviceBuffer.from_array(pack_nchwv(folded.x, folded.shape.vec))
        self.w = cd.DeviceBuffer.from_array(pack_weight(folded.w, folded.shape.vec))
        self.scale = cd.DeviceBuffer.from_array(problem.scale)
        self.bias = cd.DeviceBuffer.from_array(problem.bias)
        self.out_scale = cd.DeviceBuffer.from_array(problem.out_scale)
        ph, pw = stem.pooled_hw(problem.shape)
        self.y_shape = (problem.shape.n, round_up(problem.shape.k, 32) // 32, ph, pw, 32)
        self.y = cd.DeviceBuffer(int(np.prod(self.y_shape)))
        self.conv1 = None if conv1 is None else replace(conv1, x=self.golden() if pooled_golden is None else pooled_golden)
        if conv1 is not None:
            self.conv1_buffers = tuple(cd.DeviceBuffer.from_array(a) for a in (pack_weight(conv1.w, 32), conv1.scale,
                                                                               conv1.bias, conv1.out_scale))
            self.y1 = cd.DeviceBuffer(int(np.prod(self.y_shape)))

    def run(self, stream=None) -> None:
        from ..plugins import stem

        conv1 = None
        if self.conv1 is not None:
            conv1 = (self.conv1.shape, *(b.ptr for b in self.conv1_buffers), self.y1.ptr, self.conv1.relu)
        stem.launch_stem_pool(self.p.shape, self.x.ptr, self.w.ptr, self.scale.ptr, self.bias.ptr, self.out_scale.ptr,
                              self.y.ptr, relu=self.p.relu, stream=stream, use_wgmma=self.use_wgmma, tile=self.tile,
                              conv1=conv1)

    def conv1_output(self) -> tuple[np.ndarray, np.ndarray]:
        """After run_checked: the conv computed inside (logical int8, raw CHW32)."""
        raw = self.y1.download(self.y_shape, np.int8)
        return unpack_chw32(raw, self.conv1.shape.k), raw

    def run_checked(self) -> tuple[np.ndarray, np.ndarray]:
        """Poison y (and the inside conv's output), launch, synchronize; return (logical int8 output, raw CHW32
        output)."""
        from ..plugins import cuda_driver as cd

        self.y.fill(POISON)
        if self.conv1 is not None:
            self.y1.fill(POISON)
        self.run()
        cd.check(cd._driver().cuCtxSynchronize())
        raw = self.y.download(self.y_shape, np.int8)
        return unpack_chw32(raw, self.p.shape.k), raw

    def golden(self) -> np.ndarray:
        from ..plugins import stem
        from ..plugins.reference import maxpool_int8

        return maxpool_int8(self.p.golden(), *stem.POOL_WINDOW)


@dataclass
class BottleneckProblem:
    """ResNet's identity bottleneck block on fresh random data: three ConvProblems (conv1 1x1 256 -> 64, conv2 3x3
    pad 1 64 -> 64, conv3 1x1 64 -> 256 with the block input as residual) chained as the separate ops run them: each
    conv's x is the previous conv's golden output, conv3's residual is the block input and its residual_scale stands
    for the block input's scale."""

    convs: tuple  # (conv1, conv2, conv3) ConvProblems, x and residual filled in from the chain
    conv_golden: object = None  # the per-conv golden random() chained them with

    @classmethod
    def random(cls, n: int, h: int, w: int, relu: bool = True, seed=None, golden=None) -> "BottleneckProblem":
        """golden: the per-conv golden that chains the inputs (default ConvProblem.golden, on the CPU; bench kernels
        passes its on-device one for batch 256)."""
        from dataclasses import replace

        from ..plugins import bottleneck

        rng = np.random.default_rng(seed)
        c, width = bottleneck.CHANNELS, bottleneck.WIDTH
        seeds = rng.integers(0, 2**31, 3)
        conv1 = ConvProblem.random(ConvShape(n, c, h, w, width, 1, 1), False, relu, seeds[0])
        conv2 = ConvProblem.random(ConvShape(n, width, h, w, width, 3, 3, (1, 1), (1, 1, 1, 1)), False, relu, seeds[1])
        conv3 = ConvProblem.random(ConvShape(n, width, h, w, c, 1, 1), True, relu, seeds[2])
        golden = golden or ConvProblem.golden
        conv2 = replace(conv2, x=golden(conv1))
        conv3 = replace(conv3, x=golden(conv2), residual=conv1.x)
        return cls((conv1, conv2, conv3), golden)

    @property
    def x(self) -> np.ndarray:
        return self.convs[0].x

    @property
    def shapes(self) -> tuple:
        return tuple(c.shape for c in self.convs)

    def golden(self) -> np.ndarray:
        """The block's output: conv3's golden on conv2's on conv1's (random() chained the inputs)."""
        return (self.conv_golden or ConvProblem.golden)(self.convs[2])


class DeviceBottleneck:
    """A BottleneckProblem on the GPU as the fused bottleneck kernel runs it (plugins/bottleneck.py)."""

    def __init__(self, problem: BottleneckProblem):
        from ..plugins import cuda_driver as cd

        self.p = problem
        self.x = cd.DeviceBuffer.from_array(pack_nchwv(problem.x, 32))
        self.convs = [tuple(cd.DeviceBuffer.from_array(a) for a in (pack_weight(c.w, 32), c.scale, c.bias, c.out_scale))
                      for c in problem.convs]
        self.residual_scale = cd.DeviceBuffer.from_array(problem.convs[2].residual_scale)
        n, _, h, w = problem.x.shape
        self.y_shape = (n, problem.convs[2].shape.k // 32, h, w, 32)
        self.y = cd.DeviceBuffer(int(np.prod(self.y_shape)))

    def run(self, stream=None) -> None:
        from ..plugins import bottleneck

        bottleneck.launch_bottleneck(self.p.shapes, self.x.ptr, [tuple(b.ptr for b in c) for c in self.convs],
                                     self.residual_scale.ptr, self.y.ptr,
                                     relu=tuple(c.relu for c in self.p.convs), stream=stream)

    def run_checked(self) -> tuple[np.ndarray, np.ndarray]:
        """Poison y, launch, synchronize; return (logical int8 output, raw CHW32 output)."""
        from ..plugins import cuda_driver as cd

        self.y.fill(POISON)
        self.run()
        cd.check(cd._driver().cuCtxSynchronize())
        raw = self.y.download(self.y_shape, np.int8)
        return unpack_chw32(raw, self.p.convs[2].shape.k), raw


def run_separate_convs(problem: BottleneckProblem) -> np.ndarray:
    """The block as three fused-conv kernel launches (each its planned tactic), each fed the previous launch's device
    output (downloaded, exact int8): the raw CHW32 output of the last."""
    from dataclasses import replace

    from ..plugins.conv import ConvLaunch

    conv1, conv2, conv3 = problem.convs
    t1, _ = DeviceConv(conv1, ConvLaunch.plan(conv1.shape)).run_checked()
    t2, _ = DeviceConv(replace(conv2, x=t1), ConvLaunch.plan(conv2.shape)).run_checked()
    _, raw = DeviceConv(replace(conv3, x=t2), ConvLaunch.plan(conv3.shape)).run_checked()
    return raw


def fused_conv_golden(c: ConvProblem) -> np.ndarray:
    """A conv's output as docs/ops.md defines it: plugins/reference.py's fused_conv_int8 on its packed weight."""
    from ..plugins.reference import fused_conv_int8

    sh = c.shape
    return fused_conv_int8(c.x, pack_weight(c.w, 32), c.scale, c.bias, c.out_scale, c.residual, c.residual_scale,
                           in_channels=sh.c, out_channels=sh.k, kernel_shape=(sh.r, sh.s), strides=sh.stride,
                           pads=sh.pads, relu=int(c.relu))


class BlockProblem(BottleneckProblem):
    """The identity bottleneck block as the row-pipeline kernel (plugins/block_rows.py) is checked against it: a
    BottleneckProblem whose convs are chained, and whose output is defined, by fused_conv_int8 three times."""

    @classmethod
    def random(cls, n: int, h: int, w: int, relu: bool = True, seed=None, golden=None) -> "BlockProblem":
        return super().random(n, h, w, relu, seed, golden or fused_conv_golden)


class DeviceBlockRows(DeviceBottleneck):
    """A BlockProblem on the GPU as the row-pipeline block kernel runs it; max_ctas caps its persistent grid."""

    def __init__(self, problem: BottleneckProblem, max_ctas: int | None = None):
        super().__init__(problem)
        self.max_ctas = max_ctas

    def run(self, stream=None) -> None:
        from ..plugins import block_rows

        block_rows.launch(self.p.shapes, self.x.ptr, [tuple(b.ptr for b in c) for c in self.convs],
                          self.residual_scale.ptr, self.y.ptr, relu=tuple(c.relu for c in self.p.convs), stream=stream,
                          max_ctas=self.max_ctas)


@dataclass
class ChainProblem:
    """Two chained 1x1 convs on fresh random data, as the chain kernel runs them (plugins/chain_conv.py): conv 1
    (K1 -> C1 with a residual, ResNet's conv3 + add + ReLU) and conv 2 (C1 -> C2, the next block's conv1), conv 2's x
    being conv 1's golden output. With a downsample (a stage's first block): conv 1's residual is the golden output of
    a 1x1 conv of x0 (ds_k -> c1 channels, no ReLU, read by nothing else), its residual_scale that conv's out_scale."""

    convs: tuple  # (conv1, conv2) ConvProblems, conv2.x filled in from the chain
    conv_golden: object = None  # a per-conv golden (ConvProblem -> int8 NCHW) instead of fused_conv_int8 on the CPU
    downsample: object = None  # the downsample's ConvProblem (its x is x0), or None: the residual is read

    @classmethod
    def random(cls, n: int, h: int, w: int, c2: int, relu=(True, True), seed=None, golden=None, k1: int = 64,
               c1: int = 256, ds_k: int = 0, ds_relu: bool = False) -> "ChainProblem":
        """Conv 1 k1 -> c1 channels, conv 2 c1 -> c2 (res2's pairs by default; res3's: k1 128, c1 512); ds_k > 0: conv
        1's residual from a ds_k -> c1 downsample of a fresh x0. golden: as conv_golden (bench kernels passes its
        on-device one for batch 256)."""
        from dataclasses import replace

        rng = np.random.default_rng(seed)
        seeds = rng.integers(0, 2**31, 3)
        conv1 = ConvProblem.random(ConvShape(n, k1, h, w, c1, 1, 1), True, relu[0], seeds[0])
        conv2 = ConvProblem.random(ConvShape(n, c1, h, w, c2, 1, 1), False, relu[1], seeds[1])
        problem = cls((conv1, conv2), golden)
        if ds_k:
            problem.downsample = ConvProblem.random(ConvShape(n, ds_k, h, w, c1, 1, 1), False, ds_relu, seeds[2])
            conv1 = replace(conv1, residual=problem.golden_of(problem.downsample),
                            residual_scale=problem.downsample.out_scale.copy())
            problem.convs = (conv1, conv2)
        problem.convs = (conv1, replace(conv2, x=problem.golden_conv(0)))
        return problem

    @property
    def shapes(self) -> tuple:
        return tuple(c.shape for c in self.convs)

    def golden_conv(self, i: int) -> np.ndarray:
        """Conv i's output as docs/ops.md defines it: plugins/reference.py's fused_conv_int8 on its packed weight (or
        conv_golden's)."""
        return self.golden_of(self.convs[i])

    def golden_of(self, c) -> np.ndarray:
        """Any conv c of the problem (a ConvProblem: the pair's or the downsample) as golden_conv computes it."""
        from ..plugins.reference import fused_conv_int8

        if self.conv_golden is not None:
            return self.conv_golden(c)
        sh = c.shape
        return fused_conv_int8(c.x, pack_weight(c.w, 32), c.scale, c.bias, c.out_scale, c.residual, c.residual_scale,
                               in_channels=sh.c, out_channels=sh.k, kernel_shape=(sh.r, sh.s), strides=sh.stride,
                               pads=sh.pads, relu=int(c.relu))

    def golden(self) -> tuple[np.ndarray, np.ndarray]:
        """(y, z): fused_conv_int8 twice, z on y."""
        return self.golden_conv(0), self.golden_conv(1)


class DeviceChain:
    """A ChainProblem on the GPU as the chain kernel runs it; max_ctas caps its persistent grid; y_stride 2 stores y's
    pixels at even rows and columns only (chain_conv.launch_chain)."""

    def __init__(self, problem: ChainProblem, max_ctas: int | None = None, y_stride: int = 1):
        from ..plugins import cuda_driver as cd
        from ..plugins.chain_conv import stored_y_hw

        self.p, self.max_ctas, self.y_stride = problem, max_ctas, y_stride
        conv1, conv2 = problem.convs
        self.x = cd.DeviceBuffer.from_array(pack_nchwv(conv1.x, 32))
        ds = problem.downsample
        # with the downsample inside, the residual buffer holds poison: the kernel must compute it, never read it
        residual = pack_nchwv(conv1.residual, 32)
        self.res = cd.DeviceBuffer.from_array(residual if ds is None else np.full_like(residual, POISON))
        self.ds = None if ds is None else (cd.DeviceBuffer.from_array(pack_nchwv(ds.x, 32)),
                                           tuple(cd.DeviceBuffer.from_array(a) for a in (pack_weight(ds.w, 32), ds.scale, ds.bias, ds.out_scale)))
        self.res_scale = cd.DeviceBuffer.from_array(conv1.residual_scale)
        self.convs = [tuple(cd.DeviceBuffer.from_array(a) for a in (pack_weight(c.w, 32), c.scale, c.bias, c.out_scale))
                      for c in problem.convs]
        n, _, h, w = conv1.x.shape
        self.y_shape = (n, round_up(conv1.shape.k, 32) // 32, *stored_y_hw(conv1.shape, y_stride), 32)
        self.z_shape = (n, round_up(conv2.shape.k, 32) // 32, h, w, 32)
        self.y = cd.DeviceBuffer(int(np.prod(self.y_shape)))
        self.z = cd.DeviceBuffer(int(np.prod(self.z_shape)))

    def run(self, stream=None) -> None:
        from ..plugins import chain_conv

        ds = None
        if self.ds is not None:
            ds = (self.p.downsample.shape, self.ds[0].ptr, tuple(b.ptr for b in self.ds[1]), self.p.downsample.relu)
        chain_conv.launch_chain(self.p.shapes, self.x.ptr, self.res.ptr, self.res_scale.ptr,
                                [tuple(b.ptr for b in c) for c in self.convs], self.y.ptr, self.z.ptr,
                                relu=tuple(c.relu for c in self.p.convs), stream=stream, max_ctas=self.max_ctas,
                                downsample=ds, y_stride=self.y_stride)

    def run_checked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Poison y and z, launch, synchronize; return (y, z logical int8, y, z raw CHW32)."""
        from ..plugins import cuda_driver as cd

        self.y.fill(POISON)
        self.z.fill(POISON)
        self.run()
        cd.check(cd._driver().cuCtxSynchronize())
        y_raw, z_raw = self.y.download(self.y_shape, np.int8), self.z.download(self.z_shape, np.int8)
        conv1, conv2 = self.p.convs
        return unpack_chw32(y_raw, conv1.shape.k), unpack_chw32(z_raw, conv2.shape.k), y_raw, z_raw


def run_separate_chain(problem: ChainProblem) -> tuple[np.ndarray, np.ndarray]:
    """The pair as two fused-conv kernel launches (each its planned tactic), the second fed the first's device output
    (downloaded, exact int8): the raw CHW32 outputs (y, z)."""
    from dataclasses import replace

    from ..plugins.conv import ConvLaunch

    conv1, conv2 = problem.convs
    y, y_raw = DeviceConv(conv1, ConvLaunch.plan(conv1.shape)).run_checked()
    _, z_raw = DeviceConv(replace(conv2, x=y), ConvLaunch.plan(conv2.shape)).run_checked()
    return y_raw, z_raw
