"""`trtfuse offline`: an MLPerf-style Offline run on MLPerf LoadGen (`mlcommons-loadgen`).

The query sample library preprocesses its samples once (MLPerf ResNet-50 preprocessing, trtfuse.calib.data)
and, for GPU backends, keeps them on the device, as NVIDIA's harness does. The system under test takes
LoadGen's one Offline query, cuts it into batches as it goes (the last one padded with repeats: the graphs
have a static batch) and deals them round-robin to one worker per GPU.

A GPU worker (`_GpuWorker`) is a three-thread pipeline over `--streams` runners (default 6), each a CUDA graph
on its own stream (runtime/gpu_runner.CudaRunner, or runtime/trt_runner.TrtRunner for --backend trt) whose
forward ends with the top-1 of each image on the device (plugins/network_ops.argmax_rows):
  * the launcher thread takes the next batch and a free runner and enqueues on that runner's stream the
    batch's sample indices (from pinned memory), the gather of those samples into the runner's input, the
    forward, the copy of the batch's int32 top-1 into the runner's pinned array and an event; it hands the
    runner to
  * the completion thread, which waits for the event, copies the batch's top-1 out of the pinned array (1 KB),
    frees the runner at once and hands the copy to
  * the responder thread, which answers LoadGen: one call into LoadGen's C++ QuerySamplesComplete per batch with an
    array of responses, each pointing at its sample's 4 bytes (runtime/loadgen_answers.py; --answers objects, or a
    LoadGen module where that call cannot be found: a QuerySampleResponse object per sample).
The query itself is read where LoadGen holds it, its sample array viewed in place through a SUT of LoadGen's C++
interface (runtime/loadgen_query.py; --answers lists and objects, or a LoadGen module whose layout is not the one
checked: the Python binding's two lists of ints, converted after LoadGen's clock has started).
Neither the launcher nor the next batch's wait waits on response work (LoadGen's per-sample bookkeeping
takes longer than the copy): a runner is back in the launcher's hands as soon as its GPU work is done, and
the launcher blocks only while every runner is in flight. Responses are
the top-1 class as int32, as in MLPerf's ResNet-50 benchmark, so LoadGen's accuracy log can be scored.
A failure in either thread is kept and reported after the run; the failed batch's queries and every later
batch's are still completed (empty), so LoadGen never waits forever. LoadGen's own logs are kept in --log-dir.
"""

from __future__ import annotations

import collections
import gc
import math
import queue
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ..args import ANSWER_PATHS  # how batches are answered to LoadGen: see run_loadgen
from ..errors import TrtfuseError
from .loadgen_answers import native_answerer
from .loadgen_query import native_sut

BACKENDS = ("cuda", "onnxruntime", "trt")
GIL_SWITCH_INTERVAL_S = 0.0005  # during a LoadGen run (Python's default: 0.005)
DEFAULT_STREAMS = 6  # H200: 4 -> 6 in flight closed LoadGen's last 1.5% to the pipeline fed directly


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
        from ..calib.data import check_fits_in_memory

        check_fits_in_memory(2 * count, size)  # drawn as float64, then converted
        rng = np.random.default_rng(0)
        return rng.normal(size=(count, 3, size, size)).astype(np.float32), None
    from ..calib.data import labels_apply_to, load_data

    data = load_data(spec, count, size, split="heldout")
    labels = data.labels if model is None or labels_apply_to(data, model) else None
    return data.all().astype(np.float32), labels


class JobFeed:
    """The GPU workers' shared queue of jobs: put() one job (or None, which ends one worker), put_batches() an
    iterator of jobs cut only as workers take them. An Offline query's batches are cut as the GPUs ask for them, a
    few a millisecond, instead of all up front: cutting 22 million samples holds the GIL for seconds, which slowed the
    first tenth of a 4-GPU run to two thirds of its steady rate while the launchers waited for the interpreter."""

    def __init__(self):
        self._ready = threading.Condition()
        self._sources: collections.deque = collections.deque()  # iterators of jobs, taken from in order

    def put(self, job) -> None:
        self.put_batches(iter((job,)))

    def put_batches(self, jobs) -> None:
        with self._ready:
            self._sources.append(iter(jobs))
            self._ready.notify_all()

    def get(self):
        with self._ready:
            while True:
                while self._sources:
                    try:
                        return next(self._sources[0])
                    except StopIteration:
                        self._sources.popleft()
                self._ready.wait()


class _Worker:
    """Drains `jobs`, a queue of (sample indices, response ids, done) ended by None, calling
    done(ids, top1 int32 array) per batch, or done(ids, None) for a batch that failed (or came after a
    failure). The first failure is kept in `error` and re-raised by run_offline after the run. Workers given one
    `jobs` queue share it: each takes the next batch when it can start it, so a slower GPU takes fewer batches
    instead of finishing its share last."""

    def __init__(self, threads: list[threading.Thread], jobs: queue.Queue | JobFeed | None = None):
        self.jobs = queue.Queue() if jobs is None else jobs
        self.error: BaseException | None = None
        self._error_lock = threading.Lock()
        self.threads = threads

    def _fail(self, exc: BaseException) -> None:
        with self._error_lock:
            if self.error is None:
                self.error = exc

    def _answer(self, done, ids, top1) -> None:
        """done() must not take a thread down with it: that would leave later queries unanswered."""
        try:
            done(ids, top1)
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            self._fail(exc)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self, timeout: float = 60.0) -> None:
        """No more jobs: let the threads finish what is queued and in flight."""
        close_workers([self], timeout)


