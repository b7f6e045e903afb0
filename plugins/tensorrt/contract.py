"""What each trtfuse plugin declares to TensorRT, as plain Python that needs no TensorRT.

`plugins/tensorrt/qdp.py` turns these answers into `tensorrt.plugin` objects (register / autotune /
aot_impl / impl). Everything TensorRT would ask of a plugin is computed here, from plugins/op_schema.py
(the one list of inputs and attributes) and plugins/tactics.py, so it is tested without the builder:

* register: output shape and dtype from input shapes and attributes;
* autotune: per tactic, the type and format of every input and output (TensorRT's strings:
  "INT8", "FP32"; "CHW32", "CHW4", "LINEAR") and the tactic ids;
* aot_impl: the kernel's PTX and entry name, the launch grid/block/shared memory, and the int32 extra
  arguments in the order the kernel takes them (node inputs, then these, then the output);
* the IPluginV3 plugins (plugins/tensorrt/v3.py), whose `enqueue` launches through our own launcher
  (plugins/conv.py `ConvLaunch`) and so is not held to the AOT limits: `launcher_tactics`, the AOT
  tactics plus the persistent and large-tile mma.sync ones and, on sm_90, the wgmma tactics.

Shape arithmetic is written once over a `cdiv` and integer-like values, so the same expressions
evaluate to Python ints in tests and to TensorRT shape expressions (`trtp.cdiv`, `ShapeExpr`) in the
plugin: there nothing may be turned into an int, because in `get_output_data_types` every dim is a
placeholder (`is_fake`) and in `get_output_shapes` / `aot_impl` the batch may be dynamic. Only `+`, `-` with
non-negative constants, `*`, `//` and `cdiv` are used, the operations `ShapeExpr` has. Channels and the
kernel geometry come from the node's attributes (the rewrite guarantees static spatial dims).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from trtfuse.plugins.layout import channel_vector, round_up
from trtfuse.plugins.op_schema import FUSED_CONV, FUSED_CONV_ADD, NAMESPACE, OpSpec, chain_attributes
from trtfuse.plugins.tactics import TACTICS, TACTICS_BY_ID, WGMMA_TACTICS, ConvShape, Tactic, choose, wgmma_enabled

AOT_SOURCE = "fused_conv.cu"
AOT_ENTRY = {FUSED_CONV.name: "trtfuse_fused_conv_aot", FUSED_CONV_ADD.name: "trtfuse_fused_conv_add_aot"}
# TensorRT's AOT launch parameters carry a dynamic shared-memory size but nothing documents whether it
# raises a kernel's 48 KB default limit: expose only tactics that fit under it (see docs/tensorrt.md).
AOT_SHARED_LIMIT = 48 * 1024
EXTRA_ARG_NAMES = ("N", "C", "H", "W", "K", "OH", "OW", "R", "S", "stride_h", "stride_w", "pad_top", "pad_left", "relu")

_TRT_TYPE = {"int8": "INT8", "float32": "FP32"}


def qualified_name(spec: OpSpec) -> str:
    return f"{NAMESPACE}::{spec.name}"


@dataclass(frozen=True)
class ConvAttrs:
    in_channels: int
    out_channels: int
    kernel_shape: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    relu: int

    @classmethod
    def from_dict(cls, attrs: dict) -> "ConvAttrs":
        """From attribute values as ints / int sequences, or as the int32 arrays TensorRT's plugin layer hands over
        (an INT attribute arrives as a one-element array)."""
        def ints(name, count=None):
            values = tuple(int(v) for v in np.asarray(attrs[name]).reshape(-1))
            if count is not None and len(values) != count:
                raise ValueError(f"attribute {name} has {len(values)} values, expected {count}")
            return values

        return cls(ints("in_channels", 1)[0], ints("out_channels", 1)[0], ints("kernel_shape", 2), ints("strides", 2),
                   ints("pads", 4), ints("relu", 1)[0])

    def out_hw(self, h, w) -> tuple:
        """Output height and width: ints for ints, shape expressions for shape expressions."""
        (r, s), (sh, sw), p = self.kernel_shape, self.strides, self.pads
        return (h + p[0] + p[2] - r) // sh + 1, (w + p[1] + p[3] - s) // sw + 1


def static_value(dim) -> int | None:
    """A dim's value where it is known at this point: an int, or a TensorRT shape expression that is real
    (not a placeholder) and constant; None otherwise."""
    if isinstance(dim, (int, np.integer)):
        return int(dim)
    if getattr(dim, "is_fake", False) or dim is None:
        return None
    is_constant = getattr(dim, "is_constant", None)
    if is_constant is None:
        return None
    return int(dim.constant_value()) if is_constant else None


def output_shape(x_shape: Sequence, attrs: ConvAttrs) -> tuple:
    """register: y = [N, K, OH, OW] int8; N, H, W may be shape expressions (placeholders included)."""
    n, c, h, w = x_shape
    channels = static_value(c)
    if channels is not None and channels != attrs.in_channels:
        raise ValueError(f"input has {channels} channels, the node says in_channels={attrs.in_channels}")
    return (n, attrs.out_channels, *attrs.out_hw(h, w))


def input_formats(spec: OpSpec, attrs) -> list[str]:
    """TensorRT tensor formats, one per input then per output, in node order: x CHW4 or CHW32 by its channels, the
    residual and every output CHW32, the constants linear. `attrs`: anything with `in_channels` (ConvAttrs, ChainAttrs)."""
    x_format = "CHW4" if channel_vector(attrs.in_channels) == 4 else "CHW32"
    formats = {"x": x_format, "residual": "CHW32"}
    return [formats.get(t.name, "LINEAR") for t in spec.inputs] + ["CHW32"] * len(spec.outputs)


def io_types(spec: OpSpec) -> list[str]:
    return [_TRT_TYPE[t.dtype] for t in spec.inputs] + [_TRT_TYPE[t.dtype] for t in spec.outputs]


def aot_tactics(attrs: ConvAttrs) -> list[Tactic]:
    vec = channel_vector(attrs.in_channels)
    # The AOT entries take one CTA per output tile (the grid is a shape expression; a persistent grid
    # would need the SM count), so persistent tactics are ours alone.
    return [t for t in TACTICS if t.vec == vec and not t.persistent
            and t.shared_bytes(attrs.in_channels, attrs.kernel_shape) <= AOT_SHARED_LIMIT]


@dataclass(frozen=True)
class LaunchDevice:
    """The GPU a launcher-backed plugin runs on: its arch ("sm_90") and its opt-in shared memory per block."""

    arch: str
    shared_limit: int
    sms: int


def detect_launch_device() -> LaunchDevice | None:
    """The first GPU's LaunchDevice, or None without one (plugins then offer the AOT tactics alone)."""
    from trtfuse.plugins import cuda_driver as cd

    ok, _ = cd.gpu_available()
    if not ok:
        return None
    return LaunchDevice(cd.compute_capability(), cd.device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
                        cd.device_attribute("MULTIPROCESSOR_COUNT"))


