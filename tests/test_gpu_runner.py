"""`--backend cuda`: a `--fuse all` ResNet run on trtfuse's kernels equals the CPU golden execution of
the same rewritten model (every fused conv's int8 output within the 1-LSB rule, logits ~equal), and
anything it cannot run is refused naming the node."""

import numpy as np
import pytest

from trtfuse.errors import TrtfuseError
from trtfuse.graph_passes.pipeline import rewrite
from trtfuse.models.cache import load_cached_model
from trtfuse.plugins.cuda_driver import gpu_available
from trtfuse.plugins.op_schema import DOMAIN

_ok, _why = gpu_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _ok, reason=f"needs a CUDA GPU: {_why}")]


@pytest.mark.parametrize("arch,size,options", [("resnet50", 64, {}), ("resnet18", 96, {}),
                                               ("resnet18", 64, {"fold_stem": False}), ("resnet18", 64, {"autotune": True}),
                                               ("resnet18", 96, {"fuse_stem_pool": False}),
                                               ("resnet50", 64, {"fuse_bottleneck": True}),
                                               ("resnet50", 64, {"fuse_chain": False}),
                                               ("resnet50", 64, {"chain_in_graph": True}),
                                               ("resnet50", 64, {"chain_in_graph": True, "no_chain_kernel": True}),
                                               ("resnet50", 64, {"fuse_stem_conv": False}),
                                               ("resnet50", 64, {"fuse_subsample": False})],
                         ids=["resnet50", "resnet18", "resnet18-chw4-stem", "resnet18-autotune", "resnet18-stem-unfused",
                              "resnet50-bottleneck", "resnet50-unchained", "resnet50-rewrite-chain",
                              "resnet50-rewrite-chain-two-kernels", "resnet50-stem-conv-apart", "resnet50-y-whole"])