def close_workers(workers: list[_Worker], timeout: float = 60.0) -> None:
    """End every worker: one None each into its jobs queue (a shared queue gets one per worker that drains it, each
    taking one), then wait for all their threads."""
    for w in workers:
        w.jobs.put(None)
    for w in workers:
        for t in w.threads:
            t.join(timeout=timeout)


class _RunnerSlot:
    """One runner of a GPU worker and what its batches need besides: the sample indices in pinned memory
    and on the device, the pinned int32 [batch] array its top-1 lands in, the event after that copy.
    `start` and `wait` are the two halves _GpuWorker's threads call."""

    def __init__(self, runner, samples, sample_bytes: int, batch: int):
        from ..plugins import cuda_driver as cd

        if runner.top1_ptr is None:
            raise TrtfuseError(f"trtfuse offline answers with each image's top-1 class: the model's output "
                               f"{runner.output_name!r} is not per-image fp32/fp16 logits [batch, classes]")
        self.runner, self.samples, self.sample_bytes = runner, samples, sample_bytes
        self.indices = cd.PinnedArray(batch, np.int64)
        self.indices_on_device = cd.DeviceBuffer(8 * batch)
        self.indices_on_device.fill(0)  # sample 0, a valid index, until the first batch
        self.top1 = cd.PinnedArray(batch, np.int32)
        self.event = cd.Event()
        # the fused stem reads each image where it lies in the library (no gather copy per batch), where the runner can
        read_in_place = getattr(runner, "read_images_from", None)
        self.reads_in_place = bool(read_in_place and read_in_place(samples.ptr, self.indices_on_device.ptr))

    def start(self, indices: np.ndarray) -> None:
        """Enqueue the batch on the runner's stream, through the top-1 copy and the event (returns at once).
        The pinned arrays are free to overwrite: a slot is started again only after its last wait()."""
        from ..plugins import cuda_driver as cd
        from ..plugins import network_ops

        n = len(indices)
        stream = self.runner.stream.handle
        self.indices.array[:n] = indices
        cd.check(cd._driver().cuMemcpyHtoDAsync(self.indices_on_device.ptr, self.indices.ptr, 8 * n, stream))
        if not self.reads_in_place:
            network_ops.gather_rows(self.samples.ptr, self.indices_on_device.ptr, self.sample_bytes, n,
                                    self.runner.input_ptr, stream=stream)
        self.runner.launch()
        self.runner.copy_top1(self.top1.array)
        self.event.record(stream)

    def wait(self) -> np.ndarray:
        """The started batch's top-1 (the pinned array itself: valid until the slot is started again)."""
        self.event.synchronize()
        return self.top1.array


class _GpuWorker(_Worker):
    """One GPU: a launcher, a completion and a responder thread over `slots` (_RunnerSlot, or anything with
    start(indices) and wait() -> top-1 array). A slot goes back to the free queue once its top-1 is copied
    out, before the batch is answered."""

    def __init__(self, slots: list, thread_setup=None, jobs: queue.Queue | JobFeed | None = None):
        super().__init__([threading.Thread(target=self._launch_loop, name="offline-launch", daemon=True),
                          threading.Thread(target=self._complete_loop, name="offline-complete", daemon=True),
                          threading.Thread(target=self._respond_loop, name="offline-respond", daemon=True)], jobs)
        self.slots = slots
        self._thread_setup = thread_setup or (lambda: None)  # e.g. make the GPU's context current
        self._free: queue.Queue = queue.Queue()
        for slot in slots:
            self._free.put(slot)
        self._in_flight: queue.Queue = queue.Queue()  # (slot, ids, done) in launch order, then None
        self._answers: queue.Queue = queue.Queue()  # (done, ids, top-1 copy or None) in completion order, then None
        self.start()

    def _launch_loop(self) -> None:
        try:
            self._thread_setup()
        except BaseException as exc:  # noqa: BLE001 - every job is then answered empty
            self._fail(exc)
        try:
            while True:
                # a free runner first, then the next batch: a batch is taken only when it can start (from a shared
                # queue, by whichever GPU frees a runner first)
                slot = self._free.get()
                job = self.jobs.get()
                if job is None:
                    self._free.put(slot)
                    return
                indices, ids, done = job
                if self.error is not None:  # this worker failed: answer its batches empty
                    self._free.put(slot)
                    self._answer(done, ids, None)
                    continue
                try:
                    slot.start(indices)
                except BaseException as exc:  # noqa: BLE001
                    self._fail(exc)
                    self._free.put(slot)
                    self._answer(done, ids, None)
                    continue
                self._in_flight.put((slot, ids, done))
        finally:
            self._in_flight.put(None)

    def _complete_loop(self) -> None:
        try:
            self._thread_setup()
        except BaseException as exc:  # noqa: BLE001 - the waits below then fail and answer empty
            self._fail(exc)
        while True:
            item = self._in_flight.get()
            if item is None:
                self._answers.put(None)
                return
            slot, ids, done = item
            try:
                top1 = np.array(slot.wait()[: len(ids)])  # a copy: the slot is reused before the answer
            except BaseException as exc:  # noqa: BLE001
                self._fail(exc)
                top1 = None
            finally:
                self._free.put(slot)
            self._answers.put((done, ids, top1))

    def _respond_loop(self) -> None:
        while True:
            item = self._answers.get()
            if item is None:
                return
            self._answer(*item)


