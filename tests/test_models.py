"""trtfuse.models: ResNet topology and parameter counts against torchvision, variants, weights, cache, CLI."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from trtfuse.models.weights import GAMMA_RANGE_BRANCH_END

from trtfuse.calib.data import DEFAULT_PHOTOS, default_images, default_labels
from trtfuse.cli import main
from trtfuse.errors import TrtfuseError
from trtfuse.models import ARCHITECTURES, build, build_weights, cached_model_path, count_parameters, load_cached_model
from trtfuse.models.resnet import resnet_spec
import trtfuse.models.weights as weights_module
from trtfuse.models.weights import reference_logits, train_classifier

# Facts about torchvision.models.resnet{18,34,50,101}: sum(p.numel() for p in model.parameters()) (BN weight
# and bias included, running statistics not), and the number of Conv2d / BasicBlock-or-Bottleneck /
# downsample modules.
TORCHVISION = {
    "resnet18": dict(params=11_689_512, convs=20, blocks=8, projections=3),
    "resnet34": dict(params=21_797_672, convs=36, blocks=16, projections=3),
    "resnet50": dict(params=25_557_032, convs=53, blocks=16, projections=4),
    "resnet101": dict(params=44_549_160, convs=104, blocks=33, projections=4),
}
# Tiny inputs and few BN images where only the graph matters: the topology does not depend on them.
TINY = dict(image_size=32, bn_images=4)


def ops(model, op_type):
    return [n for n in model.graph.node if n.op_type == op_type]


def attr(node, name):
    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def run_ort(model, x, outputs=None):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(outputs, {"input": x})


def with_outputs(model, names):
    """A copy of `model` that also returns the intermediate tensors `names`."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    return m


@pytest.fixture(scope="module")
def heldout64():
    return default_images(4, size=64, split="heldout")


# --- topology -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(TORCHVISION))
def test_topology_and_parameter_count_match_torchvision(arch):
    model = build(arch, **TINY)
    expected = TORCHVISION[arch]
    convs = ops(model, "Conv")
    assert len(convs) == expected["convs"]
    assert len(ops(model, "BatchNormalization")) == expected["convs"]
    assert len(ops(model, "Add")) == expected["blocks"]  # one residual Add per block; the fc is a Gemm
    assert sum(n.name.endswith(".downsample.0") for n in convs) == expected["projections"]
    assert count_parameters(model) == expected["params"]
    # BN follows every conv, so no conv carries a bias
    assert all(len(n.input) == 2 for n in convs)
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == len(names)
    assert {"conv1", "bn1", "maxpool", "layer1.0.conv1", "layer1.0.bn1", "layer4.1.conv2", "avgpool", "fc"} <= set(names)


def test_resnet50_is_v1_5_with_projection_in_each_stage():
    model = build("resnet50", **TINY)
    convs = {n.name: n for n in ops(model, "Conv")}
    assert attr(convs["conv1"], "kernel_shape") == [7, 7] and attr(convs["conv1"], "strides") == [2, 2]
    for stage in (2, 3, 4):  # v1.5: the 3x3 conv strides, the first 1x1 does not
        assert attr(convs[f"layer{stage}.0.conv1"], "strides") == [1, 1]
        assert attr(convs[f"layer{stage}.0.conv2"], "strides") == [2, 2]
        assert attr(convs[f"layer{stage}.0.downsample.0"], "strides") == [2, 2]
    assert attr(convs["layer1.0.downsample.0"], "strides") == [1, 1]  # 64 -> 256 channels, no stride
    projections = sorted(n for n in convs if n.endswith("downsample.0"))
    assert projections == [f"layer{s}.0.downsample.0" for s in (1, 2, 3, 4)]
    widths = {n: onnx.numpy_helper.to_array(i).shape for i in model.graph.initializer for n in [i.name]}
    assert widths["layer3.5.conv3.weight"] == (1024, 256, 1, 1)
    assert widths["fc.weight"] == (1000, 2048)
    # each block's Add takes the branch's last BN and the shortcut (projection BN or the previous block)
    adds = {n.name: n for n in ops(model, "Add")}
    assert list(adds["layer2.0.add"].input) == ["layer2.0.bn3.out", "layer2.0.downsample.1.out"]
    assert list(adds["layer2.1.add"].input) == ["layer2.1.bn3.out", "layer2.0.relu3.out"]


