"""LoadGen's Offline and Server scenarios against Triton endpoints over KServe v2 gRPC (`tritonclient.grpc`).

One `TritonWorker` per endpoint (runtime/offline.run_loadgen deals the batches round-robin, so several servers
share the load, the shape of MLPerf's network division): a feeding thread takes each batch of sample indices,
sends it as one asynchronous request (the samples, preprocessed once on the client, as FP32 [n, C, H, W]; only
the `top1` output requested) with at most `max_in_flight` requests outstanding, and gRPC's callback answers
LoadGen. Every request carries a number; the callbacks are counted per number, so a run reports requests sent,
answered, failed and answered more than once: each request must be answered exactly once.

With `shared_memory="cuda"` (a client on the server's machine, as perf_analyzer's `--shared-memory cuda`) no
image crosses gRPC: the samples are put on the GPU once, each in-flight request owns a slot of one registered
CUDA shared-memory region, a batch is gathered into its slot on the GPU and the request only names the slot.

The input's name and dims come from the server's model metadata; the first endpoint's model is the reference
and every other endpoint must serve the same input.
"""

from __future__ import annotations

import base64
import queue
import threading
import time
from collections import Counter

import numpy as np

from ..errors import TrtfuseError
from .offline import SERVER_LATENCY_BOUND_MS, _loadgen, _Worker, load_samples, run_loadgen

TOP1_OUTPUT = "top1"
DEFAULT_MODEL = "resnet"


def _grpc():
    try:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException
    except ImportError:
        raise TrtfuseError("driving Triton needs tritonclient: pip install 'trtfuse[serve]'") from None
    return grpcclient, InferenceServerException


def check_endpoint(url: str) -> str:
    """KServe v2 gRPC endpoints are host:port on the loopback address here."""
    host, _, port = url.rpartition(":")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise TrtfuseError(f"--endpoint {url!r}: expected 127.0.0.1:PORT (Triton's gRPC port)")
    if host not in ("127.0.0.1", "localhost"):
        raise TrtfuseError(f"--endpoint {url!r}: only loopback endpoints (127.0.0.1) are driven")
    return f"127.0.0.1:{port}"


def model_input(url: str, model: str, timeout_s: float = 10.0) -> tuple[str, list, str, int]:
    """(input name, dims without the batch, Triton datatype, max_batch_size) of `model` at `url`, once ready."""
    grpcclient, exc_type = _grpc()
    client = grpcclient.InferenceServerClient(url)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.is_model_ready(model):
                    break
            except exc_type:
                pass
            if time.monotonic() > deadline:
                raise TrtfuseError(f"{url}: model {model!r} is not ready (is `trtfuse serve` running there?)")
            time.sleep(0.2)
        meta = client.get_model_metadata(model, as_json=True)
        config = client.get_model_config(model, as_json=True)["config"]
    except exc_type as exc:
        raise TrtfuseError(f"{url}: {exc.message()}") from None
    finally:
        client.close()
    inp = meta["inputs"][0]
    dims = [int(d) for d in inp["shape"]]
    if int(config.get("max_batch_size", 0)) > 0:
        dims = dims[1:]
    outputs = [o["name"] for o in meta["outputs"]]
    if TOP1_OUTPUT not in outputs:
        raise TrtfuseError(f"{url}: model {model!r} has no {TOP1_OUTPUT!r} output (serve it with `trtfuse serve`)")
    return inp["name"], dims, inp["datatype"], int(config.get("max_batch_size", 0))


