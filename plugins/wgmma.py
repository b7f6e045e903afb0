"""Host side of the Hopper wgmma tactic (plugins/kernels/wgmma_conv.cu): tensor maps, module, launch.

The kernel reads both operands through the bulk tensor copy engine, so each launch needs their
CUtensorMaps, encoded here with cuTensorMapEncodeTiled from the device pointers and the shape, and
passed by value (128 bytes each, weights, activations, output) ahead of ConvParams:

* weights: 2-D (KG_pad bytes, K_pad rows), row stride KG_pad, box (a_box, 128) with a_box = 32 (one
  k32 step, 32-byte swizzle) or 128 (a ring slot's 4 k32 steps in one box, 128-byte swizzle);
* activations: the CHW32 tensor [N][CB][H][W][32] as 5-D (32, W, H, CB, N) with byte strides
  (32, W*32, H*W*32, CB*H*W*32), box (32, OW*stride_w, TH*stride_h, 1, NB), elementStrides
  (1, stride_w, stride_h, 1, 1), 32-byte swizzle, out-of-bounds elements read as zero (the padding);
  the window tiles' view (32, W, N, H, CB) instead, the stride-2 windows' (64, W/2, H/2, 2, N*CB) or, images
  stacked, (64, W/2, H, N, CB) with 64-byte swizzle (tensor_map_args);
* output (the channel-major tiles that store by TMA: the ping-pong and `tma_store` ones; the others get a
  placeholder): the view (32, OW, N, OH, KB), or (32, OW, OH, N, KB) for stacked stride-2 windows, 32-byte swizzle,
  elements outside the tensor never written.

Encoded maps are cached per (pointers, shape, tactic): a CUDA-graph capture or a benchmark loop
re-encodes nothing. The module is compiled for sm_90a (wgmma, setmaxnreg are not in plain sm_90).
"""

from __future__ import annotations

import ctypes
import math
import os
from collections import OrderedDict

from . import cuda_driver as cd
from .conv_params import fast_divmod
from .conv_shape import H100_SMS, ConvShape
from .layout import gemm_k, round_up
from .nvrtc import CompiledKernel
from .wgmma_tactics import WgmmaGeometry, WgmmaTactic

SOURCE = "wgmma_conv.cu"
ENTRY = "trtfuse_wgmma_conv"
ARCH = "sm_90a"
TACTIC_HEADER = "wgmma_tactic.cuh"  # the generated include that carries the tactic (WgmmaTactic.config_header)


class WgmmaTileStruct(ctypes.Structure):
    """Mirror of trtfuse::WgmmaTile (plugins/kernels/wgmma_tile.cuh); same field order."""

    _fields_ = [(n, ctypes.c_int32) for n in ("th", "nb", "tiles_per_image", "ch_tiles", "kt", "box_bytes", "tiles",
                                              "groups_per_set", "box_groups", "pitch",
                                              "group_images")] + [
        (f"div_groups_{f}", ctypes.c_uint32) for f in ("d", "mul", "shr")]


TensorMapBytes = ctypes.c_uint64 * 16

_modules: dict[tuple, cd.Module] = {}
_maps: "OrderedDict[tuple, tuple]" = OrderedDict()
_MAP_CACHE = 512


def device_supported(device_ordinal: int = 0) -> bool:
    return cd.compute_capability(device_ordinal) == "sm_90"


def shared_memory_limit(device: int) -> int:
    """The device's opt-in shared memory per block (bytes)."""
    return cd.device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", device)


def hopper_refusal(kernel: str, smem_bytes: int) -> str | None:
    """Why the current GPU cannot run `kernel`, a wgmma/TMA kernel asking for smem_bytes of shared memory per CTA, or
    None: the one-line reason its GPU tests skip with and its launcher refuses with."""
    device = cd.current_device()
    if cd.compute_capability(device) != "sm_90":
        return f"{kernel} needs an sm_90 GPU (wgmma, TMA); this one is {cd.compute_capability(device)}"
    optin = shared_memory_limit(device)
    if optin < smem_bytes:
        return f"{kernel} needs {smem_bytes} bytes of shared memory per CTA, the GPU gives {optin}"
    return None