# A wgmma tile holds at most 256 images (a TMA box dimension), and flat tiles of 8-image groups need a batch in 8s, so a
# tactic's geometry depends on the batch N only through min(N, cap) with cap <= 256 and N % 8, besides the tile count:
# checking every N up to 256, then one N of each remainder mod 8 above it, then the largest, is exact.
_IMAGES_PER_TILE_MAX = 256
_IMAGE_GROUP = 8


def _handles_batches(tactic, shape: ConvShape, batches: tuple[int, int]) -> bool:
    lo, hi = batches
    ns = list(range(lo, min(hi, _IMAGES_PER_TILE_MAX) + 1)) + [hi]
    above = max(lo, _IMAGES_PER_TILE_MAX + 1)
    ns += list(range(above, min(hi, above + _IMAGE_GROUP - 1) + 1))
    return all(tactic.geometry(dataclasses.replace(shape, n=n)) is not None for n in ns)


def launcher_tactics(attrs: ConvAttrs, device: LaunchDevice, x_hw: tuple[int, int] | None = None,
                     batches: tuple[int, int] | None = None, *, residual: bool = True) -> list[int]:
    """Tactic ids a plugin launching through ConvLaunch offers on `device`, best guess first.

    Every mma.sync tactic of the input's vector width whose shared memory the device allows (persistent ones
    included: ConvLaunch sizes their grid from the SM count), and, where the device has wgmma (and TRTFUSE_WGMMA is
    not 0), every wgmma tactic whose geometry handles the node at every batch of `batches` (MIN, MAX: the build's
    optimization profile; a tile of stacked images needs enough of them, so a profile from batch 1 leaves those out, and
    a flat tile of 8-image groups every batch in 8s). `residual`: whether the node adds one (a FusedConvAdd); only a
    node without one is offered the tiles that keep no residual buffers (ConvShape.residual).
    Without the spatial dims or the batch range (before TensorRT configures the plugin) the wgmma tactics, whose
    geometry needs them, are left out. First comes the tactic plugins/tactics.py `choose` picks at the largest batch (our own
    runner's choice), then the AOT tactics in their order, then the rest by id.
    """
    vec = channel_vector(attrs.in_channels)
    ids = [t.id for t in aot_tactics(attrs)]
    ids += [t.id for t in TACTICS if t.vec == vec and t.id not in ids
            and t.shared_bytes(attrs.in_channels, attrs.kernel_shape) <= device.shared_limit]
    if x_hw is None or batches is None:
        return ids
    shape = ConvShape(batches[1], attrs.in_channels, *x_hw, attrs.out_channels, *attrs.kernel_shape, attrs.strides,
                      attrs.pads, residual=residual)
    if wgmma_enabled(device.arch):
        ids += [t.id for t in WGMMA_TACTICS if t.shared_bytes() <= device.shared_limit and _handles_batches(t, shape, batches)]
    best = choose(shape, device.sms, device.arch)[0].id
    return ([best] if best in ids else []) + [i for i in ids if i != best]