class CudaSharedBatches:
    """The client's half of CUDA shared memory for one endpoint: the samples on GPU `device` once, one region of
    `slots` batch-sized slots registered with the server as `name`; `fill` gathers a batch into a slot."""

    def __init__(self, client, name: str, samples: np.ndarray, batch: int, slots: int, device: int):
        from ..plugins import cuda_driver as cd

        self.device, self.batch, self.name, self.client = device, batch, name, client
        self.context = cd.context(device)
        self.sample_bytes = samples[0].nbytes
        if self.sample_bytes % 16:
            raise TrtfuseError(f"CUDA shared memory: an image of {self.sample_bytes} bytes is not a multiple of 16")
        self.library = cd.DeviceBuffer.from_array(np.ascontiguousarray(samples, dtype=np.float32))
        self.region = cd.DeviceBuffer(slots * batch * self.sample_bytes)
        self.indices = [cd.PinnedArray(batch, np.int64) for _ in range(slots)]
        self.indices_on_device = cd.DeviceBuffer(8 * batch * slots)
        self.stream = cd.Stream()
        raw = base64.b64encode(cd.ipc_handle(self.region.ptr))
        client.register_cuda_shared_memory(name, raw, device, self.region.nbytes)

    def fill(self, slot: int, indices) -> tuple[int, int]:
        """Gather the samples `indices` into `slot` (done when this returns): (offset, bytes) in the region."""
        from ..plugins import cuda_driver as cd
        from ..plugins import network_ops

        n = len(indices)
        pinned = self.indices[slot]
        pinned.array[:n] = indices
        on_device = self.indices_on_device.ptr + 8 * self.batch * slot
        cd.check(cd._driver().cuMemcpyHtoDAsync(on_device, pinned.ptr, 8 * n, self.stream.handle))
        offset = slot * self.batch * self.sample_bytes
        network_ops.gather_rows(self.library.ptr, on_device, self.sample_bytes, n, self.region.ptr + offset,
                                stream=self.stream.handle)
        self.stream.synchronize()  # the server reads the slot on its own stream: it must be complete first
        return offset, n * self.sample_bytes

    def close(self) -> None:
        try:
            self.client.unregister_cuda_shared_memory(self.name)
        finally:
            for buf in (self.region, self.library, self.indices_on_device, *self.indices):
                buf.free()


