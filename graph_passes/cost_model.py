"""When does a split-K rewrite pay? A small analytic model of one GPU, kernel by kernel.

Every kernel costs a fixed `kernel_overhead_us` (launch spacing, ramp-up and tail) plus the larger of its
compute time and its DRAM time. A GEMM kernel of tile `tm x tn` is modelled the way tiled SIMT GEMM
libraries run it: one thread block (CTA) per output tile and K slice, `ctas_per_sm` CTAs resident per SM
needed to reach the SM's peak, and every CTA computing its whole tile (rows past M are computed and
dropped: SIMT kernels predicate only their loads and stores), so

    ctas   = batch * ceil(M / tm) * ceil(N / tn) * S
    waves  = ceil(ctas / (sms * ctas_per_sm))
    t_comp = waves * 2 * tm * tn * ceil(K / S) / (peak_flops / (sms * ctas_per_sm))
    bytes  = elt * batch * (M*K + K*N + S*M*N)          (each operand read once, S partial outputs written)
    t_dram = bytes / min(dram_bw, min(ctas, sms) * sm_dram_bw)
    t_tile = max(t_comp, t_dram)

The plain GEMM runs the best tile of a menu (`plain_tiles`, the tile shapes SIMT SGEMM kernels come in,
32 to 128 a side), as the library's heuristic picks a kernel per shape:

    t_plain = kernel_overhead + min over (tm, tn) in plain_tiles of t_tile(tm, tn, S=1)

so a large GEMM fills the GPU with small tiles and runs near the peak (splitting it only adds kernels),
while a small one cannot fill it with any tile. The rewrite's batched GEMM is modelled with one tile,
`tile_m x tile_n`, fitted to the timings. With M == 1 both the plain and the batched GEMM run as
matrix-vector kernels that stream B at the full `dram_bw`:

    ctas   = batch * S * ceil(N / gemv_cols_per_cta)
    t_gemv = kernel_overhead + elt * batch * S * (ceil(K/S) * N + ceil(K/S) + N) / min(dram_bw, min(ctas, sms) * sm_dram_bw)

(the library's matrix-vector kernel gives each thread of a CTA its own outputs, so a narrow B (small N) streams
from few SMs and meets the same per-SM cap as a GEMM of few tiles)

`sm_dram_bw` caps what one SM can pull from DRAM: a GEMM with 8 CTAs cannot stream a big weight at the
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

`auto` declines when the rewrite's output tiles already fill every CTA slot (sms * ctas_per_sm), when no split
count leaves at least `min_k_per_split` of K per split, or when the best predicted rewrite is not `min_gain`
faster than the plain GEMM. The constants are per device (DeviceParams); `trtfuse bench splitk` measures both
variants on the GPU and fits the constants that are assumptions rather than measurements (see docs/split_k.md).
Every formula is written once, on numpy arrays, so that `fit` prices the whole grid of constants at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Mapping

import numpy as np

from trtfuse.errors import TrtfuseError

# The plain GEMM's tile menu: rows x columns of the output tile, every pairing of 32, 64 and 128 (the sides SIMT
# SGEMM kernels come in).
SIMT_TILES: tuple[tuple[int, int], ...] = tuple((tm, tn) for tm in (32, 64, 128) for tn in (32, 64, 128))


@dataclass(frozen=True)
class DeviceParams:
    name: str
    sms: int
    dram_bytes_per_s: float  # measured device-to-device copy rate (read + write bytes / time)
    peak_flops: Mapping[str, float]  # per dtype name: the measured large-GEMM rate
    sm_dram_bytes_per_s: float  # the most one SM's CTA pulls from DRAM (assumption; fit by the bench)
    tile_m: int = 32  # the output tile of the rewrite's batched GEMM (assumption; fit by the bench)
    tile_n: int = 32
    plain_tiles: tuple[tuple[int, int], ...] = SIMT_TILES  # the tiles the plain GEMM's library picks from
    ctas_per_sm: int = 1  # CTAs an SM needs resident to reach its peak (assumption; fit by the bench)
    # outputs of an M == 1 GEMV per CTA (assumption; fit by the bench). 32 is the widest power of two that keeps
    # ResNet-50's classifier at batch 1 (N = 1000) streaming at the full copy rate, as measured (5.6 us)
    gemv_cols_per_cta: int = 32
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
        d["plain_tiles"] = [list(t) for t in self.plain_tiles]
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
        if "plain_tiles" in d:
            try:
                d["plain_tiles"] = tuple((int(tm), int(tn)) for tm, tn in d["plain_tiles"])
            except (TypeError, ValueError):
                raise TrtfuseError(f"split-K device parameter plain_tiles must be a list of [tile_m, tile_n] pairs, not {d['plain_tiles']!r}") from None
            if not d["plain_tiles"] or min(min(t) for t in d["plain_tiles"]) < 1:
                raise TrtfuseError("split-K device parameter plain_tiles needs at least one tile of positive sides")
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


# ---- the formulas, once, on numpy arrays ----------------------------------------------------------------
# `q` is a problem (or a column of problems) with m, n, k, batch, elt, peak and the rewrite's flags; `dev` is
# a DeviceParams or the same fields as arrays of candidate constants (fit). Scalars in, numpy scalars out.


def _problem(p: GemmProblem, dev: DeviceParams) -> SimpleNamespace:
    return SimpleNamespace(m=p.m, n=p.n, k=p.k, batch=p.batch, elt=p.elt, peak=dev.flops_for(p.dtype), a_transposed=p.a_transposed,
                           b_constant=p.b_constant, b_transposed=p.b_transposed, alpha_scale=p.alpha_scale, has_bias=p.has_bias)


def _problems(problems, dev: DeviceParams) -> SimpleNamespace:
    cols = [_problem(p, dev) for p in problems]
    return SimpleNamespace(**{f: np.array([getattr(c, f) for c in cols], dtype=bool if isinstance(getattr(cols[0], f), bool) else float)
                              for f in vars(cols[0])})


def _tile_seconds(q, dev, splits, k_slice, tile_m, tile_n):
    """max(t_comp, t_dram) of a GEMM kernel run in tile_m x tile_n tiles (the module docstring's formulas)."""
    ctas = q.batch * np.ceil(q.m / tile_m) * np.ceil(q.n / tile_n) * splits
    slots = dev.sms * dev.ctas_per_sm
    t_comp = np.ceil(ctas / slots) * 2.0 * tile_m * tile_n * k_slice / (q.peak / slots)
    k_total = k_slice * splits
    dram_bytes = q.elt * q.batch * (q.m * k_total + k_total * q.n + splits * q.m * q.n)
    bandwidth = np.minimum(dev.dram_bytes_per_s, np.minimum(ctas, dev.sms) * dev.sm_dram_bytes_per_s)
    return np.maximum(t_comp, dram_bytes / bandwidth)


def _gemm_us(q, dev, splits, plain: bool):
    k_slice = np.ceil(q.k / splits)
    if plain:  # the library's pick: the best tile of the menu
        t = np.minimum.reduce([_tile_seconds(q, dev, splits, k_slice, tm, tn) for tm, tn in dev.plain_tiles])
    else:
        t = _tile_seconds(q, dev, splits, k_slice, dev.tile_m, dev.tile_n)
    # M == 1: a matrix-vector kernel streaming B at the full copy rate (measured on the H200, fp32: ResNet-50's fc
    # takes 5.6 us at batch 1 and 16 us at batch 2; the batched M == 1 GEMMs of the rewrite time like it too)
    gemv_ctas = q.batch * splits * np.ceil(q.n / dev.gemv_cols_per_cta)
    gemv_bandwidth = np.minimum(dev.dram_bytes_per_s, np.minimum(gemv_ctas, dev.sms) * dev.sm_dram_bytes_per_s)
    gemv = q.elt * q.batch * splits * (k_slice * q.n + k_slice + q.n) / gemv_bandwidth
    return dev.kernel_overhead_us + 1e6 * np.where(q.m == 1, gemv, t)


def _stream(dev, nbytes):
    return dev.kernel_overhead_us + 1e6 * nbytes / dev.dram_bytes_per_s


def _rewrite_kernels(q, dev, splits):
    """(what, microseconds, whether the rewrite emits it) for each kernel of the rewrite with `splits` slices."""
    e, b = q.elt, q.batch
    kp = np.ceil(q.k / splits) * splits
    padded = kp != q.k
    # with M == 1 the transpose of A only moves a size-1 axis and the rewrite emits a Reshape instead
    return [
        ("pad A", _stream(dev, e * b * q.m * (q.k + kp)), padded),
        ("pad B", _stream(dev, e * b * q.n * (q.k + kp)), np.logical_and(padded, np.logical_not(q.b_constant))),
        ("transpose A", _stream(dev, 2 * e * b * q.m * kp), np.logical_or(q.m > 1, q.a_transposed)),
        ("transpose B", _stream(dev, 2 * e * b * q.n * kp), np.logical_and(q.b_transposed, np.logical_not(q.b_constant))),
        ("batched gemm", _gemm_us(q, dev, splits, plain=False), True),
        ("reduce", _stream(dev, e * b * q.m * q.n * (splits + 1)), True),
        ("alpha", _stream(dev, 2 * e * b * q.m * q.n), q.alpha_scale),
        ("bias add", _stream(dev, 3 * e * b * q.m * q.n), q.has_bias),
    ]


def _split_total(q, dev, splits):
    total = 0.0
    for _, t, emitted in _rewrite_kernels(q, dev, splits):
        total = total + np.where(emitted, t, 0.0)
    return total


# ---- one problem -----------------------------------------------------------------------------------------


def gemm_us(p: GemmProblem, dev: DeviceParams, splits: int = 1) -> float:
    """The plain GEMM (splits == 1) or the rewrite's batched GEMM of `splits` slices, microseconds."""
    return float(_gemm_us(_problem(p, dev), dev, splits, plain=splits == 1))


def predict_plain(p: GemmProblem, dev: DeviceParams) -> Prediction:
    t = gemm_us(p, dev, 1)
    return Prediction(1, t, (("gemm", t),))


def predict_split(p: GemmProblem, dev: DeviceParams, splits: int) -> Prediction:
    """Kernel-by-kernel prediction of the rewrite with `splits` slices (see the module docstring)."""
    kernels = tuple((what, float(t)) for what, t, emitted in _rewrite_kernels(_problem(p, dev), dev, splits) if emitted)
    return Prediction(splits, sum(t for _, t in kernels), kernels)


def predict_fused(p: GemmProblem, dev: DeviceParams, splits: int) -> Prediction:
    """A split-K GEMM kernel (the SplitKGemm plugin): one kernel, partial sums reduced and bias added inside."""
    t = float(_gemm_us(_problem(p, dev), dev, splits, plain=False))
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


def predict_us(p: GemmProblem, dev: DeviceParams, splits: int) -> float:
    """Predicted time of the plain GEMM (splits == 1) or of the rewrite with `splits` slices."""
    return (predict_plain(p, dev) if splits == 1 else predict_split(p, dev, splits)).total_us


# ---- fitting the assumed constants -----------------------------------------------------------------------

# The constants above that are assumptions rather than measurements, and the values `fit` tries for them.
FIT_GRID = {
    "tile_m": (16, 32, 64, 128),
    "tile_n": (32, 64, 128, 256),
    "ctas_per_sm": (1, 2, 4, 8),
    "kernel_overhead_us": (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0),
    "sm_dram_share": (1.0, 2.0, 4.0, 8.0, 16.0),  # sm_dram_bytes_per_s = share * dram_bytes_per_s / sms
    "gemv_cols_per_cta": (8, 32, 128, 512),
}


def _grid(base: DeviceParams):
    """Every FIT_GRID combination: the DeviceParams fields as column arrays (one row per combination)."""
    combos = np.array(list(itertools.product(*FIT_GRID.values())), dtype=float)
    col = {name: combos[:, i : i + 1] for i, name in enumerate(FIT_GRID)}
    dev = SimpleNamespace(sms=base.sms, dram_bytes_per_s=base.dram_bytes_per_s, plain_tiles=base.plain_tiles,
                          tile_m=col["tile_m"], tile_n=col["tile_n"], ctas_per_sm=col["ctas_per_sm"],
                          kernel_overhead_us=col["kernel_overhead_us"], gemv_cols_per_cta=col["gemv_cols_per_cta"],
                          sm_dram_bytes_per_s=col["sm_dram_share"] * base.dram_bytes_per_s / base.sms)
    return combos, dev


def _decisions(problems, dev, base: DeviceParams):
    """decide() for every problem (columns) under every grid row of `dev`: the split count, 0 = decline."""
    q = _problems(problems, base)
    plain = _gemm_us(q, dev, 1, plain=True)
    cands = np.array(base.candidate_splits)
    times = np.stack([np.where(np.ceil(q.k / s) >= base.min_k_per_split, _split_total(q, dev, s), np.inf) for s in cands], axis=-1)
    best = times.argmin(axis=-1)
    best_t = np.take_along_axis(times, best[..., None], axis=-1)[..., 0]
    fills = q.batch * np.ceil(q.m / dev.tile_m) * np.ceil(q.n / dev.tile_n) >= dev.sms * dev.ctas_per_sm
    accept = ~fills & np.isfinite(best_t) & (best_t * (1.0 + base.min_gain) <= plain)
    return np.where(accept, cands[best], 0)


def fit(observations, base: DeviceParams, verdicts=None) -> tuple[DeviceParams, float]:
    """Grid-search the assumed constants (FIT_GRID) against measurements; keep the measured ones.

    observations: (GemmProblem, splits, measured_us) with splits == 1 for the plain GEMM. The score is
    first the decisions `auto` would get right (what the model is for), then the RMS of
    log(predicted / measured), so a 2x miss on a 5 us kernel weighs as much as one on a 5 ms one.
    The decisions are scored from `verdicts`, (GemmProblem, {split count or 0: score of deciding it}) per
    measured shape, for the whole grid at once; without them only the error counts.
    Returns the fitted parameters and their RMS (0.1 ~ predictions within 10%).
    """
    obs = [(p, s, t) for p, s, t in observations if t and t > 0]
    if not obs:
        raise TrtfuseError("no timings to fit the split-K cost model to")
    combos, dev = _grid(base)
    q = _problems([p for p, _, _ in obs], base)
    splits = np.array([s for _, s, _ in obs], dtype=float)
    predicted = np.where(splits == 1, _gemm_us(q, dev, 1, plain=True), _split_total(q, dev, splits))
    err = np.sqrt(np.mean(np.log(predicted / np.array([t for _, _, t in obs])) ** 2, axis=1))
    score = np.zeros(len(combos))
    if verdicts:
        chosen = _decisions([p for p, _ in verdicts], dev, base)
        for j, (_, table) in enumerate(verdicts):
            for s, value in table.items():
                score += np.where(chosen[:, j] == s, value, 0.0)

    best = int(np.lexsort((err, -score))[0])  # most right decisions, then the lowest error; the grid's order breaks ties
    fields = dict(zip(FIT_GRID, combos[best].tolist()))
    share = fields.pop("sm_dram_share")
    dev = base.replace(**{name: (float(v) if name == "kernel_overhead_us" else int(v)) for name, v in fields.items()},
                       sm_dram_bytes_per_s=float(share * base.dram_bytes_per_s / base.sms))
    return dev.replace(name=f"{base.name}-fitted", source=f"fit to {len(obs)} timings from `trtfuse bench splitk`"), float(err[best])
