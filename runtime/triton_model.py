"""The model that Triton's Python backend runs for `trtfuse serve` (and `export-triton --backend cuda|onnxruntime`).

A repository's `1/model.py` only puts trtfuse's environment on the import path and imports `TritonPythonModel`
from here; Triton then calls initialize / execute / finalize in a stub process per model instance. The dynamic
batcher hands `execute` several requests at once: their images are concatenated, run as one batch by the
backend's executor, and split back, each request answered with its rows of the logits and their top-1
(int32). A failing batch answers each of its requests with the error (the server goes on serving).

Executors (also usable without Triton, as the tests do):
  * onnxruntime: an InferenceSession on the CPU; a static-batch model runs in chunks of its batch (the last
    padded with repeats);
  * cuda: `streams` CudaRunners (trtfuse's kernels, a `--fuse all` model) on the instance's GPU, each a CUDA
    graph on its own stream; a batch is cut into chunks of at most max_batch / streams images, one chunk per
    runner, all launched before the first is waited for;
  * trt: the same over TrtRunners of an engine (TensorRT runtime, trtfuse's plugins registered).

A request's images arrive in host memory (sent in the request) or, when the client placed them in CUDA shared
memory and the model allows GPU inputs (FORCE_CPU_ONLY_INPUT_TENSORS "no"), on the instance's GPU: those are
read in place through DLPack (`DeviceImages`), quantized by the runner's own input kernel straight from there,
never copied to the host. Only the outputs a request asks for are computed into its response: a client asking
for `top1` alone gets 4 bytes per image back, not the logits.
"""

from __future__ import annotations

import ctypes
import json
import math

import numpy as np

from ..errors import TrtfuseError

TOP1_OUTPUT = "top1"
_USED_DLTENSOR = b"used_dltensor"  # a capsule name must outlive the capsule: a module constant


class OrtExecutor:
    def __init__(self, model_file: str, threads: int = 0):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # No busy-waiting between ops: a server shares its cores with other instances and processes, where
        # onnxruntime's spinning threads take the CPU from them (and from the requests queued behind).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        if threads:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(model_file, opts, providers=["CPUExecutionProvider"])
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.static_batch = inp.shape[0] if isinstance(inp.shape[0], int) else None

    def __call__(self, images: np.ndarray) -> np.ndarray:
        b = self.static_batch
        if b is None:
            return self.session.run(None, {self.input_name: images})[0]
        out = []
        for start in range(0, len(images), b):
            chunk = images[start : start + b]
            n = len(chunk)
            if n < b:
                chunk = np.concatenate([chunk, np.repeat(chunk[:1], b - n, axis=0)])
            out.append(self.session.run(None, {self.input_name: chunk})[0][:n])
        return np.concatenate(out)

    def close(self) -> None:
        self.session = None


class DeviceImages:
    """fp32 images [n, ...] already in GPU memory, `sample_bytes` apart from `ptr` (a request's input in CUDA
    shared memory); `keep` holds whatever owns the memory until the batch is done."""

    def __init__(self, ptr: int, n: int, sample_bytes: int, keep=None):
        self.ptr, self.n, self.sample_bytes, self.keep = ptr, n, sample_bytes, keep

    def __len__(self) -> int:
        return self.n