def test_resnet18_projections_start_in_stage_2():
    names = [n.name for n in build("resnet18", **TINY).graph.node]
    assert [n for n in names if n.endswith("downsample.0")] == [f"layer{s}.0.downsample.0" for s in (2, 3, 4)]


def test_spec_conv_units_cover_every_conv():
    for arch in ARCHITECTURES:
        spec = resnet_spec(arch)
        assert len(spec.conv_units()) == TORCHVISION[arch]["convs"]
        assert len(spec.blocks) == TORCHVISION[arch]["blocks"]


# --- variants -------------------------------------------------------------------------------------------


# Every opset x pool pair (ReduceMean's form depends on both), with BN form, classifier and batch cycled so
# that every pair of option values meets at least once: 10 models instead of the full 48-model product.
VARIANTS = [
    dict(opset=opset, pool=pool, fold_bn=fold, classifier=cls, batch=batch)
    for (opset, pool), (fold, cls, batch) in zip(
        itertools.product((13, 17, 18), ("gap", "reducemean")),
        itertools.cycle([(False, "gemm", 2), (True, "matmul", 2), (False, "matmul", None), (True, "gemm", None)]),
    )
] + [
    dict(opset=13, pool="gap", fold_bn=True, classifier="gemm", batch=None),
    dict(opset=17, pool="reducemean", fold_bn=False, classifier="gemm", batch=2),
    dict(opset=18, pool="gap", fold_bn=True, classifier="matmul", batch=None),
    dict(opset=18, pool="reducemean", fold_bn=False, classifier="matmul", batch=2),
]


@pytest.fixture(scope="module")
def resnet18_reference(heldout64):
    weights = build_weights("resnet18", image_size=64)
    return reference_logits(resnet_spec("resnet18"), weights, heldout64[:2])


@pytest.mark.parametrize("options", VARIANTS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_every_variant_checks_runs_and_computes_the_same_function(options, heldout64, resnet18_reference):
    model = build("resnet18", image_size=64, **options)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == options["opset"]
    # the oldest IR version carrying the opset, so older parsers accept the file
    assert model.ir_version == {13: 7, 17: 8, 18: 8}[options["opset"]]

    batch_dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    if options["batch"] is None:
        assert batch_dim.dim_param == "N"
        assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "N"
    else:
        assert batch_dim.dim_value == options["batch"]

    assert bool(ops(model, "BatchNormalization")) != options["fold_bn"]
    assert all(len(n.input) == (3 if options["fold_bn"] else 2) for n in ops(model, "Conv"))
    if options["classifier"] == "gemm":
        (gemm,) = ops(model, "Gemm")
        assert attr(gemm, "transB") == 1 and not ops(model, "MatMul")
    else:
        assert len(ops(model, "MatMul")) == 1 and not ops(model, "Gemm")
    if options["pool"] == "gap":
        assert len(ops(model, "GlobalAveragePool")) == 1 and len(ops(model, "Flatten")) == 1
    else:
        (reduce,) = ops(model, "ReduceMean")
        assert attr(reduce, "keepdims") == 0
        if options["opset"] < 18:
            assert attr(reduce, "axes") == [2, 3] and len(reduce.input) == 1
        else:
            assert len(reduce.input) == 2 and not any(a.name == "axes" for a in reduce.attribute)

    (logits,) = run_ort(model, heldout64[:2])
    assert logits.shape == (2, 1000)
    np.testing.assert_allclose(logits, resnet18_reference, rtol=1e-4, atol=1e-4 * float(np.abs(resnet18_reference).max()))


@pytest.mark.parametrize("opset", [14, 15, 16, 19, 20, 21])  # 13, 17 and 18 are in VARIANTS
def test_other_supported_opsets_run_with_the_opset_sensitive_reducemean(opset):
    x = default_images(1, size=32, split="heldout")
    expected = reference_logits(resnet_spec("resnet18"), build_weights("resnet18", **TINY), x)
    model = build("resnet18", opset=opset, pool="reducemean", **TINY)
    assert model.ir_version == onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)])
    logits, = run_ort(model, x)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_folded_and_explicit_bn_give_the_same_logits(arch, heldout64):
    explicit, = run_ort(build(arch, image_size=64, batch=4), heldout64)
    folded_model = build(arch, image_size=64, batch=4, fold_bn=True)
    folded, = run_ort(folded_model, heldout64)
    np.testing.assert_allclose(folded, explicit, rtol=1e-4, atol=1e-4 * float(np.abs(explicit).max()))
    # folding trades each BN's gamma and beta for one conv bias
    assert count_parameters(folded_model) == TORCHVISION[arch]["params"] - sum(
        u.out_channels for u in resnet_spec(arch).conv_units()
    )