def _device_samples(runner, samples: np.ndarray, batch: int):
    """(device buffer, bytes per sample): the QSL's samples on the GPU in the form the runner's input_ptr
    takes. fp32 images; or, for a runner with quantized_input (--backend cuda), their int8 graph-input form,
    quantized once here by the runner's own input kernel (the same bits its graph would compute), as
    NVIDIA's harness keeps INT8 inputs: a third of the bytes to gather per batch, no quantize per batch."""
    from ..plugins import cuda_driver as cd

    if not getattr(runner, "quantized_input", False):
        return cd.DeviceBuffer.from_array(samples), samples[0].nbytes
    per = runner.input_sample_bytes
    out = cd.DeviceBuffer(per * len(samples))
    chunk = cd.DeviceBuffer(samples[0].nbytes * batch)
    for start in range(0, len(samples), batch):
        part = np.ascontiguousarray(samples[start : start + batch], dtype=np.float32)
        chunk.upload(part)
        runner.quantize_images(chunk.ptr, len(part), out.ptr + start * per, runner.stream.handle)
        runner.stream.synchronize()
    chunk.free()
    return out, per


def runners_needed(mode: str, streams: int, count: int, batch: int) -> int:
    """Runners (CUDA graphs) per GPU: --streams, but in accuracy mode, where LoadGen asks for each of the `count`
    samples once, no more than the run has batches: one more would only take GPU memory (6 runners at batch 4096 do
    not fit in an H200's)."""
    return min(streams, -(-count // batch)) if mode == "accuracy" else streams


def _cuda_worker(make_runner, batch: int, samples: np.ndarray, device: int, streams: int,
                 jobs: JobFeed | None = None) -> _GpuWorker:
    """A _GpuWorker on GPU `device` with `streams` runners from make_runner(), samples put on it once; `jobs`: the
    queue it shares with the other GPUs' workers."""
    from ..plugins import cuda_driver as cd

    ctx = cd.context(device)
    try:
        runners = [make_runner() for _ in range(streams)]
        on_device, sample_bytes = _device_samples(runners[0], samples, batch)  # preprocessed once, kept on the GPU
    except cd.GpuOutOfMemory as exc:
        raise TrtfuseError(f"GPU {device}: {streams} runner(s) at batch {batch} and {len(samples)} samples do not fit "
                           f"in its memory ({exc}): lower --batch, --streams or --count") from None
    slots = [_RunnerSlot(r, on_device, sample_bytes, batch) for r in runners]
    return _GpuWorker(slots, thread_setup=lambda: cd.check(cd._driver().cuCtxSetCurrent(ctx)), jobs=jobs)


class _OrtWorker(_Worker):
    """The CPU worker: onnxruntime for a plain model; trtfuse's golden CPU executor (plugin nodes through
    the reference op, the rest through onnxruntime) for a rewritten int8 model."""

    def __init__(self, model_path: str, batch: int, samples: np.ndarray, model=None):
        from ..io import plugin_ops

        if model is not None and plugin_ops(model):
            from .cpu_executor import CpuExecutor

            executor = CpuExecutor(model)
            self.name = executor.input_names[0]
            output = executor.output_names[0]
            self._run = lambda x: executor.run({self.name: x})[output]
        else:
            import onnxruntime as ort

            session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
            self.name = session.get_inputs()[0].name
            self._run = lambda x: session.run(None, {self.name: x})[0]
        self.samples, self.batch = samples, batch
        self.slots = [None]
        super().__init__([threading.Thread(target=self._loop, name="offline-ort", daemon=True)])
        self.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            indices, ids, done = job
            top1 = None
            if self.error is None:
                try:
                    logits = np.asarray(self._run(self.samples[indices]))
                    top1 = np.argmax(logits.reshape(len(indices), -1), axis=1).astype(np.int32)
                except BaseException as exc:  # noqa: BLE001
                    self._fail(exc)
            self._answer(done, ids, top1)


def drive_workers(workers: list[_Worker], batch: int, count: int, samples: float, seed: int = 2,
                  min_seconds: float = 0.0) -> float:
    """samples/s of `workers` fed batches of random sample indices (of `count`) directly, round-robin, without
    LoadGen: about `samples` samples after a warm-up of two batches per runner slot, more (twice as many each time)
    until the timed part lasts min_seconds. Raises a worker's error."""
    pick = np.random.default_rng(seed)
    lock, finished = threading.Lock(), threading.Event()
    left = [0]

    def done(ids, top1):
        with lock:
            left[0] -= 1
            if left[0] == 0:
                finished.set()

    def run_batches(n: int) -> float:
        left[0] = n
        finished.clear()
        start = time.perf_counter()
        for k in range(n):
            workers[k % len(workers)].jobs.put((pick.integers(0, count, batch), range(batch), done))
        finished.wait()
        return time.perf_counter() - start

    slots = sum(len(getattr(w, "slots", [None])) for w in workers)
    run_batches(2 * slots)
    n = max(4 * slots, math.ceil(samples / batch))
    elapsed = run_batches(n)
    while elapsed < min_seconds:  # a rate over milliseconds is mostly scheduling noise
        n *= 2
        elapsed = run_batches(n)
    failed = [w.error for w in workers if w.error is not None]
    if failed:
        raise failed[0]
    return n * batch / elapsed


DEFAULT_GPU_BATCH, DEFAULT_CPU_BATCH, DEFAULT_GPU_QPS = 256, 8, 30000.0
CPU_QPS_MARGIN = 1.5
# The CPU warm-up that sizes LoadGen's query is timed over at least this long: a small model's few batches take
# milliseconds, where one scheduling pause can halve the rate and the query then ends before min_duration (INVALID).
CPU_WARMUP_S = 0.5


def plan_sharing_makers(device_names: list[str], new_runner, plan_cache: dict) -> list:
    """One runner factory per GPU. The first runner made for a kind of GPU (by name) plans its convs itself
    (new_runner(plans_from=None), which autotunes when asked); every later runner, on that GPU or another of its
    kind, takes those plans (new_runner(plans_from=...)): autotuning takes minutes per GPU and gives one kind of GPU
    the same answers up to timing noise. plan_cache (kind -> plans): given plans (--plans), filled by the first runner of
    each kind otherwise; a cache that outlives the call serves later calls too."""
    from types import SimpleNamespace

    def maker(name: str):
        def make():
            given = plan_cache.get(name)
            runner = new_runner(plans_from=given)
            if given is None:
                # the plans only, no device buffers kept: each conv's launch plan and the stem + max-pool kernel's tile
                plan_cache[name] = SimpleNamespace(plans=list(runner.plans), stem_pool_tile=getattr(runner, "stem_pool_tile", None))
            return runner
        return make

    return [maker(name) for name in device_names]


def option_refusal(backend: str, mode: str, *, autotune: bool = False, plans: str | None = None,
                   check_golden: bool = False, endpoint: bool = False, unfuse=()) -> str | None:
    """Why --plans, --unfuse or --check-golden cannot go with the rest of an offline run's options, or None."""
    if plans and (backend != "cuda" or autotune or endpoint):
        return "--plans gives --backend cuda's runners tuned plans: not with --autotune, --endpoint or another backend"
    if unfuse and (backend != "cuda" or endpoint):
        return "--unfuse turns off fusions of --backend cuda's runners: not with --endpoint or another backend"
    if check_golden and (mode != "accuracy" or endpoint or backend == "trt"):
        return ("--check-golden compares an accuracy run's answers with the CPU golden executor: it needs --mode accuracy "
                "and an ONNX --model (not --endpoint, not a TensorRT engine)")
    return None


def run_offline(model_path: str, backend: str, data: str, count: int, batch: int | None, gpus: str, mode: str,
                log_dir: str, expected_qps: float | None, min_duration_s: float, progress_cb=None, autotune: bool = False,
                streams: int = DEFAULT_STREAMS, compare_pipeline: bool = False, check_golden: bool = False,
                plans: str | None = None, answers: str = "array", unfuse=()) -> dict:
    """batch None: 256 on a GPU; on the CPU the model's static batch, else 8. expected_qps None: 30000 on a
    GPU; on the CPU the rate the worker sustains in a short warm-up (so LoadGen's one query takes about
    min_duration_s, not hours). Runners of one kind of GPU share their plans (plan_sharing_makers).
    check_golden (accuracy mode, an ONNX model): after the run, every sample's answered top-1 against the CPU golden
    executor's on the same sample (golden_agreement). plans: a results file whose tuned plans every GPU runs
    (gpu_runner.load_plans), instead of tuning or the heuristic. unfuse: the GPU runner's fusions to run as the kernels
    they replace (gpu_runner.unfused_options)."""
    _loadgen()
    why = option_refusal(backend, mode, autotune=autotune, plans=plans, check_golden=check_golden, unfuse=unfuse)
    if why:
        raise TrtfuseError(why)
    if backend not in BACKENDS:
        raise TrtfuseError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if streams < 1:
        raise TrtfuseError(f"--streams {streams}: need at least 1 runner per GPU")
    if backend != "onnxruntime" and batch is None:
        batch = DEFAULT_GPU_BATCH
    if backend == "trt":  # --model is a serialized engine (`trtfuse build`)
        from .trt_runner import TrtEngine, plan_io

        engines = {0: TrtEngine(model_path, 0)}
        plan_io(engines[0].tensors, batch)  # refuse a batch the engine cannot run before loading samples
        dims = engines[0].input_dims
        model = None
    else:
        from ..graph_passes.scales import model_input_spec
        from ..io import load_model

        model = load_model(model_path)
        _, dims = model_input_spec(model)
    static_batch = dims[0] if dims and dims[0] else None
    if backend == "onnxruntime":
        if batch is None:
            batch = static_batch or DEFAULT_CPU_BATCH
        elif static_batch and batch != static_batch:
            raise TrtfuseError(f"{model_path} has a static batch of {static_batch}: --batch {batch} cannot feed it "
                               f"(leave --batch out, or give --batch {static_batch})")
    if len(dims) != 4 or dims[2] is None or dims[2] != dims[3]:
        raise TrtfuseError(f"{model_path}: need a square static-size NCHW image input, got {dims}")
    if backend in ("cuda", "trt"):  # before the samples are loaded: minutes of work for nothing otherwise
        from ..plugins import cuda_driver as cd

        ok, why = cd.gpu_available()
        if not ok:
            raise TrtfuseError(f"--backend {backend} needs an NVIDIA GPU: {why}")
    images, labels = load_samples(data, count, size=int(dims[2]), model=model)
    count = len(images)
    streams = runners_needed(mode, streams, count, batch)
    if backend in ("cuda", "trt"):
        available = cd.check(cd._driver().cuDeviceGetCount())
        n_gpus = available if gpus == "all" else int(gpus)
        if not 1 <= n_gpus <= available:
            raise TrtfuseError(f"--gpus {gpus}: this machine has {available} GPU(s)")
        if backend == "cuda":
            from .gpu_runner import CudaRunner, load_plans, unfused_options

            names = [cd.device_name(d) for d in range(n_gpus)]
            given = load_plans(plans, batch) if plans else None
            options = unfused_options(unfuse)
            makers = plan_sharing_makers(
                names,
                lambda plans_from: CudaRunner(model, batch, autotune=autotune and plans_from is None, plans_from=plans_from,
                                              quantized_input=True, **options),
                {name: given for name in names} if given else {})
        else:
            from .trt_runner import TrtEngine, TrtRunner

            for d in range(1, n_gpus):
                engines[d] = TrtEngine(model_path, d)
            makers = [lambda e=engines[d]: TrtRunner(e, batch) for d in range(n_gpus)]
        workers, jobs = [], JobFeed()  # one queue for every GPU: each takes batches as it frees runners
        try:
            for d in range(n_gpus):
                workers.append(_cuda_worker(makers[d], batch, images, d, streams, jobs))
        except BaseException:
            close_workers(workers)
            raise
    else:
        n_gpus = 0
        workers = [_OrtWorker(model_path, batch, images, model)]
        if expected_qps is None:  # a short warm-up: the rate LoadGen should size its one query for
            try:
                # A warm-up rate runs low as often as high; LoadGen adds 10 % and a query that ends before
                # min_duration_s is INVALID, so size it for CPU_QPS_MARGIN x the measured rate.
                expected_qps = CPU_QPS_MARGIN * drive_workers(workers, batch, count, max(4 * batch, 16),
                                                              min_seconds=CPU_WARMUP_S)
            except BaseException:
                close_workers(workers)
                raise
    if expected_qps is None:
        expected_qps = DEFAULT_GPU_QPS

    out = {"backend": backend, "model": model_path, "data": data, "count": count, "batch": batch, "gpus": n_gpus,
           "streams": streams if n_gpus else None, "mode": mode, "expected_qps": expected_qps}
    if backend == "cuda":
        out["plans"] = workers[0].slots[0].runner.plan_names()
        out["plans_tuned_at_batch"] = given.batch if given else None  # --plans: the batch its file was tuned at
        out["unfused"] = list(unfuse)
        # how a batch reaches the first kernel: read in place from the device samples by index, or gathered first
        out["batch_input"] = "in place" if all(s.reads_in_place for w in workers for s in w.slots) else "gathered"
        # a runner's activations as placed by lifetime (gpu_runner share_activations) and as separate buffers, bytes
        out["activation_bytes_per_runner"] = workers[0].slots[0].runner.activation_bytes
    if compare_pipeline:  # the same workers fed directly, no LoadGen: what LoadGen's harness side costs
        try:
            out["pipeline_samples_per_s"] = drive_workers(workers, batch, count, expected_qps * min_duration_s)
        except BaseException:
            close_workers(workers)
            raise
    from .nvml import start_card_monitor

    monitor = start_card_monitor(list(range(n_gpus)))  # the record's `cards`: the clock each card's power cap left
    try:
        out.update(run_loadgen(workers, count, batch, pad_last_batch=n_gpus > 0 or static_batch is not None, mode=mode,
                               log_dir=log_dir, expected_qps=expected_qps, min_duration_s=min_duration_s, labels=labels,
                               progress_cb=progress_cb, what=f"the {backend} worker", answers=answers))
    finally:
        cards = monitor.stop() if monitor is not None else None
    if cards:
        out["cards"] = cards
        # the board's joules an answered sample, every GPU of the run together (none where a counter did not move)
        if out.get("samples_completed") and all(c["joules"] is not None for c in cards):
            out["mj_per_sample"] = 1e3 * sum(c["joules"] for c in cards) / out["samples_completed"]
    if check_golden:
        out.update(golden_agreement(accuracy_log_top1(Path(log_dir) / "mlperf_log_accuracy.json"),
                                    golden_top1(model_path, images)))
    return out


FEED_CHUNK_BATCHES = 8  # batches converted at a time while the GPUs wait on the feed: 4096 samples, a fraction of a ms
SERVER_LATENCY_BOUND_MS = 15.0  # MLPerf's ResNet-50 Server scenario: p99 latency at most 15 ms


def one_gpu_baseline_argv(args, count: int, min_duration_s: float, n_gpus: int, log_dir: str, record: str) -> list[str]:
    """`trtfuse offline` arguments of --scaling's 1-GPU run: the invocation's model, data, batch, runners, mode and
    answer path on one GPU, 1/N of its expected QPS, its logs in LOG_DIR/one-gpu, its record to `record`."""
    argv = ["offline", "--model", args.model, "--backend", args.backend, "--data", args.data, "--count", str(count),
            "--gpus", "1", "--streams", str(args.streams), "--mode", args.mode, "--min-duration", repr(min_duration_s),
            "--log-dir", log_dir, "--answers", args.answers, "-o", record]
    if args.batch is not None:
        argv += ["--batch", str(args.batch)]
    if args.expected_qps:
        argv += ["--expected-qps", repr(args.expected_qps / n_gpus)]
    if args.plans:
        argv += ["--plans", args.plans]
    elif args.autotune:
        argv += ["--autotune"]
    for name in getattr(args, "unfuse", []):
        argv += ["--unfuse", name]
    return argv


def run_one_gpu_baseline(args, count: int, min_duration_s: float, n_gpus: int) -> dict:
    """--scaling's 1-GPU run, in a process of its own: each of the two runs then starts from a fresh interpreter, as
    separate `trtfuse offline` commands would. In one process the N-GPU run came second, on the heap the first run
    had used and freed, and LoadGen's hand-over of its query took longer: 2.80 and 2.85 s for 23.8 million samples
    on the 4-GPU host, against 1.81-2.46 s in fresh processes. Returns the run's record, its path under "record"
    (its tuned plans serve the N-GPU run)."""
    import json
    import subprocess

    log_dir = str(Path(args.log_dir) / "one-gpu")
    record = str(Path(args.log_dir) / "one-gpu.json")  # written atomically by the child
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    argv = one_gpu_baseline_argv(args, count, min_duration_s, n_gpus, log_dir, record)
    # its summary table is not wanted here; its progress and any error line go to the same stderr
    done = subprocess.run([sys.executable, "-m", "trtfuse.cli", *argv], stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise TrtfuseError(f"--scaling: the 1-GPU run failed (exit status {done.returncode}; its message is above)")
    with open(record, encoding="utf-8") as f:
        out = json.load(f)
    out["record"] = record
    return out


def cut_batches(ids, indices, batch: int, pad_last_batch: bool, max_chunk_batches: int = 256):
    """(sample indices as int64, response ids) per batch of a query, converted from LoadGen's two lists as they are
    consumed: converting a 300 s Offline query's 25.7 million indices at once held back the first launch by 1.7 s (67 ns
    a sample, the H200 run's answer timeline). With pad_last_batch (a static-shape graph) the last batch is padded with
    repeats of its first index; its ids stay its own. Cut as workers take them (JobFeed), a chunk of at most
    max_chunk_batches is converted while the other GPUs wait for the feed."""
    chunk_batches, start = 1, 0  # the first batch alone, then chunks doubling up to the cap: few numpy calls
    while start < len(ids):
        end = min(len(ids), start + chunk_batches * batch)
        chunk = np.asarray(indices[start:end], dtype=np.int64)
        for first in range(0, end - start, batch):
            idx = chunk[first : first + batch]
            if pad_last_batch and len(idx) < batch:
                idx = np.concatenate([idx, np.repeat(idx[:1], batch - len(idx))])
            yield idx, ids[start + first : start + first + batch]
        start, chunk_batches = end, min(2 * chunk_batches, max_chunk_batches)


def run_loadgen(workers: list[_Worker], count: int, batch: int, pad_last_batch: bool, mode: str, log_dir: str,
                expected_qps: float, min_duration_s: float, labels=None, progress_cb=None,
                what: str = "a worker", scenario: str = "offline",
                latency_bound_ms: float = SERVER_LATENCY_BOUND_MS, answers: str = "array") -> dict:
    """LoadGen's Offline scenario (or, scenario="server", its Server scenario at `expected_qps` queries/s with
    p99 latency bound `latency_bound_ms`) over `count` samples served by `workers` (started, each with a `jobs`
    queue, dealt batches round-robin; workers sharing one JobFeed take the batches as they free runners, each cut as
    it is taken); closes the workers. Raises after the run if one of them failed."""
    lg = _loadgen()
    if scenario not in ("offline", "server"):
        raise TrtfuseError(f"LoadGen scenario {scenario!r}: offline or server")
    issued = [0]  # samples LoadGen handed over
    dealt = [0]  # batches dealt so far, across issue calls (the Server scenario issues one query per call)
    lock = threading.Lock()
    completed = [0]
    issued_at = []  # perf_counter() when LoadGen handed over the query
    query_lists = []  # the Offline query's id and index lists, freed after the run
    answered = []  # (perf_counter(), samples) per answered batch, in answer order

    if answers not in ANSWER_PATHS:
        raise TrtfuseError(f"--answers {answers!r}: one of {', '.join(ANSWER_PATHS)}")
    # "array" and "lists": one call into LoadGen's C++ QuerySamplesComplete per batch (runtime/loadgen_answers.py),
    # where this LoadGen module allows it; else, and with "objects", a QuerySampleResponse per sample through its
    # Python binding. "array" also reads the query in place (runtime/loadgen_query.py), where the module allows it.
    native = native_answerer(lg) if answers in ("array", "lists") else None

    def complete(ids, data_address: int = 0, item_bytes: int = 0) -> None:
        """LoadGen's completion of `ids`, the i-th answer the item_bytes at data_address + i * item_bytes."""
        if native:
            native.answer(np.asarray(ids, dtype=np.uint64), data_address, item_bytes)
        else:
            lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, data_address + item_bytes * i, item_bytes)
                                     for i, qid in enumerate(ids)])

    def done(ids, top1):
        if top1 is None:  # the worker failed: complete the queries empty, report the error afterwards
            complete(ids)
            return
        # One int32 array per batch, each response pointing at its element (LoadGen copies the bytes
        # inside QuerySamplesComplete, so the array only has to outlive the call).
        top1 = np.ascontiguousarray(top1, dtype=np.int32)
        complete(ids, top1.ctypes.data, 4)
        with lock:
            completed[0] += len(ids)
            answered.append((time.perf_counter(), len(ids)))
            if progress_cb:
                progress_cb(len(ids))

    def issue_queries(ids, indices):
        # The query as two sequences of ints (response ids, sample indices): uint64 views of LoadGen's own sample
        # array (NativeSut), or the two lists of the binding's "fast" SUT, instead of hundreds of thousands of
        # QuerySample objects to convert and read one by one. Each batch is queued as soon as it is cut, so the
        # GPUs start on the first while the rest are cut.
        if scenario == "offline" and isinstance(ids, list):
            # The two lists hold an int per sample (tens of millions in a long run), allocated just before this call:
            # the collector's young-generation passes would walk them under the GIL while the GPUs wait for launches
            # (80 ms for 4.4 million on this repository's CI machine). Frozen, they are never walked (thawed after
            # the run). Freeing them holds the GIL for about 20 ns a sample: 0.48 s for 23.8 million on the 4-GPU
            # host, where the last batch's launcher dropped them and every GPU's last completions waited. Held until
            # LoadGen has returned, the run's clock no longer sees it.
            gc.freeze()
            query_lists.append((ids, indices))
        issued_at.append(time.perf_counter())
        issued[0] += len(ids)
        feed = workers[0].jobs
        if isinstance(feed, JobFeed) and all(w.jobs is feed for w in workers):  # cut as the workers take them
            feed.put_batches((idx, batch_ids, done) for idx, batch_ids in
                             cut_batches(ids, indices, batch, pad_last_batch, FEED_CHUNK_BATCHES))
            return
        for idx, batch_ids in cut_batches(ids, indices, batch, pad_last_batch):
            workers[dealt[0] % len(workers)].jobs.put((idx, batch_ids, done))
            dealt[0] += 1

    def flush_queries():
        pass

    in_place = native_sut(lg, issue_queries, flush_queries) if native and answers == "array" else None
    sut = in_place.handle if in_place else lg.ConstructFastSUT(issue_queries, flush_queries)
    qsl = lg.ConstructQSL(count, count, lambda s: None, lambda s: None)
    settings = lg.TestSettings()
    settings.mode = lg.TestMode.AccuracyOnly if mode == "accuracy" else lg.TestMode.PerformanceOnly
    if scenario == "server":
        settings.scenario = lg.TestScenario.Server
        settings.server_target_qps = expected_qps
        settings.server_target_latency_ns = int(latency_bound_ms * 1e6)
        settings.server_target_latency_percentile = 0.99
    else:
        settings.scenario = lg.TestScenario.Offline
        settings.offline_expected_qps = expected_qps
    settings.min_duration_ms = int(min_duration_s * 1000)
    settings.min_query_count = 1
    from ..validate import make_output_dir

    make_output_dir(log_dir, "--log-dir")
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(log_dir)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False
    # The feeding threads wake on queues and events while the query slicing and the responses hold the
    # GIL: at Python's default 5 ms switch interval a freed runner could wait that long for its next
    # launch; a shorter interval hands the GIL over sooner (restored after the run).
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    frozen_before = gc.get_freeze_count()
    try:
        start = time.perf_counter()
        _interruptible(lambda: lg.StartTestWithLogSettings(sut, qsl, settings, log_settings))
        wall = time.perf_counter() - start
    finally:
        sys.setswitchinterval(switch_interval)
        if not frozen_before:  # a caller's own frozen objects stay frozen
            gc.unfreeze()
        close_workers(workers)
        query_lists.clear()
        lg.DestroyQSL(qsl)
        if not in_place:
            lg.DestroyFastSUT(sut)
    failed = [w.error for w in workers if w.error is not None] + (in_place.errors if in_place else [])
    if failed:
        first = str(failed[0]).splitlines()[0] if str(failed[0]) else ""
        raise TrtfuseError(f"{what} failed: {type(failed[0]).__name__}: {first}")

    summary = parse_summary(Path(log_dir) / "mlperf_log_summary.txt")
    rate = summary.get("Samples per second") if scenario == "offline" else summary.get("Completed samples per second")
    reasons = invalid_reasons(summary)
    # LoadGen's verdict and the settings it was reached under, at the top of the record: a figure is only
    # comparable with another of the same verdict and minimum duration (MLPerf's Offline rule is 600 s).
    verdict = summary.get("Result is") if mode == "performance" else None
    out = {"scenario": scenario, "result": verdict, "min_duration_s": min_duration_s, "samples_issued": issued[0],
           "samples_completed": completed[0], "wall_seconds": wall, "samples_per_s": rate, "loadgen_summary": summary,
           "log_dir": str(log_dir), "invalid_because": reasons or None, "answers": "array" if in_place else "lists" if native else "objects"}
    if issued_at and answered:
        out["timeline"] = answer_timeline(issued_at[0], answered)
    if mode == "accuracy":
        out.update(score_accuracy(Path(log_dir) / "mlperf_log_accuracy.json", labels))
    return out


