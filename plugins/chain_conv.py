"""Two chained 1x1 convs as one Hopper kernel (plugins/kernels/chain_conv.cu): a residual block's conv3 with its
residual add and ReLU (FusedConvAdd, K1 -> C1 channels) and the next block's conv1 (FusedConv, C1 -> C2), which reads
only the first one's output.

Run as two kernels, the first writes its C1-channel output y and the second reads it straight back; fused, y is still
written (the next block takes it as its residual) but its tile goes from the first GEMM's epilogue to the second GEMM
through shared memory. Both outputs are bit-identical to the two ops in sequence (the same integer accumulators, the
same requantize code), so the golden reference is fused_conv_int8 twice. docs/design/chain-conv.md has the layout,
the shared-memory budget and the bytes it saves.

Built for ResNet-50's res2 and res3 boundaries (VARIANTS): K1 = 64, C1 = 256, C2 = 64 (res2 -> res2) or 128 (res2 ->
res3's first conv1); K1 = 128, C1 = 512, C2 = 128 (res3 -> res3) or 256 (res3 -> res4's first conv1); any N, H, W with
H * W a multiple of 8. `refusal` says in one line why a pair is not taken.

A stage's first block has a downsample for its residual: a 1x1 stride-1 conv of the block's input x0 (res2: 64 -> 256
channels) that nothing else reads. DOWNSAMPLE_VARIANTS build the kernel with that conv inside (CHAIN_DS): the residual
tile is computed from x0's tile (a third GEMM, requantized as the downsample's own kernel would) and kept in registers,
so the downsample's output is neither written nor read back (`launch_chain(..., downsample=...)`, `downsample_refusal`).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, replace

from .conv_params import fast_divmod
from .conv_shape import H100_SMS, ConvShape
from .wgmma import hopper_refusal, permuted_weight_map, within_tma_limits

SOURCE = "chain_conv.cu"
ENTRY = "trtfuse_chain_conv"
ARCH = "sm_90a"
TILE = 64  # pixels per tile (chain_conv.cu: BM)
THREADS = 384  # two consumer warpgroups and the producer's
SHARED_LIMIT = 227 * 1024  # sm_90's opt-in shared memory per block


@dataclass(frozen=True)
class Variant:
    """One build of the kernel (chain_conv.cu's defines): conv 1 k1 -> c1 channels, conv 2 c1 -> c2."""

    k1: int
    c1: int
    c2: int
    stages: int  # ring slots of x tile + residual tile
    w2_stages: int  # 0: W2 resident; else W2 streamed per tile through that many k32 chunks, half in each consumer's ring
    a_in_slot: bool  # GEMM2's A tile written over the residual tile in its ring slot (else one per consumer warpgroup)
    # False where the variant measured slower than the two conv kernels it replaces (docs/design/chain-conv.md): it is
    # built, tested and benched, but the GPU runner leaves that pair to the two kernels
    in_runner: bool = True
    ds_k: int = 0  # > 0: the residual computed inside from a ds_k-channel x0 by the downsample conv (CHAIN_DS)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.k1, self.c1, self.c2)

    @property
    def name(self) -> str:
        return f"{self.k1}-{self.c1}-{self.c2}" + (f"-ds{self.ds_k}" if self.ds_k else "")

    def smem_parts(self) -> dict:
        """chain_conv.cu's Smem, by part: docs/design/chain-conv.md's budget tables."""
        w2 = (self.w2_stages or self.c1 // 32) * self.c2 * 32
        parts = {"W1": self.k1 * self.c1, "W2": w2, "A tiles": 0 if self.a_in_slot else 2 * TILE * self.c1,
                 "ring": self.stages * TILE * (self.k1 + (self.ds_k or self.c1)), "factors": 2 * (self.c1 + self.c2) * 4,
                 "mbarriers": (2 * self.stages + 1 + 2 * self.w2_stages) * 8, "alignment": 1024}
        if self.ds_k:  # its resident weights and factors; a ring slot holds x0's tile instead of the residual's
            parts.update(Wds=self.ds_k * self.c1, factors=2 * (2 * self.c1 + self.c2) * 4)
        return parts

    @property
    def smem_bytes(self) -> int:
        """Smem::BYTES + 1024 for aligning it (compiled in as CHAIN_SMEM, where a static_assert compares)."""
        return sum(self.smem_parts().values())

    def defines(self) -> dict:
        d = {"CHAIN_K1": self.k1, "CHAIN_C1": self.c1, "CHAIN_C2": self.c2, "CHAIN_STAGES": self.stages}
        if self.w2_stages or self.a_in_slot:  # (res2's builds keep the defines, and the cache keys, they had)
            d.update(CHAIN_W2_STAGES=self.w2_stages, CHAIN_A_IN_SLOT=int(self.a_in_slot))
        if self.ds_k:
            d["CHAIN_DS"] = self.ds_k
        return {**d, "CHAIN_SMEM": self.smem_bytes}


# res2 (K1 64, C1 256): both weights (32 or 48 KB) and two 32 KB A tiles leave room for 4 slots of 20 KB (x 4 KB +
# residual 16 KB). res3 (K1 128, C1 512): W1 is 64 KB and a slot 40 KB (x 8 KB + residual 32 KB), so the
# A tiles go into the slots (two slots: each consumer warpgroup's tile), and a 128 KB W2 (into res4's first conv1,
# 256 channels) is streamed through 8 chunks of 8 KB. docs/design/chain-conv.md has the tables.
VARIANTS = {v.key: v for v in (Variant(64, 256, 64, 4, 0, False), Variant(64, 256, 128, 4, 0, False),
                                Variant(128, 512, 128, 2, 0, True), Variant(128, 512, 256, 2, 8, True, in_runner=False))}
# res2's first block with its downsample inside (64 -> 256 from the pooled stem output): a slot is 8 KB (x 4 KB + x0
# 4 KB), and 6 of them keep about 48 KB of tiles in flight per SM
DOWNSAMPLE_VARIANTS = {v.key: v for v in (Variant(64, 256, 64, 6, 0, False, ds_k=64),)}


def pair_shapes(n: int, c: int, h: int, w: int, k: int, next_k: int) -> tuple[ConvShape, ConvShape]:
    """The two convs of a FusedConvAddConv (plugins/op_schema.py) on x [n, c, h, w]: 1x1 stride-1 unpadded, c -> k, then
    k -> next_k on its output (no residual)."""
    return (ConvShape(n, c, h, w, k, 1, 1, (1, 1), (0, 0, 0, 0)),
            ConvShape(n, k, h, w, next_k, 1, 1, (1, 1), (0, 0, 0, 0), residual=False))


def _builds(downsample: bool) -> dict:
    return DOWNSAMPLE_VARIANTS if downsample else VARIANTS


def variant_of(conv1: ConvShape, c2: int, downsample: bool = False) -> Variant:
    key, table = (conv1.c, conv1.k, c2), _builds(downsample)
    if key not in table:
        raise ValueError(f"no chain kernel{' with a downsample' if downsample else ''} computes {conv1.c} -> {conv1.k} -> "
                         f"{c2} channels; it is built for " + ", ".join(v.name for v in table.values()))
    return table[key]


def compile_chain(key: tuple[int, int, int], target: str = "cubin", use_cache: bool = True, downsample: bool = False):
    """The build of VARIANTS[key] (DOWNSAMPLE_VARIANTS[key] with downsample), key = (K1, C1, C2)."""
    from .nvrtc import compile_kernel

    return compile_kernel(SOURCE, _builds(downsample)[key].defines(), ARCH, target, use_cache)


def _pointwise_refusal(name: str, shape: ConvShape) -> str | None:
    if shape.vec != 32 or shape.in_vec not in (0, 32):
        return f"{name} reads a {shape.vec}-channel vector layout, the kernel reads CHW32"
    if (shape.r, shape.s, tuple(shape.stride), tuple(shape.pads)) != (1, 1, (1, 1), (0, 0, 0, 0)):
        return f"{name} is {shape.r}x{shape.s} stride {shape.stride[0]} pads {tuple(shape.pads)}, the kernel runs 1x1 stride-1 unpadded convs"
    return None


def refusal(conv1: ConvShape, conv2: ConvShape) -> str | None:
    """Why conv1 (with a residual) followed by conv2 on conv1's output cannot run as the chain kernel, or None if it
    can. That conv2 reads nothing but conv1's output, and that conv1's residual is an int8 CHW32 tensor of its output's
    shape, is the caller's graph check."""
    for name, shape in (("conv 1", conv1), ("conv 2", conv2)):
        why = _pointwise_refusal(name, shape)
        if why:
            return why
    firsts = sorted({(k1, c1) for k1, c1, _ in VARIANTS})
    if (conv1.c, conv1.k) not in firsts:
        return (f"conv 1 is {conv1.c} -> {conv1.k} channels, the kernel computes "
                + " or ".join(f"{k1} -> {c1}" for k1, c1 in firsts))
    if conv2.c != conv1.k or (conv2.n, conv2.h, conv2.w) != (conv1.n, conv1.h, conv1.w):
        return f"conv 2's input {conv2.n}x{conv2.c}x{conv2.h}x{conv2.w} is not conv 1's output {conv1.n}x{conv1.k}x{conv1.h}x{conv1.w}"
    c2s = [c2 for k1, c1, c2 in VARIANTS if (k1, c1) == (conv1.c, conv1.k)]
    if conv2.k not in c2s:
        return (f"conv 2 has {conv2.k} output channels, after a {conv1.c} -> {conv1.k} conv 1 the kernel computes "
                + " or ".join(map(str, c2s)))
    if conv1.h * conv1.w % 8:
        return f"a {conv1.h}x{conv1.w} map does not come in 8-pixel groups (the tile's TMA boxes are whole groups)"
    if conv1.n * conv1.h * conv1.w >= 2**31:
        return "over 2^31 pixels (the kernel's pixel index is an int32)"
    return None


def downsample_refusal(conv1: ConvShape, conv2: ConvShape, ds: ConvShape) -> str | None:
    """Why the pair cannot run with conv 1's residual computed inside from x0 by `ds` (the downsample conv, its shape on
    x0), or None. That the residual is ds's output and nothing else reads it is the caller's graph check."""
    why = refusal(conv1, conv2) or _pointwise_refusal("the downsample", ds)
    if why:
        return why
    v = DOWNSAMPLE_VARIANTS.get((conv1.c, conv1.k, conv2.k))
    if v is None:
        return (f"no build with a downsample for {conv1.c} -> {conv1.k} -> {conv2.k} channels; built for "
                + ", ".join(v.name for v in DOWNSAMPLE_VARIANTS.values()))
    if ds.c != v.ds_k or ds.k != conv1.k or (ds.n, ds.h, ds.w) != (conv1.n, conv1.h, conv1.w):
        return (f"the downsample is {ds.n}x{ds.c}x{ds.h}x{ds.w} -> {ds.k} channels, the build computes "
                f"{conv1.n}x{v.ds_k}x{conv1.h}x{conv1.w} -> {conv1.k}")
    return None


class ChainParamsStruct(ctypes.Structure):
    """Mirror of trtfuse::ChainParams (plugins/kernels/chain_conv.cu); same field order."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("scale1", "bias1", "out_scale1", "residual_scale", "y",
                                               "scale2", "bias2", "out_scale2", "z")] + [
        (n, ctypes.c_int32) for n in ("N", "hw", "tiles", "groups_per_image", "box_groups", "relu1", "relu2")] + [
        (f"{name}_{f}", ctypes.c_uint32) for name in ("div_hw", "div_groups") for f in ("d", "mul", "shr")] + [
        (n, ctypes.c_uint64) for n in ("scale_ds", "bias_ds", "out_scale_ds")] + [("relu_ds", ctypes.c_int32)] + [
        (n, ctypes.c_int32) for n in ("y_stride", "w", "y_w", "y_hw")] + [
        (f"div_w_{f}", ctypes.c_uint32) for f in ("d", "mul", "shr")]


def tiles(shape: ConvShape) -> int:
    return math.ceil(shape.n * shape.h * shape.w / TILE)


def box_groups(shape: ConvShape) -> int:
    """8-pixel groups per TMA box: the largest power of two dividing both the image's groups and the tile's 8, so a
    box never crosses an image and the tile is whole boxes."""
    groups = shape.h * shape.w // 8
    return min(groups & -groups, TILE // 8)


def tensor_map_args(conv1: ConvShape, c2: int, downsample: bool = False) -> dict:
    """(dims, byte strides of dims 1.., box, element strides, swizzle bytes) of each tensor map, checked against
    cuTensorMapEncodeTiled's documented limits so a bad shape fails here, by name.

    * x and the residual: the CHW32 tensor [N][CB][H][W][32] as (32, 8, CB, G, N), G = H * W / 8 groups of 8
      pixels: a box of box_groups groups x every channel block lands [group][block][8][32]. x's with 32-byte swizzle
      (wgmma's operand A, each k32 step from byte 256 * block, 8-row groups CB * 256 bytes apart); the residual's
      unswizzled (read by the epilogue's threads), or, where GEMM2's A tile is written over it (a_in_slot), with the
      32-byte swizzle too, so that the y bytes written in its place make wgmma's operand A as x's do. With the
      downsample inside, "res" is x0 (ds_k channels), swizzled like x: the downsample's operand A.
    * weights: the packed [Kpad][KGpad] matrix with its rows permuted inside each 32-channel block, dims (KGpad, e 2,
      q 4, jj 4, Kpad / 32) with row strides (1, 8, 2, 32), so box row e + 2q + 8jj + 32b is channel 32b + 8q + 2jj + e:
      wgmma column 8(4b + jj) + 2q + e then holds it, and a thread's accumulators are 8 consecutive channels (as the
      pixel-major wgmma tiles, plugins/wgmma.py). One box of 32 bytes of GEMM-K x every row per k32 step, 32-byte
      swizzle. With the downsample inside, "wds" is its weight, mapped like w1."""
    v = variant_of(conv1, c2, downsample)
    n, h, w = conv1.n, conv1.h, conv1.w
    hw, groups, gb = h * w, h * w // 8, box_groups(conv1)
    args = {}
    res = (v.ds_k // 32, 32) if v.ds_k else (v.c1 // 32, 32 if v.a_in_slot else 0)
    for name, blocks, swizzle in (("x", v.k1 // 32, 32), ("res", *res)):
        args[name] = ((32, 8, blocks, groups, n), (32, hw * 32, 256, blocks * hw * 32), (32, 8, blocks, gb, 1), (1,) * 5, swizzle)
    for name, kg, rows in (("w1", v.k1, v.c1), ("w2", v.c1, c2)) + ((("wds", v.ds_k, v.c1),) if v.ds_k else ()):
        args[name] = (*permuted_weight_map(kg, rows, 32, rows), 32)
    for name, (dims, strides, box, es, swizzle) in args.items():
        # besides the encoder's limits: no box larger than its tensor, whole 16-byte inner rows
        ok = (within_tma_limits(dims, strides, box, es, max(swizzle, 32)) and all(b <= d for b, d in zip(box, dims))
              and box[0] % 16 == 0)
        if not ok:
            raise ValueError(f"chain conv: {name} tensor map outside TMA limits for {conv1}: {dims} {strides} {box}")
    return args


Y_STRIDES = (1, 2)  # y stored whole, or only its pixels at even rows and columns (chain_conv.cu: y_stride)


def stored_y_hw(conv1: ConvShape, y_stride: int) -> tuple[int, int]:
    """The map y is stored as: conv 1's output, or its pixels at even rows and columns, the map a 1x1 stride-2
    unpadded conv reads of it (conv 1 is 1x1 unpadded: that conv at y_stride has it as its output)."""
    return replace(conv1, stride=(y_stride, y_stride)).out_hw


def params(conv1: ConvShape, conv2: ConvShape, ptrs: dict, relu: tuple[bool, bool], relu_ds: bool = False,
           y_stride: int = 1) -> ChainParamsStruct:
    hw = conv1.h * conv1.w
    y_h, y_w = stored_y_hw(conv1, y_stride)
    d_hw, d_groups, d_w = fast_divmod(hw), fast_divmod(hw // 8), fast_divmod(conv1.w)
    return ChainParamsStruct(**ptrs, N=conv1.n, hw=hw, tiles=tiles(conv1), groups_per_image=hw // 8,
                             box_groups=box_groups(conv1), relu1=int(relu[0]), relu2=int(relu[1]), relu_ds=int(relu_ds),
                             div_hw_d=d_hw[0], div_hw_mul=d_hw[1], div_hw_shr=d_hw[2],
                             div_groups_d=d_groups[0], div_groups_mul=d_groups[1], div_groups_shr=d_groups[2],
                             y_stride=y_stride, w=conv1.w, y_w=y_w, y_hw=y_h * y_w,
                             div_w_d=d_w[0], div_w_mul=d_w[1], div_w_shr=d_w[2])


def grid(conv1: ConvShape, sms: int = H100_SMS, max_ctas: int | None = None) -> int:
    """Persistent CTAs: one per two tiles (each CTA's two consumer warpgroups take its tiles in turn), at most one per
    SM; max_ctas caps it (tests: CTAs that walk many tiles, the ring wrapping round)."""
    ctas = min(math.ceil(tiles(conv1) / 2), sms)
    return max(1, min(ctas, max_ctas) if max_ctas else ctas)


def device_refusal() -> str | None:
    """Why the current GPU cannot run every variant of the kernel, or None."""
    return hopper_refusal("the chain kernel", max(v.smem_bytes for v in (*VARIANTS.values(), *DOWNSAMPLE_VARIANTS.values())))


def launch_chain(shapes: tuple[ConvShape, ConvShape], x: int, residual: int, residual_scale: int, convs, y: int, z: int,
                 *, relu=(True, True), stream=None, max_ctas: int | None = None, downsample=None, y_stride: int = 1) -> None:
    """Conv 1 on int8 CHW32 x [N, K1, H, W] with `residual` [N, C1, H, W] into y [N, C1, H, W], and conv 2 on y into
    z [N, C2, H, W]. `convs`: two (weight, scale, bias, out_scale) device pointer tuples, each conv's operands as
    docs/ops.md gives them (weights packed by layout.pack_weight); residual_scale: conv 1's.
    downsample: (ds shape, x0, (weight, scale, bias, out_scale), relu) computes the residual inside as that 1x1 conv of
    x0 (`residual` is then not read); residual_scale is still conv 1's, the downsample output's scale.
    y_stride 2: y is stored as [N, C1, ceil(H / 2), ceil(W / 2)], only its pixels at even rows and columns (stored_y_hw;
    conv 2 still reads all of y, on chip)."""
    from . import cuda_driver as cd
    from .wgmma import encode_tensor_map

    conv1, conv2 = shapes
    why = (downsample_refusal(conv1, conv2, downsample[0]) if downsample else refusal(conv1, conv2)) or device_refusal()
    if why:
        raise ValueError(why)
    if y_stride not in Y_STRIDES:
        raise ValueError(f"y_stride {y_stride}: the kernel stores y whole (1) or at even rows and columns (2)")
    if len(convs) != 2 or any(len(c) != 4 for c in convs) or (downsample and len(downsample[2]) != 4):
        raise ValueError("convs (and the downsample's) must be (weight, scale, bias, out_scale) pointer tuples")
    (w1, s1, b1, o1), (w2, s2, b2, o2) = convs
    args = tensor_map_args(conv1, conv2.k, downsample is not None)
    tensors = [("x", x), ("res", residual), ("w1", w1), ("w2", w2)]
    ds_ptrs, relu_ds = dict(scale_ds=0, bias_ds=0, out_scale_ds=0), False
    if downsample:  # the "res" map reads x0, and the downsample's weight gets a map of its own
        _, x0, (wds, sds, bds, ods), relu_ds = downsample
        tensors[1] = ("res", x0)
        tensors.append(("wds", wds))
        ds_ptrs = dict(scale_ds=sds, bias_ds=bds, out_scale_ds=ods)
    maps = [encode_tensor_map(5, ptr, *args[name]) for name, ptr in tensors]
    p = params(conv1, conv2, dict(scale1=s1, bias1=b1, out_scale1=o1, residual_scale=residual_scale, y=y, scale2=s2,
                                  bias2=b2, out_scale2=o2, z=z, **ds_ptrs), relu, bool(relu_ds), y_stride)
    defines = variant_of(conv1, conv2.k, downsample is not None).defines()
    smem = defines["CHAIN_SMEM"]
    fn = cd.kernel_module(SOURCE, defines, arch=ARCH).function(ENTRY, smem)
    ctas = grid(conv1, cd.device_attribute("MULTIPROCESSOR_COUNT"), max_ctas)
    cd.launch(fn, (ctas, 1, 1), (THREADS, 1, 1), smem, stream, [ctypes.addressof(a) for a in (*maps, p)])


def launch_chain_op(shapes: tuple[ConvShape, ConvShape], inputs, y: int, z: int, *, relu=(True, True), stream=None,
                    downsample=None, y_stride: int = 1) -> None:
    """launch_chain on a FusedConvAddConv's device pointers in node-input order (plugins/op_schema.py), read by name,
    into its outputs y and z. downsample: (ds shape, its FusedConv's device pointers in node-input order, relu): the
    residual input is that conv's output, computed inside. y_stride: as launch_chain's."""
    from .op_schema import FUSED_CONV, FUSED_CONV_ADD, chain_inputs

    first, second = (op.bind(ins) for op, ins in zip((FUSED_CONV_ADD, FUSED_CONV), chain_inputs(inputs, y)))
    convs = [tuple(b[k] for k in ("weight", "scale", "bias", "out_scale")) for b in (first, second)]
    ds = None
    if downsample:
        ds_shape, ds_inputs, ds_relu = downsample
        d = FUSED_CONV.bind(ds_inputs)
        ds = (ds_shape, d["x"], tuple(d[k] for k in ("weight", "scale", "bias", "out_scale")), ds_relu)
    launch_chain(shapes, first["x"], first["residual"], first["residual_scale"], convs, y, z, relu=relu, stream=stream,
                 downsample=ds, y_stride=y_stride)
