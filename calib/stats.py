"""Activation statistics for calibration: one pass of the fp32 model over the data on the CPU.

Every tensor to calibrate becomes an extra graph output of a copy of the model, ONNX Runtime runs
the copy batch by batch, and each tensor's values feed an `AbsHistogram`.

Histogram range without a second pass: a histogram of |x| has a fixed number of bins (2048) over
[0, edge). The first batch with a non-zero value sets `edge` to its absmax. When a later batch holds a
larger |x|, the range doubles (as often as needed) by summing adjacent bin pairs: bin j of the doubled
histogram covers exactly old bins 2j and 2j+1, so the re-binning is exact, nothing is approximated
and no sample is kept. The price is resolution: the data's own range covers between half and all of
the 2048 bins (in practice the first batch of 32 images comes close to the final absmax).
The exact absmax is tracked alongside, so `max` calibration never depends on the binning.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import math

import numpy as np

from trtfuse.errors import TrtfuseError

DEFAULT_BINS = 2048


@dataclass
class AbsHistogram:
    """Histogram of |x| over [0, edge) in `bins` equal bins, plus the exact absmax and element count."""

    bins: int = DEFAULT_BINS
    edge: float = 0.0  # 0 until a non-zero value arrives; zeros seen before that wait in counts[0]
    absmax: float = 0.0
    counts: np.ndarray = field(default=None)

    def __post_init__(self):
        if self.counts is None:
            self.counts = np.zeros(self.bins, dtype=np.int64)
        if self.bins % 2:
            raise ValueError("bins must be even so that the range can double by merging pairs")

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def bin_width(self) -> float:
        return self.edge / self.bins

    def bin_edges(self) -> np.ndarray:
        return np.linspace(0.0, self.edge, self.bins + 1)

    def _grow_to(self, value: float) -> None:
        while value >= self.edge:
            self.counts = np.concatenate([self.counts.reshape(-1, 2).sum(axis=1), np.zeros(self.bins // 2, np.int64)])
            self.edge *= 2.0

    def add(self, x: np.ndarray, scratch: "Scratch | None" = None) -> None:
        scratch = scratch or Scratch()
        a = scratch.absolute(x)
        batch_max = float(a.max()) if a.size else 0.0
        if not math.isfinite(batch_max):  # NaN or inf: no threshold can be chosen (and inf never fits a bin)
            raise NonFiniteActivation(batch_max)
        self.absmax = max(self.absmax, batch_max)
        if batch_max == 0.0:
            self.counts[0] += a.size
            return
        if self.edge == 0.0:
            # Slightly above the absmax so that the largest value falls inside the last bin.
            self.edge = float(np.nextafter(np.float32(batch_max), np.float32(np.inf)))
        elif batch_max >= self.edge:
            self._grow_to(batch_max)
        self.counts += scratch.bincount(a, self.bins / self.edge, self.bins)


class NonFiniteActivation(ValueError):
    """A tensor held NaN or inf; collect_statistics names it in a one-line TrtfuseError."""


class Scratch:
    """Reusable buffers: |x| and bin indices for tensors of millions of elements, without new allocations
    per tensor per batch (allocation and page faults cost more than the arithmetic here)."""

    def __init__(self):
        self._f = np.empty(0, np.float32)
        self._i = np.empty(0, np.uint16)

    def absolute(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        if self._f.size < x.size:
            self._f = np.empty(x.size, np.float32)
            self._i = np.empty(x.size, np.uint16)
        out = self._f[: x.size]
        np.abs(x, out=out)
        return out

    def bincount(self, a: np.ndarray, per_unit: float, bins: int) -> np.ndarray:
        """Counts of floor(a * per_unit) clipped to bins - 1; destroys `a` (it is the scratch buffer)."""
        np.multiply(a, np.float32(per_unit), out=a)
        np.minimum(a, np.float32(bins - 1), out=a)
        idx = self._i[: a.size]
        idx[...] = a  # float -> uint16 truncation is floor for non-negative values
        return np.bincount(idx, minlength=bins)[:bins]


def model_with_outputs(model, names: list[str]):
    """A copy of `model` that also outputs `names` (float tensors); the caller's model is untouched."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    existing = {o.name for o in copy.graph.output}
    produced = {o for n in copy.graph.node for o in n.output} | {i.name for i in copy.graph.input}
    for name in names:
        if name not in produced:
            from trtfuse.errors import TrtfuseError

            raise TrtfuseError(f"tensor {name!r} to calibrate is not produced by the model")
        if name not in existing:
            copy.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return copy


ORT_OPTIMIZATIONS = ("all", "basic", "none")


