"""`--backend cuda`: run a `--fuse all` model on the GPU with trtfuse's own kernels, no TensorRT.

The model must be made only of what trtfuse's kernels compute (the graph `trtfuse rewrite --fuse all`
writes for ResNets): QuantizeLinear of the input, FusedConv / FusedConvAdd, the stem's
DequantizeLinear -> MaxPool -> QuantizeLinear, and the tail DequantizeLinear -> the classifier as any
exporter writes it: GlobalAveragePool or ReduceMean over H, W (keepdims 1 or 0) -> Flatten / Reshape /
Squeeze -> Gemm or MatMul (+ Add) [-> Softmax] (runtime/classifier_plan.py plans it without a GPU).
Static or dynamic batch (the runner's batch is its own). Anything else is refused, naming the node and op;
so is a float16 Q/DQ model's rewrite (its input Cast and float16-scale Q/DQ: classifier_plan.float16_refusal).

The space-to-depth stem and the max-pool after it run as one kernel (plugins/kernels/stem_pool.cu) that writes
only the pooled tensor, when the pool keeps the stem's scale and its shape is ResNet's (stem.pool_refusal);
otherwise, or with fuse_stem_pool=False, as two. With quantized_input that kernel can read a batch's images in place
from a device sample library by index (read_images_from): the Offline harness then gathers nothing. With
fuse_stem_conv (on by default) and the row tiles' kernel, the 1x1 64 -> 64 conv reading the pooled tensor (ResNet's
res2 first conv1; stem.conv1_refusal) runs inside that kernel on each pooled row as it is written: its step is dropped,
and it never reads the pooled tensor back (which is still written, for the stage's downsample).

A FusedConvAddConv node (a residual block's last conv and the next 1x1 conv reading its output, graph_passes/chain_pairs.py)
runs as one kernel where plugins/chain_conv.py takes the pair and the GPU can run it (chain_conv.refusal, device_refusal),
else as its two convs. With fuse_chain (on by default) the runner first chains a --fuse all model itself, by that
pass: on ResNet-50's res2 and res3 (into res3's first conv1 too), the block output's tile goes from one GEMM to the next
through shared memory instead of a write and a read-back through HBM (plugins/kernels/chain_conv.cu; both outputs still
written). With fuse_downsample (on by default), the pair of a stage's first block whose residual is the stage's downsample
(a FusedConv read by nothing else) runs with that 1x1 conv inside where plugins/chain_conv.py builds it (res2): the
residual is computed from the block's input in the kernel, and the downsample's output is never materialized.
With fuse_subsample (on by default), a chained pair whose output y only 1x1 stride-2 convs read (res2's last block: the
pair's own conv 2 is res3's first conv1, and res3's downsample the only other reader) stores only y's pixels at even
rows and columns, a quarter of its bytes, and those convs run as stride-1 convs on that map (fetch returns it).

With fuse_bottleneck=True (off by default: exact, but on the H200 slower than the three wgmma conv kernels it
replaces, 0.495 against 0.258 ms at batch 256; docs/PERF.md), each identity bottleneck
block FusedConv 1x1 -> FusedConv 3x3 -> FusedConvAdd 1x1 whose intermediates have no other reader and whose
residual is the block input runs as one kernel (plugins/kernels/bottleneck.cu) when its shapes are the compiled
ones (runtime/bottleneck_match.py, bottleneck.refusal) and the GPU's shared memory holds its tiles.

Static shapes; every buffer is allocated once; the whole forward is one CUDA graph (captured through
the driver API), replayed per batch. Several runners (one per stream) give several graphs in flight.
When the graph output is fp32 logits [N, classes], the forward also writes their row-wise top-1
(numpy.argmax's answer) into an int32 [N] device buffer: `copy_top1` reads 1 KB per batch of 256
instead of the 1 MB of logits (the Offline harness's responses); the logits stay readable. The
classifier's own launch computes it when its logits are the output (no Softmax after it), else a
separate step after the output does.
The fp32 tail (pool + classifier) keeps the CPU golden executor's numerics; the int8 trunk is bit-equal
to it (docs/ops.md).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import TrtfuseError
from ..plugins import cuda_driver as cd
from ..plugins import network_ops
from ..plugins.conv import ConvLaunch, precompile
from ..plugins import bottleneck, chain_conv, stem
from ..plugins.layout import channel_vector, pack_weight, round_up, unpack_nchwv, unpack_weight
from ..graph_passes.chain_pairs import chain_conv_pairs, split_chain_node
from ..plugins.op_schema import DOMAIN, FUSED_CONV_ADD_CONV, op_for_node
from ..plugins.tactics import candidate_tactics
from .bottleneck_match import match_identity_bottleneck, node_conv_shape
from .classifier_plan import float16_refusal, plan_classifier
from .memory_plan import assign_offsets, lifetimes
from .top1 import Top1Readout


class _Tensor:
    """An int8 activation on the device in CHW{vec} layout (or an fp32 buffer when vec == 0).

    `folded_from`: this is the space-to-depth form (plugins/stem.py) of a tensor of that logical shape. `lazy`: its
    address is reserved now and its memory mapped later (cuda_driver.VirtualBuffer), its own or a slice shared with
    activations whose lives do not overlap its own (CudaRunner._place_activations)."""

    def __init__(self, shape, vec: int, dtype=np.int8, folded_from=None, lazy: bool = False):
        self.shape, self.vec, self.dtype = tuple(int(d) for d in shape), vec, dtype
        self.folded_from = folded_from
        if vec:
            n, c, h, w = self.shape
            self.physical = (n, round_up(c, vec) // vec, h, w, vec)
        else:
            self.physical = self.shape
        nbytes = int(np.prod(self.physical)) * np.dtype(dtype).itemsize
        self.buf = cd.VirtualBuffer(nbytes) if lazy else cd.DeviceBuffer(nbytes)

    def ensure_backed(self) -> None:
        """Memory of its own if it has none yet (a lazy tensor run before the forward's memory is placed: autotune)."""
        if isinstance(self.buf, cd.VirtualBuffer):
            self.buf.back_private()

    def download(self, stream=None) -> np.ndarray:
        raw = self.buf.download(self.physical, self.dtype, stream)
        return unpack_nchwv(raw, self.shape[1]) if self.vec else raw


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def unfused_options(names) -> dict:
    """CudaRunner's keyword options that turn off the fusions `names` (core/args.py UNFUSE: `--unfuse` of `bench e2e`
    and `offline`): chain pairs, the downsample inside the first pair, the conv inside the stem, the stem with its
    max-pool, a chained pair's output stored at the stride of its only readers."""
    options = {"chain": "fuse_chain", "downsample": "fuse_downsample", "stem-conv": "fuse_stem_conv",
               "stem-pool": "fuse_stem_pool", "subsample": "fuse_subsample"}
    unknown = sorted(set(names) - set(options))
    if unknown:
        raise TrtfuseError(f"--unfuse {unknown[0]}: not a fusion of the GPU runner ({', '.join(options)})")
    return {options[name]: False for name in names}


def named_plan(name: str, shape, node: str) -> ConvLaunch:
    """A launch plan from its name in a results file's `plans` (ConvLaunch.name)."""
    try:
        return ConvLaunch.from_name(name, shape)
    except ValueError as exc:
        raise TrtfuseError(f"plans: {node}: {exc}") from None


def load_plans(path: str, batch: int):
    """A results file's (`trtfuse bench e2e` or `trtfuse offline` -o) tuned plans, for a runner's plans_from: conv plans
    by node name, the stem + max-pool tile. The run's batch must be the file's or a whole multiple of it: every tile
    geometry that takes batch B takes k * B too (image groups of 8 that divide B divide k * B), and named_plan checks each
    tactic against its shape again; a plan tuned at B runs at k * B, but it was timed at B (bench e2e --autotune at
    the run's batch retunes it)."""
    import json
    from types import SimpleNamespace

    from ..validate import check_input_file

    check_input_file(path, "plans")
    try:
        with open(path) as f:
            record = json.load(f)
        names = dict(record["plans"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrtfuseError(f"--plans {path}: not a results file with a `plans` map ({type(exc).__name__}: {exc})") from None
    tuned_at = record.get("batch")
    if tuned_at is not None and (type(tuned_at) is not int or tuned_at <= 0 or batch % tuned_at):
        raise TrtfuseError(f"--plans {path} was tuned at batch {tuned_at}, this run is batch {batch} (not a whole multiple)")
    tile = None
    for node, name in list(names.items()):
        if str(name).startswith("stem_pool/"):
            try:
                tile = stem.tile_from_name(name.split("/", 1)[1])
            except ValueError as exc:
                raise TrtfuseError(f"--plans {path}: {node}: {exc}") from None
            del names[node]  # its conv's plan is the heuristic's, as in a runner that fused it
        elif name in ("bottleneck", "chain", "stem"):  # inside another kernel, no plan of its own: a runner fuses it again
            del names[node]
    return SimpleNamespace(plans=list(names.items()), stem_pool_tile=tile, batch=tuned_at)


class CudaRunner(Top1Readout):
    def __init__(self, model: onnx.ModelProto, batch: int, use_graph: bool = True, fold_stem: bool = True,
                 autotune: bool = False, plans_from: "CudaRunner | None" = None, quantized_input: bool = False,
                 fuse_stem_pool: bool = True, fuse_bottleneck: bool = False, fuse_chain: bool = True,
                 fuse_downsample: bool = True, fuse_stem_conv: bool = True, share_activations: bool = True,
                 fuse_subsample: bool = True):
        ok, why = cd.gpu_available()
        if not ok:
            raise TrtfuseError(f"--backend cuda needs an NVIDIA GPU: {why}")
        cd.context()
        self.batch, self.fold_stem, self.autotune = batch, fold_stem, autotune
        # fuse_stem_pool: the space-to-depth stem and the max-pool after it run as one kernel (plugins/stem.py,
        # stem_pool.cu) that writes only the pooled tensor; the stem's own output is then never materialized.
        self.fuse_stem_pool = fuse_stem_pool
        # fuse_bottleneck: identity bottleneck blocks as one kernel (plugins/bottleneck.py); their two intermediates
        # are then never materialized
        self.fuse_bottleneck = fuse_bottleneck
        self.fused_blocks: dict[str, tuple[str, str, str]] = {}  # conv1 node name -> the block's three node names
        # fuse_chain: a block's conv3 + residual and the next block's conv1 as one kernel (plugins/chain_conv.py); not
        # beside fuse_bottleneck, whose blocks start at the conv1 a chain would take
        self.fuse_chain = fuse_chain and not fuse_bottleneck
        if self.fuse_chain:
            model = chain_conv_pairs(model)
        self.chained: list[str] = []  # the FusedConvAddConv nodes run as the chain kernel
        self.fuse_downsample = self.fuse_chain and fuse_downsample
        self.downsampled: dict[str, str] = {}  # chained node name -> the downsample node it computes inside
        self.fuse_subsample = self.fuse_chain and fuse_subsample
        # a chained pair's output stored at stride 2 (chain_conv.py y_stride) -> (2, its logical shape N, C, H, W)
        self.subsampled: dict[str, tuple[int, tuple]] = {}
        self._stem = None  # (step index, node, original conv shape, input pointers by op input, relu) of the folded stem
        self.fused_stem: str | None = None  # the stem conv's node name once it runs with its max-pool
        self.stem_pool_tile: tuple[int, int] | None = None  # and the tile that kernel runs (stem.POOL_TILES)
        self._given_stem_tile = getattr(plans_from, "stem_pool_tile", None)
        self.fuse_stem_conv = fuse_stem_conv
        self._stem_pool = None  # (step index, step_for(tile, conv1), the pooled tensor) once the stem runs with its pool
        self.stem_conv: str | None = None  # the conv node computed inside the stem + max-pool kernel
        self.model = model
        # share_activations: every activation the forward alone reads and writes takes memory only while it is live,
        # shared with those whose lives do not overlap (runtime/memory_plan.py); fetch() then refuses the tensors
        # whose bytes a later step reuses. The graph's input and output keep memory of their own.
        self.share_activations = share_activations
        self._lazy: list[_Tensor] = []  # the tensors created lazy, placed once the forward is built
        self._reused: set[int] = set()  # ids of the tensors whose bytes another tensor of the forward also takes
        self.activation_bytes: dict[str, int] = {}  # "separate": each in its own buffer; "placed": as placed
        self._images_at = (0, 0)  # (sample library, device int64 [batch] indices) the fused stem reads, or (0, 0): its input
        self.fused_away: set[str] = set()  # tensors a fused kernel keeps on chip: fetch() cannot return them
        self._timer = cd.Timer() if autotune else None
        self._tuned: dict = {}  # (conv shape, has residual, relu) -> the plan autotune chose for it
        self._given_plans = dict(plans_from.plans) if plans_from is not None else None  # another runner's (tuned) choices
        self.inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.consumers: dict[str, list] = {}
        self.producers: dict[str, object] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
            for name in node.output:
                self.producers[name] = node
        self.tensors: dict[str, _Tensor] = {}
        self.consts: dict[str, cd.DeviceBuffer] = {}
        self.steps: list[tuple[str, object]] = []  # (label, launch(stream)) in forward order
        self.plans: list[tuple[str, ConvLaunch]] = []
        self._input_quantizer = None  # (step index, quantized tensor, fn(x, images, y, stream)) of the input QuantizeLinear
        # quantized_input: the graph starts after the input quantize step, on a batch that is already
        # int8 in its layout (quantize_images() made it, with the very kernel the step would run, so the
        # results are the same bits): the Offline harness keeps its samples quantized on the device.
        self.quantized_input = quantized_input
        self.top1: cd.DeviceBuffer | None = None  # the classifier's step may compute it (_dequantize_chain)
        self._compile()
        if quantized_input and self._input_quantizer is None:
            raise TrtfuseError("--backend cuda: quantized input needs the model's input to feed one QuantizeLinear")
        self._add_top1()
        self._place_activations()
        self.stream = cd.Stream()
        self.graph_exec = None
        if use_graph:
            self._capture()

    # ---- building ----
    def _const(self, name: str, dtype=None) -> int:
        if name not in self.consts:
            if name not in self.inits:
                raise TrtfuseError(f"--backend cuda: {name} must be a constant initializer")
            arr = self.inits[name]
            self.consts[name] = cd.DeviceBuffer.from_array(arr.astype(dtype) if dtype else arr)
        return self.consts[name].ptr

    def _tensor(self, shape, vec: int, dtype=np.int8, folded_from=None) -> _Tensor:
        """An activation of the forward: lazy (placed with the others once the forward is built) when activations share
        memory."""
        t = _Tensor(shape, vec, dtype, folded_from, lazy=self.share_activations)
        if self.share_activations:
            self._lazy.append(t)
        return t

    def _step(self, label: str, launch, *tensors, at: int | None = None) -> None:
        """Append (or, with `at`, replace) a step of the forward; `tensors`: every activation it reads or writes, from
        which _place_activations knows each one's life."""
        launch.touches = tuple(t for t in tensors if t is not None)
        if at is None:
            self.steps.append((label, launch))
        else:
            self.steps[at] = (label, launch)

    def _scalar(self, name: str) -> float:
        return float(np.asarray(self.inits[name]).reshape(-1)[0])

    def _only_consumer(self, tensor: str, op_type: str, after):
        users = self.consumers.get(tensor, [])
        if len(users) != 1 or users[0].op_type != op_type:
            raise TrtfuseError(f"--backend cuda: node {after.name or after.op_type} must feed exactly one {op_type} "
                               f"(found {[u.op_type for u in users]})")
        return users[0]

    def _compile(self) -> None:
        g = self.model.graph
        refusal = float16_refusal(self.model)
        if refusal:
            raise TrtfuseError(refusal)
        if len(g.input) != 1 or len(g.output) != 1:
            raise TrtfuseError("--backend cuda runs models with one input and one output")
        inp = g.input[0]
        dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        if len(dims) != 4 or any(d <= 0 for d in dims[1:]):
            raise TrtfuseError(f"--backend cuda needs a static NCHW input, got {dims}")
        self.input_shape = (self.batch, *dims[1:])
        self.input = _Tensor(self.input_shape, 0, np.float32)
        self.output_name = g.output[0].name
        done = set()
        for node in g.node:
            if id(node) in done:
                continue
            if node.domain == DOMAIN and node.op_type in ("FusedConv", "FusedConvAdd"):
                block = self._fused_bottleneck(node) if self.fuse_bottleneck else None
                if block:
                    done |= block
                else:
                    self._fused_conv(node)
            elif node.domain == DOMAIN and node.op_type == FUSED_CONV_ADD_CONV.name:
                self._chain(node)
            elif node.op_type == "QuantizeLinear" and node.input[0] == inp.name:
                self._quantize_input(node)
            elif node.op_type == "DequantizeLinear":
                done |= self._dequantize_chain(node)
            else:
                raise TrtfuseError(f"--backend cuda cannot run node {node.name or '?'} ({node.op_type}): "
                                   "rewrite the model with `trtfuse rewrite --fuse all`")
        if self.output_name not in self.tensors:
            raise TrtfuseError(f"--backend cuda: the graph output {self.output_name} is not produced by a supported pattern")

    def _quantize_input(self, node) -> None:
        scale = self._const(node.input[1], np.float32)
        n, c, h, w = self.input_shape
        users = self.consumers.get(node.output[0], [])
        stem_conv = (node_conv_shape(users[0], self.input_shape)
                     if len(users) == 1 and users[0].domain == DOMAIN and users[0].op_type == "FusedConv" else None)
        if self.fold_stem and stem_conv is not None and stem.applies(stem_conv):
            # The stem reads the image folded 2x2 into 16 channels: quantize straight into that form.
            folded = stem.fold(stem_conv).shape
            out = self.tensors[node.output[0]] = self._tensor((n, folded.c, folded.h, folded.w), stem.S2D_VEC,
                                                         folded_from=self.input_shape)
            quantize = lambda x, images, y, s: network_ops.quantize_s2d(x, scale, images, c, h, w, y, stream=s)
            self._input_quantizer = (len(self.steps), out, quantize)
            self._step("quantize input (space-to-depth)", lambda s, x=self.input.buf.ptr: quantize(x, n, out.buf.ptr, s), self.input, out)
            return
        vec = channel_vector(c)  # the CHW4 stem path when the image has <= 4 channels
        out = self.tensors[node.output[0]] = self._tensor(self.input_shape, vec)
        quantize = lambda x, images, y, s: network_ops.quantize(x, scale, images, c, h, w, y, vec, stream=s)
        self._input_quantizer = (len(self.steps), out, quantize)
        self._step("quantize input", lambda s, x=self.input.buf.ptr: quantize(x, n, out.buf.ptr, s), self.input, out)

    def _fused_conv(self, node) -> None:
        a = _attrs(node)
        op = op_for_node(node.op_type, node.domain)
        names = op.bind(node.input)  # the node's tensors by op_schema's input names
        x = self.tensors.get(names["x"])
        if x is None:
            raise TrtfuseError(f"--backend cuda: input {names['x']} of {node.name} is not an int8 tensor it computed")
        shape = node_conv_shape(node, x.folded_from or x.shape)
        if names["x"] in self.subsampled:  # its input holds only the pixels its stride reads: a stride-1 conv of those
            stride, full = self.subsampled[names["x"]]
            strided = node_conv_shape(node, full)
            shape = dataclasses.replace(strided, h=x.shape[2], w=x.shape[3], stride=(1, 1))
            assert strided.stride == (stride, stride) and shape.out_hw == strided.out_hw, (node.name, strided, shape)
        if self._conv_inside_stem(node, names, shape, bool(a["relu"])):
            return
        n = shape.n
        if x.folded_from:
            fc = stem.fold(shape)
            w = unpack_weight(self.inits[names["weight"]], shape.k, shape.c, (shape.r, shape.s))
            self.consts[node.name + "__folded_weight"] = cd.DeviceBuffer.from_array(pack_weight(stem.fold_weight(w, fc), stem.S2D_VEC))
            weight = self.consts[node.name + "__folded_weight"].ptr
            plan = ConvLaunch.plan(fc.shape)
        else:
            if channel_vector(shape.c) != x.vec:
                raise TrtfuseError(f"--backend cuda: {node.name} expects CHW{channel_vector(shape.c)} input")
            plan = ConvLaunch.plan(shape)
            weight = self._const(names["weight"])
        oh, ow = shape.out_hw
        out = self.tensors[node.output[0]] = self._tensor((n, shape.k, oh, ow), 32)
        r = None
        if "residual" in names:
            r = self.tensors.get(names["residual"])
            if r is None:
                raise TrtfuseError(f"--backend cuda: residual {names['residual']} of {node.name} is not an int8 tensor it computed")
        # Device pointers in node-input order (bind keeps it): activations are buffers this runner computed, the
        # weight may be the stem's folded one, the rest are the node's constants.
        computed = {"x": x.buf.ptr, "weight": weight, "residual": r.buf.ptr if r is not None else 0}
        ptrs = [computed[k] if k in computed else self._const(tensor) for k, tensor in names.items()]

        def make_step(plan):
            ws = None
            if plan.workspace_bytes:
                ws = cd.DeviceBuffer(plan.workspace_bytes)
                ws.fill(0)  # split-K leaves it zeroed after every launch
            step = lambda s: plan.launch_op(op, ptrs, out.buf.ptr, relu=bool(a["relu"]), workspace=ws.ptr if ws else 0,
                                            stream=s)
            step.touches = (x, out) + ((r,) if r is not None else ())
            return step, ws

        if self._given_plans is not None:
            given = self._given_plans.get(node.name, plan)  # absent: the other runner ran it inside a fused block
            plan = given if isinstance(given, ConvLaunch) else named_plan(given, plan.shape, node.name)
        elif self.autotune:
            # ResNet-50's 53 convs are 24 distinct problems: a problem timed once serves its repeats (same shape, its
            # residual flag included, and ReLU: the same candidates on the same amount of work)
            key = (plan.shape, bool(a["relu"]))
            if key not in self._tuned:
                self._tuned[key] = self._fastest(plan, make_step, [x, out] + ([r] if r is not None else []))
            plan = self._tuned[key]
        step, ws = make_step(plan)
        if ws is not None:
            self.consts[node.name + "__workspace"] = ws
        self.plans.append((node.name, plan))
        if x.folded_from:
            self._stem = (len(self.steps), node, shape, ptrs, bool(a["relu"]))  # ptrs' weight is the folded one
        self._step(node.name, step, *step.touches)

    def _fused_bottleneck(self, node) -> set | None:
        """Run the identity bottleneck block starting at `node` as one kernel: the ids of the block's other two nodes
        (now done), or None where it is not such a block, the kernel does not take it, or the GPU cannot run it."""
        x = self.tensors.get(node.input[0])
        if x is None or x.vec != 32 or x.folded_from:
            return None
        chain = match_identity_bottleneck(node, self.consumers, x.shape, (self.output_name,))
        device = cd.current_device()
        if isinstance(chain, str) or bottleneck.device_refusal(
                cd.device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", device)):
            return None
        convs = [tuple(self._const(chain.inputs(i)[k]) for k in ("weight", "scale", "bias", "out_scale")) for i in range(3)]
        residual_scale = self._const(chain.inputs(2)["residual_scale"])
        conv1, conv2, conv3 = chain.nodes
        out = self.tensors[conv3.output[0]] = self._tensor((x.shape[0], chain.shapes[2].k, *chain.shapes[2].out_hw), 32)
        self._step(f"{conv1.name} .. {conv3.name} (bottleneck)", lambda s: bottleneck.launch_bottleneck(
            chain.shapes, x.buf.ptr, convs, residual_scale, out.buf.ptr, relu=chain.relu, stream=s), x, out)
        self.fused_blocks[conv1.name] = tuple(n.name for n in chain.nodes)
        self.fused_away |= {conv1.output[0], conv2.output[0]}
        return {id(conv2), id(conv3)}

    def _chain(self, node) -> None:
        """A FusedConvAddConv node: the chain kernel where it takes the pair at this batch and the GPU can run it, else
        its two convs in turn (graph_passes/chain_pairs.split_chain_node), the same bits."""
        names = FUSED_CONV_ADD_CONV.bind(node.input)
        x, r = self.tensors.get(names["x"]), self.tensors.get(names["residual"])
        if x is None or r is None:
            raise TrtfuseError(f"--backend cuda: inputs x and residual of {node.name} must be int8 tensors it computed")
        a = _attrs(node)
        conv1, conv2 = chain_conv.pair_shapes(*x.shape, a["out_channels"], a["next_out_channels"])
        if x.vec != 32 or x.folded_from or chain_conv.refusal(conv1, conv2) or chain_conv.device_refusal():
            for half in split_chain_node(node):
                self._fused_conv(half)
            return
        relu = (bool(a["relu"]), bool(a["next_relu"]))
        y_stride = self._y_stride(node.output[0], (conv1.n, conv1.k, *conv1.out_hw))
        y = self.tensors[node.output[0]] = self._tensor((conv1.n, conv1.k, *chain_conv.stored_y_hw(conv1, y_stride)), 32)
        z = self.tensors[node.output[1]] = self._tensor((conv2.n, conv2.k, *conv2.out_hw), 32)
        downsample = self._inline_downsample(node, names["residual"], conv1, conv2)
        # device pointers in node-input order: x and the residual are buffers this runner computed (none for a residual
        # computed inside), the rest constants
        computed = {"x": x.buf.ptr, "residual": 0 if downsample else r.buf.ptr}
        ptrs = [computed[k] if k in computed else self._const(tensor) for k, tensor in names.items()]
        # (a label naming every node the kernel runs: bench e2e's breakdown attributes each to its stage)
        label = f"{self.downsampled[node.name]}+{node.name} (chain + downsample)" if downsample else f"{node.name} (chain)"
        # the residual's tensor, or the downsample's input where the kernel computes the residual from it
        read = self.tensors[self.producers[names["residual"]].input[0]] if downsample else r
        self._step(label, lambda s: chain_conv.launch_chain_op(
            (conv1, conv2), ptrs, y.buf.ptr, z.buf.ptr, relu=relu, stream=s, downsample=downsample, y_stride=y_stride),
            x, read, y, z)
        self.chained.append(node.name)

    def _y_stride(self, y: str, shape) -> int:
        """2 where y (of logical `shape`), a chained pair's first output, is read by nothing but 1x1 stride-2 unpadded
        FusedConv nodes (ResNet's next-stage downsample) and is not the graph output: the chain kernel then stores only
        the pixels they read (recorded in `subsampled`); else 1."""
        users = self.consumers.get(y, [])
        if not self.fuse_subsample or not users or y == self.output_name:
            return 1
        for u in users:
            if u.domain != DOMAIN or u.op_type != "FusedConv" or list(u.input[:1]) != [y]:
                return 1
            c = node_conv_shape(u, shape)
            if (c.r, c.s, c.stride, c.pads) != (1, 1, (2, 2), (0, 0, 0, 0)):
                return 1
        self.subsampled[y] = (2, tuple(shape))
        return 2

    def _inline_downsample(self, node, residual: str, conv1, conv2):
        """(shape, device pointers in node-input order, relu) of the downsample FusedConv whose output is chained `node`'s
        residual and nothing else's, when the chain kernel computes it inside (chain_conv.downsample_refusal); its own
        step is then dropped and its output never allocated. None: the residual is read as it is."""
        ds = self.producers.get(residual)
        if not self.fuse_downsample or ds is None or ds.domain != DOMAIN or ds.op_type != "FusedConv":
            return None
        x0 = self.tensors.get(ds.input[0])
        if len(self.consumers.get(residual, [])) != 1 or residual == self.output_name or x0 is None or x0.vec != 32 \
                or x0.folded_from:
            return None
        shape = node_conv_shape(ds, x0.shape)
        if chain_conv.downsample_refusal(conv1, conv2, shape):
            return None
        steps = [i for i, (label, _) in enumerate(self.steps) if label == ds.name]
        if len(steps) != 1 or (self._stem is not None and self._stem[0] > steps[0]):
            return None  # (a step index kept elsewhere would move)
        del self.steps[steps[0]]
        del self.tensors[residual]
        self.fused_away.add(residual)
        self.downsampled[node.name] = ds.name
        names = op_for_node(ds.op_type, ds.domain).bind(ds.input)
        ptrs = [x0.buf.ptr if k == "x" else self._const(tensor) for k, tensor in names.items()]
        return shape, ptrs, bool(_attrs(ds)["relu"])

    def _fastest(self, heuristic_plan: ConvLaunch, make_step, tensors) -> ConvLaunch:
        """--autotune: time every tactic and split count of this conv on its own buffers, keep the fastest.

        The buffers hold a constant non-zero byte while tuning (every candidate sees the same data; zeros
        can run faster than real data). Each candidate is timed as a CUDA graph of 10 launches (the median of 7
        replays), after the heuristic plan has run ~20 ms to bring the clocks up: timed as launches from Python, the
        host's launch cost entered the figure, and under `trtfuse offline` (a busier host) autotune kept tactics up to
        30 % slower than the heuristic's (H200, kernels v18: res4 conv2 on w61 instead of w71, res4 first conv2 on w40
        instead of w65)."""
        for t in tensors:
            t.ensure_backed()
            t.buf.fill(0x35)
        shape = heuristic_plan.shape
        ktiles = -(-shape.gemm[2] // 64)
        arch = cd.compute_capability(cd.current_device())  # sm_90 with TRTFUSE_WGMMA=1: the wgmma tactics compete
        candidates = [heuristic_plan] + [ConvLaunch(shape, t, s) for t in candidate_tactics(shape, arch)
                                         for s in ((1, 2, 4, 8) if t.family == "mma" else (1,))
                                         if s <= max(1, ktiles // 2) and (t, s) != (heuristic_plan.tactic, heuristic_plan.splits)]
        precompile([c.tactic for c in candidates], arch)  # compiled side by side first, not one by one as timed
        stream = cd.Stream()
        warm, _ = make_step(heuristic_plan)
        warm(stream.handle)
        first = self._timer.time(lambda: warm(stream.handle), stream.handle, 1)[0]
        self._timer.time(lambda: [warm(stream.handle) for _ in range(max(1, min(2000, int(20.0 / max(first, 1e-3)))))],
                         stream.handle, 1)
        best, best_ms = heuristic_plan, float("inf")
        for plan in candidates:
            ms = self._step_ms(make_step(plan)[0], stream)
            if ms < best_ms:
                best, best_ms = plan, ms
        return best

    def _step_ms(self, step, stream) -> float:
        """One launch of `step`, timed as a CUDA graph of 10 launches (the median of 7 replays)."""
        for t in getattr(step, "touches", ()):  # autotune runs before the forward's memory is placed
            t.ensure_backed()
        # (capture_graph runs the launches once outside the capture: module load and attribute setup stay out)
        graph = cd.capture_graph(stream.handle, lambda s: [step(s) for _ in range(10)])
        try:
            return sorted(self._timer.time(lambda: cd.launch_graph(graph, stream.handle), stream.handle, 7))[3] / 10
        finally:
            cd.destroy_graph(graph)

    def _dequantize_chain(self, node) -> set:
        x = self.tensors.get(node.input[0])
        if x is None:
            raise TrtfuseError(f"--backend cuda: {node.name or 'DequantizeLinear'} reads {node.input[0]}, not an int8 tensor it computed")
        dq_scale = self._const(node.input[1], np.float32)
        nxt = self.consumers.get(node.output[0], [])
        if len(nxt) != 1:
            raise TrtfuseError(f"--backend cuda: the dequantized {node.output[0]} must feed exactly one node")
        op = nxt[0]
        n, c, h, w = x.shape
        if op.op_type == "MaxPool":
            pa = _attrs(op)
            k, st, pads = pa["kernel_shape"], pa.get("strides", [1, 1]), pa.get("pads", [0, 0, 0, 0])
            if k[0] != k[1] or st[0] != st[1] or len(set(pads)) != 1 or pa.get("ceil_mode", 0) or pa.get("dilations", [1, 1]) != [1, 1]:
                raise TrtfuseError(f"--backend cuda: MaxPool {op.name} must be square, symmetric, floor mode")
            q = self._only_consumer(op.output[0], "QuantizeLinear", op)
            oh, ow = (h + 2 * pads[0] - k[0]) // st[0] + 1, (w + 2 * pads[0] - k[0]) // st[0] + 1
            pooled = self._tensor((n, c, oh, ow), 32)
            same_scale = np.isclose(self._scalar(node.input[1]), self._scalar(q.input[1]), rtol=0, atol=0)
            if same_scale and self._fuse_stem_with_pool(node, (k[0], st[0], pads[0]), pooled):
                self.tensors[q.output[0]] = pooled
                return {id(op), id(q)}
            self._step(op.name or "maxpool", lambda s: network_ops.maxpool(x.buf.ptr, n, c, h, w, k[0], st[0], pads[0], pooled.buf.ptr, stream=s),
                       x, pooled)
            if same_scale:
                self.tensors[q.output[0]] = pooled
            else:  # max commutes with a monotonic quantizer, not with a change of scale: requantize
                from ..plugins.elementwise import add_relu_requant

                out = self.tensors[q.output[0]] = self._tensor((n, c, oh, ow), 32)
                zero = self._zero_scalar()
                q_scale = self._const(q.input[1], np.float32)
                nbytes = int(np.prod(out.physical))
                self._step("requantize " + q.output[0], lambda s: add_relu_requant(
                    pooled.buf.ptr, dq_scale, pooled.buf.ptr, zero, q_scale, False, nbytes, out.buf.ptr, stream=s), pooled, out)
            return {id(op), id(q)}
        if op.op_type in ("GlobalAveragePool", "ReduceMean"):
            plan = plan_classifier(self.model, node.output[0], c)  # graph walking only: runtime/classifier_plan.py
            pooled = self._tensor((n, c), 0, np.float32)
            self._step(op.name or "avgpool", lambda s: network_ops.global_avgpool_f32(x.buf.ptr, dq_scale, n, c, h, w, pooled.buf.ptr, stream=s),
                       x, pooled)
            classes, key = plan.classes, plan.nodes[-1].name or plan.logits
            self.consts[key + "__w"] = cd.DeviceBuffer.from_array(plan.weight)
            self.consts[key + "__b"] = cd.DeviceBuffer.from_array(plan.bias)
            logits = self.tensors[plan.logits] = self._tensor((n, classes), 0, np.float32)
            wp, bp = self.consts[key + "__w"].ptr, self.consts[key + "__b"].ptr
            top1, label = {}, "classifier"
            if plan.softmax is None and plan.logits == self.output_name:
                # the output is these logits: the classifier's launch ranks them as it writes them, and _add_top1 adds
                # no step of its own (no read-back of the logits)
                self.top1 = cd.DeviceBuffer(4 * n)
                keys, done = network_ops.linear_top1_scratch(n)
                self.consts[key + "__top1_keys"], self.consts[key + "__row_block_done"] = keys, done
                top1, label = dict(top1=self.top1.ptr, top1_keys=keys.ptr, row_block_done=done.ptr), "classifier + top-1"
            self._step(label, lambda s: network_ops.linear_f32(pooled.buf.ptr, wp, bp, n, classes, c, logits.buf.ptr, stream=s,
                                                               **top1), pooled, logits)
            if plan.softmax is not None:
                probs = self.tensors[plan.softmax] = self._tensor((n, classes), 0, np.float32)
                self._step("softmax", lambda s: network_ops.softmax_rows(logits.buf.ptr, n, classes, probs.buf.ptr, stream=s),
                           logits, probs)
            return {id(nd) for nd in plan.nodes}
        raise TrtfuseError(f"--backend cuda cannot run node {op.name or '?'} ({op.op_type}) after a DequantizeLinear")

    def _fuse_stem_with_pool(self, dq, pool: tuple[int, int, int], pooled: _Tensor) -> bool:
        """Replace the folded stem conv's step by the stem + max-pool kernel writing `pooled`, when `dq` dequantizes
        the stem's output for this max-pool alone (and the pool keeps its scale: the caller checks) and the kernel
        takes the shapes (stem.pool_refusal). False leaves the two steps as they are."""
        if not self.fuse_stem_pool or self._stem is None:
            return False
        index, conv, shape, ptrs, relu = self._stem
        if dq.input[0] != conv.output[0] or len(self.consumers.get(conv.output[0], [])) != 1:
            return False
        if stem.pool_refusal(shape, pool) is not None:
            return False
        names = op_for_node(conv.op_type, conv.domain).bind(ptrs)

        images = self.tensors[conv.input[0]]  # the quantized input (or a sample library in its place: read_images_from)

        def step_for(tile, conv1=None, conv1_out=None):
            step = lambda s: stem.launch_stem_pool(shape, self._images_at[0] or names["x"], names["weight"], names["scale"],
                                                   names["bias"], names["out_scale"], pooled.buf.ptr, relu=relu, stream=s,
                                                   tile=tile, image_index=self._images_at[1], conv1=conv1)
            step.touches = (images, pooled) + ((conv1_out,) if conv1_out is not None else ())
            return step

        arch = cd.compute_capability(cd.current_device())
        tile = self._given_stem_tile or stem.default_tile(arch)
        if self._given_plans is None and self.autotune:  # the tile too is chosen by timing (stem.pool_tiles)
            stream = cd.Stream()
            tile = min(stem.pool_tiles(arch), key=lambda t: self._step_ms(step_for(t), stream))
        step = step_for(tile)
        self._step(conv.name + " + max-pool", step, *step.touches, at=index)
        self.stem_pool_tile = tile
        self.fused_stem = conv.name
        self.fused_away.add(conv.output[0])
        del self.tensors[conv.output[0]]
        self._stem_pool = (index, step_for, pooled)
        return True

    def _conv_inside_stem(self, node, names: dict, shape, relu: bool) -> bool:
        """With fuse_stem_conv: run the FusedConv `node` inside the stem + max-pool kernel when it reads that kernel's
        pooled tensor and the kernel's tile computes it (stem.conv1_refusal); the stem's step then writes its output
        too. False: it runs as its own step."""
        if not self.fuse_stem_conv or self._stem_pool is None or self.stem_conv is not None or node.op_type != "FusedConv":
            return False
        index, step_for, pooled = self._stem_pool
        if self.tensors.get(names["x"]) is not pooled or stem.conv1_refusal(self._stem[2], shape, self.stem_pool_tile):
            return False
        out = self.tensors[node.output[0]] = self._tensor((shape.n, shape.k, *shape.out_hw), 32)
        conv1 = (shape, self._const(names["weight"]), self._const(names["scale"]), self._const(names["bias"]),
                 self._const(names["out_scale"]), out.buf.ptr, relu)
        label, _ = self.steps[index]
        step = step_for(self.stem_pool_tile, conv1, out)
        self._step(f"{label} + {node.name}", step, *step.touches, at=index)
        self.stem_conv = node.name
        return True

    def _add_top1(self) -> None:
        if self.top1 is not None:
            return  # the classifier's own launch computes it
        out = self.tensors[self.output_name]
        if out.vec or out.dtype != np.float32 or len(out.shape) != 2:
            return  # not logits: no top-1 (top1_ptr stays None)
        rows, classes = out.shape
        self.top1 = cd.DeviceBuffer(4 * rows)
        self._step("top-1", lambda s, x=out.buf.ptr, y=self.top1.ptr: network_ops.argmax_rows(x, rows, classes, y, stream=s), out)

    def _place_activations(self) -> None:
        """Map the lazy tensors' memory. With share_activations, every activation the steps alone touch takes a slice of
        one allocation for the forward, shared with those whose lives (first to last step touching it) do not overlap
        its own (runtime/memory_plan.py); the tensors touched from outside the forward (the input quantize's output,
        which the Offline harness fills, and the graph output) and any step that names no tensors keep memory of their
        own, as does every tensor then. Tensors no step touches (kept on chip by a fused kernel) get none."""
        if not self._lazy:
            return
        touched = [getattr(launch, "touches", None) for _, launch in self.steps]
        outside = {id(self.tensors[self.output_name])}
        if self._input_quantizer is not None:
            outside.add(id(self._input_quantizer[1]))
        lazy = {id(t): t for t in self._lazy}
        unknown = any(ts is None for ts in touched)  # (a step whose tensors are unknown: no sharing, nothing lost)
        lives = {} if unknown else lifetimes([[id(t) for t in ts if id(t) in lazy and id(t) not in outside] for ts in touched])
        shared = {key: lazy[key] for key in lives}
        on_own = [t for t in self._lazy if id(t) not in shared and (unknown or id(t) in outside)]
        gran = cd.allocation_granularity(cd.current_device())
        offsets, arena = assign_offsets({key: t.buf.span for key, t in shared.items()}, lives, gran)
        for t in self._lazy:  # any memory autotune gave them goes back first (tensors no step touches keep none)
            t.buf.unback()
        physical = cd.PhysicalMemory(arena, cd.current_device()) if arena else None
        for key, t in shared.items():
            t.buf.back_with(physical, offsets[key])
        for t in on_own:
            t.buf.back_private()
        spans = [(offsets[key], offsets[key] + t.buf.span, key) for key, t in shared.items()]
        self._reused = {key for start, end, key in spans if any(s < end and start < e for s, e, k in spans if k != key)}
        self.activation_bytes = {"separate": sum(t.buf.span for t in list(shared.values()) + on_own),
                                 "placed": arena + sum(t.buf.span for t in on_own)}

    def _zero_scalar(self) -> int:
        if "__zero" not in self.consts:
            self.consts["__zero"] = cd.DeviceBuffer.from_array(np.zeros(1, np.float32))
        return self.consts["__zero"].ptr

    # ---- running ----
    def _launch_all(self, stream) -> None:
        skip = self._input_quantizer[0] if self.quantized_input else None
        for i, (_, step) in enumerate(self.steps):
            if i != skip:
                step(stream)

    def _capture(self) -> None:
        self.graph_exec = cd.capture_graph(self.stream.handle, self._launch_all)

    def plan_names(self) -> dict[str, str]:
        """Each conv's launch plan as "tactic name/s<split-K slices>" (the results files' `plans`); the stem fused with
        its max-pool as "stem_pool/<tile>", the nodes of a fused bottleneck block as "bottleneck", a chained pair as "chain"."""
        names = {name: f"stem_pool/{stem.tile_name(self.stem_pool_tile)}" if name == self.fused_stem else p.name
                 for name, p in self.plans}
        names.update((name, "bottleneck") for block in self.fused_blocks.values() for name in block)
        names.update((name, "chain") for name in self.chained)
        if self.stem_conv is not None:
            names[self.stem_conv] = "stem"
        return names

    def read_images_from(self, library: int, indices: int) -> bool:
        """With quantized_input and the stem fused with its max-pool: let every later forward read image i of its batch
        as image indices[i] (a device int64 [batch] array) of `library` (quantized images, input_sample_bytes each), in
        place, instead of from the input buffer a gather fills; the graph is captured again, running one forward first,
        so `indices` must already hold indices into the library (zeros will do). False (nothing changed)
        where the first kernel is not the fused stem: the caller then gathers into input_ptr."""
        if not (self.quantized_input and self.fused_stem):
            return False
        self._images_at = (library, indices)
        if self.graph_exec is not None:
            cd.destroy_graph(self.graph_exec)
            self._capture()
        return True

    def launch(self) -> None:
        """Run the forward on the runner's stream on whatever the input buffer holds (asynchronous)."""
        if self.graph_exec is not None:
            cd.launch_graph(self.graph_exec, self.stream.handle)
        else:
            self._launch_all(self.stream.handle)

    def load_input(self, images: np.ndarray) -> None:
        if self.quantized_input:
            raise TrtfuseError("--backend cuda: this runner takes quantized batches (input_ptr), not images")
        if images.shape != self.input_shape:
            raise TrtfuseError(f"--backend cuda: expected input {self.input_shape}, got {tuple(images.shape)}")
        self.input.buf.upload(np.ascontiguousarray(images, dtype=np.float32))

    @property
    def input_ptr(self) -> int:
        """Where a batch goes: the fp32 images, or with quantized_input their int8 form."""
        return self._input_quantizer[1].buf.ptr if self.quantized_input else self.input.buf.ptr

    @property
    def input_sample_bytes(self) -> int:
        """Bytes of one image at input_ptr (images are contiguous there)."""
        t = self._input_quantizer[1] if self.quantized_input else self.input
        return t.buf.nbytes // self.batch

    def quantize_images(self, x: int, images: int, y: int, stream) -> None:
        """fp32 images at device pointer x -> their int8 graph-input form at y (images x input_sample_bytes
        with quantized_input), by the kernel of the graph's own input quantize step."""
        if self._input_quantizer is None:
            raise TrtfuseError("--backend cuda: the model's input does not feed one QuantizeLinear")
        self._input_quantizer[2](x, images, y, stream)

    def run(self, images: np.ndarray) -> np.ndarray:
        self.load_input(images)
        self.launch()
        self.stream.synchronize()
        return self.tensors[self.output_name].download()

    def fetch(self, name: str) -> np.ndarray:
        """A tensor of the last forward, copied on this runner's stream (other runners keep running); one in
        `subsampled` as stored: its pixels at even rows and columns."""
        if name in self.fused_away:
            raise TrtfuseError(f"--backend cuda: {name} stays on chip inside a fused kernel; run with fuse_stem_pool=False (and fuse_bottleneck=False) to fetch it")
        if id(self.tensors[name]) in self._reused:
            raise TrtfuseError(f"--backend cuda: {name} shares its memory with later activations of the forward; build the "
                               "runner with share_activations=False to fetch it")
        return self.tensors[name].download(self.stream.handle)
