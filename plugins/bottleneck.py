"""ResNet's identity bottleneck block (conv1 1x1 -> conv2 3x3 -> conv3 1x1 + the block input) as one kernel,
plugins/kernels/bottleneck.cu.

The three convs run separately write two 64-channel intermediates to memory and read them back, and read the block
input twice (conv1's input, conv3's residual). The fused kernel reads the input once and writes only the output; the
intermediates stay in shared memory, conv1 recomputed on each tile's 1-pixel border for conv2's window. Its result is
bit-identical to the three fused-conv ops run in sequence (same integer accumulators, same requantize code), so the
golden reference is fused_conv_int8 three times (tests/test_bottleneck.py checks that chain).

Built for one shape family: input and output 256 channels, width 64, stride 1, no downsample (the residual is the
block input itself); any N, H, W. `refusal` says in one line why a block is not taken.
"""

from __future__ import annotations

import ctypes

from .conv_shape import ConvShape

SOURCE = "bottleneck.cu"
ENTRY = "trtfuse_bottleneck"
WIDTH = 64
CHANNELS = 4 * WIDTH  # block input = block output channels
TILE = (8, 14)  # output rows x columns per CTA tile (bottleneck.cu's TH, TW)
THREADS = 256


def smem_bytes(patch_buffers: int) -> int:
    """bottleneck.cu's SMEM_BYTES with `patch_buffers` input patches (compiled in as BOTTLENECK_SMEM_BYTES, where a
    static_assert compares the two)."""
    th, tw = TILE
    halo, out = (th + 2) * (tw + 2), th * tw
    weights = WIDTH * (CHANNELS + 16) + WIDTH * (9 * WIDTH + 16) + CHANNELS * (WIDTH + 16)
    patches = patch_buffers * halo * (CHANNELS + 16)
    mids = (halo + out) * (WIDTH + 16)
    factors = 2 * (WIDTH + WIDTH + CHANNELS) * 4
    return weights + patches + mids + factors


class BottleneckParamsStruct(ctypes.Structure):
    """Mirror of trtfuse::BottleneckParams (plugins/kernels/bottleneck.cu); same field order."""

    _fields_ = [(n, ctypes.c_uint64) for n in (
        "x", "w1", "scale1", "bias1", "out_scale1", "w2", "scale2", "bias2", "out_scale2",
        "w3", "scale3", "bias3", "out_scale3", "residual_scale", "y")] + [
        (n, ctypes.c_int32) for n in ("N", "H", "W", "relu1", "relu2", "relu3")]


def variant(arch: str, smem_optin: int) -> tuple[str, dict, int] | None:
    """(NVRTC arch, defines, dynamic shared bytes) on a GPU of compute capability `arch` whose CTAs may opt in to
    `smem_optin` bytes of shared memory, or None where even one input patch does not fit (device_refusal says so):
    two patch buffers (the next tile's loads overlap this tile's math) where they fit, else one."""
    for buffers in (2, 1):
        smem = smem_bytes(buffers)
        if smem <= smem_optin:
            return arch, {"BOTTLENECK_PATCH_BUFFERS": buffers, "BOTTLENECK_SMEM_BYTES": smem}, smem
    return None


def device_refusal(smem_optin: int) -> str | None:
    """Why a GPU whose CTAs may opt in to `smem_optin` bytes of shared memory cannot run the kernel, or None."""
    if smem_optin < smem_bytes(1):
        return (f"the kernel keeps its weights, one input patch and both intermediates in {smem_bytes(1)} bytes of "
                f"shared memory, the GPU gives a CTA at most {smem_optin}")
    return None


