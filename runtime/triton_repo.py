"""Triton model repositories: `config.pbtxt` written from a model's I/O and validated against Triton's
model-config schema (tritonclient's `model_config_pb2`, the pbtxt parsed with protobuf's text_format).

Two variants:
  * `plan`: a standard Triton + TensorRT deployment (`platform: "tensorrt_plan"`, `1/model.plan`), I/O names,
    dims and types from the ONNX model, or for an engine from `trtfuse build`'s record beside it (else from
    the engine itself where a TensorRT runtime and a GPU are there);
  * `python`: trtfuse's own executors behind Triton's Python backend (runtime/triton_model.py): `1/model.py`,
    the model file beside it, the backend (cuda, onnxruntime, trt) and streams as config parameters. This is
    what `trtfuse serve` runs.
Both: `max_batch_size`, `dynamic_batching` (preferred batch sizes, max queue delay), one instance per GPU
(`instance_group` of kind GPU, one entry per device) or one CPU instance.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TrtfuseError
from ..io import atomic_write_text

ONNX_TO_TRITON = {1: "TYPE_FP32", 10: "TYPE_FP16", 16: "TYPE_BF16", 3: "TYPE_INT8", 2: "TYPE_UINT8", 6: "TYPE_INT32",
                  7: "TYPE_INT64", 9: "TYPE_BOOL", 11: "TYPE_FP64"}
TRT_TO_TRITON = {"FLOAT": "TYPE_FP32", "HALF": "TYPE_FP16", "BF16": "TYPE_BF16", "INT8": "TYPE_INT8", "UINT8": "TYPE_UINT8",
                 "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "BOOL": "TYPE_BOOL"}
TRITON_TO_NUMPY = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_INT8": "int8", "TYPE_UINT8": "uint8",
                   "TYPE_INT32": "int32", "TYPE_INT64": "int64", "TYPE_BOOL": "bool", "TYPE_FP64": "float64"}
TOP1_OUTPUT = "top1"


@dataclass
class TensorSpec:
    name: str
    dtype: str  # Triton TYPE_*
    shape: list  # full shape, batch first; -1 where dynamic
    vectorized: bool = False  # an engine I/O in a vectorized format (CHW32...)


@dataclass
class ModelIO:
    inputs: list
    outputs: list
    batch_range: tuple | None = None  # (min, max) of a dynamic batch dim (an engine's profile 0), else None
    notes: list = field(default_factory=list)

    @property
    def static_batch(self) -> int | None:
        d = self.inputs[0].shape[0] if self.inputs and self.inputs[0].shape else -1
        return d if d > 0 else None


def onnx_io(model_path: str) -> ModelIO:
    from ..io import load_model

    model = load_model(model_path)
    inits = {i.name for i in model.graph.initializer}

    def spec(v):
        tt = v.type.tensor_type
        if tt.elem_type not in ONNX_TO_TRITON:
            raise TrtfuseError(f"{model_path}: tensor {v.name!r} has ONNX element type {tt.elem_type}, which Triton has no type for")
        return TensorSpec(v.name, ONNX_TO_TRITON[tt.elem_type],
                          [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim])

    return ModelIO([spec(v) for v in model.graph.input if v.name not in inits], [spec(v) for v in model.graph.output])


def engine_io(engine_path: str) -> ModelIO:
    """An engine's I/O: from `trtfuse build`'s record beside it, else from the engine through the TensorRT (or
    lean) runtime, which needs a GPU."""
    from .trt_build import build_record

    if not Path(engine_path).is_file():
        raise TrtfuseError(f"no such engine file: {engine_path}")
    record = build_record(engine_path)
    if record.get("io"):
        tensors = record["io"]
        batch_range = tuple(record["batch_range"]) if record.get("batch_range") else None
    else:
        try:
            from .trt_runner import TrtEngine

            eng = TrtEngine(engine_path)
        except TrtfuseError as exc:
            raise TrtfuseError(f"{engine_path}: no I/O in its trtfuse build record (build it with this trtfuse's "
                               f"`trtfuse build`, or export the ONNX model) and the engine cannot be read here: {exc}") from None
        tensors = [{"name": t.name, "is_input": t.is_input, "dtype": t.dtype, "shape": list(t.shape),
                    "vectorized": t.vectorized} for t in eng.tensors]
        batch_range = eng.input.batch_range

    def spec(t):
        if t["dtype"] not in TRT_TO_TRITON:
            raise TrtfuseError(f"{engine_path}: tensor {t['name']!r} is TensorRT {t['dtype']}, which Triton has no type for")
        return TensorSpec(t["name"], TRT_TO_TRITON[t["dtype"]], [int(d) for d in t["shape"]], bool(t.get("vectorized")))

    io = ModelIO([spec(t) for t in tensors if t["is_input"]], [spec(t) for t in tensors if not t["is_input"]], batch_range)
    for t in io.inputs + io.outputs:
        if t.vectorized:
            io.notes.append(f"{t.name} is vectorized in the engine (CHW32 or similar): clients send and receive the "
                            "tensor in that layout, its dims as the engine declares them")
    if record.get("plugins") == "qdp":
        io.notes.append("plugins: Quickly Deployable Plugins with AOT kernels embedded in the plan; nothing to load")
    elif record.get("plugins") == "v3":
        io.notes.append("plugins: Python IPluginV3 (trtfuse must be importable and its creators registered in the "
                        "server process; a standard tensorrt_plan deployment cannot load them: build with --plugins qdp)")
    return io


def _dims(shape: list, batched: bool) -> str:
    return "[ " + ", ".join(str(d) for d in (shape[1:] if batched else shape)) + " ]"


def config_text(name: str, io: ModelIO, max_batch: int, preferred: list[int], queue_delay_us: int, gpus: list[int],
                platform: str | None = None, backend: str | None = None, parameters: dict | None = None,
                extra_outputs: list | None = None, instances_per_gpu: int = 1) -> str:
    batched = max_batch > 0
    lines = []
    for note in io.notes:
        lines.append(f"# {note}")
    lines.append(f'name: "{name}"')
    if platform:
        lines.append(f'platform: "{platform}"')
    if backend:
        lines.append(f'backend: "{backend}"')
    lines.append(f"max_batch_size: {max_batch}")
    for kind, tensors in (("input", io.inputs), ("output", io.outputs + list(extra_outputs or []))):
        lines.append(f"{kind} [")
        lines.append(",\n".join(f'  {{\n    name: "{t.name}"\n    data_type: {t.dtype}\n    dims: {_dims(t.shape, batched)}\n  }}'
                                for t in tensors))
        lines.append("]")
    if batched:
        pref = ", ".join(str(p) for p in preferred)
        lines.append("dynamic_batching {")
        if preferred:
            lines.append(f"  preferred_batch_size: [ {pref} ]")
        lines.append(f"  max_queue_delay_microseconds: {queue_delay_us}")
        lines.append("}")
    lines.append("instance_group [")
    if gpus:
        lines.append(",\n".join(f"  {{ count: {instances_per_gpu}, kind: KIND_GPU, gpus: [ {g} ] }}" for g in gpus))
    else:
        lines.append("  { count: 1, kind: KIND_CPU }")
    lines.append("]")
    for k, v in (parameters or {}).items():
        lines.append(f'parameters {{ key: "{k}" value: {{ string_value: {json.dumps(str(v))} }} }}')
    return "\n".join(lines) + "\n"


def validate(text: str, what: str = "config.pbtxt"):
    """Parse `text` as Triton's ModelConfig (protobuf text format); a one-line error on anything the schema
    refuses. Returns the message."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        raise TrtfuseError("validating a Triton model configuration needs tritonclient: pip install 'trtfuse[serve]'") from None
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise TrtfuseError(f"{what} does not follow Triton's model-config schema: {exc}") from None
    if not config.name or not config.input or not config.output:
        raise TrtfuseError(f"{what}: a model configuration needs a name, inputs and outputs")
    if config.max_batch_size < 0:
        raise TrtfuseError(f"{what}: max_batch_size must be >= 0")
    for p in config.dynamic_batching.preferred_batch_size:
        if not 1 <= p <= config.max_batch_size:
            raise TrtfuseError(f"{what}: preferred batch size {p} is outside 1..max_batch_size ({config.max_batch_size})")
    return config


