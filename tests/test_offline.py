"""`trtfuse offline` on MLPerf LoadGen: the harness end to end on the CPU (onnxruntime backend, a small
model), LoadGen's logs kept and parsed, accuracy-mode responses scored; the GPU worker's launcher /
completion pipeline on the CPU with stand-in runner slots (every query answered once, the launcher never
waiting on response work, failures answered and reported); the cuda backend on a GPU."""

import collections
import json
import shlex
import threading
import time

import numpy as np
import pytest

pytest.importorskip("mlperf_loadgen", reason="needs mlcommons-loadgen (pip install 'trtfuse[offline]')")

from onnx_fixtures import save_tiny_rewritten  # noqa: E402
from trtfuse.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from trtfuse.io import save_model
    from trtfuse.models import build

    path = tmp_path_factory.mktemp("m") / "r18.onnx"
    save_model(build("resnet18", image_size=32, batch=None), path)
    return path


@pytest.mark.parametrize("mode", ["performance", "accuracy"])
def test_offline_onnxruntime_backend(small_model, tmp_path, capsys, mode):
    out = tmp_path / "result.json"
    rc = main(["offline", "--model", str(small_model), "--backend", "onnxruntime", "--count", "48", "--batch", "16",
               "--min-duration", "0.5", "--expected-qps", "50", "--mode", mode, "--log-dir", str(tmp_path / "logs"),
               "-o", str(out), "--json"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert (tmp_path / "logs" / "mlperf_log_detail.txt").exists()
    if mode == "performance":
        assert result["samples_per_s"] > 0 and result["loadgen_summary"]["Scenario"] == "Offline"
        assert result["samples_completed"] > 0
        # the verdict and the duration it was reached under, for comparing records without opening LoadGen's log
        assert result["result"] == result["loadgen_summary"]["Result is"] and result["result"] in ("VALID", "INVALID")
        assert result["min_duration_s"] == 0.5 and result["gpus"] == 0
    else:
        assert result["result"] is None
        assert result["accuracy_responses"] == 48  # every sample answered once, top-1 as int32
    assert "cards" not in result and "mj_per_sample" not in result  # no GPU in the run: no board to read
    # the record's command is the call's own arguments, not the process's (here pytest's)
    assert result["command"].startswith(f"trtfuse offline --model {small_model} --backend onnxruntime --count 48")


def test_check_golden_scores_every_answer_against_the_cpu_golden_executor(small_model, tmp_path):
    out = tmp_path / "result.json"
    rc = main(["offline", "--model", str(small_model), "--backend", "onnxruntime", "--data", "default", "--count", "24",
               "--batch", "8", "--min-duration", "0.2", "--expected-qps", "50", "--mode", "accuracy", "--check-golden",
               "--log-dir", str(tmp_path / "logs"), "-o", str(out), "--json"])
    assert rc == 0
    result = json.loads(out.read_text())
    # ONNX Runtime's float32 top-1 against the golden executor's float32 (np.float64 accumulation) on the same photos
    assert result["golden_checked"] == 24
    assert result["golden_top1_agreement"] == 1.0 and result["golden_top1_mismatches"] == []


def test_golden_agreement_names_the_samples_that_differ():
    from trtfuse.runtime.offline import golden_agreement

    got = golden_agreement({0: 3, 1: 5, 2: 7, 4: 1}, np.array([3, 5, 6, 9, 1]))
    assert got == {"golden_checked": 4, "golden_top1_agreement": 0.75, "golden_top1_mismatches": [2]}


@pytest.mark.parametrize("extra", [["--mode", "performance"], ["--mode", "accuracy", "--backend", "trt"]],
                         ids=["performance-mode", "trt-engine"])
def test_check_golden_outside_an_onnx_accuracy_run_is_one_line(small_model, tmp_path, capsys, extra):
    rc = main(["offline", "--model", str(small_model), "--check-golden", "--log-dir", str(tmp_path / "logs")] + extra)
    err = capsys.readouterr().err
    assert rc != 0 and "--check-golden" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_offline_compare_pipeline_feeds_the_same_workers_without_loadgen(small_model, tmp_path):
    out = tmp_path / "result.json"
    rc = main(["offline", "--model", str(small_model), "--backend", "onnxruntime", "--count", "32", "--batch", "16",
               "--min-duration", "0.2", "--expected-qps", "50", "--compare-pipeline", "--log-dir", str(tmp_path / "logs"),
               "-o", str(out), "--json"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["pipeline_samples_per_s"] > 0 and result["samples_per_s"] > 0
    assert result["timeline"]["first_answer_ms"] > 0  # one batch here: no steady rate (None), nothing divided by 0


def test_offline_errors_are_one_line(small_model, capsys):
    assert main(["offline", "--model", str(small_model), "--backend", "trt", "--count", "4", "--log-dir", "/tmp/x"]) == 2
    assert "is an ONNX model" in capsys.readouterr().err  # --backend trt runs a serialized engine
    assert main(["offline", "--model", "/nonexistent.onnx"]) == 2
    capsys.readouterr()
    assert main(["offline", "--model", str(small_model), "--streams", "0"]) == 2
    err = capsys.readouterr().err
    assert "--streams" in err and err.count("\n") == 1


def test_streams_default_is_the_harness_default():
    from trtfuse.cli import build_parser
    from trtfuse.runtime.offline import DEFAULT_STREAMS

    assert build_parser().parse_args(["offline", "--model", "m.onnx"]).streams == DEFAULT_STREAMS


def test_summary_parser_reads_loadgen_lines(tmp_path):
    from trtfuse.runtime.offline import parse_summary

    p = tmp_path / "s.txt"
    p.write_text("Scenario : Offline\nSamples per second: 31234.5\nResult is : VALID\n")
    assert parse_summary(p) == {"Scenario": "Offline", "Samples per second": 31234.5, "Result is": "VALID"}


@pytest.mark.gpu
@pytest.mark.parametrize("streams", [1, 3])
def test_offline_cuda_backend_on_a_gpu(tmp_path, streams):
    """Accuracy mode on the GPU: each sample's response is the top-1 that a plain run of the same model
    on the same images gives (100 samples in batches of 16: the last one padded)."""
    from trtfuse.plugins.cuda_driver import gpu_available

    ok, why = gpu_available()
    if not ok:
        pytest.skip(f"needs a CUDA GPU: {why}")
    from trtfuse.runtime.gpu_runner import CudaRunner
    from trtfuse.runtime.offline import load_samples

    model = save_tiny_rewritten(tmp_path / "all.onnx")
    out = tmp_path / "r.json"
    assert main(["offline", "--model", str(tmp_path / "all.onnx"), "--backend", "cuda", "--count", "100", "--batch",
                 "16", "--streams", str(streams), "--mode", "accuracy", "--check-golden", "--log-dir", str(tmp_path / "logs"),
                 "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["accuracy_responses"] == 100 and result["gpus"] == 1 and result["streams"] == streams
    placed = result["activation_bytes_per_runner"]  # activations sharing memory by lifetime
    assert 0 < placed["placed"] < placed["separate"]
    assert result["batch_input"] == "in place"  # the fused stem reads each image from the device samples by index
    assert result["golden_checked"] == 100 and result["golden_top1_mismatches"] == []  # the CPU golden executor's top-1
    (card,) = result["cards"]  # NVML's readings over the run: the clock the card ran at, its power and joules
    assert card["gpu"] == 0 and 100 < card["sm_mhz_median"] < 5000 and card["readings"] >= 1
    if card["joules"] is None:  # a run shorter than the energy counter's update period: no energy figure at all
        assert card["watts_mean"] is None and "mj_per_sample" not in result
    else:
        assert card["joules"] > 0 and result["mj_per_sample"] == pytest.approx(1e3 * card["joules"] / result["samples_completed"])
    images, _ = load_samples("synthetic", 100, 32)
    runner = CudaRunner(model, 16)
    padded = np.concatenate([images, images[:12]])
    want = np.concatenate([np.argmax(runner.run(padded[i : i + 16]), 1) for i in range(0, 112, 16)])[:100]
    entries = json.loads((tmp_path / "logs" / "mlperf_log_accuracy.json").read_text())
    got = {e["qsl_idx"]: int.from_bytes(bytes.fromhex(e["data"]), "little", signed=True) for e in entries}
    assert [got[i] for i in range(100)] == want.tolist()


# ---- the GPU worker's pipeline, with stand-ins for the runner slots ----

def model_top1(indices):
    """What the stand-in 'model' answers for a sample: a fixed function of its index."""
    return (np.asarray(indices) * 7 + 3) % 1000


class FakeGpu:
    """Stand-ins for runtime.offline._RunnerSlot: start() 'runs the batch' and writes its top-1 into the
    slot's array right away, as the asynchronous copy into the pinned array will by the time the event
    fires; wait() hands that array back. Were a slot started again before its top-1 was copied out, the
    next batch would overwrite the answers under the responder (the done() below checks after a pause). Failures: the
    n-th start (a launch error) or the n-th wait (an error the event reports), counted over all slots."""

    def __init__(self, batch: int, slots: int, fail_start: int | None = None, fail_wait: int | None = None,
                 batch_s: float = 0.0):
        self.lock = threading.Lock()
        self.starts = self.waits = 0
        self.fail_start, self.fail_wait = fail_start, fail_wait
        self.batch_s = batch_s  # how long a batch 'runs': wait() returns that long after start()
        self.slots = [FakeSlot(self, batch) for _ in range(slots)]

    def count(self, what: str) -> int:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)
            return getattr(self, what)


class FakeSlot:
    def __init__(self, gpu: FakeGpu, batch: int):
        self.gpu, self.top1 = gpu, np.full(batch, -1, np.int32)
        self.ready_at = 0.0

    def start(self, indices):
        if self.gpu.count("starts") == self.gpu.fail_start:
            raise RuntimeError("CUDA driver error CUDA_ERROR_LAUNCH_FAILED")
        self.top1[:] = model_top1(indices)
        self.ready_at = time.monotonic() + self.gpu.batch_s

    def wait(self):
        if self.gpu.count("waits") == self.gpu.fail_wait:
            raise RuntimeError("CUDA driver error CUDA_ERROR_ILLEGAL_ADDRESS")
        time.sleep(max(0.0, self.ready_at - time.monotonic()))
        return self.top1


class Responder:
    """done() for _GpuWorker without LoadGen: records each batch's answer (a copy taken after a pause,
    so an answer overwritten while being read shows up as wrong) and which query ids it covered."""

    def __init__(self, pause_s: float = 0.002):
        self.pause_s = pause_s
        self.lock = threading.Lock()
        self.answers = {}  # batch number -> top-1 list or None
        self.ids = collections.Counter()

    def done_for(self, batch_no: int):
        def done(ids, top1):
            time.sleep(self.pause_s)
            with self.lock:
                self.answers[batch_no] = None if top1 is None else np.array(top1).tolist()
                self.ids.update(ids)
        return done


def _submit(worker, responder, batches: int, batch: int):
    """Batches of sample indices 10 * b + i with query ids 1000 * b + i (the last one short, as LoadGen's
    last batch is, padded with repeats as issue_queries pads it)."""
    sent = {}
    for b in range(batches):
        n = batch if b < batches - 1 else batch - 3
        indices = np.arange(10 * b, 10 * b + n, dtype=np.int64)
        padded = np.concatenate([indices, np.repeat(indices[:1], batch - n)])
        sent[b] = (indices, [1000 * b + i for i in range(n)])
        worker.jobs.put((padded, sent[b][1], responder.done_for(b)))
    return sent


def test_gpu_worker_answers_every_query_once_with_its_own_top1():
    from trtfuse.runtime.offline import _GpuWorker

    gpu, responder = FakeGpu(batch=8, slots=3), Responder()
    worker = _GpuWorker(gpu.slots)
    sent = _submit(worker, responder, batches=20, batch=8)
    worker.close(timeout=10)
    assert not any(t.is_alive() for t in worker.threads) and worker.error is None
    assert gpu.starts == 20 and gpu.waits == 20
    assert sorted(responder.ids.elements()) == sorted(i for _, ids in sent.values() for i in ids)
    assert max(responder.ids.values()) == 1
    for b, (indices, _) in sent.items():  # only the real samples of the padded last batch are answered
        assert responder.answers[b] == model_top1(indices).tolist(), b


def test_gpus_sharing_one_queue_take_batches_as_they_free_runners():
    """Two GPUs, one three times slower per batch, drain one queue (as run_offline gives its GPU workers): the faster
    takes most of the batches instead of a half dealt in advance, every query is answered once with its own top-1, and
    close_workers ends both (each taking one of the Nones in the shared queue)."""
    from trtfuse.runtime.offline import JobFeed, _GpuWorker, close_workers

    jobs, responder = JobFeed(), Responder(pause_s=0.0)
    fast, slow = FakeGpu(batch=8, slots=2, batch_s=0.004), FakeGpu(batch=8, slots=2, batch_s=0.012)
    workers = [_GpuWorker(fast.slots, jobs=jobs), _GpuWorker(slow.slots, jobs=jobs)]
    assert workers[0].jobs is workers[1].jobs is jobs
    sent = _submit(workers[0], responder, batches=60, batch=8)
    close_workers(workers, timeout=10)
    assert not any(t.is_alive() for w in workers for t in w.threads) and all(w.error is None for w in workers)
    assert fast.starts + slow.starts == 60 and fast.starts >= 1.5 * slow.starts, (fast.starts, slow.starts)
    assert sorted(responder.ids.elements()) == sorted(i for _, ids in sent.values() for i in ids)
    assert max(responder.ids.values()) == 1
    for b, (indices, _) in sent.items():
        assert responder.answers[b] == model_top1(indices).tolist(), b


def test_job_feed_cuts_batches_only_as_they_are_taken():
    from trtfuse.runtime.offline import JobFeed

    feed, cut = JobFeed(), []

    def batches(n):
        for b in range(n):
            cut.append(b)
            yield b

    feed.put("single")
    feed.put_batches(batches(5))
    feed.put(None)
    assert feed.get() == "single" and cut == []
    assert [feed.get(), feed.get()] == [0, 1] and cut == [0, 1]  # nothing cut ahead of the takers
    assert [feed.get() for _ in range(3)] == [2, 3, 4] and feed.get() is None
    got = []
    taker = threading.Thread(target=lambda: got.append(feed.get()))
    taker.start()  # an empty feed blocks until a job comes
    time.sleep(0.05)
    assert got == []
    feed.put_batches(iter(["late"]))
    taker.join(5)
    assert got == ["late"]


def test_loadgen_over_gpus_sharing_a_job_feed(tmp_path):
    """Under LoadGen, two workers on one JobFeed (as run_offline's GPUs): every sample answered once with its own
    top-1, both workers taking batches."""
    from trtfuse.runtime.offline import JobFeed, _GpuWorker, run_loadgen

    feed, gpus = JobFeed(), [FakeGpu(batch=8, slots=2, batch_s=0.001) for _ in range(2)]
    workers = [_GpuWorker(g.slots, jobs=feed) for g in gpus]
    result = run_loadgen(workers, 45, 8, pad_last_batch=True, mode="accuracy", log_dir=str(tmp_path / "logs"),
                         expected_qps=2000.0, min_duration_s=0.2)
    assert result["accuracy_responses"] == 45 and result["samples_completed"] == 45
    assert all(g.starts > 0 for g in gpus) and not _loadgen_errors(tmp_path)
    entries = json.loads((tmp_path / "logs" / "mlperf_log_accuracy.json").read_text())
    got = {e["qsl_idx"]: int.from_bytes(bytes.fromhex(e["data"]), "little", signed=True) for e in entries}
    assert got == {i: int(model_top1(i)) for i in range(45)}


def test_runners_go_on_while_loadgen_is_still_answering():
    """While LoadGen is still busy with the first batch's responses, the runners are waited on, freed and
    launched again: all six batches run on three runners, and each answer, copied out before its runner was
    reused, is still its own batch's top-1."""
    from trtfuse.runtime.offline import _GpuWorker

    gpu, release = FakeGpu(batch=4, slots=3), threading.Event()
    answered = []

    def done(ids, top1):
        release.wait(10)
        answered.append((list(ids), top1.tolist()))

    worker = _GpuWorker(gpu.slots)
    for b in range(6):
        worker.jobs.put((np.arange(4 * b, 4 * b + 4), list(range(4 * b, 4 * b + 4)), done))
    deadline = time.monotonic() + 5
    while gpu.waits < 6 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert gpu.starts == 6 and gpu.waits == 6 and answered == []
    release.set()
    worker.close(timeout=10)
    assert answered == [(list(range(4 * b, 4 * b + 4)), model_top1(np.arange(4 * b, 4 * b + 4)).tolist()) for b in range(6)]
    assert worker.error is None


def test_a_failed_launch_is_reported_and_every_query_still_answered():
    from trtfuse.runtime.offline import _GpuWorker

    gpu, responder = FakeGpu(batch=8, slots=3, fail_start=3), Responder()
    worker = _GpuWorker(gpu.slots)
    sent = _submit(worker, responder, batches=10, batch=8)
    worker.close(timeout=10)
    assert isinstance(worker.error, RuntimeError) and "LAUNCH_FAILED" in str(worker.error)
    assert sorted(responder.ids.elements()) == sorted(i for _, ids in sent.values() for i in ids)
    assert max(responder.ids.values()) == 1
    # batches launched before the failure keep their answers; the failed one and all later are empty
    assert [responder.answers[b] for b in (0, 1)] == [model_top1(sent[b][0]).tolist() for b in (0, 1)]
    assert all(responder.answers[b] is None for b in range(2, 10)) and gpu.starts == 3


def test_a_failed_wait_is_reported_and_every_query_still_answered():
    from trtfuse.runtime.offline import _GpuWorker

    gpu, responder = FakeGpu(batch=8, slots=3, fail_wait=2), Responder()
    worker = _GpuWorker(gpu.slots)
    sent = _submit(worker, responder, batches=10, batch=8)
    worker.close(timeout=10)
    assert "ILLEGAL_ADDRESS" in str(worker.error)
    assert sorted(responder.ids.elements()) == sorted(i for _, ids in sent.values() for i in ids)
    assert max(responder.ids.values()) == 1
    assert responder.answers[0] == model_top1(sent[0][0]).tolist() and responder.answers[1] is None
    # batches already in flight when the wait failed finish normally; the rest are answered empty
    for b in range(2, 10):
        assert responder.answers[b] in (None, model_top1(sent[b][0]).tolist()), b


def test_a_failing_responder_does_not_stop_the_pipeline():
    from trtfuse.runtime.offline import _GpuWorker

    gpu, calls = FakeGpu(batch=4, slots=2), []

    def done(ids, top1):
        calls.append((list(ids), top1 is None))
        if len(calls) == 2:
            raise ValueError("responder broke")

    worker = _GpuWorker(gpu.slots)
    for b in range(5):
        worker.jobs.put((np.arange(4), [b], done))
    worker.close(timeout=10)
    assert isinstance(worker.error, ValueError)
    # each batch once, none re-answered (after the failure the launcher answers new batches empty at once,
    # so they may overtake ones still in flight)
    assert sorted(ids for ids, _ in calls) == [[b] for b in range(5)]


def _loadgen_run(tmp_path, mode, gpu, count=45, batch=8, answers="array"):
    from trtfuse.runtime.offline import _GpuWorker, run_loadgen

    worker = _GpuWorker(gpu.slots)
    return run_loadgen([worker], count, batch, pad_last_batch=True, mode=mode, log_dir=str(tmp_path / "logs"),
                       expected_qps=200.0, min_duration_s=0.2, answers=answers)


def _loadgen_errors(tmp_path) -> list:
    detail = (tmp_path / "logs" / "mlperf_log_detail.txt").read_text().splitlines()
    return [line for line in detail if '"is_error": true' in line]


@pytest.mark.parametrize("answers", ["array", "lists", "objects"])
def test_gpu_pipeline_under_loadgen_accuracy_mode(tmp_path, answers):
    """Every sample answered once, the response of each sample its own top-1 (the responses point into
    the slot's array at base + 4 * i), the short last batch padded and its padding not answered: LoadGen's own
    accuracy log says so, whether the query is read in place or as lists and the batch answered with one C++ call or
    an object per sample."""
    result = _loadgen_run(tmp_path, "accuracy", FakeGpu(batch=8, slots=3), answers=answers)
    assert result["accuracy_responses"] == 45 and result["samples_completed"] == 45
    assert result["answers"] == answers
    entries = json.loads((tmp_path / "logs" / "mlperf_log_accuracy.json").read_text())
    assert sorted(e["qsl_idx"] for e in entries) == list(range(45))
    for e in entries:
        assert int.from_bytes(bytes.fromhex(e["data"]), "little", signed=True) == model_top1(e["qsl_idx"])
    assert _loadgen_errors(tmp_path) == []


def test_gpu_pipeline_under_loadgen_performance_mode(tmp_path):
    result = _loadgen_run(tmp_path, "performance", FakeGpu(batch=8, slots=3))
    summary = result["loadgen_summary"]
    assert summary["Scenario"] == "Offline" and result["samples_completed"] == summary["samples_per_query"] > 0
    assert _loadgen_errors(tmp_path) == []
    t = result["timeline"]
    assert 0 < t["first_answer_ms"] <= 1000 * t["last_answer_s"] <= 1000 * result["wall_seconds"]
    assert t["steady_samples_per_s"] > 0 and len(t["samples_per_s_by_tenth"]) == 10


def test_a_query_is_cut_into_batches_one_at_a_time():
    from trtfuse.runtime.offline import cut_batches

    class Recorded(list):  # LoadGen's list of indices, recording how far it was read
        furthest = 0

        def __getitem__(self, key):
            Recorded.furthest = max(Recorded.furthest, key.stop if isinstance(key, slice) else key + 1)
            return list.__getitem__(self, key)

    ids = [1000 + i for i in range(10)]
    indices = Recorded(range(50, 60))
    batches = cut_batches(ids, indices, 4, pad_last_batch=True)
    first = next(batches)
    assert Recorded.furthest == 4  # the first batch is queued before the rest of the query is read
    rest = list(batches)
    assert [b[1] for b in [first] + rest] == [ids[0:4], ids[4:8], ids[8:10]]
    assert [b[0].tolist() for b in [first] + rest] == [[50, 51, 52, 53], [54, 55, 56, 57], [58, 59, 58, 58]]
    assert all(b[0].dtype == np.int64 for b in rest)
    assert [len(b[0]) for b in cut_batches(ids, list(range(10)), 4, pad_last_batch=False)] == [4, 4, 2]
    many = list(range(3000))  # across the growing chunks: every sample once, in order, in batches of 7
    cut = list(cut_batches([i + 1 for i in many], many, 7, pad_last_batch=False))
    assert np.concatenate([b[0] for b in cut]).tolist() == many and sum((b[1] for b in cut), []) == [i + 1 for i in many]
    assert {len(b[0]) for b in cut[:-1]} == {7} and len(cut[-1][0]) == 3000 % 7


def test_drive_workers_feeds_batches_without_loadgen_and_reports_failures():
    from trtfuse.runtime.offline import _GpuWorker, drive_workers

    gpu = FakeGpu(batch=8, slots=3)
    workers = [_GpuWorker(gpu.slots), _GpuWorker(FakeGpu(batch=8, slots=3).slots)]
    assert drive_workers(workers, 8, 40, samples=200) > 0
    assert gpu.starts == 6 + 13  # round-robin: its half of the warm-up (2 x 6 slots) and 13 of max(4 x 6, 200 / 8) = 25
    for w in workers:
        w.close()
    broken = _GpuWorker(FakeGpu(batch=8, slots=2, fail_wait=3).slots)
    with pytest.raises(RuntimeError, match="ILLEGAL_ADDRESS"):
        drive_workers([broken], 8, 40, samples=64)
    broken.close()


def test_drive_workers_times_at_least_min_seconds():
    from trtfuse.runtime.offline import _GpuWorker, drive_workers

    gpu = FakeGpu(batch=8, slots=3)
    worker = _GpuWorker(gpu.slots)
    start = time.perf_counter()
    assert drive_workers([worker], 8, 40, samples=8, min_seconds=0.2) > 0
    assert time.perf_counter() - start >= 0.2
    # the warm-up, then 12 batches, 24, 48, ... until one round lasts 0.2 s: each round twice the one before
    timed = gpu.starts - 6
    rounds = [12 * 2**k for k in range(12)]
    assert any(sum(rounds[: k + 1]) == timed for k in range(12)), timed
    worker.close()


def test_answer_timeline_separates_ramp_and_drain_from_the_steady_rate():
    from trtfuse.runtime.offline import answer_timeline

    # 100 batches of 10 samples, one every 10 ms after a 200 ms start-up, and a last one 100 ms late
    answered = [(5.0 + 0.2 + 0.01 * k, 10) for k in range(99)] + [(5.0 + 0.2 + 0.98 + 0.1, 10)]
    t = answer_timeline(5.0, answered)
    assert t["first_answer_ms"] == pytest.approx(200.0)
    assert t["steady_samples_per_s"] == pytest.approx(1000.0, rel=0.02)
    assert t["last_answer_s"] == pytest.approx(1.28)
    assert t["seconds_beyond_steady"] == pytest.approx(1.28 - 1.0, abs=0.02)
    assert t["samples_per_s_by_tenth"][0] < 600 and t["samples_per_s_by_tenth"][5] == pytest.approx(1000.0, rel=0.02)


@pytest.mark.parametrize("answers", ["array", "lists", "objects"])
def test_gpu_pipeline_failure_under_loadgen_is_one_error_after_the_run(tmp_path, answers):
    from trtfuse.errors import TrtfuseError

    gpu = FakeGpu(batch=8, slots=3, fail_wait=3)
    with pytest.raises(TrtfuseError, match="a worker failed: RuntimeError: CUDA driver error CUDA_ERROR_ILLEGAL_ADDRESS"):
        _loadgen_run(tmp_path, "accuracy", gpu, answers=answers)
    assert gpu.starts >= 3  # LoadGen got every query answered (else the run would not have returned)


def test_bench_harness_measures_the_harness_ceiling(tmp_path, capsys):
    # `trtfuse bench harness`: the real LoadGen and _GpuWorker over instant slots, no GPU.
    out = tmp_path / "harness.json"
    argv = ["bench", "harness", "--seconds", "0.05", "--batch", "8", "--count", "64", "--slots", "2", "-o", str(out), "--json"]
    assert main(argv) == 0
    rec = json.loads(out.read_text())
    # LoadGen's one Offline query: 1.1 x expected rate x duration samples, every one answered
    assert rec["samples_completed"] == 11000 and rec["samples_per_s"] > 0 and rec["slots"] == 2 and rec["batch"] == 8
    assert rec["command"] == shlex.join(["trtfuse", *argv])
    capsys.readouterr()
    assert main(["bench", "harness", "--slots", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_offline_scaling_runs_one_gpu_first_and_records_the_ratio(small_model, tmp_path, monkeypatch):
    """--scaling: the 1-GPU run of the same invocation first, in a process of its own (its expected QPS 1/N, its own
    log folder), then N GPUs; the record carries scaling_vs_1gpu and the 1-GPU verdict. The runs are stood in for (no
    GPU here); what is checked is what the command asks of them and what it records."""
    import trtfuse.plugins.cuda_driver as cd
    import trtfuse.runtime.offline as offline_mod

    calls = []

    def fake_baseline(args, count, min_duration, n):
        calls.append(offline_mod.one_gpu_baseline_argv(args, count, min_duration, n, "L1", "R1"))
        return {"gpus": 1, "samples_per_s": 70000.0, "result": "VALID", "min_duration_s": min_duration,
                "log_dir": "L1", "record": str(tmp_path / "one-gpu.json")}

    def fake_run(model, backend, data, count, batch, gpus, mode, log_dir, expected_qps, min_duration, **kw):
        calls.append((gpus, log_dir, expected_qps, kw["autotune"], kw["plans"]))
        return {"gpus": int(gpus), "samples_per_s": 266000.0, "result": "VALID", "min_duration_s": min_duration,
                "log_dir": log_dir}

    monkeypatch.setattr(offline_mod, "run_one_gpu_baseline", fake_baseline)
    monkeypatch.setattr(offline_mod, "run_offline", fake_run)
    monkeypatch.setattr(cd, "device_name", lambda *a: "stand-in GPU")
    monkeypatch.setattr(cd, "device_count", lambda *a: 4)
    out = tmp_path / "r.json"
    rc = main(["offline", "--model", str(small_model), "--backend", "cuda", "--gpus", "4", "--scaling", "--autotune",
               "--batch", "512", "--streams", "3", "--answers", "objects", "--unfuse", "stem-conv",
               "--expected-qps", "280000", "--min-duration", "300", "--log-dir", str(tmp_path / "logs"), "-o", str(out)])
    assert rc == 0
    child, parent = calls
    # the child's command line is a valid `trtfuse offline` one, with the invocation's settings on one GPU
    from trtfuse.cli import build_parser

    a = build_parser().parse_args(child)
    assert (a.gpus, a.expected_qps, a.min_duration, a.batch, a.streams, a.answers, a.autotune, a.log_dir, a.output) == (
        "1", 70000.0, 300.0, 512, 3, "objects", True, "L1", "R1")
    assert a.model == str(small_model) and a.backend == "cuda" and not a.scaling and a.unfuse == ["stem-conv"]
    # the N-GPU run takes the plans the 1-GPU run tuned, from its record, instead of tuning again
    assert parent == ("4", str(tmp_path / "logs"), 280000.0, False, str(tmp_path / "one-gpu.json"))
    rec = json.loads(out.read_text())
    assert rec["scaling_vs_1gpu"] == pytest.approx(3.8) and rec["one_gpu"]["result"] == "VALID"
    assert rec["min_duration_s"] == 300 and rec["gpus"] == 4


def test_the_scaling_baseline_runs_as_a_child_trtfuse_offline(small_model, tmp_path, monkeypatch):
    """run_one_gpu_baseline starts `python -m trtfuse.cli offline ...` and reads the record the child wrote; a failing
    child is one error line. Here the child is a real trtfuse offline run on onnxruntime (the CPU backend)."""
    import argparse

    import trtfuse.runtime.offline as offline_mod
    from trtfuse.errors import TrtfuseError

    args = argparse.Namespace(model=str(small_model), backend="onnxruntime", data="synthetic", streams=1,
                              mode="performance", answers="array", batch=None, expected_qps=100.0, plans=None,
                              autotune=False, log_dir=str(tmp_path / "logs"))
    one = offline_mod.run_one_gpu_baseline(args, 16, 0.2, 2)
    assert one["samples_per_s"] > 0 and one["result"] in ("VALID", "INVALID") and one["gpus"] == 0
    assert one["record"] == str(tmp_path / "logs" / "one-gpu.json") and (tmp_path / "logs" / "one-gpu" / "mlperf_log_summary.txt").exists()
    args.model = str(tmp_path / "missing.onnx")
    with pytest.raises(TrtfuseError, match="the 1-GPU run failed"):
        offline_mod.run_one_gpu_baseline(args, 16, 0.2, 2)


def test_offline_scaling_needs_several_gpus_and_a_gpu_backend(small_model, tmp_path, capsys):
    for extra in (["--backend", "onnxruntime"], ["--backend", "cuda", "--gpus", "1"]):
        rc = main(["offline", "--model", str(small_model), "--scaling", "--log-dir", str(tmp_path / "l"), *extra])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "--scaling" in err


def test_plan_sharing_tunes_once_per_kind_of_gpu():
    """plan_sharing_makers: the first runner of a kind of GPU plans (autotunes) itself; every other runner, on any GPU
    of that kind and in a later run with the same cache, gets its plans. A different kind of GPU tunes for itself."""
    from trtfuse.runtime.offline import plan_sharing_makers

    made = []

    class Runner:
        def __init__(self, gpu, plans_from):
            self.tuned = plans_from is None
            self.plans = [("conv", f"tuned on {gpu}")] if self.tuned else list(plans_from.plans)
            made.append(self)

    cache = {}
    names = ["H200", "H200", "H100"]
    makers = [plan_sharing_makers([n], lambda plans_from, d=d: Runner(d, plans_from), cache)[0] for d, n in enumerate(names)]
    for make in makers:  # as run_offline builds workers: each GPU's runners in turn
        for _ in range(3):
            make()
    assert [r.tuned for r in made] == [True, False, False, False, False, False, True, False, False]
    assert all(r.plans == [("conv", "tuned on 0")] for r in made[:6]) and made[8].plans == [("conv", "tuned on 2")]
    again = plan_sharing_makers(["H200"], lambda plans_from: Runner(9, plans_from), cache)[0]()
    assert not again.tuned and again.plans == [("conv", "tuned on 0")]


def test_loadgens_query_lists_are_kept_from_the_collector_during_the_run(tmp_path):
    """The query's id and index lists (an int each per sample) are frozen out of the cyclic collector while batches
    run, so its passes never walk them under the GIL, and thawed after the run."""
    import gc

    seen = []

    class CountingGpu(FakeGpu):
        pass

    gpu = CountingGpu(batch=8, slots=2)
    for slot in gpu.slots:
        start = slot.start
        slot.start = lambda indices, start=start: (seen.append(gc.get_freeze_count()), start(indices))[1]
    before = gc.get_freeze_count()
    result = _loadgen_run(tmp_path, "performance", gpu, answers="lists")
    assert result["answers"] == "lists"
    assert result["samples_completed"] > 0 and seen and min(seen) > before
    assert gc.get_freeze_count() == before


def test_the_offline_querys_lists_are_freed_after_the_run_not_during_it(tmp_path, monkeypatch):
    """Freeing an Offline query's id and index lists (an int object per sample) holds the GIL for a noticeable time
    in a long run; it must not happen inside LoadGen's timed run, where the last batch's launcher used to drop them."""
    import weakref

    import mlperf_loadgen as lg

    class TrackedList(list):  # a list that can be watched with a weak reference
        pass

    refs, alive_at_last_wait = [], []
    construct = lg.ConstructFastSUT

    def construct_watched(issue, flush):
        def issue_watched(ids, indices):
            ids, indices = TrackedList(ids), TrackedList(indices)
            refs.extend([weakref.ref(ids), weakref.ref(indices)])
            issue(ids, indices)
        return construct(issue_watched, flush)

    monkeypatch.setattr(lg, "ConstructFastSUT", construct_watched)
    gpu = FakeGpu(batch=8, slots=2)
    for slot in gpu.slots:
        wait = slot.wait
        slot.wait = lambda wait=wait: (alive_at_last_wait.append([r() is not None for r in refs]), wait())[1]
    result = _loadgen_run(tmp_path, "performance", gpu, answers="lists")
    assert result["samples_completed"] > 0 and len(refs) == 2
    assert all(all(alive) for alive in alive_at_last_wait)  # every batch, the last one included
    import gc

    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_accuracy_mode_builds_no_more_runners_than_the_run_has_batches():
    from trtfuse.runtime.offline import runners_needed

    assert runners_needed("accuracy", 6, 256, 4096) == 1
    assert runners_needed("accuracy", 6, 1000, 256) == 4
    assert runners_needed("accuracy", 2, 5000, 256) == 2
    assert runners_needed("performance", 6, 256, 4096) == 6  # LoadGen repeats samples: every runner launches


def test_a_gpu_out_of_memory_is_one_line_naming_the_sizes(monkeypatch):
    pytest.importorskip("cuda.bindings.driver", reason="needs cuda-python (pip install 'trtfuse[gpu]')")
    from trtfuse.errors import TrtfuseError
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.runtime import offline as offline_mod

    drv = cd._driver()
    with pytest.raises(cd.GpuOutOfMemory, match=r"^the GPU is out of memory \(CUDA_ERROR_OUT_OF_MEMORY\)$"):
        cd.check((drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY,))
    monkeypatch.setattr(cd, "context", lambda device: None)  # the driver's own check() raised it above

    def runner_too_large():
        cd.check((drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY,))

    with pytest.raises(TrtfuseError) as err:
        offline_mod._cuda_worker(runner_too_large, 4096, np.zeros((256, 3, 8, 8), np.float32), 0, 6)
    assert str(err.value) == ("GPU 0: 6 runner(s) at batch 4096 and 256 samples do not fit in its memory (the GPU is out "
                              "of memory (CUDA_ERROR_OUT_OF_MEMORY)): lower --batch, --streams or --count")


@pytest.mark.gpu
def test_bench_e2e_pipeline_only_times_a_given_model(tmp_path):
    """`bench e2e --pipeline-only --model`: the Offline pipeline without LoadGen on a rewritten model of another size
    than ResNet-50's 224 x 224, recorded with its command; no graph loop, no breakdown."""
    from trtfuse.plugins.cuda_driver import gpu_available

    ok, why = gpu_available()
    if not ok:
        pytest.skip(f"needs a CUDA GPU: {why}")
    save_tiny_rewritten(tmp_path / "all.onnx")
    out = tmp_path / "r.json"
    assert main(["bench", "e2e", "--pipeline-only", "--model", str(tmp_path / "all.onnx"), "--batch", "16", "--streams", "2",
                 "--seconds", "0.5", "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["offline_pipeline_samples_per_s"] > 0 and result["model"] == str(tmp_path / "all.onnx")
    assert "breakdown" not in result and "--pipeline-only" in result["command"]
    history = [json.loads(line) for line in (tmp_path / "e2e-history.jsonl").read_text().splitlines()]
    assert history[-1]["pipeline_only"] is True
