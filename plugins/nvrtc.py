"""Compile the CUDA kernels with NVRTC (cuda-python): no CUDA toolkit and no GPU needed.

One compile per (kernel source, tactic, target architecture). The result (cubin for sm_XX, or PTX for
compute_XX, the form TensorRT's AOT path embeds) is cached on disk keyed by the sources, options and
NVRTC version. ptxas' resource report is parsed so CI can fail on local-memory spills.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import TrtfuseError

KERNEL_DIR = Path(__file__).parent / "kernels"
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")


@dataclass(frozen=True)
class CompiledKernel:
    image: bytes  # cubin, or PTX text (NUL-terminated) when target == "ptx"
    target: str  # "cubin" | "ptx"
    arch: str
    log: str
    resources: dict  # entry name -> {"registers", "spill_stores", "spill_loads", "stack"}

    def spills(self) -> dict[str, int]:
        return {k: v["spill_stores"] + v["spill_loads"] for k, v in self.resources.items()
                if v["spill_stores"] or v["spill_loads"]}


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise TrtfuseError("cuda-python is not installed: pip install 'trtfuse[gpu]' (cuda-bindings, nvidia-cuda-nvrtc)") from None
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    err, major, minor = _nvrtc().nvrtcVersion()
    return major, minor


def _cache_dir() -> Path:
    root = os.environ.get("TRTFUSE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trtfuse")
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sources(folders) -> dict[str, str]:
    """Every kernel source and header of `folders` by file name (what an #include may reach), the first folder's
    first: the cache key covers them all, so editing any header recompiles what may include it."""
    out: dict[str, str] = {}
    for folder in folders:
        for p in sorted(Path(folder).glob("*.cu*")):
            out.setdefault(p.name, p.read_text())
    return out


_RESOURCE_RE = re.compile(
    r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads.*?Used (\d+) registers",
    re.S,
)


def parse_resources(log: str) -> dict:
    out = {}
    for name, stack, st, ld, regs in _RESOURCE_RE.findall(log):
        out[name] = {"registers": int(regs), "spill_stores": int(st), "spill_loads": int(ld), "stack": int(stack)}
    return out


def compile_kernel(source: str, defines: dict[str, int], arch: str = "sm_90", target: str = "cubin",
                   use_cache: bool = True, headers: dict[str, str] | None = None,
                   include_dirs: Sequence[str | os.PathLike] = ()) -> CompiledKernel:
    """Compile <source> with -D defines for `arch` (e.g. "sm_90"); `headers` are generated headers (include
    name -> text) the source includes, such as a tactic's configuration struct. The source and its includes are
    found in plugins/kernels/ and then in `include_dirs`: the profiling probes and hooks live in the bench's own
    folder (bench/probe_kernels/), which the bench passes here, so no production build can include them."""
    nvrtc = _nvrtc()
    folders = (KERNEL_DIR, *(Path(d) for d in include_dirs))
    sources = _sources(folders)
    if source not in sources:
        raise TrtfuseError(f"no kernel source {source} in {', '.join(str(f) for f in folders)}")
    cc = arch.split("_")[1]
    gpu_arch = f"sm_{cc}" if target == "cubin" else f"compute_{cc}"
    opts = [f"--gpu-architecture={gpu_arch}", "-std=c++17", *(f"-I{f}" for f in folders), "--ptxas-options=-v", "-lineinfo"]
    opts += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    generated = sorted((headers or {}).items())
    key_parts = (sorted(sources.items()), source, opts, nvrtc_version()) + ((generated,) if generated else ())
    key = hashlib.sha256(repr(key_parts).encode()).hexdigest()[:24]
    cache = _cache_dir() / f"{Path(source).stem}-{key}.{target}"
    log_path = cache.with_suffix(cache.suffix + ".log")
    if use_cache and cache.exists() and log_path.exists():
        log = log_path.read_text()
        return CompiledKernel(cache.read_bytes(), target, arch, log, parse_resources(log))

    err, prog = nvrtc.nvrtcCreateProgram(sources[source].encode(), source.encode(), len(generated),
                                         [text.encode() for _, text in generated], [name.encode() for name, _ in generated])
    try:
        bopts = [o.encode() for o in opts]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(bopts), bopts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.decode(errors="replace").rstrip("\x00")
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise TrtfuseError(f"NVRTC failed to compile {source} {defines or [n for n, _ in generated]} for {arch}: {log.strip().splitlines()[0] if log.strip() else res}")
        if target == "cubin":
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            image = b" " * size
            nvrtc.nvrtcGetCUBIN(prog, image)
        else:
            _, size = nvrtc.nvrtcGetPTXSize(prog)
            image = b" " * size
            nvrtc.nvrtcGetPTX(prog, image)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    if target == "ptx":  # PTX carries no ptxas report: compile the cubin too for the resource numbers
        log = compile_kernel(source, defines, arch, "cubin", use_cache, headers, include_dirs).log
    # Atomic cache write: concurrent processes (and threads: conv.precompile) may compile the same kernel.
    for path, data in ((cache, image), (log_path, log.encode())):
        tmp = path.with_suffix(path.suffix + f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return CompiledKernel(image, target, arch, log, parse_resources(log))
