"""`trtfuse offline`: an MLPerf-style Offline run on MLPerf LoadGen (`mlcommons-loadgen`).

The query sample library preprocesses its samples once (MLPerf ResNet-50 preprocessing, trtfuse.calib.data)
and, for GPU backends, keeps them on the device, as NVIDIA's harness does. The system under test takes
LoadGen's one Offline query, cuts it into batches, and runs them on one worker per GPU, each with two
runners (two CUDA graphs in flight). Responses are the top-1 class as int32, as in MLPerf's ResNet-50
benchmark, so LoadGen's accuracy log can be scored. LoadGen's own logs are kept in --log-dir.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from pathlib import Path

import numpy as np

from ..errors import TrtfuseError

BACKENDS = ("cuda", "onnxruntime", "trt")


def _loadgen():
    try:
        import mlperf_loadgen as lg
    except ImportError:
        raise TrtfuseError("MLPerf LoadGen is not installed: pip install 'trtfuse[offline]' (mlcommons-loadgen)") from None
    return lg


def load_samples(spec: str, count: int, size: int = 224, model=None):
    """(images [count, 3, size, size] float32, labels or None): labels only where they are classes of `model`
    (`trtfuse.calib.data.labels_apply_to`; with no model, whatever labels the data carries)."""
    if spec == "synthetic":
        rng = np.random.default_rng(0)
        return rng.normal(size=(count, 3, size, size)).astype(np.float32), None
    from ..calib.data import labels_apply_to, load_data

    data = load_data(spec, count, size, split="heldout")
    labels = data.labels if model is None or labels_apply_to(data, model) else None
    return data.all().astype(np.float32), labels


class _Worker:
    """A thread draining a queue of (sample indices, response ids, done); a failure is kept, reported after
    the run, and the failed batch's queries are still completed so LoadGen never waits forever."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._guarded, daemon=True)

    def _guarded(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - re-raised by run_offline
            self.error = exc
            while True:
                job = self.jobs.get()
                if job is None:
                    break
                job[2](job[1], None)


class _GpuWorker(_Worker):
    """One GPU: two runners (streams) fed by a queue of (sample indices, response ids). A runner is a
    gpu_runner.CudaRunner (--backend cuda) or a trt_runner.TrtRunner (--backend trt): input_ptr, stream,
    launch(), fetch(), output_name."""

    def __init__(self, make_runner, batch: int, samples: np.ndarray, device: int, streams: int = 2):
        from ..plugins import cuda_driver as cd

        self.device, self.batch = device, batch
        cd.context(device)
        self.samples = cd.DeviceBuffer.from_array(samples)  # preprocessed once, kept on the GPU
        self.sample_bytes = samples[0].nbytes
        self.runners = [make_runner() for _ in range(streams)]
        self.index_bufs = [cd.DeviceBuffer(8 * batch) for _ in range(streams)]
        super().__init__()
        self.thread.start()

    def _loop(self) -> None:
        from ..plugins import cuda_driver as cd
        from ..plugins import network_ops

        drv = cd._driver()
        cd.check(drv.cuCtxSetCurrent(cd.context(self.device)))
        pending = []  # (runner, ids, n) launched, not yet read back
        turn = 0
        while True:
            job = self.jobs.get()
            if job is None:
                break
            indices, ids, done = job
            slot_of_runner = turn % len(self.runners)
            runner = self.runners[slot_of_runner]
            turn += 1
            if len(pending) == len(self.runners):
                self._finish(*pending.pop(0))
            # gather this batch's device-resident samples with one kernel
            index = np.ascontiguousarray(indices, dtype=np.int64)
            ibuf = self.index_bufs[slot_of_runner]
            cd.check(drv.cuMemcpyHtoDAsync(ibuf.ptr, index.ctypes.data, index.nbytes, runner.stream.handle))
            network_ops.gather_rows(self.samples.ptr, ibuf.ptr, self.sample_bytes, len(index), runner.input_ptr,
                                    stream=runner.stream.handle)
            runner.launch()
            pending.append((runner, ids, len(ids), done))
            if self.jobs.empty():
                while pending:
                    self._finish(*pending.pop(0))

    def _finish(self, runner, ids, n, done) -> None:
        logits = runner.fetch(runner.output_name)[:n]
        done(ids, np.argmax(logits, axis=1).astype(np.int32))


class _OrtWorker(_Worker):
    def __init__(self, model_path: str, batch: int, samples: np.ndarray):
        import onnxruntime as ort

        self.session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name
        self.samples, self.batch = samples, batch
        super().__init__()
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                break
            indices, ids, done = job
            logits = self.session.run(None, {self.name: self.samples[indices]})[0]
            done(ids, np.argmax(logits, axis=1).astype(np.int32))


def run_offline(model_path: str, backend: str, data: str, count: int, batch: int, gpus: str, mode: str,
                log_dir: str, expected_qps: float, min_duration_s: float, progress_cb=None, autotune: bool = False) -> dict:
    lg = _loadgen()
    if backend == "trt":  # --model is a serialized engine (`trtfuse build`)
        from .trt_runner import TrtEngine, plan_io

        engines = {0: TrtEngine(model_path, 0)}
        plan_io(engines[0].tensors, batch)  # refuse a batch the engine cannot run before loading samples
        dims = engines[0].input_dims
    else:
        from ..graph_passes.scales import model_input_spec
        from ..io import load_model

        model = load_model(model_path)
        _, dims = model_input_spec(model)
    if len(dims) != 4 or dims[2] is None or dims[2] != dims[3]:
        raise TrtfuseError(f"{model_path}: need a square static-size NCHW image input, got {dims}")
    images, labels = load_samples(data, count, size=int(dims[2]), model=model)
    count = len(images)
    if backend in ("cuda", "trt"):
        from ..plugins import cuda_driver as cd

        ok, why = cd.gpu_available()
        if not ok:
            raise TrtfuseError(f"--backend {backend} needs an NVIDIA GPU: {why}")
        available = cd.check(cd._driver().cuDeviceGetCount())
        n_gpus = available if gpus == "all" else int(gpus)
        if not 1 <= n_gpus <= available:
            raise TrtfuseError(f"--gpus {gpus}: this machine has {available} GPU(s)")
        if backend == "cuda":
            from .gpu_runner import CudaRunner

            def maker():  # a GPU's first runner plans (or autotunes); its other runners reuse those plans
                first = []

                def make():
                    runner = CudaRunner(model, batch, autotune=autotune and not first, plans_from=first[0] if first else None)
                    first.append(runner)
                    return runner
                return make

            makers = [maker() for _ in range(n_gpus)]
        else:
            from .trt_runner import TrtEngine, TrtRunner

            for d in range(1, n_gpus):
                engines[d] = TrtEngine(model_path, d)
            makers = [lambda e=engines[d]: TrtRunner(e, batch) for d in range(n_gpus)]
        workers = [_GpuWorker(makers[d], batch, images, d) for d in range(n_gpus)]
    else:
        n_gpus = 0
        workers = [_OrtWorker(model_path, batch, images)]

    lock = threading.Lock()
    completed = [0]

    def done(ids, top1):
        if top1 is None:  # the worker failed: complete the queries empty, report the error afterwards
            lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0) for qid in ids])
            return
        # One int32 array per batch, each response pointing at its element (LoadGen copies the bytes
        # inside QuerySamplesComplete, so the array only has to outlive the call).
        top1 = np.ascontiguousarray(top1, dtype=np.int32)
        base = top1.ctypes.data
        lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, base + 4 * i, 4) for i, qid in enumerate(ids)])
        with lock:
            completed[0] += len(ids)
            if progress_cb:
                progress_cb(len(ids))

    def issue_queries(query_samples):
        # Offline hands over every query at once (hundreds of thousands): queue each batch as soon as it
        # is cut, so the GPUs start on the first while the rest are still being sliced.
        for k, start in enumerate(range(0, len(query_samples), batch)):
            chunk = query_samples[start : start + batch]
            idx = np.fromiter((q.index for q in chunk), np.int64, len(chunk))
            if backend in ("cuda", "trt") and len(idx) < batch:  # a static-shape graph: pad the last batch with repeats
                idx = np.concatenate([idx, np.repeat(idx[:1], batch - len(idx))])
            workers[k % len(workers)].jobs.put((idx, [q.id for q in chunk], done))

    def flush_queries():
        pass

    sut = lg.ConstructSUT(issue_queries, flush_queries)
    qsl = lg.ConstructQSL(count, count, lambda s: None, lambda s: None)
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Offline
    settings.mode = lg.TestMode.AccuracyOnly if mode == "accuracy" else lg.TestMode.PerformanceOnly
    settings.offline_expected_qps = expected_qps
    settings.min_duration_ms = int(min_duration_s * 1000)
    settings.min_query_count = 1
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(log_dir)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False
    start = time.perf_counter()
    lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    wall = time.perf_counter() - start
    for w in workers:
        w.jobs.put(None)
    for w in workers:
        w.thread.join(timeout=60)
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    failed = [w.error for w in workers if w.error is not None]
    if failed:
        raise TrtfuseError(f"the {backend} worker failed: {type(failed[0]).__name__}: {str(failed[0]).splitlines()[0] if str(failed[0]) else ''}")

    summary = parse_summary(Path(log_dir) / "mlperf_log_summary.txt")
    out = {"backend": backend, "model": model_path, "data": data, "count": count, "batch": batch, "gpus": n_gpus,
           "mode": mode, "samples_completed": completed[0], "wall_seconds": wall,
           "samples_per_s": summary.get("Samples per second"), "loadgen_summary": summary, "log_dir": str(log_dir)}
    if mode == "accuracy":
        out.update(score_accuracy(Path(log_dir) / "mlperf_log_accuracy.json", labels))
    return out


def parse_summary(path: Path) -> dict:
    """LoadGen's mlperf_log_summary.txt 'Key : value' lines, numbers as numbers."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*([^:=]+?)\s*:\s*(.+?)\s*$", line)
        if m:
            key, val = m.groups()
            try:
                out[key] = float(val) if "." in val or "e" in val.lower() else int(val)
            except ValueError:
                out[key] = val
    return out


def score_accuracy(path: Path, labels) -> dict:
    import json

    if not path.exists():
        return {}
    entries = json.loads(path.read_text() or "[]")
    preds = {e["qsl_idx"]: int.from_bytes(bytes.fromhex(e["data"]), "little", signed=True) for e in entries}
    out = {"accuracy_responses": len(preds)}
    if labels is not None and preds:
        idx = np.array(sorted(preds))
        out["top1_accuracy"] = float(np.mean(np.array([preds[i] for i in idx]) == np.asarray(labels)[idx]))
    return out