def test_onnx_graph_matches_the_numpy_reference(heldout64):
    weights = build_weights("resnet50", image_size=64)
    expected = reference_logits(resnet_spec("resnet50"), weights, heldout64)
    logits, = run_ort(build("resnet50", image_size=64, batch=None), heldout64)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


@pytest.mark.parametrize("image_size", [32, 96])
def test_image_size_sets_input_shape(image_size):
    model = build("resnet18", image_size=image_size, bn_images=4)
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [1, 3, image_size, image_size]
    logits, = run_ort(model, default_images(1, size=image_size, split="heldout"))
    assert logits.shape == (1, 1000) and np.isfinite(logits).all()


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(image_size=100), "multiple of 32"),
        (dict(image_size=0), "multiple of 32"),
        (dict(image_size=16), "multiple of 32"),
        (dict(opset=12), "opset"),
        (dict(opset=22), "opset"),
        (dict(batch=0), "batch"),
        (dict(classifier="conv"), "classifier"),
        (dict(pool="max"), "pool"),
        (dict(seed=-1), "seed"),
        (dict(bn_images=1), "bn_images"),
        (dict(colour="red"), "unknown model option"),
    ],
)
def test_bad_options_raise_one_line_errors(options, message):
    with pytest.raises(TrtfuseError, match=message) as err:
        build("resnet18", **options)
    assert "\n" not in str(err.value)


def test_unknown_arch_is_rejected():
    with pytest.raises(TrtfuseError, match="resnet152"):
        build("resnet152")


# --- weights --------------------------------------------------------------------------------------------


def test_weights_are_deterministic_in_the_seed():
    from trtfuse.models.builder import _synthesize

    a = _synthesize("resnet18", seed=3, image_size=32, bn_images=4, progress=None)
    b = _synthesize("resnet18", seed=3, image_size=32, bn_images=4, progress=None)
    c = build_weights("resnet18", seed=0, **TINY)  # memoised by the topology test
    assert a.keys() == b.keys() == c.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["layer1.0.conv1.weight"], c["layer1.0.conv1.weight"])
    assert not np.array_equal(a["fc.weight"], c["fc.weight"])


def test_bn_statistics_are_those_of_the_estimation_images():
    """On the very images the statistics came from, every BN output has per-channel mean beta and std gamma."""
    model = build("resnet18", image_size=64, batch=None)
    weights = build_weights("resnet18", image_size=64)
    images = default_images(32, size=64, seed=0, split="calib")  # the estimation batch (see builder._synthesize)
    bns = [n.name for n in ops(model, "BatchNormalization")]
    assert len(bns) == 20
    outputs = run_ort(with_outputs(model, [f"{b}.out" for b in bns]), images)[1:]
    for name, out in zip(bns, outputs):
        mean, std = out.mean(axis=(0, 2, 3)), out.std(axis=(0, 2, 3))
        np.testing.assert_allclose(mean, weights[f"{name}.bias"], atol=2e-3, err_msg=name)
        np.testing.assert_allclose(std, weights[f"{name}.weight"], rtol=2e-3, err_msg=name)


def test_conv_weights_are_kaiming_normal_fan_out():
    weights = build_weights("resnet50", **TINY)
    w = weights["layer3.2.conv2.weight"]  # [256, 256, 3, 3]
    assert abs(w.std() / np.sqrt(2.0 / (256 * 9)) - 1.0) < 0.02
    gammas = weights["layer3.2.bn3.weight"]  # a branch-ending BN gets the small gamma
    lo, hi = GAMMA_RANGE_BRANCH_END
    assert lo <= gammas.min() and gammas.max() <= hi and hi < 0.5  # branch ends damped (models/weights.py)
    assert 0.5 <= weights["layer3.2.bn2.weight"].min() and weights["layer3.2.bn2.weight"].max() <= 1.5


def top2_gaps(logits):
    """Per image, the gap between the two largest logits in units of that image's logit std over classes."""
    top = np.sort(logits, axis=1)
    return (top[:, -1] - top[:, -2]) / logits.std(axis=1)