class TritonWorker(_Worker):
    """Sends the batches of its `jobs` queue to one endpoint as asynchronous gRPC requests, at most
    `max_in_flight` outstanding (each owning one slot: of the CUDA shared-memory region, where one is used)."""

    def __init__(self, url: str, model: str, input_name: str, samples: np.ndarray, max_in_flight: int = 64,
                 timeout_s: float = 60.0, shared_memory: str = "none", batch: int = 1, device: int = 0):
        grpcclient, self._exc_type = _grpc()
        self.url, self.model, self.input_name, self.samples = url, model, input_name, samples
        self.client = grpcclient.InferenceServerClient(url)
        self._grpc = grpcclient
        self._free_slots: queue.Queue = queue.Queue()
        for slot in range(max_in_flight):
            self._free_slots.put(slot)
        self.max_in_flight, self.timeout_s = max_in_flight, timeout_s
        self._count_lock = threading.Lock()
        self.sent = 0
        self.answers: Counter = Counter()  # request number -> callbacks received
        self.failures = 0
        self.fill_seconds = 0.0  # time the feeding thread spent gathering batches into CUDA shared memory
        self.shared = None
        if shared_memory == "cuda":
            try:
                self.shared = CudaSharedBatches(self.client, f"trtfuse-{url.replace(':', '-')}-{id(self)}", samples,
                                                batch, max_in_flight, device)
            except self._exc_type as exc:
                self.client.close()
                raise TrtfuseError(f"{url}: CUDA shared memory refused: {exc.message()}") from None
        super().__init__([threading.Thread(target=self._loop, name=f"triton-{url}", daemon=True)])
        self.start()

    def _loop(self) -> None:
        if self.shared is not None:
            from ..plugins import cuda_driver as cd

            cd.check(cd._driver().cuCtxSetCurrent(self.shared.context))
        while True:
            job = self.jobs.get()
            if job is None:
                for _ in range(self.max_in_flight):  # every request answered before the worker is closed
                    try:
                        self._free_slots.get(timeout=self.timeout_s)
                    except queue.Empty:
                        break
                if self.shared is not None:
                    self.shared.close()
                self.client.close()
                return
            indices, ids, done = job
            if self.error is not None:
                self._answer(done, ids, None)
                continue
            slot = self._free_slots.get()
            try:
                inp = self._request_input(slot, np.asarray(indices))
                with self._count_lock:
                    number = self.sent
                    self.sent += 1
                self.client.async_infer(self.model, [inp], callback=self._callback(number, slot, ids, done),
                                        outputs=[self._grpc.InferRequestedOutput(TOP1_OUTPUT)],
                                        client_timeout=self.timeout_s)
            except BaseException as exc:  # noqa: BLE001 - reported after the run; the batch is answered empty
                self._free_slots.put(slot)
                self._fail(exc)
                self._answer(done, ids, None)

    def _request_input(self, slot: int, indices: np.ndarray):
        shape = [len(indices), *self.samples.shape[1:]]
        inp = self._grpc.InferInput(self.input_name, shape, "FP32")
        if self.shared is not None:
            started = time.perf_counter()
            offset, nbytes = self.shared.fill(slot, indices)
            self.fill_seconds += time.perf_counter() - started
            inp.set_shared_memory(self.shared.name, nbytes, offset=offset)
        else:
            inp.set_data_from_numpy(np.ascontiguousarray(self.samples[indices]))
        return inp

    def _callback(self, number: int, slot: int, ids, done):
        def on_result(result, error):
            with self._count_lock:
                self.answers[number] += 1
                if error is not None:
                    self.failures += 1
            self._free_slots.put(slot)
            if error is not None:
                self._fail(TrtfuseError(f"{self.url}: {error.message() if hasattr(error, 'message') else error}"))
                self._answer(done, ids, None)
                return
            try:
                top1 = result.as_numpy(TOP1_OUTPUT).reshape(-1)[: len(ids)]
            except BaseException as exc:  # noqa: BLE001
                self._fail(exc)
                top1 = None
            self._answer(done, ids, top1)
        return on_result

    def counts(self) -> dict:
        with self._count_lock:
            return {"endpoint": self.url, "requests_sent": self.sent, "requests_answered": len(self.answers),
                    "answered_more_than_once": sum(1 for v in self.answers.values() if v > 1),
                    "requests_failed": self.failures,
                    "client_fill_ms_mean": 1e3 * self.fill_seconds / self.sent if self.shared is not None and self.sent else None}


