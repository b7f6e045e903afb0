"""`trtfuse build`: a TensorRT engine from a rewritten ONNX model, with trtfuse's plugins.

Follows NVIDIA's ONNX-parser flow (TensorRT >= 10.9; explicit quantization only): register the
plugins first, a strongly typed network (the Q/DQ and int8 plugin types
decide precision; TensorRT 11 has no other mode), the ONNX parser, one optimization profile over the
batch range, an optional timing cache, and a serialized engine written atomically.

Two plugin flavours (`--plugins`): "qdp", the Quickly Deployable Plugins (plugins/tensorrt/qdp.py), whose
AOT kernels TensorRT embeds in the engine (mma.sync tactics under 48 KB of shared memory); or "v3", the
Python IPluginV3 plugins (plugins/tensorrt/v3.py), which launch through trtfuse's own launcher and so offer
TensorRT every tactic the GPU runs, the Hopper wgmma ones included (contract.launcher_tactics), at the
price of needing trtfuse wherever the engine runs. A model with FusedConvAddConv nodes (`rewrite --chain`) builds with
"v3" only. The flavour is written next to the engine
(`<engine>.trtfuse.json`) so `trtfuse run/offline --backend trt` registers the same one.

`--version-compatible` sets BuilderFlag.VERSION_COMPATIBLE: only such an engine can be run by the lean
runtime (`tensorrt_lean`), and the runner then allows the engine's embedded host code. For the AOT kernels the
record also names the PTX ISA and target they were emitted at (contract.AOT_PTX_ISA), which decide the
oldest driver that can load the engine.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import TrtfuseError
from ..io import atomic_write_bytes, atomic_write_text, check_not_same_file, load_model

PLUGIN_FLAVOURS = ("qdp", "v3")


DEFAULT_BATCH = (1, 8, 256)


def sidecar_path(engine: str) -> Path:
    """Where `build_engine` records how an engine was built (its plugin flavour) for the runner."""
    return Path(f"{engine}.trtfuse.json")


def build_record(engine: str) -> dict:
    """What `build_engine` recorded next to `engine` ({} where nothing is: an engine built elsewhere)."""
    path = sidecar_path(engine)
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text())
        flavour = record.get("plugins")
    except (OSError, ValueError, AttributeError):
        raise TrtfuseError(f"{path} is not a trtfuse build record (JSON with a \"plugins\" field)") from None
    if flavour not in PLUGIN_FLAVOURS:
        raise TrtfuseError(f"{path} names plugin flavour {flavour!r}; expected one of {', '.join(PLUGIN_FLAVOURS)}")
    return record


def engine_plugin_flavour(engine: str) -> str | None:
    """The plugin flavour recorded next to `engine`, or None where nothing is recorded (an engine built elsewhere)."""
    return build_record(engine).get("plugins")


def profile_shapes(name: str, dims: list, batch: tuple[int, int, int] | None) -> tuple | None:
    """(min, opt, max) shapes of one network input in the optimization profile, or None where the input is static
    and needs none. Only dim 0 may be dynamic; a static batch is kept as the model has it (TensorRT rejects a
    profile that contradicts it), and an explicit --batch that differs from it is refused."""
    dims = [int(d) for d in dims]
    if any(d < 0 for d in dims[1:]):
        raise TrtfuseError(f"input {name} has dynamic non-batch dims {dims}: give the model static spatial dims")
    if dims and dims[0] < 0:
        lo, opt, hi = batch or DEFAULT_BATCH
        return tuple([b, *dims[1:]] for b in (lo, opt, hi))
    if batch is not None and batch != (dims[0],) * 3:
        raise TrtfuseError(f"input {name} has a static batch of {dims[0]}, so --batch {','.join(map(str, batch))} cannot "
                           f"apply: build with --batch {dims[0]} (or leave it out), or export the model with a dynamic batch")
    return None


def network_io(trt, network) -> list[dict]:
    """The network's I/O as `trtfuse export-triton` reads it from the build record: name, direction, TensorRT
    dtype name, shape (-1 where dynamic) and whether its allowed formats exclude the linear one (a vectorized
    I/O such as CHW32)."""
    out = []
    tensors = [(network.get_input(i), True) for i in range(network.num_inputs)]
    tensors += [(network.get_output(i), False) for i in range(network.num_outputs)]
    linear = 1 << int(trt.TensorFormat.LINEAR) if hasattr(trt, "TensorFormat") else 1
    for t, is_input in tensors:
        formats = int(getattr(t, "allowed_formats", 0) or 0)
        out.append({"name": t.name, "is_input": is_input, "dtype": t.dtype.name, "shape": [int(d) for d in t.shape],
                    "vectorized": bool(formats) and not formats & linear})
    return out


def builder_flags(trt, version_compatible: bool) -> list:
    """The BuilderFlags the build sets: VERSION_COMPATIBLE on request (the lean runtime runs nothing else)."""
    return [trt.BuilderFlag.VERSION_COMPATIBLE] if version_compatible else []


def build_engine(model_path: str, output: str, batch: tuple[int, int, int] | None = None, timing_cache: str | None = None,
                 workspace_mib: int = 4096, plugins: str = "qdp", version_compatible: bool = False) -> dict:
    try:
        return _build_engine(model_path, output, batch, timing_cache, workspace_mib, plugins, version_compatible)
    except TrtfuseError:
        raise
    except Exception as exc:  # TensorRT's own exceptions (RuntimeError, TypeError...) are one line too
        text = str(exc).strip()
        raise TrtfuseError(f"TensorRT failed while building {model_path}: {type(exc).__name__}: "
                           f"{text.splitlines()[0] if text else 'no message'}") from None


def _build_engine(model_path, output, batch, timing_cache, workspace_mib, plugins, version_compatible) -> dict:
    from ..plugins.op_schema import DOMAIN, FUSED_CONV_ADD_CONV
    from trtfuse.plugins.tensorrt.qdp import import_tensorrt, register_all

    if plugins not in PLUGIN_FLAVOURS:
        raise TrtfuseError(f"--plugins takes {' or '.join(PLUGIN_FLAVOURS)}, not {plugins!r}")
    check_not_same_file(model_path, output)
    model = load_model(model_path)  # one-line errors for broken files, before TensorRT is involved
    if plugins == "qdp":
        chained = sum(n.domain == DOMAIN and n.op_type == FUSED_CONV_ADD_CONV.name for n in model.graph.node)
        if chained:
            raise TrtfuseError(f"{model_path} has {chained} {FUSED_CONV_ADD_CONV.name} nodes, which the QDP plugins cannot "
                               "build (TensorRT embeds one AOT kernel per QDP node): build with --plugins v3, or "
                               "rewrite without --chain")
    trt, _ = import_tensorrt()
    if not hasattr(trt, "Builder") or not hasattr(trt, "OnnxParser"):
        raise TrtfuseError(f"{trt.__name__} {trt.__version__} has no builder or ONNX parser (a runtime-only install): "
                           "building an engine needs the full TensorRT >= 10.9")
    if plugins == "qdp":
        register_all()
    else:
        from trtfuse.plugins.tensorrt import v3

        v3.register_creators(trt)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model_path)):
        first = parser.get_error(0).desc() if parser.num_errors else "unknown parser error"
        raise TrtfuseError(f"TensorRT's ONNX parser rejected {model_path}: {first}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    for flag in builder_flags(trt, version_compatible):
        config.set_flag(flag)
    profile = builder.create_optimization_profile()
    dynamic = False
    for i in range(network.num_inputs):
        inp = network.get_input(i)
        shapes = profile_shapes(inp.name, list(inp.shape), batch)
        if shapes is not None:
            profile.set_shape(inp.name, *shapes)
            dynamic = True
            batch_range = [int(shapes[0][0]), int(shapes[2][0])]
    if dynamic:
        config.add_optimization_profile(profile)
    cache = None
    if timing_cache:
        data = Path(timing_cache).read_bytes() if Path(timing_cache).exists() else b""
        cache = config.create_timing_cache(data)
        config.set_timing_cache(cache, ignore_mismatch=False)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise TrtfuseError("TensorRT failed to build the engine (see the messages above)")
    record = {"plugins": plugins, "tensorrt": trt.__version__, "version_compatible": bool(version_compatible),
              "io": network_io(trt, network)}
    if dynamic:
        record["batch_range"] = batch_range  # the profile's batch dim, min and max
    if plugins == "qdp":
        from trtfuse.plugins.tensorrt import contract as tc
        from trtfuse.plugins.tensorrt.qdp import aot_arch

        arch = aot_arch()
        record["aot_ptx"] = {"target": arch, "isa": tc.aot_ptx_isa(arch) or "NVRTC's own"}
    atomic_write_bytes(output, bytes(engine))
    atomic_write_text(sidecar_path(output), json.dumps(record) + "\n")
    if cache is not None:
        atomic_write_bytes(timing_cache, bytes(cache.serialize()))
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    plugin_nodes = sum(1 for n in model.graph.node if n.domain == DOMAIN)
    plugin_layers = sum(1 for l in layers if l.type in (trt.LayerType.PLUGIN_V3, trt.LayerType.PLUGIN_V2, trt.LayerType.PLUGIN))
    return {"model": str(model_path), "engine": output, "tensorrt": trt.__version__, "layers": len(layers),
            "plugin_layers": plugin_layers, "plugin_nodes_in_onnx": plugin_nodes, "plugins": plugins,
            "batch": list(batch) if batch else "from the model", "version_compatible": bool(version_compatible),
            **({"aot_ptx": f"{record['aot_ptx']['target']}, PTX ISA {record['aot_ptx']['isa']}"} if "aot_ptx" in record else {}),
            "engine_bytes": Path(output).stat().st_size}