def test_train_classifier_dual_descent_is_plain_gradient_descent():
    """The N-dimensional form in train_classifier takes exactly the steps of gradient descent on W itself."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0.0, 2.0, (3, 20))
    x = np.abs(centres[np.arange(12) % 3] + rng.normal(0.0, 1.0, (12, 20)))  # non-negative, like pooled ReLUs
    y = np.arange(12) % 3
    weight, bias = train_classifier(x, y, 7, np.random.default_rng(1), steps=40)  # classes 3..6 get no views

    spread = x.std(0) + 0.1 * x.std(0).mean() + 1e-12
    z = (x - x.mean(0)) / spread
    init = np.random.default_rng(1)
    w = init.uniform(-20 ** -0.5, 20 ** -0.5, (7, 20))
    b = init.uniform(-20 ** -0.5, 20 ** -0.5, 7)
    lr = 1.0 / np.linalg.eigvalsh((z @ z.T + 1.0) / 12)[-1]
    for _ in range(40):
        logits = z @ w.T + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - np.eye(7)[y]) / 12
        w, b = w - lr * g.T @ z, b - lr * g.sum(0)
    np.testing.assert_allclose(x @ weight.T + bias, z @ w.T + b, rtol=1e-4, atol=1e-4)
    trained = x @ weight.T + bias
    assert (trained.argmax(1) == y).all()  # separable training views: all right after 40 steps
    assert trained[:, 3:].max() < trained.max(1).min()  # classes without views never win


def test_classifier_is_trained_on_the_train_split_and_generalises():
    """Classes are the default photos; the probe fits its training views and classifies other views of the
    held-out photos (same classes, new crops), with the untrained 984 outputs never on top."""
    spec, weights = resnet_spec("resnet18"), build_weights("resnet18", image_size=64)
    train = reference_logits(spec, weights, default_images(2 * len(DEFAULT_PHOTOS), size=64, split="train"))
    assert (train.argmax(1) == default_labels(len(train), "train")).all()
    held = reference_logits(spec, weights, default_images(32, size=64, split="heldout"))
    top1 = held.argmax(1)
    assert (top1 < len(DEFAULT_PHOTOS)).all()
    # measured 0.91 on this 64x64 ResNet-18 (1.00 on the 224 ResNet-50); predicting one class per photo
    # set would give 1/8
    assert np.mean(top1 == default_labels(32, "heldout")) >= 0.75
    # softmax regression never moves the sum of the outputs, so logits have no common offset that would
    # inflate the logit cosine of a quantized model
    assert (np.abs(held.mean(1)) / held.std(1)).max() < 0.1  # measured 0.05


@pytest.mark.slow
def test_resnet50_224_activations_are_realistic_and_margins_are_a_trained_classifiers():
    """The real default model: block outputs keep sane ranges on held-out photos; the classifier gets the
    held-out photos right with the top class several logit std clear for most images, not saturated."""
    from trtfuse.models.activation_stats import block_output_stats, logit_summary

    model = load_cached_model("resnet50", batch=None)
    stats, logits = block_output_stats(model, default_images(16, size=224, split="heldout"))
    assert [s["block"] for s in stats] == [f"layer{i}.{j}.relu3" for i, n in enumerate((3, 4, 6, 3), 1) for j in range(n)]
    for s in stats:
        assert 0.2 < s["std"] < 5.0, s
        assert 0.2 < s["positive"] < 0.95, s
        assert s["max"] < 100.0, s
    assert np.isfinite(logits).all()
    summary = logit_summary(logits)
    assert summary["distinct_top1"] == 8, logits.argmax(axis=1)  # the 8 held-out photos
    assert np.mean(logits.argmax(1) == default_labels(16, "heldout")) >= 0.9  # measured 1.00 (32 views)
    gaps = top2_gaps(logits)
    # measured on 32 views: median 4.7, 10th percentile 2.0 (recipe 1's random projection: about 0.3)
    assert np.median(gaps) > 3.0 and np.mean(gaps > 1.0) >= 0.75, np.round(gaps, 2)
    assert 0.5 < summary["mean_top_probability"] < 0.99  # peaked, not saturated (measured 0.85)


# --- cache ----------------------------------------------------------------------------------------------


def test_disk_cache_reuses_and_keys_by_options(tmp_path, monkeypatch):
    import trtfuse.models.builder as build_module

    monkeypatch.setenv("TRTFUSE_CACHE", str(tmp_path))
    first = cached_model_path("resnet18", **TINY)
    assert first.is_file() and first.parent.parent == tmp_path
    monkeypatch.setattr(build_module, "build", lambda *a, **k: pytest.fail("cache miss rebuilt the model"))
    assert cached_model_path("resnet18", **TINY) == first
    assert cached_model_path("resnet18", image_size=32, bn_images=4, opset=13) == first  # defaults spelled out
    monkeypatch.undo()
    monkeypatch.setenv("TRTFUSE_CACHE", str(tmp_path))
    other = cached_model_path("resnet18", fold_bn=True, **TINY)
    assert other != first and other.is_file()
    loaded = load_cached_model("resnet18", **TINY)
    assert loaded.SerializeToString() == build("resnet18", **TINY).SerializeToString()
    props = {p.key: p.value for p in loaded.metadata_props}
    assert json.loads(props["trtfuse.options"])["image_size"] == 32
    assert props["trtfuse.weights_recipe"] == str(weights_module.WEIGHTS_RECIPE)


def test_cache_key_changes_with_the_weight_recipe(monkeypatch):
    from trtfuse.models.cache import cache_key

    before = cache_key("resnet18", TINY)
    monkeypatch.setattr(weights_module, "WEIGHTS_RECIPE", weights_module.WEIGHTS_RECIPE + 1)
    assert cache_key("resnet18", TINY) != before


# --- CLI ------------------------------------------------------------------------------------------------


def test_cli_writes_a_checked_model_and_prints_json(tmp_path, capsys):
    out = tmp_path / "r18.onnx"
    rc = main(["models", "resnet18", "-o", str(out), "--image-size", "32", "--bn-images", "4", "--fold-bn", "--dynamic-batch", "--opset", "17", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["params"] == count_parameters(onnx.load(str(out)))
    assert summary["convs"] == 20 and summary["opset"] == 17 and summary["file"] == str(out)
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert not ops(model, "BatchNormalization")
    assert [p.name for p in tmp_path.iterdir()] == ["r18.onnx"]  # no temporary file left behind


def test_cli_table_through_the_console_entry(tmp_path):
    out = tmp_path / "r18.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "trtfuse.cli", "models", "resnet18", "-o", str(out), "--image-size", "32", "--bn-images", "4"],
        capture_output=True, text=True, env={**os.environ, "TRTFUSE_PROGRESS": "0"}, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    header, rule, row = proc.stdout.strip().splitlines()
    assert header.split()[:3] == ["arch", "params", "nodes"] and row.split()[:2] == ["resnet18", "11689512"]
    assert out.is_file()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--image-size", "100"], "multiple of 32"),
        (["--opset", "11"], "opset"),
        (["--batch", "0"], "batch"),
        (["-o", "/no/such/folder/x.onnx"], "does not exist"),
    ],
)
def test_cli_rejects_bad_values_with_one_line(tmp_path, capsys, extra, message):
    target = tmp_path / "keep.onnx"
    target.write_bytes(b"do not touch")
    rc = main(["models", "resnet18", "-o", str(target), "--bn-images", "4"] + extra)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and err.startswith("trtfuse: error:") and message in err
    assert target.read_bytes() == b"do not touch"


def test_cli_rejects_a_directory_as_output(tmp_path, capsys):
    assert main(["models", "resnet18", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["resnet152", "-o", "x.onnx"], ["resnet18"], ["resnet18", "-o", "x.onnx", "--classifier", "conv"],
     ["resnet18", "-o", "x.onnx", "--batch", "2", "--dynamic-batch"], ["resnet18", "-o", "x.onnx", "--pool", "max"]],
)
def test_cli_argument_errors_exit_2(argv, capsys):
    assert main(["models"] + argv) == 2  # usage errors too: one line, exit 2, no SystemExit out of main()
    err = capsys.readouterr().err.strip()
    assert err.startswith("trtfuse: error: models: ") and "\n" not in err, err


def test_cli_arch_choices_are_the_library_architectures():
    from trtfuse.args import ARCHITECTURES as ARCH_CHOICES

    assert tuple(ARCH_CHOICES) == tuple(ARCHITECTURES)
