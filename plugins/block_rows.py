"""ResNet-50's res2 identity bottleneck block as one Hopper kernel that walks image rows (plugins/kernels/block_rows.cu):
conv1 (1x1 256 -> 64), conv2 (3x3 pad 1, 64 -> 64) and conv3 (1x1 64 -> 256 with the block input as residual), each
with its requantize and ReLU, a and b kept in shared memory a few rows at a time, y the only tensor written.

A persistent CTA takes whole images and walks their rows through a pipeline of wgmma warpgroups (conv1 on row r + 1,
conv2 on row r, conv3 on row r - 1 as CONV3_WGS warpgroups sharing the 256 channels) fed by a TMA producer; a row of
W <= 64 pixels is one m64 tile. The output is bit-identical to plugins/reference.py's fused_conv_int8 three times (the
same integer accumulators, the same requantize code). docs/design/block-rows.md has the schedule, the shared-memory
budget and what bounds its speed. `refusal` says in one line why a block is not taken. `bench kernels` times it; the
GPU runner does not run it (res2's blocks run as conv2 and the chain kernel's pairs, as fast).
"""

from __future__ import annotations

import ctypes

from . import bottleneck
from .conv_shape import H100_SMS, ConvShape
from .wgmma import hopper_refusal, permuted_weight_map, within_tma_limits

SOURCE = "block_rows.cu"
ENTRY = "trtfuse_block_rows"
ARCH = "sm_90a"
CONV3_WGS, CONV3_N = 4, 64  # conv3's warpgroups (256 / CONV3_WGS channels each) and the channels of one of its passes
THREADS = 128 * (3 + CONV3_WGS)  # the conv1, conv2 and conv3 warpgroups, and the producer's
CHANNELS, WIDTH = 256, 64  # block input / output channels, bottleneck width
TILE_ROWS = 64  # pixels of an image row on wgmma's M (block_rows.cu: BM)
SHARED_LIMIT = 227 * 1024  # sm_90's opt-in shared memory per block
X_STAGES, A_STAGES, B_STAGES = 5, 4, 2  # ring depths (block_rows.cu)