@dataclass(frozen=True)
class AutotuneCombination:
    types: str  # "INT8, INT8, FP32, ..." one per input then output
    formats: str  # "CHW32, LINEAR, ..."
    tactics: tuple[int, ...]


def autotune(spec: OpSpec, attrs: ConvAttrs) -> list[AutotuneCombination]:
    return [AutotuneCombination(", ".join(io_types(spec)), ", ".join(input_formats(spec, attrs)),
                                tuple(t.id for t in aot_tactics(attrs)))]


@dataclass(frozen=True)
class AotLaunch:
    entry: str
    grid_x: object  # int, or a TensorRT shape expression when N is symbolic
    block_x: int
    shared_mem: int
    extra_args: tuple  # int32 values (or expressions), in EXTRA_ARG_NAMES order


def aot_launch(spec: OpSpec, attrs: ConvAttrs, x_shape: Sequence, tactic_id: int,
               cdiv: Callable = lambda a, b: (a + b - 1) // b) -> AotLaunch:
    """aot_impl's launch description; N, H and W may be TensorRT shape expressions (then so are the grid and the
    extra arguments that depend on them)."""
    tactic = TACTICS_BY_ID[tactic_id]
    if tactic not in aot_tactics(attrs):
        raise ValueError(f"tactic {tactic_id} is not offered for this node")
    n, c, h, w = x_shape
    oh, ow = attrs.out_hw(h, w)
    k_pad = round_up(attrs.out_channels, 32)
    grid_x = cdiv(n * (oh * ow), tactic.bm) * ((k_pad + tactic.bn - 1) // tactic.bn)
    extra = (n, attrs.in_channels, h, w, attrs.out_channels, oh, ow, *attrs.kernel_shape, *attrs.strides,
             attrs.pads[0], attrs.pads[1], attrs.relu)
    return AotLaunch(AOT_ENTRY[spec.name], grid_x, tactic.threads,
                     tactic.shared_bytes(attrs.in_channels, attrs.kernel_shape), extra)


# ---- FusedConvAddConv: a block's last conv and the next conv, one op with two outputs (graph_passes/chain_pairs.py) ----

# Its tactics, an id space of its own: the chain kernel (plugins/chain_conv.py, Hopper), or the op's two convs as two
# launches, each on the tactic plugins/tactics.py `choose` picks (every GPU; the same bits).
CHAIN_KERNEL_TACTIC = 1
TWO_KERNELS_TACTIC = 2


@dataclass(frozen=True)
class ChainAttrs:
    in_channels: int
    out_channels: int
    next_out_channels: int
    relu: int
    next_relu: int

    @classmethod
    def from_dict(cls, attrs: dict) -> "ChainAttrs":
        """From ints or the one-element int32 arrays TensorRT's plugin layer hands over."""
        def one(name):
            values = np.asarray(attrs[name]).reshape(-1)
            if values.size != 1:
                raise ValueError(f"attribute {name} has {values.size} values, expected 1")
            return int(values[0])

        return cls(*(one(f.name) for f in dataclasses.fields(cls)))

    def shapes(self, n: int, h: int, w: int) -> tuple[ConvShape, ConvShape]:
        """Both convs' ConvShapes for an x of [n, in_channels, h, w]."""
        from trtfuse.plugins.chain_conv import pair_shapes

        return pair_shapes(n, self.in_channels, h, w, self.out_channels, self.next_out_channels)


def chain_output_shapes(x_shape: Sequence, attrs: ChainAttrs) -> tuple[tuple, tuple]:
    """register: y = [N, out_channels, H, W] and next_y = [N, next_out_channels, H, W], int8 (1x1 convs: H, W kept)."""
    n, c, h, w = x_shape
    channels = static_value(c)
    if channels is not None and channels != attrs.in_channels:
        raise ValueError(f"input has {channels} channels, the node says in_channels={attrs.in_channels}")
    return (n, attrs.out_channels, h, w), (n, attrs.next_out_channels, h, w)


def chain_tactics(attrs: ChainAttrs, device: LaunchDevice | None, x_hw: tuple[int, int] | None = None,
                  batches: tuple[int, int] | None = None) -> list[int]:
    """The tactics a FusedConvAddConv plugin offers, best first: the chain kernel where `device` runs it and it takes
    the node at every batch of the profile (known once configured: x's H, W and the batch range), then the two
    kernels, which run everywhere."""
    from trtfuse.plugins import chain_conv

    ids = [TWO_KERNELS_TACTIC]
    if device is None or x_hw is None or batches is None or device.arch != "sm_90":
        return ids
    if device.shared_limit < max(v.smem_bytes for v in chain_conv.VARIANTS.values()):
        return ids
    if all(chain_conv.refusal(*attrs.shapes(n, *x_hw)) is None for n in batches):
        return [CHAIN_KERNEL_TACTIC] + ids
    return ids


# The PTX ISA each AOT target is emitted at: the first ISA that knows the architecture, so the embedded PTX
# asks the driver for nothing newer than the GPU itself needs (docs/tensorrt.md, "PTX and the driver").
# NVRTC writes its own newest ISA (13.x: 9.x), which a driver older than that CUDA release refuses with
# CUDA_ERROR_UNSUPPORTED_PTX_VERSION although the kernels use nothing past ISA 7.0.
AOT_PTX_ISA = {"sm_80": "7.0", "sm_86": "7.1", "sm_87": "7.4", "sm_89": "7.8", "sm_90": "7.8", "sm_100": "8.6",
               "sm_120": "8.7"}
# NVRTC >= 12.4 annotates loads with `.pragma "used_bytes_mask N"`, an optimization hint of ISA 8.3: it is
# dropped where the target ISA is older (the instructions it annotates are unchanged).
_PRAGMAS_SINCE = {"used_bytes_mask": (8, 3)}


def _isa(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def ptx_isa(ptx: bytes) -> str:
    """The `.version` directive of a PTX image."""
    for line in ptx.decode(errors="replace").splitlines():
        if line.startswith(".version "):
            return line.split()[1]
    raise ValueError("PTX without a .version directive")


def aot_ptx_isa(arch: str) -> str | None:
    """The ISA aot_ptx emits for `arch` ("sm_90"), None for an architecture not in AOT_PTX_ISA (NVRTC's own)."""
    return AOT_PTX_ISA.get(arch)


def retarget_ptx(ptx: bytes, isa: str) -> bytes:
    """`ptx` declared at ISA `isa` where that is older than NVRTC's, hint pragmas newer than `isa` dropped."""
    current = ptx_isa(ptx)
    if _isa(isa) >= _isa(current):
        return ptx
    lines = []
    for line in ptx.decode().split("\n"):
        if line.startswith(".version "):
            line = f".version {isa}"
        stripped = line.strip()
        if stripped.startswith(".pragma "):
            name = stripped.split('"')[1].split()[0] if '"' in stripped else ""
            if name in _PRAGMAS_SINCE and _isa(isa) < _PRAGMAS_SINCE[name]:
                continue
        lines.append(line)
    return "\n".join(lines).encode()


def aot_ptx(tactic_id: int, arch: str = "sm_90") -> bytes:
    """The PTX TensorRT embeds in the engine for this tactic (one image holds both AOT entries), at the ISA of
    AOT_PTX_ISA for `arch`."""
    from trtfuse.plugins.nvrtc import compile_kernel

    ptx = compile_kernel(AOT_SOURCE, TACTICS_BY_ID[tactic_id].defines(), arch, "ptx").image
    isa = aot_ptx_isa(arch)
    return retarget_ptx(ptx, isa) if isa else ptx