def _interruptible(call) -> None:
    """Run `call` (LoadGen's StartTest, which blocks in C++ where Python never sees a signal) on a thread
    while the main thread waits in short steps, so Ctrl-C is seen at once. LoadGen cannot be cancelled
    mid-run, so an interrupt ends the process: one line, exit status 130 (no output is half-written: the
    result files are written after the run, and atomically)."""
    import os

    finished = threading.Event()
    failure: list[BaseException] = []

    def target():
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            failure.append(exc)
        finally:
            finished.set()

    threading.Thread(target=target, name="loadgen", daemon=True).start()
    try:
        while not finished.wait(0.1):
            pass
    except KeyboardInterrupt:
        sys.stdout.flush()
        sys.stderr.write("trtfuse: interrupted\n")
        sys.stderr.flush()
        os._exit(130)
    if failure:
        raise failure[0]


def invalid_reasons(summary: dict) -> str | None:
    """Why LoadGen judged a run INVALID, from its summary: the unmet conditions and its recommendations."""
    if summary.get("Result is") != "INVALID":
        return None
    unmet = [k.replace(" satisfied", "").strip() for k, v in summary.items() if k.endswith("satisfied") and str(v).upper() == "NO"]
    parts = [f"{', '.join(unmet)} not satisfied"] if unmet else []
    parts += summary.get("Recommendations", [])
    return "; ".join(parts) or "LoadGen gave no reason (see mlperf_log_summary.txt)"


