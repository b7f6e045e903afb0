"""`--backend trt`: run a serialized TensorRT engine (from `trtfuse build`) on the GPU.

Deserializes with the full runtime (`tensorrt`), or the lean runtime when only it is installed (it runs
version-compatible engines only: `trtfuse build --version-compatible`). What must be registered first follows
the build record next to the engine (runtime/trt_build.py): nothing for the Quickly Deployable Plugins, whose
AOT kernels are embedded in the engine (no Python runs for them); the IPluginV3 creators (plugins/tensorrt/v3.py)
for `--plugins v3` and for an engine without a record.
One execution context per runner, device buffers from plugins/cuda_driver.py, `execute_async_v3` on the
runner's stream, optionally captured once into a CUDA graph and replayed. The runner has the same
surface as runtime/gpu_runner.CudaRunner (input_ptr, launch, fetch, run, top1_ptr, copy_top1), so
`trtfuse offline` drives both with one worker: when the first output is float32 or float16 logits
([batch, classes], trailing 1s allowed) our argmax kernel (plugins/network_ops.argmax_rows) runs on that
output buffer on the runner's stream right after TensorRT's enqueue, inside the same CUDA graph.

Which engine I/O is accepted is decided by `plan_io`, plain Python over the engine's tensor list (tested
without TensorRT): one float32 linear NCHW image input with static C, H, W; linear outputs of a numpy
dtype; a batch the engine's profile allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import TrtfuseError
from .top1 import Top1Readout
from .trt_build import build_record

# TensorRT DataType name -> numpy dtype (bf16/fp8/fp4/int4 have no numpy dtype: refused).
NUMPY_DTYPES = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
                "UINT8": np.uint8, "BOOL": np.bool_}


@dataclass(frozen=True)
class IOTensor:
    name: str
    is_input: bool
    dtype: str  # TensorRT DataType name
    shape: tuple  # as the engine declares it; -1 where dynamic
    vectorized: bool  # a vectorized format (CHW32...): the host cannot read it as NCHW
    batch_range: tuple | None = None  # inputs: (min, max) of dim 0 in optimization profile 0


@dataclass(frozen=True)
class IOPlan:
    input: IOTensor
    input_shape: tuple
    outputs: tuple


def plan_io(tensors: list[IOTensor], batch: int) -> IOPlan:
    """The input shape to set for `batch` images, or a one-line reason the engine cannot be run this way."""
    inputs = [t for t in tensors if t.is_input]
    outputs = tuple(t for t in tensors if not t.is_input)
    if len(inputs) != 1:
        raise TrtfuseError(f"the engine has {len(inputs)} inputs ({', '.join(t.name for t in inputs)}): trtfuse runs one image input")
    if not outputs:
        raise TrtfuseError("the engine has no outputs")
    x = inputs[0]
    if len(x.shape) != 4 or x.dtype != "FLOAT" or x.vectorized:
        raise TrtfuseError(f"engine input {x.name!r} is {x.dtype} {list(x.shape)}{' vectorized' if x.vectorized else ''}: "
                           "need float32 linear [N, C, H, W]")
    if any(d < 0 for d in x.shape[1:]):
        raise TrtfuseError(f"engine input {x.name!r} has dynamic non-batch dims {list(x.shape)}")
    if x.shape[0] >= 0:
        if batch != x.shape[0]:
            raise TrtfuseError(f"the engine's batch is fixed at {x.shape[0]}, not {batch}")
    else:
        lo, hi = x.batch_range
        if not lo <= batch <= hi:
            raise TrtfuseError(f"batch {batch} is outside the engine's profile ({lo}..{hi}): rebuild with `trtfuse build --batch`")
    for t in outputs:
        if t.vectorized or t.dtype not in NUMPY_DTYPES:
            raise TrtfuseError(f"engine output {t.name!r} is {t.dtype}{' vectorized' if t.vectorized else ''}: "
                               f"need a linear {'/'.join(NUMPY_DTYPES)} tensor")
    return IOPlan(x, (batch, *x.shape[1:]), outputs)


def batch_for(x: IOTensor, count: int) -> int:
    """The batch to run `count` images with: the fixed one, else as many as the profile allows."""
    return x.shape[0] if x.shape[0] >= 0 else max(x.batch_range[0], min(count, x.batch_range[1]))


def resolved_shape(name: str, shape) -> tuple:
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise TrtfuseError(f"engine output {name!r} has shape {list(shape)} after the input shape is set: "
                           "data-dependent output shapes are not supported")
    return shape


def logits_classes(shape: tuple, dtype: str, batch: int) -> int | None:
    """The class count when an output of this shape and numpy dtype name holds one row of logits per image
    that our argmax kernel reads ([batch, classes] with any trailing 1s, float32 or float16), else None."""
    from ..plugins.network_ops import ARGMAX_DTYPES

    if dtype not in ARGMAX_DTYPES or len(shape) < 2 or shape[0] != batch:
        return None
    classes = int(np.prod(shape[1:]))
    return classes if classes >= 1 and classes == max(shape[1:]) else None


def register_plugins(trt, module_name: str, record: dict) -> str:
    """trtfuse's plugins in `trt`'s registry before deserializing, as the engine's build `record` needs them;
    returns what was registered: "none" (AOT kernels embedded) or "v3"."""
    from trtfuse.plugins.tensorrt import v3

    flavour = record.get("plugins")
    if module_name != "tensorrt" and record and not record.get("version_compatible"):
        raise TrtfuseError(f"the engine was built without --version-compatible, and {module_name} (the lean runtime) runs "
                           "only version-compatible engines: rebuild with `trtfuse build --version-compatible`, or install "
                           "the full TensorRT runtime (pip install 'trtfuse[trt]')")
    if flavour == "qdp":
        return "none"  # AOT plugins: TensorRT runs the PTX embedded in the engine, nothing to register
    try:
        v3.register_creators(trt)
    except TrtfuseError:
        raise
    except Exception as exc:
        text = str(exc).strip()
        raise TrtfuseError(f"registering trtfuse's IPluginV3 creators in {module_name} failed: {type(exc).__name__}: "
                           f"{text.splitlines()[0] if text else 'no message'}") from None
    return "v3"


class TrtEngine:
    """A deserialized engine on one GPU, its runtime and plugins; runners (contexts) are made from it."""

    def __init__(self, path: str, device: int = 0):
        from ..plugins import cuda_driver as cd
        from trtfuse.plugins.tensorrt.v3 import import_trt

        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise TrtfuseError(f"cannot read engine {path}: {exc.strerror or exc}") from None
        if Path(path).suffix == ".onnx":
            raise TrtfuseError(f"{path} is an ONNX model: --backend trt runs an engine, build one with `trtfuse build`")
        record = build_record(path)
        trt, self.module_name = import_trt()
        ok, why = cd.gpu_available()  # before trt.Runtime: without a GPU the lean runtime's object is unusable
        if not ok:
            raise TrtfuseError(f"--backend trt needs an NVIDIA GPU: {why}")
        cd.context(device)  # several GPUs: each engine is made on its own device's context
        self.trt, self.device, self.path = trt, device, path
        self.plugins = register_plugins(trt, self.module_name, record)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        if record.get("version_compatible") and hasattr(self.runtime, "engine_host_code_allowed"):
            self.runtime.engine_host_code_allowed = True  # a version-compatible engine carries the lean runtime's code
        self.engine = self.runtime.deserialize_cuda_engine(data)
        if self.engine is None:
            lean = (" (the lean runtime runs only engines built with `trtfuse build --version-compatible`)"
                    if self.module_name != "tensorrt" else "")
            raise TrtfuseError(f"{self.module_name} {trt.__version__} could not deserialize {path}{lean}: see TensorRT's messages above")
        self.tensors = engine_io(trt, self.engine)

    @property
    def input(self) -> IOTensor:
        return next(t for t in self.tensors if t.is_input)

    @property
    def input_dims(self) -> list:
        """[N or None, C, H, W], as model_input_spec gives an ONNX input's dims."""
        return [d if d >= 0 else None for d in self.input.shape]