def make_session(model, threads: int = 2, optimization: str = "all"):
    """An onnxruntime CPU session. optimization: ONNX Runtime's graph optimization level. For a Q/DQ model,
    "all" (ORT's default) fuses the Q/DQ chains into its integer kernels (QLinearConv, ...) with their own
    requantization; "none" runs the Q/DQ chain as written (float ops between explicit roundings)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                     "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                     "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[optimization]
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def input_name_and_size(model) -> tuple[str, int | None]:
    """The model's single image input and its spatial size (None when dynamic)."""
    from trtfuse.errors import TrtfuseError

    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise TrtfuseError(f"expected one image input, the model has {len(inputs)}: {[i.name for i in inputs]}")
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) != 4:
        raise TrtfuseError(f"expected a 4-D NCHW image input, {inputs[0].name} has {len(dims)} dimensions")
    h = dims[2].dim_value if dims[2].HasField("dim_value") else None
    return inputs[0].name, h


def check_images_fit(model, images) -> None:
    """One-line error when the data cannot feed the model's [N, 3, S, S] input."""
    from trtfuse.errors import TrtfuseError

    name, size = input_name_and_size(model)
    initializers = {t.name for t in model.graph.initializer}
    dims = next(i for i in model.graph.input if i.name not in initializers).type.tensor_type.shape.dim
    channels = dims[1].dim_value if dims[1].HasField("dim_value") else None
    if channels is not None and channels != images.channels:
        raise TrtfuseError(f"model input {name} has {channels} channels; the data has {images.channels}")
    if size is not None and images.size != size:
        raise TrtfuseError(f"the model takes {size}x{size} images, the data is {images.size}x{images.size}")


def static_batch_size(model) -> int | None:
    dim = model.graph.input[0].type.tensor_type.shape.dim
    initializers = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name not in initializers:
            dim = inp.type.tensor_type.shape.dim
            break
    return dim[0].dim_value if dim and dim[0].HasField("dim_value") and dim[0].dim_value > 0 else None


def padded_batches(images, batch_size: int, pad: bool):
    """(batch, number of real images): a model with a static batch dimension gets full batches, the
    last one padded by repeating its first image; callers drop the padding rows from every output."""
    for batch in images.batches(batch_size):
        real = len(batch)
        if pad and real < batch_size:
            batch = np.concatenate([batch, np.repeat(batch[:1], batch_size - real, axis=0)])
        yield batch, real


def collect_statistics(model, images, tensors: list[str], batch_size: int = 8, threads: int = 2,
                       bins: int = DEFAULT_BINS, show_progress: bool = True) -> dict[str, AbsHistogram]:
    """Run the fp32 model over `images` (a trtfuse.calib.data.ImageSet) once; histogram every tensor."""
    from trtfuse.ui import progress

    input_name, _ = input_name_and_size(model)
    fixed_batch = static_batch_size(model)
    session = make_session(model_with_outputs(model, tensors), threads)
    hists = {name: AbsHistogram(bins) for name in tensors}
    scratch = Scratch()

    def accumulate(values, real):
        for name, value in zip(tensors, values):
            try:
                hists[name].add(value[:real], scratch)
            except NonFiniteActivation as exc:
                raise TrtfuseError(f"activation {name!r} holds {exc.args[0]} on the calibration data: no scale can be "
                                   f"chosen (check --data for NaN/inf or values far outside the model's range)") from None

    data_range = [math.inf, -math.inf]

    def check_batch(batch, real):
        lo, hi = float(np.min(batch[:real])), float(np.max(batch[:real]))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise TrtfuseError("the calibration data hold NaN or infinite values: give finite images")
        data_range[0], data_range[1] = min(data_range[0], lo), max(data_range[1], hi)

    # Histograms of batch k are built on a worker thread while ONNX Runtime runs batch k+1: numpy's
    # ufuncs and ORT both release the GIL, so the two overlap instead of leaving a core idle.
    bar = progress(total=images.count, desc="calibrating", enabled=show_progress, unit="img")
    with ThreadPoolExecutor(max_workers=1) as worker:
        pending = None  # (future, images it covers) of the batch being histogrammed
        try:
            for batch, real in padded_batches(images, fixed_batch or batch_size, fixed_batch is not None):
                check_batch(batch, real)
                values = session.run(tensors, {input_name: batch})
                if pending is not None:
                    pending[0].result()
                    bar.update(pending[1])
                pending = (worker.submit(accumulate, values, real), real)
            if pending is not None:
                pending[0].result()
                bar.update(pending[1])
        finally:
            bar.close()
    if data_range[0] == data_range[1]:
        raise TrtfuseError(f"every calibration image is the constant {data_range[0]:g}: the scales would describe no "
                           f"real input (give natural images, e.g. --data default)")
    return hists