def answer_timeline(issued_at: float, answered: list[tuple[float, int]]) -> dict:
    """Where a run's time went, from the answers' clock times: the first answer's latency (the pipeline
    filling), the steady rate over the middle 80% of the samples, the rate in each tenth of the samples,
    and the seconds the run took beyond `samples / steady rate` (ramp-up plus drain): what separates
    LoadGen's figure from the GPUs' own rate. Rates over a span inside a single answer are None."""
    times = np.array([t - issued_at for t, _ in answered])
    counts = np.cumsum([n for _, n in answered])
    total = int(counts[-1])

    def time_at(fraction):  # clock time when `fraction` of the samples had been answered
        return float(times[min(int(np.searchsorted(counts, fraction * total)), len(times) - 1)])

    edges = [time_at(k / 10) if k else 0.0 for k in range(11)]
    mid_s = time_at(0.9) - time_at(0.1)
    steady = 0.8 * total / mid_s if mid_s > 0 else None
    return {"first_answer_ms": 1000 * float(times[0]), "last_answer_s": float(times[-1]),
            "steady_samples_per_s": steady,
            "samples_per_s_by_tenth": [0.1 * total / (b - a) if b > a else None for a, b in zip(edges, edges[1:])],
            "seconds_beyond_steady": float(times[-1]) - total / steady if steady else None}


