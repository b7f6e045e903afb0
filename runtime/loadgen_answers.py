"""Answering LoadGen with one C++ call per batch instead of one Python object per sample.

LoadGen's Python binding takes a list of `QuerySampleResponse` objects, which pybind11 copies into a
`std::vector` before it releases the GIL: about 1.2 us a sample on this repository's CI machine, all of it under
the one GIL. At the 340,000 samples/s of four H200s that is a core's worth of interpreter time, taken from the
threads that launch the GPUs' graphs. NVIDIA's harness, written in C++, hands LoadGen's
`mlperf::QuerySamplesComplete(QuerySampleResponse*, size_t, const ResponseCallback&)` an array per batch; this
module calls that same function, in the LoadGen module already loaded, through ctypes with a numpy array of
responses (ctypes releases the GIL for the call, so LoadGen's per-sample bookkeeping runs beside the feeders).

The function is not exported, so its address is the module's load address plus its value in the module's ELF
symbol table (read here). `native_answerer()` returns None, and the caller keeps the Python binding, wherever any
assumption does not hold: not an ELF module with a symbol table, the symbol absent or not a function, or a binding
whose `QuerySampleResponse` lacks the `n_tokens` field that makes the struct four 8-byte words (LoadGen 4.1 and
later). The empty `ResponseCallback` passed is a zeroed std::function (libstdc++: no manager means empty), which is
how manylinux wheels are built.
"""

from __future__ import annotations

import ctypes
import struct
import sys

import numpy as np

QUERY_SAMPLES_COMPLETE = "_ZN6mlperf20QuerySamplesCompleteEPNS_19QuerySampleResponseEmRKSt8functionIFvS1_EE"
MODULE_INIT = "PyInit_mlperf_loadgen"

# mlperf::QuerySampleResponse (query_sample.h): id, data, size, n_tokens
RESPONSE_DTYPE = np.dtype([("id", "<u8"), ("data", "<u8"), ("size", "<u8"), ("n_tokens", "<i8")])
STD_FUNCTION_BYTES = 32  # sizeof(std::function<...>) in libstdc++ on 64-bit


def elf_function_symbols(path: str, names: set[str]) -> dict[str, int]:
    """{name: value} of the FUNC symbols in `names` found in the ELF64 little-endian file's .symtab (absent: not
    there). Raises ValueError where the file is not such an ELF."""
    return elf_symbols(path, names, kinds=(STT_FUNC,))


STT_OBJECT, STT_FUNC = 1, 2


def elf_symbols(path: str, names: set[str], kinds: tuple[int, ...] = (STT_OBJECT, STT_FUNC)) -> dict[str, int]:
    """{name: value} of the symbols in `names` of the given types (STT_FUNC, STT_OBJECT: functions, data such as a
    vtable) with a nonzero value, from the ELF64 little-endian file's .symtab. Raises ValueError where the file is not
    such an ELF."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    found: dict[str, int] = {}
    wanted = {n.encode() for n in names}
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != 2 or entsize != 24:  # SHT_SYMTAB of Elf64_Sym
            continue
        strtab_offset = sections[link][4]
        symbols = np.frombuffer(data, dtype=np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"),
                                                      ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")]),
                                count=size // 24, offset=offset)
        wanted_kind = np.isin(symbols["info"] & 0xF, kinds)
        for entry in symbols[wanted_kind & (symbols["value"] != 0)]:
            start = strtab_offset + int(entry["name"])
            name = data[start : data.index(b"\0", start)]
            if name in wanted:
                found[name.decode()] = int(entry["value"])
    return found


class NativeAnswerer:
    """Calls LoadGen's C++ QuerySamplesComplete with a batch's responses in one array."""

    def __init__(self, address: int):
        self._call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)(address)
        self._empty_callback = ctypes.create_string_buffer(STD_FUNCTION_BYTES)  # zeroed: an empty std::function

    def answer(self, ids: np.ndarray, data_address: int = 0, item_bytes: int = 0) -> None:
        """Complete the samples `ids` (LoadGen's response ids), the i-th one's answer the `item_bytes` bytes at
        data_address + i * item_bytes (LoadGen copies them inside the call, where it keeps them at all); no data
        (a failed batch's) where item_bytes is 0."""
        responses = np.zeros(len(ids), RESPONSE_DTYPE)
        responses["id"] = ids
        responses["data"] = data_address + item_bytes * np.arange(len(ids), dtype=np.uint64)
        responses["size"] = item_bytes
        self._call(responses.ctypes.data, len(responses), ctypes.addressof(self._empty_callback))


def loaded_module_symbols(lg, names: set[str], kinds: tuple[int, ...] = (STT_OBJECT, STT_FUNC)) -> tuple[int, dict[str, int]] | None:
    """(load address, {name: value}) of the loaded module `lg` (a 64-bit little-endian ELF) and the symbols `names`
    of the given types in its symbol table, the load address from its exported init function's; None unless every
    name is there."""
    path = getattr(lg, "__file__", None)
    if not path or sys.byteorder != "little" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        symbols = elf_symbols(path, set(names) | {MODULE_INIT}, kinds)
        library = ctypes.CDLL(path)  # already loaded: the same handle, nothing runs
        init_address = ctypes.cast(getattr(library, MODULE_INIT), ctypes.c_void_p).value
    except (OSError, ValueError, AttributeError, struct.error):
        return None
    if not init_address or not all(name in symbols for name in (*names, MODULE_INIT)):
        return None
    return init_address - symbols[MODULE_INIT], symbols


def native_answerer(lg) -> NativeAnswerer | None:
    """A NativeAnswerer into the loaded LoadGen module `lg`, or None where it cannot be found with certainty (see
    the module's docstring)."""
    if not hasattr(lg.QuerySampleResponse(), "n_tokens"):
        return None
    found = loaded_module_symbols(lg, {QUERY_SAMPLES_COMPLETE}, kinds=(STT_FUNC,))
    if found is None:
        return None
    load_address, symbols = found
    return NativeAnswerer(load_address + symbols[QUERY_SAMPLES_COMPLETE])