def test_fuse_all_resnet_matches_cpu_golden(arch, size, options, monkeypatch):
    """chain_in_graph: the model is rewritten with --chain (FusedConvAddConv nodes); no_chain_kernel: the GPU is taken
    not to run the chain kernel, so those nodes run as their two convs."""
    from trtfuse.graph_passes.chain_pairs import chain_conv_pairs
    from trtfuse.plugins import chain_conv
    from trtfuse.runtime.cpu_executor import run_model
    from trtfuse.runtime.gpu_runner import CudaRunner

    options = dict(options)
    chain_in_graph, no_chain_kernel = options.pop("chain_in_graph", False), options.pop("no_chain_kernel", False)
    if no_chain_kernel:
        monkeypatch.setattr(chain_conv, "device_refusal", lambda: "taken not to run here")
    model = load_cached_model(arch, image_size=size, batch=2)
    images = np.random.default_rng().normal(size=(2, 3, size, size)).astype(np.float32)
    fused, _ = rewrite(model, "all", calib_images=images)
    if chain_in_graph:
        fused = chain_conv_pairs(fused)
        assert sum(n.op_type == "FusedConvAddConv" for n in fused.graph.node) == 6
    runner = CudaRunner(fused, 2, share_activations=False, **options)  # every intermediate kept for fetch below
    logits = runner.run(images)
    # activations sharing memory by lifetime (the default): the same bits, in less memory, and the tensors whose bytes a
    # later step reuses are refused by fetch
    shared = CudaRunner(fused, 2, plans_from=runner, **{k: v for k, v in options.items() if k != "autotune"})
    assert np.array_equal(shared.run(images), logits)
    assert np.array_equal(shared.fetch_top1(), np.argmax(logits, 1))
    assert shared.activation_bytes["placed"] < shared.activation_bytes["separate"]
    refused = []
    for name in shared.tensors:
        try:
            shared.fetch(name)
        except TrtfuseError as e:
            assert "share_activations=False" in str(e)
            refused.append(name)
    assert refused and shared.output_name not in refused
    # every int8 tensor the runner computed: the plugin nodes' outputs (less the stem's, when it stays on chip
    # inside the stem + max-pool kernel) and the pooled tensor after the stem
    names = [o for n in fused.graph.node if n.domain == DOMAIN for o in n.output if o not in runner.fused_away]
    names += [n.output[0] for n in fused.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in
              {m.output[0] for m in fused.graph.node if m.op_type == "MaxPool"}]
    assert bool(runner.fused_away) == (options.get("fuse_stem_pool", True) and options.get("fold_stem", True))
    if options.get("fuse_bottleneck"):  # res2's two identity blocks, where the GPU's shared memory holds the kernel
        from trtfuse.plugins import bottleneck
        from trtfuse.plugins import cuda_driver as cd

        fits = not bottleneck.device_refusal(cd.device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", cd.current_device()))
        assert sorted(runner.fused_blocks) == (["layer1.1.conv1__fused", "layer1.2.conv1__fused"] if fits else [])
    else:
        assert not runner.fused_blocks

    from trtfuse.plugins import stem

    # res2's first conv1 (1x1 64 -> 64 on the pooled tensor) runs inside the stem + max-pool kernel's row tiles
    inside = arch == "resnet50" and runner.stem_pool_tile in stem.ROW_TILES and options.get("fuse_stem_conv", True)
    assert runner.stem_conv == ("layer1.0.conv1__fused" if inside else None)
    if inside:
        assert runner.plan_names()["layer1.0.conv1__fused"] == "stem"
        assert f"{runner.fused_stem} + max-pool + layer1.0.conv1__fused" in [label for label, _ in runner.steps]

    chains = options.get("fuse_chain", True) or chain_in_graph
    if arch == "resnet50" and chains and not options.get("fuse_bottleneck") and chain_conv.device_refusal() is None:
        # each res2 and res3 block's conv3 + residual with the next block's conv1 (res2's last one's: res3's first) as
        # one kernel, but for res3's last block into res4's first conv1 (the variant the chain pass leaves out); at 64 x
        # 64 images res3's maps are 8 x 8, 64 pixels, whole 8-pixel groups
        assert runner.chained == [f"layer{a}.conv3__fused+layer{b}.conv1__fused" for a, b in
                                  [("1.0", "1.1"), ("1.1", "1.2"), ("1.2", "2.0"), ("2.0", "2.1"), ("2.1", "2.2"), ("2.2", "2.3")]]
        assert {runner.plan_names()[n] for n in runner.chained} == {"chain"}
        # res2's first pair computes its residual, the stage's downsample, inside: that output is never materialized
        assert runner.downsampled == {"layer1.0.conv3__fused+layer1.1.conv1__fused": "layer1.0.downsample.0__fused"}
        ds_out = next(n.output[0] for n in fused.graph.node if n.name == "layer1.0.downsample.0__fused")
        assert ds_out in runner.fused_away
        # res2's last pair's output is read only by res3's downsample (1x1 stride 2): stored at stride 2, 8 x 8 of 16 x 16
        res3_ds = next(n for n in fused.graph.node if n.name == "layer2.0.downsample.0__fused")
        assert runner.subsampled == ({res3_ds.input[0]: (2, (2, 256, size // 4, size // 4))}
                                     if options.get("fuse_subsample", True) else {})
        assert runner.tensors[res3_ds.input[0]].shape == (2, 256, *((size // 8,) * 2 if runner.subsampled else (size // 4,) * 2))
    else:
        assert not runner.chained and not runner.downsampled and not runner.subsampled
    for name in runner.fused_away:
        with pytest.raises(TrtfuseError, match="on chip"):
            runner.fetch(name)
    cpu = run_model(fused, {fused.graph.input[0].name: images}, names + [fused.graph.output[0].name])
    for name, want in zip(names, cpu):
        got = runner.fetch(name)
        if name in runner.subsampled:  # stored as the pixels its stride-2 readers take
            want = want[:, :, ::2, ::2]
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and (diff == 0).mean() >= 0.999, name
    ref = cpu[-1]
    cos = np.sum(ref * logits, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(logits, axis=1))
    assert cos.min() > 0.9999 and (np.argmax(ref, 1) == np.argmax(logits, 1)).all()
    # the device top-1 of the same logits, as numpy would pick it, from the classifier's own launch (the graph's last
    # step): no separate top-1 step reads the logits back
    labels = [label for label, _ in runner.steps]
    assert labels[-1] == "classifier + top-1" and "top-1" not in labels and runner.top1_ptr is not None
    assert np.array_equal(runner.fetch_top1(), np.argmax(logits, 1))


def test_top1_copy_lands_in_a_pinned_array_after_the_event():
    """The Offline harness's readout: launch, copy_top1 into pinned memory, an event; after the event the
    pinned array holds numpy's argmax of the logits of that forward (the logits stay readable)."""
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.runtime.gpu_runner import CudaRunner

    model = load_cached_model("resnet18", image_size=32, batch=4)
    rng = np.random.default_rng()
    fused, _ = rewrite(model, "all", calib_images=rng.normal(size=(4, 3, 32, 32)).astype(np.float32))
    runner = CudaRunner(fused, 4)
    pinned, event = cd.PinnedArray(4, np.int32), cd.Event()
    for _ in range(3):  # fresh images each time: a stale copy would show
        runner.load_input(rng.normal(size=(4, 3, 32, 32)).astype(np.float32))
        pinned.array[:] = -1
        runner.launch()
        runner.copy_top1(pinned.array)
        event.record(runner.stream.handle)
        event.synchronize()
        assert np.array_equal(pinned.array, np.argmax(runner.fetch(runner.output_name), 1))
    with pytest.raises(ValueError, match="int32"):
        runner.copy_top1(np.zeros(4, np.int64))


def test_residual_only_model_is_refused_naming_the_node():
    from trtfuse.runtime.gpu_runner import CudaRunner

    model = load_cached_model("resnet18", image_size=64, batch=1)
    fused, _ = rewrite(model, "residual", calib_images=np.zeros((1, 3, 64, 64), np.float32) + 0.5)
    with pytest.raises(TrtfuseError, match="cannot run node"):
        CudaRunner(fused, 1)


@pytest.mark.parametrize("fold_stem", [True, False], ids=["space-to-depth-stem", "chw4-stem"])
def test_quantized_input_runner_gives_the_same_logits(fold_stem):
    # The Offline harness keeps its samples quantized on the device (quantize_images, the graph's own
    # input kernel) and runs a graph that starts after the input quantize step: same bits out.
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.runtime.gpu_runner import CudaRunner

    model = load_cached_model("resnet18", image_size=64, batch=3)
    images = np.random.default_rng().normal(size=(3, 3, 64, 64)).astype(np.float32)
    fused, _ = rewrite(model, "all", calib_images=images)
    plain = CudaRunner(fused, 3, fold_stem=fold_stem)
    want = plain.run(images)
    quantized = CudaRunner(fused, 3, fold_stem=fold_stem, quantized_input=True, plans_from=plain)
    assert quantized.input_sample_bytes < images[0].nbytes  # int8, not the fp32 image
    with pytest.raises(TrtfuseError, match="quantized batches"):
        quantized.load_input(images)
    src = cd.DeviceBuffer.from_array(images)
    quantized.quantize_images(src.ptr, 3, quantized.input_ptr, quantized.stream.handle)
    quantized.launch()
    quantized.stream.synchronize()
    got = quantized.fetch(quantized.output_name)
    assert np.array_equal(got, want)


def _with_softmax(model):
    import onnx
    from onnx import helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    logits = out.graph.output[0]
    out.graph.node.append(helper.make_node("Softmax", [logits.name], ["probabilities"], name="softmax", axis=-1))
    out.graph.output[0].name = "probabilities"
    return out


@pytest.mark.parametrize("options,softmax", [({"classifier": "matmul", "pool": "reducemean"}, False),
                                             ({"classifier": "matmul", "pool": "reducemean", "batch": None}, True),
                                             ({}, True)],
                         ids=["reducemean-matmul-add", "dynamic-batch-softmax", "gap-gemm-softmax"])
def test_every_classifier_form_runs_and_matches_the_cpu_golden(options, softmax):
    from trtfuse.runtime.cpu_executor import run_model
    from trtfuse.runtime.gpu_runner import CudaRunner

    options = dict(options)
    batch = options.pop("batch", 2)
    model = load_cached_model("resnet18", image_size=64, batch=batch, opset=17, **options)
    images = np.random.default_rng().normal(size=(2, 3, 64, 64)).astype(np.float32)
    fused, _ = rewrite(model, "all", calib_images=images)
    if softmax:
        fused = _with_softmax(fused)
    runner = CudaRunner(fused, 2)
    got = runner.run(images)
    want = run_model(fused, {fused.graph.input[0].name: images}, [fused.graph.output[0].name])[0]
    assert np.array_equal(np.argmax(got, 1), np.argmax(want, 1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 if softmax else 1e-5)
    # the top-1 of the output: the classifier's launch computes it from the logits it writes, but a softmax's output is
    # ranked by a step of its own after it
    labels = [label for label, _ in runner.steps]
    assert labels[-1] == ("top-1" if softmax else "classifier + top-1") and labels.count("top-1") == int(softmax)
    assert np.array_equal(runner.fetch_top1(), np.argmax(got, 1))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["torchvision_resnet50_torchscript_opset17", "torchvision_resnet50_dynamo_opset18"])
def test_torchvision_export_runs_on_our_kernels_equal_to_the_cpu_golden(name):
    from onnx_fixtures import load_fixture
    from trtfuse.runtime.cpu_executor import run_model
    from trtfuse.runtime.gpu_runner import CudaRunner

    model = load_fixture(name)
    images = np.random.default_rng(1).normal(size=(1, 3, 224, 224)).astype(np.float32)
    fused, _ = rewrite(model, "all", calib_images=images)
    logits = CudaRunner(fused, 1).run(images)
    want = run_model(fused, {fused.graph.input[0].name: images}, [fused.graph.output[0].name])[0]
    assert np.array_equal(np.argmax(logits, 1), np.argmax(want, 1))
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