def include_dirs(tactic: WgmmaTactic) -> tuple:
    """Folders besides plugins/kernels/ a tactic's build reads: none for a table tactic. A profiling build (`diag` or
    `timeline` set, which only bench/wgmma_diag.py and bench/wgmma_timeline.py do) includes its hooks,
    wgmma_profiling.cuh / wgmma_timeline.cuh; they live with the bench (bench/probe_kernels/) so that no production
    build can reach them, and are found there only for such a build."""
    if not (tactic.diag or tactic.timeline):
        return ()
    from trtfuse.bench import PROBE_KERNEL_DIR  # (here, not at the top: plugins never import the bench otherwise)

    return (PROBE_KERNEL_DIR,)


def compile_tactic(tactic: WgmmaTactic, target: str = "cubin", arch: str = ARCH, use_cache: bool = True) -> CompiledKernel:
    """The kernel built for one tactic: wgmma_conv.cu with the tactic's configuration struct as its generated header."""
    from .nvrtc import compile_kernel

    return compile_kernel(SOURCE, {}, arch, target, use_cache, headers={TACTIC_HEADER: tactic.config_header()},
                          include_dirs=include_dirs(tactic))


def module_for(tactic: WgmmaTactic) -> cd.Module:
    """The tactic's sm_90a module on the current device, compiled and checked against its shared memory once."""
    device = cd.current_device()
    key = (tactic.config_header(), device)  # a module belongs to one context
    if key not in _modules:
        if not device_supported():
            raise RuntimeError(f"{tactic.name} needs an sm_90 GPU (this one is {cd.compute_capability()})")
        limit = shared_memory_limit(device)
        if tactic.shared_bytes() > limit:  # (a table tactic never is: tests/test_wgmma_tiling.py; a bench --replace variant can be)
            raise ValueError(f"{tactic.name} needs {tactic.shared_bytes()} bytes of shared memory per block; this GPU allows {limit}")
        _modules[key] = cd.Module(compile_tactic(tactic).image)
    return _modules[key]


