"""When does a split-K rewrite pay? A small analytic model of one GPU, kernel by kernel.

Every kernel costs a fixed `kernel_overhead_us` (launch spacing, ramp-up and tail) plus the larger of its
compute time and its DRAM time. A GEMM kernel is modelled the way tiled GEMM libraries run it: one
thread block (CTA) per `tile_m x tile_n` output tile and K slice, one CTA per SM at a time, so

    ctas   = batch * ceil(M / tile_m) * ceil(N / tile_n) * S
    waves  = ceil(ctas / (sms * ctas_per_sm))
    t_comp = waves * 2 * min(tile_m, M) * min(tile_n, N) * ceil(K / S) / (peak_flops / (sms * ctas_per_sm))
    bytes  = elt * batch * (M*K + K*N + S*M*N)          (each operand read once, S partial outputs written)
    t_dram = bytes / min(dram_bw, min(ctas, sms) * sm_dram_bw)
    t_gemm = kernel_overhead + max(t_comp, t_dram)

except the plain GEMM with M == 1, which libraries run as a matrix-vector kernel streaming B at the full
`dram_bw`. `sm_dram_bw` caps what one SM can pull from DRAM: a GEMM with 8 CTAs cannot stream a big weight at the
full 4.25 TB/s, which is exactly why splitting K helps small-M, small-N, large-K problems. `ctas_per_sm` is the
other half of that: an SM reaches its peak only with several CTAs resident to hide latency, so one CTA alone
runs at 1/ctas_per_sm of the SM's rate and a grid of fewer than sms * ctas_per_sm CTAs leaves throughput unused.
The rewrite adds, besides the batched GEMM (S > 1 in the formulas above):

    transpose of A  (M > 1 or transA)  2 * elt * batch*M*K bytes       + overhead
    zero pad of A   (K % S != 0)            2 * elt * batch*M*K bytes       + overhead
    reduction       S partials -> 1         elt * batch*M*N * (S + 1) bytes + overhead
    alpha multiply  (Gemm, alpha != 1)      2 * elt * batch*M*N bytes       + overhead
    bias add        (Gemm with C: it was fused into the GEMM epilogue before)   3 * elt * M*N + overhead
    dynamic B       (pad / transpose of a B that is not a constant)         2 * elt * K*N per op + overhead

`auto` declines when the output tiles already fill every CTA slot (sms * ctas_per_sm), when no split count leaves at least
`min_k_per_split` of K per split, or when the best predicted rewrite is not `min_gain` faster than the
plain GEMM. The constants are per device (DeviceParams); `trtfuse bench splitk` measures both variants
on the GPU and fits the constants that are assumptions rather than measurements (see docs/split_k.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from typing import Mapping

from trtfuse.errors import TrtfuseError


@dataclass(frozen=True)
class DeviceParams:
    name: str
    sms: int
    dram_bytes_per_s: float  # measured device-to-device copy rate (read + write bytes / time)
    peak_flops: Mapping[str, float]  # per dtype name: the measured large-GEMM rate
    sm_dram_bytes_per_s: float  # the most one SM's CTA pulls from DRAM (assumption; fit by the bench)
    tile_m: int = 32  # the library's effective output tile for the small GEMMs split-K is about
    tile_n: int = 32
    ctas_per_sm: int = 1  # CTAs an SM needs resident to reach its peak (assumption; fit by the bench)
    kernel_overhead_us: float = 4.0  # fixed cost of each kernel the rewrite adds
    min_k_per_split: int = 256
    min_gain: float = 0.10  # predicted speed-up must reach 1 + min_gain
    candidate_splits: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    source: str = ""  # where the figures come from

    def flops_for(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise TrtfuseError(f"device parameters '{self.name}' have no peak rate for {dtype} (have: {', '.join(self.peak_flops)})")
        return self.peak_flops[dtype]

    def replace(self, **changes) -> "DeviceParams":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["peak_flops"] = dict(self.peak_flops)
        d["candidate_splits"] = list(self.candidate_splits)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "DeviceParams":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise TrtfuseError(f"unknown split-K device parameter(s): {', '.join(sorted(unknown))}")
        d = dict(d)
        if "candidate_splits" in d:
            d["candidate_splits"] = tuple(int(s) for s in d["candidate_splits"])
        try:
            return cls(**d)
        except TypeError as exc:
            raise TrtfuseError(f"incomplete split-K device parameters: {exc}") from None

    @classmethod
    def from_json(cls, path: str) -> "DeviceParams":
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as exc:
            raise TrtfuseError(f"cannot read split-K device parameters {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise TrtfuseError(f"{path} is not JSON: {exc.msg} at line {exc.lineno}") from None
        if isinstance(data, dict) and data.get("benchmark") == "splitk":
            # a `trtfuse bench splitk` results file: its fitted constants, CUDA-graph timings first
            fitted = data.get("fitted") or {}
            timing = "graph_us" if "graph_us" in fitted else "us"
            if timing not in fitted:
                raise TrtfuseError(f"{path} holds no fitted split-K parameters")
            data = fitted[timing]["params"]
        if not isinstance(data, dict):
            raise TrtfuseError(f"{path} does not hold split-K device parameters")
        return cls.from_dict(data)


# NVIDIA H200 of this workplace (shared/anchors/h200-peers-2026-11-21.json): 132 SMs, 4.25 TB/s measured
# device-to-device copy, 50.8 TFLOPS measured fp32 SGEMM 8192^3, 656 TFLOPS measured fp16 GEMM 8192^3.
# tile 32x32 and the 4 us overhead reproduce the anchor's seed-001 plain time (model 14.7 us, measured
# 14.6 us); sm_dram_bytes_per_s (4 x the per-SM share of the copy rate) is an assumption.
H200 = DeviceParams(
    name="h200",
    sms=132,
    dram_bytes_per_s=4.25e12,
    peak_flops={"float32": 50.8e12, "float16": 656e12, "bfloat16": 656e12},
    sm_dram_bytes_per_s=4 * 4.25e12 / 132,
    source="shared/anchors/h200-peers-2026-11-21.json (sms, copy rate, GEMM rates); tile, overhead: seed-001 anchor; sm_dram_bytes_per_s: assumed",
)

# H100 SXM: same SM count; its HBM3 is slower. No measurement of our own: the rates are the H200's scaled
# by the memory-bandwidth ratio only where memory-bound (3.35 / 4.8 TB/s of the data sheets).
H100 = H200.replace(
    name="h100",
    dram_bytes_per_s=4.25e12 * 3.35 / 4.8,
    sm_dram_bytes_per_s=4 * 4.25e12 * 3.35 / 4.8 / 132,
    source="H200 parameters with DRAM rates scaled by the data-sheet bandwidth ratio 3.35/4.8 (not measured)",
)

DEVICES: dict[str, DeviceParams] = {"h200": H200, "h100": H100}


def device_params(name_or_path: str | DeviceParams | None) -> DeviceParams:
    """'h200' / 'h100', a JSON file of DeviceParams fields, or DeviceParams itself; None -> H200."""
    if name_or_path is None:
        return H200
    if isinstance(name_or_path, DeviceParams):
        return name_or_path
    key = str(name_or_path).lower()
    if key in DEVICES:
        return DEVICES[key]
    if key.endswith(".json"):
        return DeviceParams.from_json(str(name_or_path))
    raise TrtfuseError(f"unknown split-K device '{name_or_path}': use one of {', '.join(DEVICES)} or a .json parameter file")


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class GemmProblem:
    """One MatMul/Gemm as the cost model sees it: `batch` independent [M, K] x [K, N] products.

    A MatMul whose B is 2-D folds A's leading dims into M (one big GEMM); a batched B makes `batch` GEMMs.
    The flags say which extra kernels the rewrite needs beyond reshape (free) + batched GEMM + reduction.
    """

    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "float32"
    a_transposed: bool = False  # Gemm transA
    b_constant: bool = True
    b_transposed: bool = False  # Gemm transB
    alpha_scale: bool = False  # Gemm alpha != 1
    has_bias: bool = False  # Gemm with C (fused in the plain GEMM, a separate Add after the rewrite)

    @property
    def elt(self) -> int:
        if self.dtype not in DTYPE_BYTES:
            raise TrtfuseError(f"split-K cost model has no element size for {self.dtype}")
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Prediction:
    splits: int
    total_us: float
    kernels: tuple[tuple[str, float], ...]  # (what, microseconds)


@dataclass(frozen=True)
class Decision:
    splits: int  # 0: do not split
    reason: str
    plain_us: float | None = None
    split_us: float | None = None

    @property
    def accepted(self) -> bool:
        return self.splits > 1


def output_tiles(p: GemmProblem, dev: DeviceParams) -> int:
    return p.batch * math.ceil(p.m / dev.tile_m) * math.ceil(p.n / dev.tile_n)


def padded_k(k: int, splits: int) -> int:
    """K rounded up to a multiple of the split count: the rewrite zero-pads K to this."""
    return -(-k // splits) * splits


def gemm_us(p: GemmProblem, dev: DeviceParams, splits: int = 1) -> float:
    if splits == 1 and p.m == 1:
        # libraries run M == 1 as a matrix-vector kernel that streams B with every SM (measured on the
        # H200, fp32: ResNet-50's fc takes 5.6 us at batch 1 and 16 us at batch 2, bench/results)
        return dev.kernel_overhead_us + 1e6 * p.elt * p.batch * (p.k * p.n + p.k + p.n) / dev.dram_bytes_per_s
    k_slice = padded_k(p.k, splits) // splits
    ctas = output_tiles(p, dev) * splits
    slots = dev.sms * dev.ctas_per_sm
    waves = math.ceil(ctas / slots)
    per_cta_flops = dev.flops_for(p.dtype) / slots
    t_comp = waves * 2.0 * min(dev.tile_m, p.m) * min(dev.tile_n, p.n) * k_slice / per_cta_flops
    k_total = k_slice * splits
    dram_bytes = p.elt * p.batch * (p.m * k_total + k_total * p.n + splits * p.m * p.n)
    bandwidth = min(dev.dram_bytes_per_s, min(ctas, dev.sms) * dev.sm_dram_bytes_per_s)
    return dev.kernel_overhead_us + 1e6 * max(t_comp, dram_bytes / bandwidth)


def _stream_us(dev: DeviceParams, nbytes: float) -> float:
    return dev.kernel_overhead_us + 1e6 * nbytes / dev.dram_bytes_per_s


def predict_plain(p: GemmProblem, dev: DeviceParams) -> Prediction:
    t = gemm_us(p, dev, 1)
    return Prediction(1, t, (("gemm", t),))


def predict_split(p: GemmProblem, dev: DeviceParams, splits: int) -> Prediction:
    """Kernel-by-kernel prediction of the rewrite with `splits` slices (see the module docstring)."""
    e, b = p.elt, p.batch
    kp = padded_k(p.k, splits)
    kernels: list[tuple[str, float]] = []
    if kp != p.k:
        kernels.append(("pad A", _stream_us(dev, e * b * p.m * (p.k + kp))))
        if not p.b_constant:
            kernels.append(("pad B", _stream_us(dev, e * b * p.n * (p.k + kp))))
    if p.m > 1 or p.a_transposed:
        # with M == 1 the transpose only moves a size-1 axis and the rewrite emits a Reshape instead
        kernels.append(("transpose A", _stream_us(dev, 2 * e * b * p.m * kp)))
    if p.b_transposed and not p.b_constant:
        kernels.append(("transpose B", _stream_us(dev, 2 * e * b * p.n * kp)))
    kernels.append(("batched gemm", gemm_us(p, dev, splits)))
    kernels.append(("reduce", _stream_us(dev, e * b * p.m * p.n * (splits + 1))))
    if p.alpha_scale:
        kernels.append(("alpha", _stream_us(dev, 2 * e * b * p.m * p.n)))
    if p.has_bias:
        kernels.append(("bias add", _stream_us(dev, 3 * e * b * p.m * p.n)))
    return Prediction(splits, sum(t for _, t in kernels), tuple(kernels))


def predict_fused(p: GemmProblem, dev: DeviceParams, splits: int) -> Prediction:
    """A split-K GEMM kernel (the SplitKGemm plugin): one kernel, partial sums reduced and bias added inside."""
    t = gemm_us(p, dev, splits)
    return Prediction(splits, t, (("split-k gemm", t),))


def decide(p: GemmProblem, dev: DeviceParams, fused: bool = False) -> Decision:
    """The `auto` policy: the split count with the best predicted time, or 0 with the reason why not.

    fused=True judges the SplitKGemm plugin kernel (predict_fused) instead of the graph rewrite."""
    tiles = output_tiles(p, dev)
    if tiles >= dev.sms * dev.ctas_per_sm:
        return Decision(0, f"{tiles} output tiles of {dev.tile_m}x{dev.tile_n} already fill the {dev.sms} SMs x {dev.ctas_per_sm} CTAs")
    candidates = [s for s in dev.candidate_splits if padded_k(p.k, s) // s >= dev.min_k_per_split]
    if not candidates:
        return Decision(0, f"K={p.k} leaves fewer than {dev.min_k_per_split} per split even at {min(dev.candidate_splits)} splits")
    plain = predict_plain(p, dev).total_us
    predict = predict_fused if fused else predict_split
    best = min((predict(p, dev, s) for s in candidates), key=lambda pr: pr.total_us)
    if best.total_us * (1.0 + dev.min_gain) > plain:
        return Decision(
            0,
            f"best split ({best.splits}) predicted {best.total_us:.1f} us vs {plain:.1f} us plain: gain below {dev.min_gain:.0%}",
            plain,
            best.total_us,
        )
    return Decision(best.splits, f"predicted {best.total_us:.1f} us with {best.splits} splits vs {plain:.1f} us plain", plain, best.total_us)


# The constants above that are assumptions rather than measurements, and the values `fit` tries for them.
FIT_GRID = {
    "tile_m": (16, 32, 64, 128),
    "tile_n": (32, 64, 128, 256),
    "ctas_per_sm": (1, 2, 4, 8),
    "kernel_overhead_us": (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0),
    "sm_dram_share": (1.0, 2.0, 4.0, 8.0, 16.0),  # sm_dram_bytes_per_s = share * dram_bytes_per_s / sms
}


def predict_us(p: GemmProblem, dev: DeviceParams, splits: int) -> float:
    """Predicted time of the plain GEMM (splits == 1) or of the rewrite with `splits` slices."""
    return (predict_plain(p, dev) if splits == 1 else predict_split(p, dev, splits)).total_us


def fit(observations, base: DeviceParams, decisions_right=None) -> tuple[DeviceParams, float]:
    """Grid-search the assumed constants (FIT_GRID) against measurements; keep the measured ones.

    observations: (GemmProblem, splits, measured_us) with splits == 1 for the plain GEMM. The score is
    first `decisions_right(params)` (how many measured shapes `auto` would judge right; what the model
    is for), then the RMS of log(predicted / measured), so a 2x miss on a 5 us kernel weighs as much as
    one on a 5 ms one. Returns the fitted parameters and their RMS (0.1 ~ predictions within 10%).
    """
    obs = [(p, s, t) for p, s, t in observations if t and t > 0]
    if not obs:
        raise TrtfuseError("no timings to fit the split-K cost model to")
    best: tuple[tuple[float, float], DeviceParams] | None = None
    for tile_m, tile_n, ctas_per_sm, overhead, share in itertools.product(*FIT_GRID.values()):
        dev = base.replace(
            tile_m=tile_m,
            tile_n=tile_n,
            ctas_per_sm=ctas_per_sm,
            kernel_overhead_us=overhead,
            sm_dram_bytes_per_s=share * base.dram_bytes_per_s / base.sms,
        )
        err = math.sqrt(sum(math.log(predict_us(p, dev, s) / t) ** 2 for p, s, t in obs) / len(obs))
        score = (-(decisions_right(dev) if decisions_right else 0), err)
        if best is None or score < best[0]:
            best = (score, dev)
    (_, err), dev = best
    return dev.replace(name=f"{base.name}-fitted", source=f"fit to {len(obs)} timings from `trtfuse bench splitk`"), err