class GpuExecutor:
    """`streams` runners of `chunk` images each (make_runner(chunk)); a batch of n images is cut into
    ceil(n / chunk) chunks dealt to the runners in turn, every chunk launched before any is waited for.

    Images come as numpy arrays (one or a list: concatenated, uploaded, the last chunk padded with repeats) or as
    a list of DeviceImages on the GPU, one per request, read in place: their images are packed into chunks as
    host images are (a chunk may hold several requests' images), each request's images quantized straight into
    their rows of the runner's int8 input by a runner with `quantized_input`, or copied there by others.
    A call returns (logits [n, classes] or None when not wanted, top-1 int32 [n])."""

    def __init__(self, make_runner, max_batch: int, streams: int, device: int | None = None):
        self.device = device
        self.chunk = max(1, math.ceil(max_batch / max(1, streams)))
        self.runners = [make_runner(self.chunk) for _ in range(max(1, streams))]
        self._staging: dict[int, object] = {}  # runner index -> fp32 device buffer for host images

    def _device_chunks(self, parts: list[DeviceImages]):
        """Chunks of `chunk` images (the last one shorter), each a list of (part, first image, images, row)."""
        chunk, filled = [], 0
        for part in parts:
            start = 0
            while start < len(part):
                n = min(len(part) - start, self.chunk - filled)
                chunk.append((part, start, n, filled))
                start, filled = start + n, filled + n
                if filled == self.chunk:
                    yield chunk
                    chunk, filled = [], 0
        if chunk:
            yield chunk

    def _feed_device(self, runner, segments) -> int:
        from ..plugins import cuda_driver as cd

        for part, start, n, row in segments:
            src = part.ptr + start * part.sample_bytes
            if getattr(runner, "quantized_input", False):
                runner.quantize_images(src, n, runner.input_ptr + row * runner.input_sample_bytes, runner.stream.handle)
            else:
                cd.copy_device(runner.input_ptr + row * part.sample_bytes, src, n * part.sample_bytes, runner.stream.handle)
        return sum(seg[2] for seg in segments)

    def _feed_host(self, k: int, runner, images: np.ndarray) -> int:
        from ..plugins import cuda_driver as cd

        n = len(images)
        if n < self.chunk:
            images = np.concatenate([images, np.repeat(images[:1], self.chunk - n, axis=0)])
        images = np.ascontiguousarray(images, dtype=np.float32)
        if not getattr(runner, "quantized_input", False):
            runner.load_input(images)
            return n
        if k not in self._staging:
            self._staging[k] = cd.DeviceBuffer(images.nbytes)
        self._staging[k].upload(images)
        runner.quantize_images(self._staging[k].ptr, self.chunk, runner.input_ptr, runner.stream.handle)
        return n

    def __call__(self, images, want_logits: bool = True):
        if self.device is not None:  # this thread's current context: the instance's GPU, whichever thread calls
            from ..plugins import cuda_driver as cd

            cd.context(self.device)
        parts = images if isinstance(images, list) else [images]
        on_device = all(isinstance(p, DeviceImages) for p in parts)
        if on_device:
            feeds = [(lambda k, r, segs=segs: self._feed_device(r, segs)) for segs in self._device_chunks(parts)]
        else:
            shape = next(p.shape[1:] for p in parts if not isinstance(p, DeviceImages))
            host = np.concatenate([self._to_host(p, shape) for p in parts]) if len(parts) > 1 else np.asarray(parts[0])
            feeds = [(lambda k, r, x=host[s : s + self.chunk]: self._feed_host(k, r, x))
                     for s in range(0, len(host), self.chunk)]
        logits, top1 = [], []
        for first in range(0, len(feeds), len(self.runners)):
            group = []
            for k, (runner, feed) in enumerate(zip(self.runners, feeds[first : first + len(self.runners)])):
                n = feed(k, runner)
                runner.launch()
                readout = self._top1_readout(runner)
                if readout is not None:  # the top-1 copy queued behind the forward: one wait per runner
                    runner.copy_top1(readout)
                group.append((k, runner, n, readout))
            for k, runner, n, readout in group:
                runner.stream.synchronize()
                rows = None
                if want_logits or readout is None:
                    rows = np.asarray(runner.fetch(runner.output_name), dtype=np.float32).reshape(self.chunk, -1)[:n]
                logits.append(rows)
                top1.append(np.array(readout[:n]) if readout is not None else np.argmax(rows, axis=1).astype(np.int32))
        return (np.concatenate(logits) if want_logits else None), np.concatenate(top1)

    @staticmethod
    def _top1_readout(runner):
        """The runner's pinned int32 [chunk] top-1 array, or None for a runner without a top-1."""
        if getattr(runner, "top1", None) is None or not hasattr(runner, "top1_host"):
            return None
        return runner.top1_host()

    @staticmethod
    def _to_host(part, shape) -> np.ndarray:
        """Host images as they are; a request's GPU images (batched with host ones) copied to the host."""
        if not isinstance(part, DeviceImages):
            return np.asarray(part)
        from ..plugins import cuda_driver as cd

        out = np.empty((part.n, *shape), np.float32)
        if out.nbytes != part.n * part.sample_bytes:
            raise TrtfuseError(f"a request's GPU images are {part.sample_bytes} bytes each, the others {out[0].nbytes}")
        cd.check(cd._driver().cuMemcpyDtoH(out.ctypes.data, part.ptr, out.nbytes))
        return out

    def close(self) -> None:
        self.runners = []
        self._staging = {}


def make_executor(backend: str, model_file: str, max_batch: int, device: int = 0, streams: int = 2, threads: int = 0):
    if backend == "onnxruntime":
        return OrtExecutor(model_file, threads)
    from ..plugins import cuda_driver as cd

    cd.context(device)
    if backend == "cuda":
        from ..io import load_model
        from .gpu_runner import CudaRunner

        model = load_model(model_file)

        def runner(batch: int):
            # quantized_input: the runner's graph starts after its input quantize, which _feed runs on the images
            # wherever they are (one pass over GPU-resident images, no copy); a model whose input does not feed one
            # QuantizeLinear runs the graph from the fp32 input
            try:
                return CudaRunner(model, batch, quantized_input=True)
            except TrtfuseError:
                return CudaRunner(model, batch)

        return GpuExecutor(runner, max_batch, streams, device)
    if backend == "trt":
        from .trt_runner import TrtEngine, TrtRunner

        engine = TrtEngine(model_file, device)
        return GpuExecutor(lambda b: TrtRunner(engine, b), max_batch, streams, device)
    raise ValueError(f"unknown backend {backend!r}")