def _batching(io: ModelIO, max_batch: int, preferred: list[int] | None) -> tuple[int, list[int]]:
    """max_batch_size (0: no batch dim for Triton, a static-batch engine) and the preferred sizes."""
    if max_batch < 1:
        raise TrtfuseError(f"--max-batch {max_batch}: need at least 1")
    if io.batch_range is not None and max_batch > io.batch_range[1]:
        raise TrtfuseError(f"--max-batch {max_batch}: the engine's profile runs batches {io.batch_range[0]}..{io.batch_range[1]}")
    preferred = sorted(set(preferred or []))
    bad = [p for p in preferred if not 1 <= p <= max_batch]
    if bad:
        raise TrtfuseError(f"--preferred-batch {bad[0]}: must be within 1..--max-batch ({max_batch})")
    return max_batch, preferred


def _write_model_dir(repo: str, name: str, config: str, fill) -> Path:
    """REPO/NAME with config.pbtxt (validated) and version 1 (`fill(version_dir)` writes its files), built beside
    the repository and moved in whole, so a failure leaves no half-written model."""
    validate(config)
    final = _fresh_model_dir(repo, name)
    tmp = final.with_name(f".{name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "1").mkdir(parents=True)
        atomic_write_text(tmp / "config.pbtxt", config)
        fill(tmp / "1")
        _install_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _fresh_model_dir(repo: str, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise TrtfuseError(f"--name {name!r}: a model name is one folder name")
    root = Path(repo)
    if root.exists() and not root.is_dir():
        raise TrtfuseError(f"{repo} exists and is not a folder")
    if root.exists() and (root / name).exists():
        raise TrtfuseError(f"{root / name} already exists: choose another -o or --name")
    if not root.parent.is_dir() and str(root.parent):
        raise TrtfuseError(f"output folder does not exist: {root.parent}")
    root.mkdir(exist_ok=True)
    return root / name


def _install_dir(tmp_dir: Path, final: Path) -> None:
    os.replace(tmp_dir, final)


def export_plan(model: str, repo: str, name: str = "resnet", max_batch: int = 256, preferred: list[int] | None = None,
                queue_delay_us: int = 100, gpus: list[int] | None = None) -> dict:
    """A `tensorrt_plan` model repository for `model` (an engine, copied to 1/model.plan, or an ONNX model:
    the config, and the engine to build into 1/model.plan)."""
    is_onnx = Path(model).suffix == ".onnx"
    io = onnx_io(model) if is_onnx else engine_io(model)
    if len(io.inputs) != 1:
        raise TrtfuseError(f"{model}: {len(io.inputs)} inputs; trtfuse exports single-image-input models")
    static = io.static_batch
    if static is not None:  # an explicit static batch: Triton's batch dim would not match the engine's
        max_batch, preferred = 0, []
        io.notes.append(f"static batch {static}: max_batch_size 0 and the batch dim in dims (no dynamic batching)")
    else:
        max_batch, preferred = _batching(io, max_batch, preferred)
    text = config_text(name, io, max_batch, preferred, queue_delay_us, list(gpus or []), platform="tensorrt_plan")
    final = _write_model_dir(repo, name, text,
                             lambda version: None if is_onnx else shutil.copyfile(model, version / "model.plan"))
    out = {"repository": str(Path(repo)), "model": name, "platform": "tensorrt_plan", "max_batch_size": max_batch,
           "preferred_batch_size": preferred, "max_queue_delay_us": queue_delay_us,
           "instances": [f"GPU {g}" for g in gpus] if gpus else ["CPU"],
           "inputs": [f"{t.name} {t.dtype} {t.shape}" for t in io.inputs],
           "outputs": [f"{t.name} {t.dtype} {t.shape}" for t in io.outputs], "notes": io.notes,
           "config": str(final / "config.pbtxt")}
    if is_onnx:
        out["next"] = f"trtfuse build {model} -o {final / '1' / 'model.plan'} --batch 1,{max(preferred or [max_batch])},{max_batch}"
    return out


def trtfuse_site_dirs() -> list[str]:
    """Where this Python finds trtfuse and its dependencies (site folders, so editable installs' .pth files count)."""
    dirs = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    import trtfuse

    src = str(Path(trtfuse.__file__).resolve().parent.parent)
    return list(dict.fromkeys(dirs + [src])) if not any(src.startswith(d) for d in dirs) else dirs


def export_python(model: str, repo: str, backend: str, name: str = "resnet", max_batch: int = 64,
                  preferred: list[int] | None = None, queue_delay_us: int = 100, gpus: list[int] | None = None,
                  streams: int = 2, threads: int = 0, instances_per_gpu: int = 1) -> dict:
    """A Python-backend repository running `model` on trtfuse's `backend` executor (runtime/triton_model.py).
    instances_per_gpu > 1: several instances (stub processes) per GPU, so one's Python work between batches
    overlaps another's GPU work."""
    if instances_per_gpu < 1:
        raise TrtfuseError("--instances must be at least 1")
    if backend not in ("cuda", "onnxruntime", "trt"):
        raise TrtfuseError(f"--backend {backend!r}: cuda, onnxruntime or trt")
    if backend == "trt":
        io = engine_io(model)
        if io.batch_range is None and io.static_batch is None:
            raise TrtfuseError(f"{model}: cannot tell the engine's batch range")
    else:
        if Path(model).suffix != ".onnx" and not Path(model).is_file():
            raise TrtfuseError(f"no such model file: {model}")
        io = onnx_io(model)
    if len(io.inputs) != 1 or len(io.inputs[0].shape) != 4:
        raise TrtfuseError(f"{model}: trtfuse serves models with one [N, C, H, W] image input")
    if any(d < 1 for d in io.inputs[0].shape[1:]):
        raise TrtfuseError(f"{model}: the image input needs static C, H, W, got {io.inputs[0].shape}")
    if io.inputs[0].dtype != "TYPE_FP32":
        raise TrtfuseError(f"{model}: the image input is {io.inputs[0].dtype}; trtfuse serves fp32 images")
    if backend in ("cuda", "trt") and not gpus:
        raise TrtfuseError(f"--backend {backend} runs on GPUs: --gpus must name at least one")
    if backend == "onnxruntime":
        gpus = []
    max_batch, preferred = _batching(io, max_batch, preferred)
    logits = io.outputs[0]
    io = ModelIO(io.inputs, [TensorSpec(logits.name, "TYPE_FP32", [-1] + [d if d > 0 else -1 for d in logits.shape[1:]])])
    io.inputs[0].shape = [-1] + list(io.inputs[0].shape[1:])
    io.notes = [f"trtfuse {backend} executor behind Triton's Python backend; outputs: {logits.name} (fp32 rows) "
                f"and {TOP1_OUTPUT} (int32 class index per image)"]
    model_file = "model.plan" if backend == "trt" else "model.onnx"
    text = config_text(name, io, max_batch, preferred, queue_delay_us, list(gpus or []), backend="python",
                       parameters={"backend": backend, "model_file": model_file, "streams": streams, "threads": threads,
                                   # GPU executors read images a client put in CUDA shared memory where they lie
                                   **({"FORCE_CPU_ONLY_INPUT_TENSORS": "no"} if gpus else {})},
                       extra_outputs=[TensorSpec(TOP1_OUTPUT, "TYPE_INT32", [-1, 1])],
                       instances_per_gpu=instances_per_gpu if gpus else 1)

    def fill(version: Path) -> None:
        paths = ", ".join(repr(d) for d in trtfuse_site_dirs())
        atomic_write_text(version / "model.py",
                          '"""Triton Python-backend model written by `trtfuse export-triton` / `trtfuse serve`: trtfuse\'s '
                          f'{backend} executor\n(trtfuse/runtime/triton_model.py) from the Python environment that wrote it."""\n'
                          f"import site\n\nfor _d in [{paths}]:\n    site.addsitedir(_d)\n\n"
                          "from trtfuse.runtime.triton_model import TritonPythonModel  # noqa: E402,F401\n")
        try:
            os.link(model, version / model_file)
        except OSError:
            shutil.copyfile(model, version / model_file)

    final = _write_model_dir(repo, name, text, fill)
    return {"repository": str(Path(repo)), "model": name, "backend": f"python ({backend})", "max_batch_size": max_batch,
            "preferred_batch_size": preferred, "max_queue_delay_us": queue_delay_us,
            "instances": [f"GPU {g}" for g in gpus for _ in range(instances_per_gpu)] if gpus else ["CPU"],
            "streams": streams if gpus else None,
            "inputs": [f"{t.name} {t.dtype} {t.shape}" for t in io.inputs], "input_shape": list(io.inputs[0].shape),
            "outputs": [f"{t.name} {t.dtype} {t.shape}" for t in io.outputs] + [f"{TOP1_OUTPUT} TYPE_INT32 [-1, 1]"],
            "config": str(final / "config.pbtxt")}


def model_config(repo: str, name: str):
    """The validated ModelConfig of REPO/NAME."""
    path = Path(repo) / name / "config.pbtxt"
    return validate(path.read_text(), str(path))
