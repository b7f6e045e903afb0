"""Python API of the fused INT8 conv kernel: launch on a stream from device pointers.

Used alike by the tests, `trtfuse bench kernels`, the GPU runner and TensorRT's JIT `impl`.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

from . import cuda_driver as cd
from . import wgmma
from .conv_params import ConvParamsStruct, fast_divmod  # noqa: F401  (launchers import them from here)
from .op_schema import OpSpec
from .tactics import ConvShape, Tactic, choose, TACTICS_BY_ID

SOURCE = "fused_conv.cu"
ENTRY = "trtfuse_fused_conv"
ENTRY_SPLIT_K = "trtfuse_fused_conv_splitk"
ENTRY_F32 = "trtfuse_gemm_f32out"
ENTRY_F32_SPLIT_K = "trtfuse_gemm_f32out_splitk"


def _device_arch() -> str | None:
    """The current GPU's sm_XY, or None without one (the heuristic then stays on sm_80 tactics)."""
    ok, _ = cd.gpu_available()
    return cd.compute_capability() if ok else None


def module_for(tactic: Tactic) -> cd.Module:
    return cd.kernel_module(SOURCE, tactic.defines())


def compile_for(tactic, arch: str):
    """The kernel image `module_for` of the tactic's family loads on an `arch` GPU (NVRTC, through the disk cache)."""
    from . import wgmma
    from .nvrtc import compile_kernel

    if tactic.family == "wgmma":
        return wgmma.compile_tactic(tactic)
    return compile_kernel(SOURCE, tactic.defines(), arch, "cubin")