def engine_io(trt, engine) -> list[IOTensor]:
    out = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        batch_range = None
        if is_input and engine.num_optimization_profiles:
            lo, _, hi = engine.get_tensor_profile_shape(name, 0)
            batch_range = (int(lo[0]), int(hi[0])) if len(lo) else None
        # get_tensor_vectorized_dim, not get_tensor_format: the lean module cannot return a TensorFormat.
        out.append(IOTensor(name, is_input, engine.get_tensor_dtype(name).name, tuple(int(d) for d in engine.get_tensor_shape(name)),
                            engine.get_tensor_vectorized_dim(name) != -1, batch_range))
    return out


class TrtRunner(Top1Readout):
    """One execution context with its own buffers and stream; static shapes after construction."""

    def __init__(self, engine: TrtEngine, batch: int, use_graph: bool = True):
        from ..plugins import cuda_driver as cd

        cd.context(engine.device)  # and so is each runner
        self.plan = plan_io(engine.tensors, batch)
        self.batch, self.engine = batch, engine
        self.context = engine.engine.create_execution_context()
        if self.context is None:
            raise TrtfuseError("TensorRT could not create an execution context (out of device memory?)")
        x = self.plan.input
        if not self.context.set_input_shape(x.name, self.plan.input_shape):
            raise TrtfuseError(f"TensorRT refused input shape {list(self.plan.input_shape)} for {x.name!r}")
        self.input_shape = self.plan.input_shape
        self.shapes = {x.name: self.input_shape}
        self.dtypes = {x.name: np.float32}
        for t in self.plan.outputs:
            self.shapes[t.name] = resolved_shape(t.name, self.context.get_tensor_shape(t.name))
            self.dtypes[t.name] = NUMPY_DTYPES[t.dtype]
        self.buffers = {n: cd.DeviceBuffer(int(np.prod(s)) * np.dtype(self.dtypes[n]).itemsize) for n, s in self.shapes.items()}
        for name, buf in self.buffers.items():
            if not self.context.set_tensor_address(name, buf.ptr):
                raise TrtfuseError(f"TensorRT refused the address of {name!r}")
        self.output_name = self.plan.outputs[0].name
        self.top1 = None
        self._top1_launch = self._plan_top1()
        self.stream = cd.Stream()
        self.graph_exec = None
        if use_graph:
            self._capture()

    @property
    def input_ptr(self) -> int:
        return self.buffers[self.plan.input.name].ptr

    def _plan_top1(self):
        """The argmax launch over the output's rows, or None (and no top-1) where logits_classes says no."""
        from ..plugins import cuda_driver as cd
        from ..plugins import network_ops

        dtype = np.dtype(self.dtypes[self.output_name]).name
        classes = logits_classes(self.shapes[self.output_name], dtype, self.batch)
        if classes is None:
            return None
        self.top1 = cd.DeviceBuffer(4 * self.batch)
        logits, top1 = self.buffers[self.output_name].ptr, self.top1.ptr
        return lambda stream: network_ops.argmax_rows(logits, self.batch, classes, top1, dtype, stream=stream)

    def _execute(self) -> None:
        if not self.context.execute_async_v3(int(self.stream.handle)):
            raise RuntimeError("TensorRT execute_async_v3 failed (see TensorRT's messages)")
        if self._top1_launch is not None:
            self._top1_launch(self.stream.handle)

    def _capture(self) -> None:
        from ..plugins import cuda_driver as cd

        # The run outside the capture matters here too: TensorRT does its deferred, shape-dependent work in
        # the first enqueue after set_input_shape, and our plugins load their kernel modules there.
        self.graph_exec = cd.capture_graph(self.stream.handle, lambda _stream: self._execute(), thread_local=True)

    def launch(self) -> None:
        """The forward on the runner's stream over whatever the input buffer holds (asynchronous)."""
        from ..plugins import cuda_driver as cd

        if self.graph_exec is not None:
            cd.launch_graph(self.graph_exec, self.stream.handle)
        else:
            self._execute()

    def load_input(self, images: np.ndarray) -> None:
        if tuple(images.shape) != self.input_shape:
            raise TrtfuseError(f"--backend trt: expected input {list(self.input_shape)}, got {list(images.shape)}")
        self.buffers[self.plan.input.name].upload(np.ascontiguousarray(images, dtype=np.float32))

    def fetch(self, name: str) -> np.ndarray:
        """An output of the last run, copied on this runner's stream (see DeviceBuffer.download)."""
        return self.buffers[name].download(self.shapes[name], self.dtypes[name], self.stream.handle)

    def run(self, images: np.ndarray) -> np.ndarray:
        self.load_input(images)
        self.launch()
        return self.fetch(self.output_name)