def run_triton(endpoints: list[str], scenario: str, data: str, count: int, batch: int, mode: str, log_dir: str,
               expected_qps: float, min_duration_s: float, model: str = DEFAULT_MODEL, max_in_flight: int = 64,
               latency_bound_ms: float = SERVER_LATENCY_BOUND_MS, progress_cb=None, samples=None,
               shared_memory: str = "none", answers: str = "array") -> dict:
    """A LoadGen run (Offline: batches of `batch`; Server: one sample per query, the server's dynamic batcher
    batching them) against `endpoints`, Triton's gRPC ports. `samples` = (images, labels) reuses a loaded set.
    shared_memory="cuda": images through CUDA shared memory on this machine's GPUs (endpoint i on GPU i mod the
    GPU count), "none": in the requests."""
    if shared_memory not in ("none", "cuda"):
        raise TrtfuseError(f"--shared-memory {shared_memory!r}: none or cuda")
    _loadgen()
    if not endpoints:
        raise TrtfuseError("--endpoint: name at least one Triton gRPC endpoint")
    urls = [check_endpoint(u) for u in endpoints]
    if len(set(urls)) != len(urls):
        raise TrtfuseError("--endpoint: the same endpoint twice")
    input_name, dims, dtype, max_batch = model_input(urls[0], model)
    for u in urls[1:]:
        other = model_input(u, model)
        if other[:3] != (input_name, dims, dtype):
            raise TrtfuseError(f"{u} serves {model!r} with input {other[:3]}, {urls[0]} with {(input_name, dims, dtype)}")
    if dtype != "FP32" or len(dims) != 3 or dims[1] != dims[2] or min(dims) < 1:
        raise TrtfuseError(f"{urls[0]}: model {model!r} takes {dtype} {dims}; LoadGen here sends FP32 square images [C, S, S]")
    per_request = 1 if scenario == "server" else batch
    if max_batch and per_request > max_batch:
        raise TrtfuseError(f"--batch {batch}: the served model takes at most {max_batch} images per request")
    images, labels = samples if samples is not None else load_samples(data, count, size=dims[1])
    count = len(images)
    gpus = 0
    if shared_memory == "cuda":
        from ..plugins import cuda_driver as cd

        ok, why = cd.gpu_available()
        if not ok:
            raise TrtfuseError(f"--shared-memory cuda needs a GPU on this machine: {why}")
        gpus = cd.device_count()
    workers = []
    try:
        for i, u in enumerate(urls):
            workers.append(TritonWorker(u, model, input_name, images, max_in_flight=max_in_flight,
                                        shared_memory=shared_memory, batch=per_request, device=i % gpus if gpus else 0))
    except BaseException:
        for w in workers:
            w.close()
        raise
    out = {"endpoints": urls, "model": model, "scenario": scenario, "data": data, "count": count,
           "batch": per_request, "mode": mode, "shared_memory": shared_memory}
    try:
        out.update(run_loadgen(workers, count, per_request, pad_last_batch=False, mode=mode, log_dir=log_dir,
                               expected_qps=expected_qps, min_duration_s=min_duration_s, labels=labels,
                               progress_cb=progress_cb, what="a Triton endpoint", scenario=scenario,
                               latency_bound_ms=latency_bound_ms, answers=answers))
    finally:
        out["requests"] = [w.counts() for w in workers]
    summary = out.get("loadgen_summary", {})
    p99 = summary.get("99.00 percentile latency (ns)")
    out["p99_latency_ms"] = p99 / 1e6 if isinstance(p99, (int, float)) else None
    out["valid"] = summary.get("Result is") == "VALID"
    # LoadGen's VALID also needs its early-stopping estimate to confirm the percentile, which takes some
    # hundreds of queries; the measured p99 against the bound is kept apart.
    out["p99_within_bound"] = str(summary.get("Performance constraints satisfied", "")).lower() == "yes"
    out["early_stopping_satisfied"] = str(summary.get("Early stopping satisfied", "")).lower() == "yes"
    return out


def find_peak(run_at, start_qps: float, max_runs: int, tolerance: float = 0.05, key: str = "valid") -> dict:
    """The highest target QPS whose Server run passes (`key` of its result: "valid", LoadGen's verdict, or
    "p99_within_bound"), by doubling from `start_qps` until a run fails, then bisecting, `max_runs` runs at most.
    run_at(qps) -> result dict."""
    runs = []
    lo, hi = None, None  # highest passing, lowest failing target
    qps = start_qps
    for _ in range(max_runs):
        r = run_at(qps)
        runs.append({"target_qps": qps, "valid": r["valid"], "p99_within_bound": r.get("p99_within_bound"),
                     "p99_latency_ms": r["p99_latency_ms"], "completed_samples_per_s": r["samples_per_s"]})
        if r[key]:
            lo = qps if lo is None else max(lo, qps)
        else:
            hi = qps if hi is None else min(hi, qps)
        if hi is None:
            qps = qps * 2
        elif lo is None:
            qps = qps / 2
        elif (hi - lo) / hi <= tolerance:
            break
        else:
            qps = (lo + hi) / 2
    return {"peak_qps": lo, "lowest_failing_qps": hi, "peak_criterion": key, "runs": runs}