def encode_tensor_map(rank: int, ptr: int, dims, strides, box, elem_strides, swizzle_bytes: int):
    """A tiled uint8 CUtensorMap as the 128 bytes a kernel takes by value (also plugins/chain_conv.py's maps)."""
    drv = cd._driver()
    swizzle = {0: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE, 32: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
               64: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B, 128: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}[swizzle_bytes]
    tmap = cd.check(drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, ptr,
        [drv.cuuint64_t(v) for v in dims], [drv.cuuint64_t(v) for v in strides],
        [drv.cuuint32_t(v) for v in box], [drv.cuuint32_t(v) for v in elem_strides],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    return TensorMapBytes(*[int(v) for v in tmap.opaque])


def swizzle_bytes(tactic: WgmmaTactic, name: str) -> int:
    """Shared-memory swizzle of a map: the activation boxes are 32-byte rows (one CHW32 vector per
    pixel; the stride-2 windows' 64-byte pairs of them); the weight boxes are as wide as the tactic's a_box (32,
    or 128 = a slot's 4 k32 steps)."""
    return {"w": tactic.a_box, "x": tactic.window_row_bytes, "y": 32}[name]


def within_tma_limits(dims, strides, box, elem_strides, span: int) -> bool:
    """Whether a tiled map is inside cuTensorMapEncodeTiled's documented limits: dims up to 2^32, byte strides
    multiples of 16 below 2^40, boxes of 1..256 elements whose inner one fits the swizzle span, element strides
    1..8 dividing their box."""
    return (len(strides) == len(dims) - 1 and all(0 < d <= 1 << 32 for d in dims)
            and all(st % 16 == 0 and st < 1 << 40 for st in strides)
            and all(0 < b <= 256 for b in box) and box[0] <= span
            and all(1 <= e <= 8 and b % e == 0 for b, e in zip(box, elem_strides)))


def permuted_weight_map(kg: int, rows: int, box_k: int, box_rows: int) -> tuple:
    """(dims, strides, box, element strides) of a packed [rows][kg] weight whose rows are permuted inside each
    32-channel block: dims (kg, e 2, q 4, jj 4, rows / 32) with row strides (1, 8, 2, 32), so box row
    e + 2q + 8jj + 32b is channel 32b + 8q + 2jj + e: wgmma column 8(4b + jj) + 2q + e then holds it, and each
    thread's accumulators are 8 consecutive channels (the pixel-major tiles, the chain kernel)."""
    return ((kg, 2, 4, 4, rows // 32), (kg, 8 * kg, 2 * kg, 32 * kg), (box_k, 2, 4, 4, box_rows // 32), (1,) * 5)


def tensor_map_args(shape: ConvShape, tactic: WgmmaTactic, geo: WgmmaGeometry) -> dict:
    """(dims, byte strides of dims 1.., box, element strides) of each map (weights, activations and, for the tactics
    that store by TMA, output); checked against cuTensorMapEncodeTiled's documented limits so a bad shape fails
    here, by name."""
    kp = round_up(shape.k, 32)
    _, kg_pad = gemm_k(shape.c, (shape.r, shape.s))
    cb = math.ceil(shape.c / 32)
    oh, ow = shape.out_hw
    sh, sw = shape.stride
    args = {
        "w": ((kg_pad, kp), (kg_pad,), (tactic.a_box, tactic.CHANNELS), (1, 1)),
        "x": ((32, shape.w, shape.h, cb, shape.n),
              (32, shape.w * 32, shape.h * shape.w * 32, cb * shape.h * shape.w * 32),
              (32, ow * sw, geo.th * sh, 1, geo.nb), (1, sw, sh, 1, 1)),
    }
    if tactic.stride2_windows:
        # stride2_windows: pairs of columns (64 bytes) x rows split by parity (row 2 h2 + ph): the view (64, W / 2, H / 2, 2,
        # N * CB), box (64, pitch, TH + 1, 2, 1) from (0, -1, oh0 - 1, 0, n * CB + cb), landing [ph][h2][pair][64]
        # (tactics.py: _stride2_window_tiles).
        # Stacked images (nb > 1): the view (64, W / 2, H, N, CB), one box (64, pitch, 2 OH, NB, 1) with element strides
        # (1, 1, 2, 1, 1) per tap row r from (0, -1, r - 1, n0, cb): rows 2oh + r - 1, landing [image][oh][pair][64].
        hw32 = shape.h * shape.w * 32
        if geo.nb > 1:
            args["x"] = ((64, shape.w // 2, shape.h, shape.n, cb), (64, shape.w * 32, cb * hw32, hw32),
                         (64, geo.pitch, 2 * geo.th, geo.nb, 1), (1, 1, 2, 1, 1))
        else:  # quads (quad_windows): the same with 128-byte rows, (128, W / 4, H / 2, 2, N * CB)
            rb = tactic.window_row_bytes
            args["x"] = ((rb, shape.w * 32 // rb, shape.h // 2, 2, shape.n * cb), (rb, 2 * shape.w * 32, shape.w * 32, hw32),
                         (rb, geo.pitch, geo.th + 1, 2, 1), (1,) * 5)
    elif tactic.halo_rows:
        # One window per channel block (halo_rows): TH + R - 1 input rows of NB images side by side, each `pitch`
        # columns from -pad_left, the padding zero-filled; each tap reads a shifted view of it. The view (32, W, N,
        # H, CB) puts the images between a row's columns and the rows, so one box lands [row][image][column][32].
        args["x"] = ((32, shape.w, shape.n, shape.h, cb),
                     (32, cb * shape.h * shape.w * 32, shape.w * 32, shape.h * shape.w * 32),
                     (32, geo.pitch, geo.nb, geo.th + shape.r - 1, 1), (1,) * 5)
    if tactic.flat:
        # (32, 8, CB, G, N): a 1x1 stride-1 unpadded conv's input pixels (the output's) in G = OH * OW / 8 groups of
        # 8 per image; a box is box_groups groups x a slot's 4 channel blocks, landing [group][block][8][32] (flat).
        # Maps whose pixels do not come in 8s (group_images 8): (32, 8 images, CB, OH * OW, N / 8), group q is pixel
        # q % (OH * OW) of images 8 (q / (OH * OW)) .. + 7, landing the same [group][block][8][32].
        hw = shape.h * shape.w
        if shape.stride != (1, 1):
            # stride 2 (8-image groups on every map): the view (32, N, CB, OW, OH) of the input's every other column and
            # row; a box (32, 8, 4, box_groups, 1) is 8 images x a slot's blocks x box_groups pixels of one output row, landing the
            # same [group][block][image][32] (the producer's coordinates: images 8 * set, pixel (oh, ow))
            args["x"] = ((32, shape.n, cb, ow, oh), (cb * hw * 32, hw * 32, sw * 32, sh * shape.w * 32),
                         (32, 8, tactic.ks, geo.box_groups, 1), (1,) * 5)
        elif geo.group_images == 8:
            args["x"] = ((32, 8, cb, hw, shape.n // 8), (cb * hw * 32, hw * 32, 32, 8 * cb * hw * 32),
                         (32, 8, tactic.ks, geo.box_groups, 1), (1,) * 5)
        else:
            args["x"] = ((32, 8, cb, geo.groups_per_set, shape.n), (32, hw * 32, 256, cb * hw * 32),
                         (32, 8, tactic.ks, geo.box_groups, 1), (1,) * 5)
    if tactic.stores_by_tma:
        # The channel-major ping-pong and `tma_store` tiles' weight rows permuted inside each 16-channel group: dims
        # (KGpad, g 8, h 2, Kpad/16, 1) with row strides (2, 1, 16) so box row 16u + 8h + g is channel 16u + 2g + h, and
        # a consumer thread's two accumulator rows (g, g + 8) are adjacent channels. Their output leaves by TMA store:
        # boxes (32, pitch, NB, TH, 1) of the view (32, OW, N, OH, KB), laid out as the window positions; the copy engine
        # drops the positions past a row, the rows past the map and the channel blocks past Kpad.
        args["w"] = ((kg_pad, 8, 2, kp // 16, 1), (2 * kg_pad, kg_pad, 16 * kg_pad, kp * kg_pad),
                     (tactic.a_box, 8, 2, tactic.CHANNELS // 16, 1), (1,) * 5)
        if tactic.stride2_windows and geo.nb > 1:  # stacked images: positions (i * OH + oh) * pitch + ow, (32, OW, OH, N, KB)
            args["y"] = ((32, ow, oh, shape.n, kp // 32), (32, ow * 32, kp * oh * ow, oh * ow * 32),
                         (32, geo.pitch, geo.th, geo.nb, 1), (1,) * 5)
        elif tactic.quad_windows:  # positions split by column parity e: a store per parity of the view (32, OW / 2, 2, OH, N * KB)
            args["y"] = ((32, ow // 2, 2, oh, shape.n * kp // 32), (64, 32, ow * 32, oh * ow * 32),
                         (32, geo.pitch, 1, geo.th, 1), (1,) * 5)
        else:
            args["y"] = ((32, ow, shape.n, oh, kp // 32), (32, kp * oh * ow, ow * 32, oh * ow * 32),
                         (32, geo.pitch, geo.nb, geo.th, 1), (1,) * 5)
    if tactic.pixel_major:
        args["w"] = permuted_weight_map(kg_pad, kp, tactic.a_box, tactic.CHANNELS)
    for name, (dims, strides, box, es) in args.items():
        if not within_tma_limits(dims, strides, box, es, swizzle_bytes(tactic, name)):
            raise ValueError(f"{tactic.name}: {name} tensor map outside TMA limits for {shape}: {dims} {strides} {box} {es}")
    return args


def tensor_maps(shape: ConvShape, tactic: WgmmaTactic, geo: WgmmaGeometry, x: int, w: int, y: int):
    """(weight map, activation map, output map) as 128-byte host buffers, cached. Only the tactics that store by TMA
    have an output map; the others get the activation map in its place (never read)."""
    key = (x, w, y, shape, tactic)  # the whole tactic: variants of one id (bench --replace) can differ in their boxes
    hit = _maps.get(key)
    if hit is not None:
        _maps.move_to_end(key)
        return hit
    args = tensor_map_args(shape, tactic, geo)
    wmap = encode_tensor_map(len(args["w"][0]), w, *args["w"], swizzle_bytes(tactic, "w"))
    xmap = encode_tensor_map(5, x, *args["x"], swizzle_bytes(tactic, "x"))
    ymap = encode_tensor_map(5, y, *args["y"], swizzle_bytes(tactic, "y")) if "y" in args else xmap
    _maps[key] = (wmap, xmap, ymap)
    if len(_maps) > _MAP_CACHE:
        _maps.popitem(last=False)
    return wmap, xmap, ymap


def _sms() -> int:
    """SMs a persistent grid fills; TRTFUSE_WGMMA_MAX_CTAS caps it (tests: several tiles per CTA on small shapes)."""
    ok, _ = cd.gpu_available()
    sms = cd.device_attribute("MULTIPROCESSOR_COUNT") if ok else H100_SMS
    cap = os.environ.get("TRTFUSE_WGMMA_MAX_CTAS")
    return min(sms, max(1, int(cap))) if cap else sms


def grid(shape: ConvShape, tactic: WgmmaTactic) -> tuple[int, int, int]:
    """One CTA per tile, or for a persistent tactic min(tiles, SMs) CTAs."""
    geo = tactic.geometry(shape)
    if geo is None:
        raise ValueError(f"{tactic.name} does not handle {shape}: {tactic.can_implement(shape)[1]}")
    if not tactic.persistent:
        return geo.ctas, 1, 1
    ctas = min(geo.ctas, _sms())
    if (tactic.pixel_major or tactic.resident_kt) and ctas < geo.ctas:  # each CTA keeps one channel tile (its folded factors load once)
        # resident weights need it (the kernel traps otherwise): never fewer CTAs than channel tiles
        ctas = max(geo.ch_tiles if tactic.resident_kt else 1, ctas - ctas % geo.ch_tiles)
    if tactic.multicast:  # whole clusters of 2: tile pairs (2i, 2i+1) stay together as each CTA strides the tiles
        ctas = max(2, ctas - ctas % 2)
    return ctas, 1, 1


def programmatic_launch(tactic: WgmmaTactic) -> bool:
    """Whether the tactic's launch may start before the previous grid in its stream completes (its `pdl`; wgmma_conv.cu's
    launch_dependents). TRTFUSE_PDL=0 launches every grid after the previous one (the kernel's griddepcontrol then waits
    for nothing): a knob for streams that share the GPU, where an early grid's CTAs hold SMs while they wait."""
    return tactic.pdl > 0 and os.environ.get("TRTFUSE_PDL", "1") != "0"


def launch(shape: ConvShape, tactic: WgmmaTactic, params, x: int, w: int, stream) -> None:
    """Launch with a filled ConvParamsStruct (plugins/conv.py); x, w are the device pointers in it."""
    geo = tactic.geometry(shape)
    if geo is None:
        raise ValueError(f"{tactic.name} does not handle {shape}: {tactic.can_implement(shape)[1]}")
    wmap, xmap, ymap = tensor_maps(shape, tactic, geo, x, w, params.y)
    d, mul, shr = fast_divmod(max(geo.groups_per_set, 1))
    tile = WgmmaTileStruct(th=geo.th, nb=geo.nb, tiles_per_image=geo.tiles_per_image, ch_tiles=geo.ch_tiles,
                           kt=geo.kt, box_bytes=geo.box_bytes, tiles=geo.ctas, groups_per_set=geo.groups_per_set,
                           box_groups=geo.box_groups, pitch=geo.pitch, group_images=geo.group_images, div_groups_d=d,
                           div_groups_mul=mul, div_groups_shr=shr)
    smem = tactic.shared_bytes()
    fn = module_for(tactic).function(ENTRY, smem)
    cd.launch(fn, grid(shape, tactic), (tactic.threads, 1, 1), smem, stream,
              [ctypes.addressof(wmap), ctypes.addressof(xmap), ctypes.addressof(ymap), ctypes.addressof(params),
               ctypes.addressof(tile)], programmatic=programmatic_launch(tactic))
