"""Triton Inference Server's binary, unpacked from PyPI's `nvidia-pytriton` wheel, and one server process.

The wheel bundles `tritonserver` (with its Python backend and one Python backend stub per Python minor version)
but pins numpy below 2, so trtfuse never installs it: `locate()` unpacks only the server tree of the wheel
into a cache folder and copies the stub for the running Python beside `backends/python`, where the Python
backend looks for it. Where the tree comes from, first match wins:

  * `TRTFUSE_TRITON_HOME`: a folder laid out as the wheel's `pytriton/tritonserver` (bin/tritonserver,
    backends/python ...), its libraries in `TRTFUSE_TRITON_LIBS` or its `../../nvidia_pytriton.libs`;
  * the cache, `$TRTFUSE_CACHE` or `$XDG_CACHE_HOME/trtfuse` or `~/.cache/trtfuse`, folder `triton-<wheel version>`;
  * a wheel file named by `TRTFUSE_PYTRITON_WHEEL`, else one that `pip download --no-deps nvidia-pytriton==0.7.0`
    fetches, unpacked into the cache (atomically: a half-unpacked tree is never used).

`TritonServer` starts the binary on 127.0.0.1 only (HTTP, gRPC and metrics ports), waits for readiness, and
stops it with SIGTERM: Triton then refuses new requests, answers the ones it holds (up to its exit timeout)
and exits.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from ..errors import TrtfuseError

PYTRITON_VERSION = "0.7.0"
HOST = "127.0.0.1"  # the server never listens on another address
_TREE = "pytriton/tritonserver"
_LIBS = "nvidia_pytriton.libs"


def cache_dir() -> Path:
    root = os.environ.get("TRTFUSE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trtfuse")
    return Path(root)


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


class TritonInstall:
    """An unpacked server tree: `home` (bin/, backends/, caches/) and `libs` (the wheel's bundled libraries)."""

    def __init__(self, home: Path, libs: Path):
        self.home, self.libs = Path(home), Path(libs)
        self.binary = self.home / "bin" / "tritonserver"
        self.backends = self.home / "backends"
        self.stub = self.backends / "python" / "triton_python_backend_stub"

    def check(self) -> None:
        if not self.binary.is_file():
            raise TrtfuseError(f"no Triton server binary at {self.binary}")
        if not (self.backends / "python" / "libtriton_python.so").is_file():
            raise TrtfuseError(f"{self.backends / 'python'} has no Python backend (libtriton_python.so)")

    def ensure_stub(self) -> None:
        """The Python backend runs models in a stub process linked to one Python minor version: copy the running
        Python's beside the backend (the wheel keeps one per version under python_backend_stubs/)."""
        src = self.home / "python_backend_stubs" / python_tag() / "triton_python_backend_stub"
        if not src.is_file():
            have = sorted(p.name for p in (self.home / "python_backend_stubs").glob("*")) if (self.home / "python_backend_stubs").is_dir() else []
            if self.stub.is_file():
                return  # a tree laid out by hand with its stub in place
            raise TrtfuseError(f"the Triton tree at {self.home} has no Python backend stub for Python {python_tag()} "
                               f"(it has: {', '.join(have) or 'none'})")
        if self.stub.is_file() and self.stub.stat().st_size == src.stat().st_size and self.stub.read_bytes() == src.read_bytes():
            return
        tmp = self.stub.with_name(f".{self.stub.name}.{os.getpid()}.tmp")
        shutil.copy2(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, self.stub)

    def env(self, extra_pythonpath: list[str] | None = None) -> dict:
        """The server's environment: the bundled libraries and the running Python's libpython on the loader path,
        and this interpreter's import path (numpy, onnxruntime, trtfuse) for the stub's embedded Python."""
        env = dict(os.environ)
        lib_paths = [str(self.libs)]
        libdir = sysconfig.get_config_var("LIBDIR")
        if libdir:
            lib_paths.append(libdir)
        if env.get("LD_LIBRARY_PATH"):
            lib_paths.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_paths)
        paths = list(extra_pythonpath or []) + [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["PYTHONHOME"] = sys.base_prefix  # the stub embeds libpython of this Python: its standard library
        env.pop("PYTHONSTARTUP", None)
        return env


def python_runtime_problem() -> str | None:
    """Why the Python backend stub cannot embed the running Python, or None."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        if not list(Path(libdir).glob(f"libpython{python_tag()}*.so*")):
            return f"Python {sys.version.split()[0]} was built without a shared libpython{python_tag()} (the Python backend stub links it)"
    return None


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest),
           f"nvidia-pytriton=={PYTRITON_VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("nvidia_pytriton-*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise TrtfuseError(f"could not download nvidia-pytriton=={PYTRITON_VERSION} for Triton's server binary ({last}); "
                           "set TRTFUSE_PYTRITON_WHEEL to a downloaded wheel or TRTFUSE_TRITON_HOME to an unpacked tree")
    return wheels[0]


def _unpack(wheel: Path, target: Path) -> None:
    """The wheel's server tree and libraries into `target`, atomically (a temporary folder renamed into place)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [m for m in zf.infolist() if m.filename.startswith((_TREE + "/", _LIBS + "/"))]
                if not any(m.filename == f"{_TREE}/bin/tritonserver" for m in members):
                    raise TrtfuseError(f"{wheel} holds no {_TREE}/bin/tritonserver: not an nvidia-pytriton wheel")
                for m in members:
                    zf.extract(m, tmp)
                    mode = (m.external_attr >> 16) & 0o777
                    if mode and not m.is_dir():
                        os.chmod(tmp / m.filename, mode)
        except (zipfile.BadZipFile, OSError) as exc:
            raise TrtfuseError(f"cannot unpack {wheel}: {exc}") from None
        os.chmod(tmp / _TREE / "bin" / "tritonserver", 0o755)
        for stub in (tmp / _TREE / "python_backend_stubs").glob("*/triton_python_backend_stub"):
            os.chmod(stub, 0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _TREE / "bin" / "tritonserver").is_file():  # not a concurrent unpack that won
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def locate(fetch: bool = True) -> TritonInstall:
    """The Triton server tree (see the module's docstring), unpacked into the cache first if need be, with the
    running Python's backend stub in place. fetch=False: never download, a one-line error instead."""
    home = os.environ.get("TRTFUSE_TRITON_HOME")
    if home:
        home = Path(home)
        libs = Path(os.environ.get("TRTFUSE_TRITON_LIBS") or home.parent.parent / _LIBS)
        inst = TritonInstall(home, libs)
    else:
        target = cache_dir() / f"triton-{PYTRITON_VERSION}"
        if not (target / _TREE / "bin" / "tritonserver").is_file():
            wheel = os.environ.get("TRTFUSE_PYTRITON_WHEEL")
            if wheel:
                if not Path(wheel).is_file():
                    raise TrtfuseError(f"TRTFUSE_PYTRITON_WHEEL={wheel}: no such file")
                _unpack(Path(wheel), target)
            elif not fetch:
                raise TrtfuseError(f"Triton's server is not unpacked in {target} (run `trtfuse serve` once, or set TRTFUSE_PYTRITON_WHEEL)")
            else:
                with tempfile.TemporaryDirectory(prefix="trtfuse-pytriton-") as d:
                    _unpack(_download_wheel(Path(d)), target)
        inst = TritonInstall(target / _TREE, target / _LIBS)
    inst.check()
    problem = python_runtime_problem()
    if problem:
        raise TrtfuseError(problem)
    inst.ensure_stub()
    return inst


def free_port() -> int:
    """A port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


class TritonServer:
    """One `tritonserver` process serving `repository` on 127.0.0.1. Use as a context manager or call
    start()/stop(). Its log goes to `log_path` (a temporary file by default)."""

    def __init__(self, repository: str, install: TritonInstall | None = None, http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None, log_path: str | None = None,
                 exit_timeout_s: int = 30, gpu_metrics: bool = False, extra_pythonpath: list[str] | None = None,
                 verbose: int = 0, python_shm_bytes: int | None = None, cuda_pool_bytes: dict[int, int] | None = None):
        self.repository = str(repository)
        self.install = install or locate()
        ports = [p for p in (http_port, grpc_port, metrics_port) if p is not None]
        if len(set(ports)) != len(ports):
            raise TrtfuseError(f"the HTTP, gRPC and metrics ports must differ, got {ports}")
        for p in ports:
            if not 1 <= p <= 65535:
                raise TrtfuseError(f"port {p}: need 1..65535")
            if not port_is_free(p):
                raise TrtfuseError(f"port {p} on {HOST} is in use")
        self.http_port = http_port or free_port()
        self.grpc_port = grpc_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.exit_timeout_s, self.gpu_metrics, self.verbose = exit_timeout_s, gpu_metrics, verbose
        self.extra_pythonpath = extra_pythonpath
        self.python_shm_bytes = python_shm_bytes  # the Python backend's shared-memory pool per instance (its start and growth step)
        # per GPU: Triton's CUDA memory pool, through which the Python backend hands GPU input tensors (images a
        # client put in CUDA shared memory) to its stub processes; Triton's default, 64 MB, holds 100 images
        self.cuda_pool_bytes = dict(cuda_pool_bytes or {})
        self._own_log = log_path is None
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"{HOST}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        return [str(self.install.binary), f"--model-repository={self.repository}",
                f"--backend-directory={self.install.backends}",
                f"--http-address={HOST}", f"--http-port={self.http_port}",
                f"--grpc-address={HOST}", f"--grpc-port={self.grpc_port}",
                f"--metrics-address={HOST}", f"--metrics-port={self.metrics_port}",
                "--allow-metrics=true", f"--allow-gpu-metrics={'true' if self.gpu_metrics else 'false'}",
                f"--exit-timeout-secs={self.exit_timeout_s}", "--strict-readiness=true",
                "--disable-auto-complete-config", f"--log-verbose={self.verbose}"] + (
                [f"--backend-config=python,shm-default-byte-size={self.python_shm_bytes}",
                 f"--backend-config=python,shm-growth-byte-size={self.python_shm_bytes}"] if self.python_shm_bytes else []) + [
                f"--cuda-memory-pool-byte-size={gpu}:{size}" for gpu, size in sorted(self.cuda_pool_bytes.items())]

    def start(self, timeout_s: float = 120.0) -> "TritonServer":
        if self.proc is not None:
            return self
        log = open(self.log_path, "ab")
        try:
            # Its own session: a Ctrl-C at the terminal reaches trtfuse, which then stops the server in order.
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.install.env(self.extra_pythonpath), start_new_session=True)
        finally:
            log.close()
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _get(self, path: str, timeout: float = 2.0) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError):
            return 0

    def live(self) -> bool:
        return self._get("/v2/health/live") == 200

    def ready(self) -> bool:
        return self._get("/v2/health/ready") == 200

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TrtfuseError(f"tritonserver exited with status {self.proc.returncode} before it was ready: "
                                   f"{self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.2)
        raise TrtfuseError(f"tritonserver was not ready after {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 1) -> str:
        """The last meaningful line(s) of the server's log (errors first)."""
        try:
            text = Path(self.log_path).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        errors = [l for l in text if l[:1] == "E" or "error" in l.lower()]
        pick = (errors or text)[-lines:]
        return " | ".join(l.strip() for l in pick) or "(empty log)"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            return r.read().decode()

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM, then wait for the exit (in-flight requests are answered first); SIGKILL only past the timeout."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s if timeout_s is not None else self.exit_timeout_s + 15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode

    def cleanup(self) -> None:
        if self._own_log:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
