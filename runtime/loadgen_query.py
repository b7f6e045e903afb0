"""Receiving LoadGen's query as a view of its own sample array instead of two Python lists.

LoadGen's "fast" Python SUT copies each query's `std::vector<QuerySample>` into two `std::vector`s (response ids,
sample indices), which pybind11 then turns into two Python lists of ints, all under the GIL and after LoadGen has
started its clock. A 300 s Offline query holds about 30 million samples: on the H200 host that conversion put 2.8 s
between LoadGen's start and the harness's first look at the query (LoadGen's minimum latency against the harness's
own first answer), 0.9 % of the run. NVIDIA's C++ harness reads the vector where it lies; this module does the same
from Python.

`NativeSut` is a `mlperf::SystemUnderTest` laid out in ctypes memory: an object whose first word points into a
vtable of ctypes callbacks (complete and deleting destructors, `Name`, `IssueQuery`, `FlushQueries`: Itanium C++
ABI order, system_under_test.h), and a `std::string` for `Name` to return. LoadGen's Python binding passes SUT
handles as plain addresses (`StartTestWithLogSettings(uintptr_t sut, ...)` casts its argument and calls through the
vtable), so the object's address is handed to it like the binding's own SUT's. `IssueQuery` receives the vector by
reference: its first two words are the array's begin and end, read as a numpy array of (id, index) pairs without
a copy. The array belongs to the query, which LoadGen keeps until the test ends, and the callback's views must not
be used after `StartTest` returns.

`native_sut()` returns None, and the caller keeps the binding's SUT, wherever any assumption does not hold: not a
64-bit little-endian ELF module, a `std::string` of the old libstdc++ ABI, or a vtable of the binding's own fast SUT
whose slots are not, in this order, its destructors, `Name`, `IssueQuery` and `FlushQueries` as the module's symbol
table names them (read from the loaded module's memory, so the layout relied on is the one LoadGen was built with).
"""

from __future__ import annotations

import ctypes
import struct
import traceback

import numpy as np

from .loadgen_answers import loaded_module_symbols

# mlperf::QuerySample (query_sample.h): ResponseId id (uintptr_t), QuerySampleIndex index (size_t)
QUERY_SAMPLE_DTYPE = np.dtype([("id", "<u8"), ("index", "<u8")])

_FAST = "6mlperf12_GLOBAL__N_129FastSystemUnderTestTrampoline"
_BASE = "6mlperf12_GLOBAL__N_125SystemUnderTestTrampoline"
FAST_SUT_VTABLE = f"_ZTVN{_FAST}E"
# the fast SUT's vtable slots after offset-to-top and typeinfo, as its symbol table names them
FAST_SUT_SLOTS = (f"_ZN{_FAST}D1Ev", f"_ZN{_FAST}D0Ev", f"_ZN{_BASE}4NameEv",
                  f"_ZN{_FAST}10IssueQueryERKSt6vectorINS_11QuerySampleESaIS3_EE", f"_ZN{_BASE}12FlushQueriesEv")
# a function taking a std::string by value: its mangled name says which libstdc++ string ABI the module was built with
START_TEST_CXX11 = ("_ZN6mlperf9StartTestEPNS_15SystemUnderTestEPNS_18QuerySampleLibraryERKNS_12TestSettingsERKNS_11"
                    "LogSettingsENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE")

_VOID_OF_THIS = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_POINTER_OF_THIS = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
_ISSUE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class _Cxx11String(ctypes.Structure):
    """libstdc++'s std::string (the C++11 ABI): data pointer, length, 16-byte local buffer (used for short strings)."""
    _fields_ = [("data", ctypes.c_void_p), ("length", ctypes.c_size_t), ("local", ctypes.c_char * 16)]


def query_view(vector_address: int) -> np.ndarray:
    """The samples of the std::vector<QuerySample> at vector_address as a numpy array of QUERY_SAMPLE_DTYPE, sharing
    the vector's memory (libstdc++: the vector's first two words are its begin and end pointers)."""
    begin, end = struct.unpack("<QQ", ctypes.string_at(vector_address, 16))
    count = (end - begin) // QUERY_SAMPLE_DTYPE.itemsize
    if count == 0:
        return np.zeros(0, QUERY_SAMPLE_DTYPE)
    return np.frombuffer((ctypes.c_char * (count * QUERY_SAMPLE_DTYPE.itemsize)).from_address(begin),
                         dtype=QUERY_SAMPLE_DTYPE)


class NativeSut:
    """A mlperf::SystemUnderTest in ctypes memory: LoadGen's IssueQuery calls issue(ids, indices) with the query's
    response ids and sample indices as uint64 views of its own array; FlushQueries calls flush(). `handle` is what
    LoadGen's StartTest takes as its SUT. An exception in either callback is printed and kept in `errors` (it cannot
    cross into LoadGen)."""

    def __init__(self, name: str, issue, flush, typeinfo: int = 0):
        self._issue, self._flush = issue, flush
        self.errors: list[BaseException] = []
        encoded = name.encode()[:15]
        self._name = _Cxx11String()
        self._name.local = encoded
        self._name.length = len(encoded)
        self._name.data = ctypes.addressof(self._name) + _Cxx11String.local.offset
        self._callbacks = (_VOID_OF_THIS(lambda this: None), _VOID_OF_THIS(lambda this: None),
                           _POINTER_OF_THIS(lambda this: ctypes.addressof(self._name)),
                           _ISSUE(self._issue_query), _VOID_OF_THIS(self._flush_queries))
        self._vtable = (ctypes.c_void_p * (2 + len(self._callbacks)))(
            0, typeinfo, *(ctypes.cast(c, ctypes.c_void_p).value for c in self._callbacks))
        self._object = (ctypes.c_void_p * 1)(ctypes.addressof(self._vtable) + 2 * ctypes.sizeof(ctypes.c_void_p))

    @property
    def handle(self) -> int:
        return ctypes.addressof(self._object)

    def _issue_query(self, this, vector_address) -> None:
        try:
            samples = query_view(vector_address)
            self._issue(samples["id"], samples["index"])
        except BaseException as e:  # noqa: BLE001 - nothing may unwind into LoadGen's C++ thread
            traceback.print_exc()
            self.errors.append(e)

    def _flush_queries(self, this) -> None:
        try:
            self._flush()
        except BaseException as e:  # noqa: BLE001
            traceback.print_exc()
            self.errors.append(e)


def fast_sut_typeinfo(lg) -> int | None:
    """The typeinfo address in the binding's own fast SUT vtable, once every slot after it has been checked against
    the symbol table (see the module's docstring); None where any check fails."""
    found = loaded_module_symbols(lg, {FAST_SUT_VTABLE, START_TEST_CXX11, *FAST_SUT_SLOTS})
    if found is None:
        return None
    load_address, symbols = found
    words = struct.unpack(f"<{2 + len(FAST_SUT_SLOTS)}Q",
                          ctypes.string_at(load_address + symbols[FAST_SUT_VTABLE], 8 * (2 + len(FAST_SUT_SLOTS))))
    offset_to_top, typeinfo, slots = words[0], words[1], words[2:]
    if offset_to_top != 0 or slots != tuple(load_address + symbols[name] for name in FAST_SUT_SLOTS):
        return None
    return typeinfo


def native_sut(lg, issue, flush, name: str = "trtfuse") -> NativeSut | None:
    """A NativeSut for the loaded LoadGen module `lg`, or None where its layout cannot be confirmed."""
    typeinfo = fast_sut_typeinfo(lg)
    return None if typeinfo is None else NativeSut(name, issue, flush, typeinfo)