def parse_summary(path: Path) -> dict:
    """LoadGen's mlperf_log_summary.txt 'Key : value' lines, numbers as numbers."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("* "):  # under "Recommendations:"
            out.setdefault("Recommendations", []).append(line.strip()[2:].strip())
            continue
        m = re.match(r"^\s*([^:=]+?)\s*:\s*(.+?)\s*$", line)
        if m:
            key, val = m.groups()
            try:
                out[key] = float(val) if "." in val or "e" in val.lower() else int(val)
            except ValueError:
                out[key] = val
    return out


def accuracy_log_top1(path: Path) -> dict[int, int]:
    """Sample index -> the top-1 answered for it, from LoadGen's mlperf_log_accuracy.json (int32 per response)."""
    import json

    if not path.exists():
        return {}
    entries = json.loads(path.read_text() or "[]")
    return {e["qsl_idx"]: int.from_bytes(bytes.fromhex(e["data"]), "little", signed=True) for e in entries}


def score_accuracy(path: Path, labels) -> dict:
    if not path.exists():
        return {}
    preds = accuracy_log_top1(path)
    out = {"accuracy_responses": len(preds)}
    if labels is not None and preds:
        idx = np.array(sorted(preds))
        out["top1_accuracy"] = float(np.mean(np.array([preds[i] for i in idx]) == np.asarray(labels)[idx]))
    return out