def _conv_refusal(name: str, shape: ConvShape, c: int, k: int, r: int, pads: tuple[int, int, int, int]) -> str | None:
    if shape.in_vec not in (0, 32) or shape.vec != 32:
        return f"{name} reads a {shape.vec}-channel vector layout, the kernel reads CHW32"
    if (shape.c, shape.k) != (c, k):
        return f"{name} is {shape.c} -> {shape.k} channels, the kernel computes {c} -> {k}"
    if (shape.r, shape.s) != (r, r):
        return f"{name} is {shape.r}x{shape.s}, the kernel runs {r}x{r}"
    if tuple(shape.stride) != (1, 1):
        return f"{name} has stride {shape.stride[0]}x{shape.stride[1]}, the kernel runs the stride-1 identity block"
    if tuple(shape.pads) != pads:
        return f"{name} pads {tuple(shape.pads)}, the kernel pads {pads}"
    return None


def refusal(conv1: ConvShape, conv2: ConvShape, conv3: ConvShape) -> str | None:
    """Why the chain conv1 -> conv2 -> conv3 (+ the block input as conv3's residual) cannot run as the bottleneck
    kernel, or None if it can: the kernel is compiled for 256 -> 64 (1x1) -> 64 (3x3, pad 1) -> 256 (1x1), stride 1.
    That the residual is the block input and each intermediate has no other reader is the caller's graph check."""
    for why in (_conv_refusal("conv1", conv1, CHANNELS, WIDTH, 1, (0, 0, 0, 0)),
                _conv_refusal("conv2", conv2, WIDTH, WIDTH, 3, (1, 1, 1, 1)),
                _conv_refusal("conv3", conv3, WIDTH, CHANNELS, 1, (0, 0, 0, 0))):
        if why:
            return why
    for name, a, b in (("conv2", conv1, conv2), ("conv3", conv2, conv3)):
        if (b.n, b.h, b.w) != (a.n, *a.out_hw):
            return f"{name}'s input {b.n}x{b.h}x{b.w} is not its producer's output {a.n}x{a.out_hw[0]}x{a.out_hw[1]}"
    return None


def launch_bottleneck(shapes: tuple[ConvShape, ConvShape, ConvShape], x: int, convs, residual_scale: int, y: int, *,
                      relu=(True, True, True), stream=None) -> None:
    """The block on int8 CHW32 x [N, 256, H, W] into y (same shape). `convs`: three (weight, scale, bias, out_scale)
    device pointers, each conv's operands as docs/ops.md gives them (weights packed by layout.pack_weight);
    residual_scale: the block input's scale (conv3's residual_scale)."""
    from . import cuda_driver as cd

    why = refusal(*shapes)
    if why:
        raise ValueError(why)
    if len(convs) != 3 or any(len(c) != 4 for c in convs):
        raise ValueError("convs must be three (weight, scale, bias, out_scale) pointer tuples")
    (w1, s1, b1, o1), (w2, s2, b2, o2), (w3, s3, b3, o3) = convs
    n, h, w = shapes[0].n, shapes[0].h, shapes[0].w
    p = BottleneckParamsStruct(x=x, w1=w1, scale1=s1, bias1=b1, out_scale1=o1, w2=w2, scale2=s2, bias2=b2,
                               out_scale2=o2, w3=w3, scale3=s3, bias3=b3, out_scale3=o3, residual_scale=residual_scale,
                               y=y, N=n, H=h, W=w, relu1=int(relu[0]), relu2=int(relu[1]), relu3=int(relu[2]))
    device = cd.current_device()
    optin = cd.device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", device)
    chosen = variant(cd.compute_capability(device), optin)
    if chosen is None:
        raise ValueError(device_refusal(optin))
    _, defines, smem = chosen
    fn = cd.kernel_module(SOURCE, defines).function(ENTRY, smem)
    tiles = n * -(-h // TILE[0]) * -(-w // TILE[1])
    if tiles == 0:
        return
    resident = cd.max_active_blocks(fn, THREADS, smem) * cd.device_attribute("MULTIPROCESSOR_COUNT")
    if resident < 1:
        raise RuntimeError(f"{ENTRY} does not fit an SM with {smem} bytes of shared memory")
    cd.launch(fn, (min(tiles, resident), 1, 1), (THREADS, 1, 1), smem, stream, [ctypes.addressof(p)])
