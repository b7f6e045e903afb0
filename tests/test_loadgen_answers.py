"""runtime/loadgen_answers.py: LoadGen's C++ QuerySamplesComplete found in the loaded LoadGen module and called
with an array per batch. What it answers is checked against LoadGen's own accuracy log in tests/test_offline.py
(both answer paths); here: the address arithmetic against the kernel's map of the process, the refusals that keep
the Python binding, and the harness ceiling with each path."""

import json
import sys
import types
from pathlib import Path

import pytest

lg = pytest.importorskip("mlperf_loadgen", reason="mlcommons-loadgen is not installed")

from trtfuse.runtime import loadgen_answers as la  # noqa: E402


def _mappings(path: str) -> list[tuple[int, int, str, int]]:
    """(start, end, permissions, file offset) of every mapping of `path` in this process (/proc/self/maps)."""
    real = str(Path(path).resolve())
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5] == real:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end, fields[1], int(fields[2], 16)))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_function_address_lies_in_the_loadgen_modules_executable_mapping():
    answerer = la.native_answerer(lg)
    assert answerer is not None, "the installed LoadGen should allow one C++ call per batch"
    symbols = la.elf_function_symbols(lg.__file__, {la.QUERY_SAMPLES_COMPLETE, la.MODULE_INIT})
    maps = _mappings(lg.__file__)
    load_address = min(start for start, _end, _perm, offset in maps if offset == 0)
    address = load_address + symbols[la.QUERY_SAMPLES_COMPLETE]
    assert any(start <= address < end and "x" in perm for start, end, perm, _off in maps)
    # the module's exported init function, found by the dynamic loader, sits where the symbol table says
    import ctypes

    init = ctypes.cast(getattr(ctypes.CDLL(lg.__file__), la.MODULE_INIT), ctypes.c_void_p).value
    assert init == load_address + symbols[la.MODULE_INIT]
    assert ctypes.cast(answerer._call, ctypes.c_void_p).value == address


def test_the_response_array_has_loadgens_struct_layout():
    # query_sample.h: id, data, size (uintptr_t, uintptr_t, size_t) and int64 n_tokens, no padding
    assert la.RESPONSE_DTYPE.itemsize == 32 and list(la.RESPONSE_DTYPE.names) == ["id", "data", "size", "n_tokens"]
    r = lg.QuerySampleResponse(11, 22, 33, 44)
    assert (r.id, r.data, r.size, r.n_tokens) == (11, 22, 33, 44)


def test_no_answerer_where_the_module_is_not_what_was_checked(tmp_path):
    not_elf = tmp_path / "mlperf_loadgen.so"
    not_elf.write_text("not a shared object")
    assert la.native_answerer(types.SimpleNamespace(__file__=str(not_elf), QuerySampleResponse=lg.QuerySampleResponse)) is None
    # an ELF module without LoadGen's function (here one of numpy's)
    import numpy.linalg._umath_linalg as other

    assert la.native_answerer(types.SimpleNamespace(__file__=other.__file__, QuerySampleResponse=lg.QuerySampleResponse)) is None

    class OldResponse:  # LoadGen before 4.1: no n_tokens, a 24-byte struct
        def __init__(self, *args):
            self.id = self.data = self.size = 0

    assert la.native_answerer(types.SimpleNamespace(__file__=lg.__file__, QuerySampleResponse=OldResponse)) is None
    with pytest.raises(ValueError, match="not a 64-bit"):
        la.elf_function_symbols(str(not_elf), {la.MODULE_INIT})


def test_an_unknown_answer_path_is_refused(tmp_path):
    from trtfuse.errors import TrtfuseError
    from trtfuse.runtime.offline import _GpuWorker, run_loadgen, close_workers

    from test_offline import FakeGpu

    worker = _GpuWorker(FakeGpu(batch=8, slots=2).slots)
    try:
        with pytest.raises(TrtfuseError, match="--answers 'tuples': one of array, lists, objects"):
            run_loadgen([worker], 16, 8, pad_last_batch=True, mode="performance", log_dir=str(tmp_path / "l"),
                        expected_qps=100.0, min_duration_s=0.1, answers="tuples")
    finally:
        close_workers([worker])


def test_bench_harness_with_each_answer_path(tmp_path):
    from trtfuse.cli import main

    for answers in ("array", "lists", "objects"):
        out = tmp_path / f"{answers}.json"
        assert main(["bench", "harness", "--seconds", "0.05", "--batch", "8", "--count", "64", "--slots", "2",
                     "--answers", answers, "-o", str(out), "--json"]) == 0
        rec = json.loads(out.read_text())
        assert rec["answers"] == answers and rec["samples_completed"] == 11000
