"""The little of the CUDA driver API trtfuse needs, through cuda-python (cuda.bindings.driver):
the primary context, device buffers, pinned host arrays, streams, events and loaded modules. Everything that launches
our kernels (tests, benchmarks, the GPU runner, TensorRT's JIT `impl`) goes through here."""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

from ..errors import TrtfuseError
from .layout import round_up


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        raise TrtfuseError("cuda-python is not installed: pip install 'trtfuse[gpu]'") from None
    return driver


class GpuOutOfMemory(TrtfuseError):
    """The GPU has no room for an allocation: the user's sizes (batch, runners in flight) are too large for it, not a
    fault of ours, so it is a one-line error. Callers that know those sizes re-raise it naming them."""


def check(result):
    """Unpack a cuda-python (err, *values) tuple, raising on error."""
    drv = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        if err == drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise GpuOutOfMemory("the GPU is out of memory (CUDA_ERROR_OUT_OF_MEMORY)")
        _, name = drv.cuGetErrorName(err)
        raise RuntimeError(f"CUDA driver error {name.decode() if name else err}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@lru_cache(maxsize=None)
def _primary_context(device_ordinal: int):
    drv = _driver()
    check(drv.cuInit(0))
    return check(drv.cuDevicePrimaryCtxRetain(check(drv.cuDeviceGet(device_ordinal))))


def context(device_ordinal: int | None = None):
    """The device's primary context (shared with PyTorch/CuPy), made current on this thread.

    With no device named: keep whatever context is current (a worker for GPU 1 set its own), else
    make GPU 0's current. Everything that allocates or loads calls this, so with several GPUs each
    object lands on the GPU whose context its creator made current."""
    drv = _driver()
    if device_ordinal is None:
        check(drv.cuInit(0))
        current = check(drv.cuCtxGetCurrent())
        if current is not None and int(current) != 0:
            return current
        device_ordinal = 0
    ctx = _primary_context(device_ordinal)
    check(drv.cuCtxSetCurrent(ctx))
    return ctx


def current_device() -> int:
    context()
    return int(check(_driver().cuCtxGetDevice()))


def gpu_available() -> tuple[bool, str]:
    """(available, reason) without raising: for tests that skip cleanly."""
    try:
        drv = _driver()
    except TrtfuseError as exc:
        return False, str(exc)
    try:
        err, = drv.cuInit(0)
    except Exception as exc:  # no libcuda.so at all (a CPU-only machine)
        return False, f"no NVIDIA driver ({type(exc).__name__})"
    if err != drv.CUresult.CUDA_SUCCESS:
        return False, f"no CUDA driver/GPU (cuInit: {err.name})"
    err, count = drv.cuDeviceGetCount()
    if err != drv.CUresult.CUDA_SUCCESS or count == 0:
        return False, "no CUDA device"
    return True, ""


def device_count() -> int:
    return int(check(_driver().cuDeviceGetCount()))


@lru_cache(maxsize=None)
def device_attribute(name: str, device_ordinal: int = 0) -> int:
    drv = _driver()
    check(drv.cuInit(0))  # no context needed, and none is made current (that would switch GPUs)
    attr = getattr(drv.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return check(drv.cuDeviceGetAttribute(attr, check(drv.cuDeviceGet(device_ordinal))))


def compute_capability(device_ordinal: int = 0) -> str:
    return f"sm_{device_attribute('COMPUTE_CAPABILITY_MAJOR', device_ordinal)}{device_attribute('COMPUTE_CAPABILITY_MINOR', device_ordinal)}"


def device_name(device_ordinal: int = 0) -> str:
    drv = _driver()
    check(drv.cuInit(0))
    name = check(drv.cuDeviceGetName(256, check(drv.cuDeviceGet(device_ordinal))))
    return name.split(b"\0")[0].decode()


def pci_bus_id(device_ordinal: int = 0) -> str:
    """The GPU's PCI bus id (domain:bus:device.function), by which NVML and nvidia-smi know it: their order need not be CUDA's."""
    drv = _driver()
    check(drv.cuInit(0))
    bus_id = check(drv.cuDeviceGetPCIBusId(32, check(drv.cuDeviceGet(device_ordinal))))
    return bus_id.split(b"\0")[0].decode()


class _DriverMemory:
    """Memory the driver allocated at `ptr`, released once (free(), or when the object is collected)."""

    ptr = 0

    def _release(self) -> None:
        raise NotImplementedError

    def free(self) -> None:
        if self.ptr:
            self._release()
            self.ptr = 0

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass


class DeviceBuffer(_DriverMemory):
    """Owned device memory: upload numpy, download numpy, fill bytes."""

    def __init__(self, nbytes: int):
        context()
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(check(_driver().cuMemAlloc(self.nbytes)))

    @classmethod
    def from_array(cls, array: np.ndarray, stream=None) -> "DeviceBuffer":
        array = np.ascontiguousarray(array)
        buf = cls(array.nbytes)
        buf.upload(array)
        return buf

    def upload(self, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        assert array.nbytes <= self.nbytes
        check(_driver().cuMemcpyHtoD(self.ptr, array.ctypes.data, array.nbytes))

    def download(self, shape, dtype, stream=None) -> np.ndarray:
        """Copy to a new host array. With a stream: ordered after that stream's work only (a plain
        cuMemcpyDtoH runs on the legacy default stream, which waits for every blocking stream: with two
        CUDA graphs in flight, fetching one runner's logits would wait for the other runner's forward)."""
        out = np.empty(shape, dtype=dtype)
        drv = _driver()
        if stream is None:
            check(drv.cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes))
        else:
            check(drv.cuMemcpyDtoHAsync(out.ctypes.data, self.ptr, out.nbytes, stream))
            check(drv.cuStreamSynchronize(stream))
        return out

    def fill(self, byte: int) -> None:
        check(_driver().cuMemsetD8(self.ptr, byte & 0xFF, self.nbytes))

    def _release(self) -> None:
        check(_driver().cuMemFree(self.ptr))


def _device_location(device_ordinal: int):
    drv = _driver()
    prop = drv.CUmemAllocationProp()
    prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device_ordinal
    return prop


@lru_cache(maxsize=None)
def allocation_granularity(device_ordinal: int) -> int:
    """The bytes a physical allocation and a mapping come in (cuMemGetAllocationGranularity; 2 MB on NVIDIA's GPUs)."""
    drv = _driver()
    return int(check(drv.cuMemGetAllocationGranularity(
        _device_location(device_ordinal), drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))


class PhysicalMemory:
    """Device memory with no address of its own, in chunks of the allocation granularity (one cuMemCreate each):
    VirtualBuffer ranges map slices of it. cuMemMap maps an allocation only from its start, so a slice is mapped chunk
    by chunk. The memory lives on until its handles are released and the last mapping of each chunk is gone."""

    def __init__(self, nbytes: int, device_ordinal: int):
        context()
        self.chunk = allocation_granularity(device_ordinal)
        self.device = device_ordinal
        self.handles = []
        try:
            for _ in range(round_up(max(int(nbytes), 1), self.chunk) // self.chunk):
                self.handles.append(check(_driver().cuMemCreate(self.chunk, _device_location(device_ordinal), 0)))
        except BaseException:
            self.free()
            raise
        self.nbytes = len(self.handles) * self.chunk

    def free(self) -> None:
        while self.handles:
            check(_driver().cuMemRelease(self.handles.pop()))

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass


class VirtualBuffer(DeviceBuffer):
    """Device memory whose address is fixed when it is created and whose backing comes later: a reserved virtual range
    (cuMemAddressReserve), unbacked until back_private() maps memory of its own or back_with() a slice of a shared
    PhysicalMemory. Kernels, graphs and tensor maps may take `ptr` before either: only running them needs the
    backing. Buffers whose lives do not overlap can so share memory (runtime/gpu_runner.py, share_activations)."""

    def __init__(self, nbytes: int):
        context()
        self.nbytes = max(int(nbytes), 1)
        self.device = current_device()
        gran = allocation_granularity(self.device)
        self.span = round_up(self.nbytes, gran)
        self.ptr = int(check(_driver().cuMemAddressReserve(self.span, gran, 0, 0)))
        self.backing: PhysicalMemory | None = None  # the shared memory it maps a slice of (None: its own, or none)
        self._mapped: list[tuple[int, int]] = []  # (address, bytes) of its mappings, each unmapped whole

    def back_private(self) -> None:
        """Memory of its own, if it has none yet (one allocation, its handle released once mapped: the mapping keeps it)."""
        if not self._mapped:
            drv = _driver()
            handle = check(drv.cuMemCreate(self.span, _device_location(self.device), 0))
            try:
                self._map_at(self.ptr, self.span, handle)
            finally:
                check(drv.cuMemRelease(handle))
            self._allow_access()

    def back_with(self, physical: PhysicalMemory, offset: int) -> None:
        """Bytes offset .. offset + span of `physical` (offset a multiple of its chunk), in place of any backing it had
        (which is given back)."""
        if offset % physical.chunk or self.span % physical.chunk or offset + self.span > physical.nbytes:
            raise ValueError(f"a slice at {offset} of {self.span} bytes does not fit {physical.nbytes} in {physical.chunk}-byte chunks")
        self._unmap()
        first = offset // physical.chunk
        for k in range(self.span // physical.chunk):
            self._map_at(self.ptr + k * physical.chunk, physical.chunk, physical.handles[first + k])
        self._allow_access()
        self.backing = physical

    def unback(self) -> None:
        """Give its memory back (the address stays reserved): it must not be touched again until backed."""
        self._unmap()

    def _map_at(self, address: int, size: int, handle) -> None:
        check(_driver().cuMemMap(address, size, 0, handle, 0))
        self._mapped.append((address, size))

    def _allow_access(self) -> None:
        drv = _driver()
        access = drv.CUmemAccessDesc()
        access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = self.device
        access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        check(drv.cuMemSetAccess(self.ptr, self.span, [access], 1))

    def _unmap(self) -> None:
        while self._mapped:
            check(_driver().cuMemUnmap(*self._mapped.pop()))
        self.backing = None

    def _release(self) -> None:
        self._unmap()
        check(_driver().cuMemAddressFree(self.ptr, self.span))


class PinnedArray(_DriverMemory):
    """A numpy array in page-locked host memory (cuMemHostAlloc): copies into it on a stream are truly
    asynchronous (a pageable destination makes cuMemcpyDtoHAsync wait for the copy on the host).

    `array` is a view of memory this object owns: it must not be used after free() or once the object
    is gone."""

    def __init__(self, shape, dtype):
        context()
        self.dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.nbytes = max(int(np.prod(shape)) * self.dtype.itemsize, 1)
        self.ptr = int(check(_driver().cuMemHostAlloc(self.nbytes, 0)))
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.ptr)
        self.array = np.frombuffer(raw, dtype=np.uint8)[: int(np.prod(shape)) * self.dtype.itemsize].view(self.dtype).reshape(shape)

    def _release(self) -> None:
        self.array = None
        check(_driver().cuMemFreeHost(self.ptr))


def download_async(dst: np.ndarray, src_ptr: int, stream) -> None:
    """Enqueue a copy of dst.nbytes bytes from device memory into the C-contiguous host array `dst` on
    `stream`; asynchronous only when `dst` is pinned (PinnedArray.array), and `dst` must stay untouched
    until the stream has passed the copy (an Event recorded after it)."""
    if not dst.flags.c_contiguous:
        raise ValueError("download_async needs a C-contiguous destination")
    check(_driver().cuMemcpyDtoHAsync(dst.ctypes.data, src_ptr, dst.nbytes, stream))


def copy_device(dst_ptr: int, src_ptr: int, nbytes: int, stream) -> None:
    """Enqueue a device-to-device copy of nbytes on `stream`."""
    check(_driver().cuMemcpyDtoDAsync(dst_ptr, src_ptr, nbytes, stream))


def ipc_handle(ptr: int) -> bytes:
    """The CUDA IPC handle (64 bytes) of a cuMemAlloc allocation, for another process on this machine (Triton's
    CUDA shared-memory registration) to map the same device memory."""
    import ctypes

    handle = check(_driver().cuIpcGetMemHandle(ptr))
    if hasattr(handle, "reserved"):  # cuda-bindings 12: the bytes as (signed) chars
        return bytes(b & 0xFF for b in handle.reserved)
    return ctypes.string_at(handle.getPtr(), 64)  # cuda-bindings 13: the struct's address only


class Event:
    """A CUDA event for ordering only (no timing). Waiting on it blocks the thread in the driver instead
    of spinning, which leaves the CPU to the Python threads that feed the GPU; cuda-python releases the
    GIL inside the wait."""

    def __init__(self):
        drv = _driver()
        context()
        flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING | drv.CUevent_flags.CU_EVENT_BLOCKING_SYNC
        self.handle = check(drv.cuEventCreate(int(flags)))

    def record(self, stream) -> None:
        check(_driver().cuEventRecord(self.handle, stream))

    def synchronize(self) -> None:
        check(_driver().cuEventSynchronize(self.handle))


class Module:
    """A loaded cubin/PTX image and its functions."""

    def __init__(self, image: bytes):
        context()
        self.module = check(_driver().cuModuleLoadData(image))
        self._functions = {}

    def function(self, name: str, dynamic_smem: int = 0):
        drv = _driver()
        fn = self._functions.get(name)
        if fn is None:
            fn = check(drv.cuModuleGetFunction(self.module, name.encode()))
            self._functions[name] = fn
        if dynamic_smem > 48 * 1024:  # above 48 KB a kernel must opt in
            check(drv.cuFuncSetAttribute(fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem))
        return fn


_kernel_modules: dict[tuple, Module] = {}


def kernel_module(source: str, defines: dict | None = None, device_ordinal: int | None = None,
                  include_dirs: tuple = (), arch: str | None = None) -> Module:
    """plugins/kernels/<source> (or a source of `include_dirs`: the bench's probes) compiled for this GPU (NVRTC,
    disk-cached) and loaded, once per process. arch: another target than the GPU's own sm_XY, such as sm_90a."""
    from .nvrtc import compile_kernel

    device = current_device() if device_ordinal is None else device_ordinal
    context(device)
    arch = arch or compute_capability(device)
    key = (source, tuple(sorted((defines or {}).items())), arch, device, tuple(map(str, include_dirs)))  # a module belongs to one context
    if key not in _kernel_modules:
        _kernel_modules[key] = Module(compile_kernel(source, defines or {}, arch, "cubin", include_dirs=include_dirs).image)
    return _kernel_modules[key]


_occupancy: dict = {}


def max_active_blocks(fn, threads: int, dynamic_smem: int) -> int:
    """CTAs of `fn` resident per SM at once (the driver's occupancy calculator), cached."""
    key = (int(fn), threads, dynamic_smem)
    if key not in _occupancy:
        _occupancy[key] = check(_driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, dynamic_smem))
    return _occupancy[key]


def launch(fn, grid, block, shared_bytes: int, stream, arg_pointers: list[int], programmatic: bool = False) -> None:
    """cuLaunchKernel with kernelParams given as host addresses of each argument's bytes. `programmatic`: the
    grid may start before the previous one in the stream completes (programmatic stream serialization; the kernel
    itself waits, griddepcontrol.wait, before it touches what that grid writes or reads)."""
    drv = _driver()
    params = (ctypes.c_void_p * len(arg_pointers))(*arg_pointers)
    if not programmatic:
        check(drv.cuLaunchKernel(fn, *grid, *block, shared_bytes, stream or 0, ctypes.addressof(params), 0))
        return
    attr = drv.CUlaunchAttribute()
    attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_bytes
    config.hStream = stream or 0
    config.attrs = [attr]
    config.numAttrs = 1
    check(drv.cuLaunchKernelEx(config, fn, ctypes.addressof(params), 0))


def capture_graph(stream, work, thread_local: bool = False):
    """Run `work(stream)` once outside a capture (kernel modules load, attributes and TensorRT's deferred
    setup happen there), then capture a second call as a CUDA graph and return its executable."""
    drv = _driver()
    work(stream)
    check(drv.cuStreamSynchronize(stream))
    mode = drv.CUstreamCaptureMode
    check(drv.cuStreamBeginCapture(stream, mode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL if thread_local
                                   else mode.CU_STREAM_CAPTURE_MODE_RELAXED))
    try:
        work(stream)
    finally:
        graph = check(drv.cuStreamEndCapture(stream))
    try:
        return check(drv.cuGraphInstantiate(graph, 0))
    finally:
        check(drv.cuGraphDestroy(graph))  # the executable does not need it


def launch_graph(graph_exec, stream) -> None:
    check(_driver().cuGraphLaunch(graph_exec, stream))


def destroy_graph(graph_exec) -> None:
    check(_driver().cuGraphExecDestroy(graph_exec))


class Stream:
    def __init__(self):
        context()
        self.handle = check(_driver().cuStreamCreate(0))

    def synchronize(self) -> None:
        check(_driver().cuStreamSynchronize(self.handle))


class Timer:
    """CUDA events around a region on a stream; milliseconds."""

    def __init__(self):
        drv = _driver()
        context()
        self.start = check(drv.cuEventCreate(0))
        self.stop = check(drv.cuEventCreate(0))

    def time(self, fn, stream, reps: int) -> list[float]:
        drv = _driver()
        out = []
        for _ in range(reps):
            check(drv.cuEventRecord(self.start, stream))
            fn()
            check(drv.cuEventRecord(self.stop, stream))
            check(drv.cuEventSynchronize(self.stop))
            out.append(check(drv.cuEventElapsedTime(self.start, self.stop)))
        return out