def smem_parts(x_stages: int = X_STAGES) -> dict:
    """block_rows.cu's Smem, by part (docs/design/block-rows.md's budget table). Every operand tile is [64 rows][32]
    bytes per k32 step; x, a and b rows are padded to 64 pixels."""
    tile = TILE_ROWS * 32
    return {"W1": CHANNELS * WIDTH, "W2": 9 * WIDTH * WIDTH, "W3": WIDTH * CHANNELS,
            "x ring": x_stages * (CHANNELS // 32) * tile,
            "a ring (3 shifted copies a row)": A_STAGES * 3 * (WIDTH // 32) * tile,
            "zero tile": (WIDTH // 32) * tile, "b ring": B_STAGES * (WIDTH // 32) * tile,
            "factors": 2 * (WIDTH + WIDTH + CHANNELS) * 4,
            "mbarriers": (2 * (x_stages + A_STAGES + B_STAGES) + 1) * 8, "alignment": 1024}


def smem_bytes(x_stages: int = X_STAGES) -> int:
    """Smem::BYTES + 1024 for aligning it (compiled in as BLOCK_ROWS_SMEM, where a static_assert compares)."""
    return sum(smem_parts(x_stages).values())


def defines() -> dict:
    return {"BLOCK_ROWS_X_STAGES": X_STAGES, "BLOCK_ROWS_CONV3_WGS": CONV3_WGS, "BLOCK_ROWS_CONV3_N": CONV3_N,
            "BLOCK_ROWS_SMEM": smem_bytes()}


def compile_block_rows(target: str = "cubin", use_cache: bool = True):
    from .nvrtc import compile_kernel

    return compile_kernel(SOURCE, defines(), ARCH, target, use_cache)


def refusal(conv1: ConvShape, conv2: ConvShape, conv3: ConvShape) -> str | None:
    """Why conv1 -> conv2 -> conv3 (+ the block input as conv3's residual) cannot run as this kernel, or None if it can:
    the identity block bottleneck.refusal takes, with rows of at most one wgmma tile. That the residual is the block
    input and that a and b have no other reader is the caller's graph check."""
    why = bottleneck.refusal(conv1, conv2, conv3)
    if why:
        return why
    if conv1.w > TILE_ROWS:
        return f"a {conv1.w}-pixel image row is over the {TILE_ROWS} pixels of one wgmma tile"
    if conv1.n * CHANNELS * conv1.h * conv1.w >= 2**31 or conv1.n >= 2**31:
        return "over 2^31 bytes of block input (the kernel's tensor coordinates are int32)"
    return None


class BlockRowsParamsStruct(ctypes.Structure):
    """Mirror of trtfuse::BlockRowsParams (plugins/kernels/block_rows.cu); same field order."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("scale1", "bias1", "out_scale1", "scale2", "bias2", "out_scale2",
                                               "scale3", "bias3", "out_scale3", "residual_scale", "y")] + [
        (n, ctypes.c_int32) for n in ("N", "H", "W", "relu1", "relu2", "relu3")]


def tensor_map_args(shape: ConvShape) -> dict:
    """(dims, byte strides of dims 1.., box, element strides, swizzle bytes) of each tensor map, checked against
    cuTensorMapEncodeTiled's documented limits so a bad shape fails here, by name. `shape` is conv1's.

    * x: the CHW32 block input [N][8][H][W][32] as (32, W, H, 8, N); a box (32, W, 1, 1, 1) is channel block j of image
      row r, W rows of 32 bytes landing with the 32-byte swizzle in the x slot's tile j (8 loads a row).
    * weights: the packed [rows][KG] matrices with their rows permuted inside each 32-channel block
      (wgmma.permuted_weight_map), one box of 32 bytes of GEMM-K x every row per k32 step, 32-byte swizzle: W1
      (64 x 256, 8 steps), W2 (64 x 576, 18 steps, step 9c + 3dr + ds as pack_weight orders a 3x3's GEMM-K), W3
      (256 x 64, 2 steps)."""
    n, h, w = shape.n, shape.h, shape.w
    blocks = CHANNELS // 32
    args = {"x": ((32, w, h, blocks, n), (32, w * 32, h * w * 32, blocks * h * w * 32), (32, w, 1, 1, 1), (1,) * 5, 32)}
    for name, kg, rows in (("w1", CHANNELS, WIDTH), ("w2", 9 * WIDTH, WIDTH), ("w3", WIDTH, CHANNELS)):
        args[name] = (*permuted_weight_map(kg, rows, 32, rows), 32)
    for name, (dims, strides, box, es, swizzle) in args.items():
        ok = (within_tma_limits(dims, strides, box, es, swizzle) and all(b <= d for b, d in zip(box, dims))
              and box[0] % 16 == 0)
        if not ok:
            raise ValueError(f"block rows: {name} tensor map outside TMA limits for {shape}: {dims} {strides} {box}")
    return args


def params(shape: ConvShape, ptrs: dict, relu: tuple[bool, bool, bool]) -> BlockRowsParamsStruct:
    return BlockRowsParamsStruct(**ptrs, N=shape.n, H=shape.h, W=shape.w, relu1=int(relu[0]), relu2=int(relu[1]),
                                 relu3=int(relu[2]))


def grid(shape: ConvShape, sms: int = H100_SMS, max_ctas: int | None = None) -> int:
    """Persistent CTAs, one image at a time each: min(N, SMs); max_ctas caps it (tests: CTAs walking many images, the
    rings wrapping round)."""
    ctas = min(shape.n, sms)
    return max(1, min(ctas, max_ctas) if max_ctas else ctas)


def device_refusal() -> str | None:
    """Why the current GPU cannot run the kernel, or None."""
    return hopper_refusal("the block rows kernel", smem_bytes())


def launch(shapes: tuple[ConvShape, ConvShape, ConvShape], x: int, convs, residual_scale: int, y: int, *,
           relu=(True, True, True), stream=None, max_ctas: int | None = None) -> None:
    """The block on int8 CHW32 x [N, 256, H, W] into y (same shape). `convs`: three (weight, scale, bias, out_scale)
    device pointer tuples, each conv's operands as docs/ops.md gives them (weights packed by layout.pack_weight);
    residual_scale: the block input's scale (conv3's residual_scale)."""
    from . import cuda_driver as cd
    from .wgmma import encode_tensor_map

    why = refusal(*shapes) or device_refusal()
    if why:
        raise ValueError(why)
    if len(convs) != 3 or any(len(c) != 4 for c in convs):
        raise ValueError("convs must be three (weight, scale, bias, out_scale) pointer tuples")
    (w1, s1, b1, o1), (w2, s2, b2, o2), (w3, s3, b3, o3) = convs
    conv1 = shapes[0]
    args = tensor_map_args(conv1)
    maps = [encode_tensor_map(5, ptr, *args[name]) for name, ptr in (("x", x), ("w1", w1), ("w2", w2), ("w3", w3))]
    p = params(conv1, dict(scale1=s1, bias1=b1, out_scale1=o1, scale2=s2, bias2=b2, out_scale2=o2, scale3=s3, bias3=b3,
                           out_scale3=o3, residual_scale=residual_scale, y=y), relu)
    smem = smem_bytes()
    fn = cd.kernel_module(SOURCE, defines(), arch=ARCH).function(ENTRY, smem)
    ctas = grid(conv1, cd.device_attribute("MULTIPROCESSOR_COUNT"), max_ctas)
    cd.launch(fn, (ctas, 1, 1), (THREADS, 1, 1), smem, stream, [ctypes.addressof(a) for a in (*maps, p)])