def _golden_chunk(model_path: str, images: np.ndarray) -> np.ndarray:
    """A process's share of golden_top1: the CPU golden executor's top-1 of each image, one image at a time."""
    from ..graph_passes.scales import model_input_spec
    from ..io import load_model
    from .cpu_executor import run_model

    model = load_model(model_path)
    name, dims = model_input_spec(model)
    step = dims[0] if dims and dims[0] else len(images)
    output = model.graph.output[0].name
    logits = [run_model(model, {name: images[i : i + step]}, [output])[0] for i in range(0, len(images), step)]
    return np.concatenate(logits).reshape(len(images), -1).argmax(axis=1)


def golden_top1(model_path: str, images: np.ndarray, processes: int | None = None) -> np.ndarray:
    """The top-1 class of every image by the CPU golden executor (runtime/cpu_executor.py: docs/ops.md's semantics, the
    reference every kernel is checked against), the images split over processes (the executor is single-threaded numpy)."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    processes = max(1, min(processes or os.cpu_count() or 1, len(images)))
    chunks = np.array_split(images, processes)
    # one BLAS thread per process: a process per core already, and each one's own thread pool would oversubscribe them
    threads = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update({k: "1" for k in threads})
    try:
        # spawn: the parent holds a CUDA context and LoadGen's threads, which a forked child must not inherit
        with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
            return np.concatenate(list(pool.map(_golden_chunk, [model_path] * processes, chunks)))
    finally:
        for k, v in threads.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def golden_agreement(answered: dict[int, int], golden: np.ndarray) -> dict:
    """How an accuracy run's answers (sample index -> top-1) agree with the golden top-1 of the same samples."""
    idx = np.array(sorted(answered), dtype=np.int64)
    ours = np.array([answered[i] for i in idx], dtype=np.int64)
    mismatched = idx[ours != golden[idx]] if len(idx) else idx
    return {"golden_checked": int(len(idx)), "golden_top1_agreement": float(np.mean(ours == golden[idx])) if len(idx) else None,
            "golden_top1_mismatches": [int(i) for i in mismatched]}
