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
"""

from __future__ import annotations

import json
import math

import numpy as np

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


class GpuExecutor:
    """`streams` runners of `chunk` images each (make_runner(chunk)); a batch of n images is cut into
    ceil(n / chunk) chunks dealt to the runners in turn, every chunk launched before any is waited for."""

    def __init__(self, make_runner, max_batch: int, streams: int, device: int | None = None):
        self.device = device
        self.chunk = max(1, math.ceil(max_batch / max(1, streams)))
        self.runners = [make_runner(self.chunk) for _ in range(max(1, streams))]

    def __call__(self, images: np.ndarray) -> np.ndarray:
        if self.device is not None:  # this thread's current context: the instance's GPU, whichever thread calls
            from ..plugins import cuda_driver as cd

            cd.context(self.device)
        out = []
        for start in range(0, len(images), self.chunk * len(self.runners)):
            group = []
            for k, runner in enumerate(self.runners):
                chunk = images[start + k * self.chunk : start + (k + 1) * self.chunk]
                if not len(chunk):
                    break
                n = len(chunk)
                if n < self.chunk:
                    chunk = np.concatenate([chunk, np.repeat(chunk[:1], self.chunk - n, axis=0)])
                runner.load_input(np.ascontiguousarray(chunk, dtype=np.float32))
                runner.launch()
                group.append((runner, n))
            for runner, n in group:
                runner.stream.synchronize()
                out.append(np.asarray(runner.fetch(runner.output_name), dtype=np.float32).reshape(self.chunk, -1)[:n])
        return np.concatenate(out)

    def close(self) -> None:
        self.runners = []


def make_executor(backend: str, model_file: str, max_batch: int, device: int = 0, streams: int = 2, threads: int = 0):
    if backend == "onnxruntime":
        return OrtExecutor(model_file, threads)
    from ..plugins import cuda_driver as cd

    cd.context(device)
    if backend == "cuda":
        from ..io import load_model
        from .gpu_runner import CudaRunner

        model = load_model(model_file)
        return GpuExecutor(lambda b: CudaRunner(model, b), max_batch, streams, device)
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
        self.executor = make_executor(params["backend"], model_file, int(config.get("max_batch_size", 1)) or 1,
                                      device=device, streams=int(params.get("streams", "2") or 2),
                                      threads=int(params.get("threads", "0") or 0))

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        try:
            arrays = [_array(pb_utils.get_input_tensor_by_name(r, self.input_name)) for r in requests]
            images = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            logits = np.asarray(self.executor(np.ascontiguousarray(images, dtype=np.float32)), dtype=np.float32)
            logits = logits.reshape(len(images), -1)
            top1 = np.argmax(logits, axis=1).astype(np.int32).reshape(-1, 1)
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error; the server goes on
            msg = f"trtfuse: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(msg)) for _ in requests]
        responses, start = [], 0
        for a in arrays:
            n = len(a)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                _tensor(pb_utils, self.logits_name, logits[start : start + n]),
                _tensor(pb_utils, TOP1_OUTPUT, top1[start : start + n])]))
            start += n
        return responses

    def finalize(self):
        if getattr(self, "executor", None) is not None:
            self.executor.close()
            self.executor = None
