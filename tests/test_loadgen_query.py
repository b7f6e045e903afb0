"""runtime/loadgen_query.py: a SUT of LoadGen's C++ interface that reads the query where LoadGen holds it. Checked
against LoadGen itself: the vtable layout read from the installed module, and the same test run through the binding's
own fast SUT and through ours giving the same sample indices, with LoadGen's summary naming our SUT."""

import ctypes
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pytest

lg = pytest.importorskip("mlperf_loadgen", reason="mlcommons-loadgen is not installed")

from trtfuse.runtime import loadgen_query as lq  # noqa: E402


def _offline_query(tmp_path: Path, name: str, construct) -> tuple[list, str]:
    """Run LoadGen's Offline test (fixed seeds: the same query every time) with the SUT `construct(issue, flush)`
    returns, answering each query at once; (the (ids, indices) copies it was issued, LoadGen's summary text)."""
    issued = []

    def issue(ids, indices):
        issued.append((np.array(ids, dtype=np.uint64), np.array(indices, dtype=np.uint64)))
        lg.QuerySamplesComplete([lg.QuerySampleResponse(int(i), 0, 0) for i in ids])

    sut, destroy = construct(issue, lambda: None)
    qsl = lg.ConstructQSL(64, 64, lambda s: None, lambda s: None)
    settings = lg.TestSettings()
    settings.scenario, settings.mode = lg.TestScenario.Offline, lg.TestMode.PerformanceOnly
    # 1.1 x 2000/s x 50 ms = 110 samples
    settings.offline_expected_qps, settings.min_duration_ms, settings.min_query_count = 2000, 50, 1
    log = lg.LogSettings()
    log.log_output.outdir = str(tmp_path / name)
    log.log_output.copy_summary_to_stdout = False
    (tmp_path / name).mkdir()
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log)
    finally:
        lg.DestroyQSL(qsl)
        destroy()
    return issued, (tmp_path / name / "mlperf_log_summary.txt").read_text()


def test_the_native_sut_is_issued_the_query_the_bindings_own_sut_is(tmp_path):
    def binding(issue, flush):
        sut = lg.ConstructFastSUT(issue, flush)
        return sut, lambda: lg.DestroyFastSUT(sut)

    kept = []

    def native(issue, flush):
        sut = lq.native_sut(lg, issue, flush)
        assert sut is not None, "the installed LoadGen's fast SUT layout should be confirmed"
        kept.append(sut)
        return sut.handle, lambda: None

    theirs, _ = _offline_query(tmp_path, "binding", binding)
    ours, summary = _offline_query(tmp_path, "native", native)
    assert len(theirs) == len(ours) == 1 and kept[0].errors == []
    (their_ids, their_indices), (our_ids, our_indices) = theirs[0], ours[0]
    assert len(our_indices) == 110 and np.array_equal(our_indices, their_indices)
    assert len(set(our_ids.tolist())) == len(our_ids) and our_ids.min() > 0  # LoadGen's per-sample response ids
    assert "SUT name : trtfuse" in summary and "Result is" in summary


def test_query_view_shares_the_vectors_memory():
    samples = np.zeros(5, lq.QUERY_SAMPLE_DTYPE)
    samples["id"], samples["index"] = np.arange(100, 105), np.arange(5)[::-1]
    begin = samples.ctypes.data
    vector = (ctypes.c_uint64 * 3)(begin, begin + samples.nbytes, begin + samples.nbytes)  # begin, end, capacity
    view = lq.query_view(ctypes.addressof(vector))
    assert view["id"].tolist() == [100, 101, 102, 103, 104] and view["index"].tolist() == [4, 3, 2, 1, 0]
    samples["index"][0] = 77
    assert view["index"][0] == 77  # not a copy
    empty = (ctypes.c_uint64 * 3)(0, 0, 0)
    assert len(lq.query_view(ctypes.addressof(empty))) == 0


def test_an_error_in_the_callback_is_kept_not_thrown_into_loadgen(capsys):
    def issue(ids, indices):
        raise RuntimeError("cannot cut")

    sut = lq.NativeSut("t", issue, lambda: None)
    empty = (ctypes.c_uint64 * 3)(0, 0, 0)
    vtable = ctypes.cast(ctypes.c_void_p.from_address(sut.handle).value, ctypes.POINTER(ctypes.c_void_p))
    issue_slot = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(vtable[3])  # IssueQuery
    issue_slot(sut.handle, ctypes.addressof(empty))
    assert [str(e) for e in sut.errors] == ["cannot cut"] and "cannot cut" in capsys.readouterr().err
    name = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(vtable[2])(sut.handle)  # Name: a std::string
    data, length = struct.unpack("<QQ", ctypes.string_at(name, 16))
    assert ctypes.string_at(data, length) == b"t"


def test_no_native_sut_where_the_layout_is_not_confirmed(tmp_path):
    not_elf = tmp_path / "mlperf_loadgen.so"
    not_elf.write_text("not a shared object")
    assert lq.native_sut(types.SimpleNamespace(__file__=str(not_elf)), None, None) is None
    import numpy.linalg._umath_linalg as other  # an ELF module without LoadGen's symbols

    assert lq.native_sut(types.SimpleNamespace(__file__=other.__file__), None, None) is None
    assert lq.native_sut(types.SimpleNamespace(), None, None) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_checked_vtable_lies_in_the_loadgen_module():
    typeinfo = lq.fast_sut_typeinfo(lg)
    assert typeinfo is not None
    real = str(Path(lg.__file__).resolve())
    spans = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in Path("/proc/self/maps").read_text().splitlines()
             if line.split()[-1] == real]
    assert any(start <= typeinfo < end for start, end in spans)