def precompile(tactics, arch: str, workers: int | None = None) -> None:
    """Compile the kernels of `tactics` for `arch` on a thread pool, so the launches that follow load them from the disk
    cache. Autotune on a fresh machine is mostly NVRTC compiling its candidates one after another (each some seconds);
    NVRTC releases the GIL, so a thread per core compiles them side by side."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    unique = list({t.name: t for t in tactics}.values())
    workers = workers or min(len(unique), os.cpu_count() or 1)
    if workers <= 1:
        for t in unique:
            compile_for(t, arch)
        return
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda t: compile_for(t, arch), unique))


@dataclass
class ConvLaunch:
    """A planned launch: shape, tactic, split count and the split-K workspace it needs."""

    shape: ConvShape
    tactic: Tactic
    splits: int = 1
    out_f32: bool = False  # the classifier: fp32 [M][K] logits = float(acc) * scale + bias, no requantize

    @classmethod
    def plan(cls, shape: ConvShape, tactic_id: int | None = None, splits: int | None = None,
             out_f32: bool = False) -> "ConvLaunch":
        if tactic_id is None:
            t, s = choose(shape, arch=_device_arch())
        else:
            t, s = TACTICS_BY_ID[tactic_id], 1
            if t.vec != shape.vec:
                raise ValueError(f"tactic {t.name} reads vec {t.vec}, shape needs {shape.vec}")
        return cls(shape, t, splits if splits is not None else s, out_f32)

    @property
    def name(self) -> str:
        """"<tactic name>/s<split-K slices>": how results files (`plans`) and autotune's records name a plan."""
        return f"{self.tactic.name}/s{self.splits}"

    @classmethod
    def from_name(cls, name: str, shape: ConvShape) -> "ConvLaunch":
        """The plan `name` (see .name) for `shape`; ValueError where no tactic has that name or it cannot take the shape."""
        tactic, _, splits = name.rpartition("/s")
        by_name = {t.name: t for t in TACTICS_BY_ID.values()}  # every family: mma.sync, persistent, wgmma
        if tactic not in by_name or not splits.isdigit():
            raise ValueError(f"{name!r} is not a tactic of this version (tactic name/s<splits>)")
        t = by_name[tactic]
        if t.family == "wgmma" and not t.geometry(shape):
            raise ValueError(f"{name!r} cannot run its shape {shape}")
        try:
            return cls.plan(shape, t.id, int(splits))
        except ValueError as exc:
            raise ValueError(f"{name!r} cannot run its shape: {exc}") from None

    @property
    def tiles(self) -> int:
        m, n, _ = self.shape.gemm
        return math.ceil(m / self.tactic.bm) * math.ceil(n / self.tactic.bn)

    @property
    def grid(self) -> tuple[int, int, int]:
        if self.tactic.family == "wgmma":
            return wgmma.grid(self.shape, self.tactic)
        return self.tiles, self.splits, 1

    def launch_grid(self, fn, smem: int) -> tuple[int, int, int]:
        """The grid actually launched: a persistent tactic gets only the CTAs that are resident at once."""
        if not self.tactic.persistent or self.splits > 1 or self.out_f32:  # those entries are not persistent
            return self.grid
        resident = cd.max_active_blocks(fn, self.tactic.threads, smem) * cd.device_attribute("MULTIPROCESSOR_COUNT")
        return min(self.tiles, max(1, resident)), 1, 1

    @property
    def workspace_bytes(self) -> int:
        """int32 partial sums [M][Kpad] + one counter per output tile; zero-initialised once."""
        if self.splits == 1:
            return 0
        m, n, _ = self.shape.gemm
        return 4 * m * n + 4 * self.tiles

    def launch_op(self, op: OpSpec, inputs, y: int, *, relu: bool = True, workspace: int = 0, stream=None) -> None:
        """Launch on the device pointers of `op`'s inputs in node-input order (FusedConv or FusedConvAdd), read by name."""
        a = op.bind(inputs)
        self.launch(a["x"], a["weight"], a["scale"], a["bias"], a["out_scale"], y, residual=a.get("residual", 0),
                    residual_scale=a.get("residual_scale", 0), relu=relu, workspace=workspace, stream=stream)

    def launch(self, x: int, w: int, scale: int, bias: int, out_scale: int, y: int, *, residual: int = 0,
               residual_scale: int = 0, relu: bool = True, workspace: int = 0, stream=None) -> None:
        sh, t = self.shape, self.tactic
        if self.splits > 1 and not workspace:
            raise ValueError("split-K launch needs a zeroed workspace of workspace_bytes")
        if residual and not sh.residual:
            raise ValueError(f"{t.name} was planned for a conv without a residual (ConvShape.residual), given one")
        m, n, _ = sh.gemm
        oh, ow = sh.out_hw
        p = ConvParamsStruct(x=x, w=w, scale=scale, bias=bias, out_scale=out_scale, residual=residual,
                             residual_scale=residual_scale, y=0 if self.out_f32 else y, y_f32=y if self.out_f32 else 0,
                             workspace=workspace,
                             counters=workspace + 4 * m * n if workspace else 0, N=sh.n, C=sh.c, H=sh.h, W=sh.w,
                             K=sh.k, OH=oh, OW=ow, R=sh.r, S=sh.s, stride_h=sh.stride[0], stride_w=sh.stride[1],
                             pad_top=sh.pads[0], pad_left=sh.pads[1], relu=int(relu), splits=self.splits)
        for name, d in (("div_ohw", oh * ow), ("div_ow", ow)):
            for field, value in zip(("d", "mul", "shr"), fast_divmod(d)):
                setattr(p, f"{name}_{field}", value)
        if t.family == "wgmma":  # Hopper tactic: plugins/wgmma.py (tensor maps + sm_90a module)
            if self.splits > 1 or self.out_f32:
                raise ValueError(f"{t.name} has no split-K or fp32-output variant")
            return wgmma.launch(sh, t, p, x, w, stream)
        smem = t.shared_bytes(sh.c, (sh.r, sh.s))
        entries = (ENTRY_F32, ENTRY_F32_SPLIT_K) if self.out_f32 else (ENTRY, ENTRY_SPLIT_K)
        fn = module_for(t).function(entries[self.splits > 1], smem)
        cd.launch(fn, self.launch_grid(fn, smem), (t.threads, 1, 1), smem, stream, [ctypes.addressof(p)])