class _LegacyDLPack:
    """An array as the stub's from_dlpack reads it: an unversioned "dltensor" capsule (numpy 2 offers the
    versioned kind to callers that pass max_version, which the stub's reader does not take)."""

    def __init__(self, array: np.ndarray):
        self.array, self.capsule = array, None

    def __dlpack__(self, *args, **kwargs):
        self.capsule = self.array.__dlpack__()
        return self.capsule

    def consumed(self) -> None:
        """Name the capsule as DLPack's consumers do once they own the tensor, so numpy's capsule destructor
        leaves it to the stub (the stub names it otherwise, and numpy then reports an error per tensor)."""
        import ctypes

        if self.capsule is not None:
            set_name = ctypes.pythonapi.PyCapsule_SetName
            set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
            set_name(self.capsule, _USED_DLTENSOR)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def _tensor(pb_utils, name: str, array: np.ndarray):
    """A pb_utils.Tensor through DLPack: the stub's numpy path (pybind11 built against numpy 1) reads numpy 2
    arrays as empty."""
    source = _LegacyDLPack(np.ascontiguousarray(array))
    tensor = pb_utils.Tensor.from_dlpack(name, source)
    source.consumed()
    return tensor


def _array(tensor) -> np.ndarray:
    return np.from_dlpack(tensor)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DL_CUDA, _DL_FLOAT = 2, 2


def device_images(capsule, device: int) -> DeviceImages:
    """A GPU tensor's DLPack capsule (pb_utils.Tensor.to_dlpack) as DeviceImages, read in place. The capsule is
    not consumed: it stays in `keep`, and its own destructor returns the tensor when the batch is done."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))  # DLManagedTensor starts with its DLTensor
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.device.device_type != _DL_CUDA or t.device.device_id != device:
        raise TrtfuseError(f"input on device type {t.device.device_type} #{t.device.device_id}, not this instance's GPU {device}")
    if (t.dtype.code, t.dtype.bits, t.dtype.lanes) != (_DL_FLOAT, 32, 1) or t.ndim < 2:
        raise TrtfuseError(f"GPU input must be fp32 [n, ...], got DLPack type {t.dtype.code}/{t.dtype.bits} shape {shape}")
    sample = int(np.prod(shape[1:]))
    if t.strides:  # C-contiguous rows only
        want = [int(np.prod(shape[i + 1 :])) for i in range(t.ndim)]
        if [t.strides[i] for i in range(t.ndim)] != want:
            raise TrtfuseError("GPU input must be C-contiguous")
    return DeviceImages(int(t.data or 0) + int(t.byte_offset), shape[0], 4 * sample, keep=capsule)


class TritonPythonModel:
    """Triton's Python backend interface (one object per model instance, in its own stub process)."""

    def initialize(self, args):
        import os

        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.input_name = config["input"][0]["name"]
        self.logits_name = next(o["name"] for o in config["output"] if o["name"] != TOP1_OUTPUT)
        kind = args.get("model_instance_kind", "CPU")
        device = int(args.get("model_instance_device_id", 0)) if kind == "GPU" else 0
        model_file = os.path.join(args["model_repository"], args["model_version"], params["model_file"])
        self.device = device
        self.executor = make_executor(params["backend"], model_file, int(config.get("max_batch_size", 1)) or 1,
                                      device=device, streams=int(params.get("streams", "2") or 2),
                                      threads=int(params.get("threads", "0") or 0))
        self.gpu_executor = isinstance(self.executor, GpuExecutor)

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        try:
            parts = [self._images(pb_utils.get_input_tensor_by_name(r, self.input_name)) for r in requests]
            wanted = [set(r.requested_output_names() or ()) for r in requests]  # empty: every output
            want_logits = any(not w or self.logits_name in w for w in wanted)
            if self.gpu_executor:
                logits, top1 = self.executor(parts, want_logits=want_logits)
            else:
                host = [np.asarray(p, dtype=np.float32) for p in parts]
                logits = np.asarray(self.executor(host[0] if len(host) == 1 else np.concatenate(host)), dtype=np.float32)
                logits = logits.reshape(sum(len(p) for p in parts), -1)
                top1 = np.argmax(logits, axis=1).astype(np.int32)
            top1 = top1.reshape(-1, 1)
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error; the server goes on
            msg = f"trtfuse: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(msg)) for _ in requests]
        responses, start = [], 0
        for part, w in zip(parts, wanted):
            n = len(part)
            outputs = []
            if not w or self.logits_name in w:
                outputs.append(_tensor(pb_utils, self.logits_name, logits[start : start + n]))
            if not w or TOP1_OUTPUT in w:
                outputs.append(_tensor(pb_utils, TOP1_OUTPUT, top1[start : start + n]))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            start += n
        return responses

    def _images(self, tensor):
        """A request's images: on the GPU (CUDA shared memory, GPU inputs allowed) read in place, else a host array."""
        if self.gpu_executor and not tensor.is_cpu():
            return device_images(tensor.to_dlpack(), self.device)
        return _array(tensor)

    def finalize(self):
        if getattr(self, "executor", None) is not None:
            self.executor.close()
            self.executor = None
