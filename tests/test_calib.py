"""Calibration: histograms, calibrators, loaders, scales files, statistics on a small conv net."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from trtfuse.calib import calibrators as cal
from trtfuse.calib.data import load_array_file, load_data, load_image_folder
from trtfuse.calib.scales import (FORMAT, calibration_cache_text, parse_calibration_cache, read_scales,
                                  validate_scales_document)
from trtfuse.calib.stats import AbsHistogram, collect_statistics, model_with_outputs
from trtfuse.calib.tensors import broad_activation_tensors
from trtfuse.errors import TrtfuseError


# ---------------------------------------------------------------------------------------------------
# A small residual conv net built with onnx.helper: Conv-BN-Relu, Conv-BN, Add(shortcut), Relu, GAP, Gemm.

def small_resnet(size: int = 16, channels: int = 8, classes: int = 10, seed: int = 0, batch=None) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), name))
        return name

    def bn(prefix, c):
        return [const(f"{prefix}_g", rng.uniform(0.5, 1.5, c)), const(f"{prefix}_b", rng.normal(0, 0.1, c)),
                const(f"{prefix}_m", rng.normal(0, 0.1, c)), const(f"{prefix}_v", rng.uniform(0.5, 1.5, c))]

    c = channels
    nodes = [
        helper.make_node("Conv", ["input", const("w1", rng.normal(0, 0.3, (c, 3, 3, 3)))], ["conv1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv1"] + bn("bn1", c), ["bn1"]),
        helper.make_node("Relu", ["bn1"], ["relu1"]),
        helper.make_node("Conv", ["relu1", const("w2", rng.normal(0, 0.2, (c, c, 3, 3)))], ["conv2"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv2"] + bn("bn2", c), ["bn2"]),
        helper.make_node("Add", ["bn2", "relu1"], ["add"]),
        helper.make_node("Relu", ["add"], ["relu2"]),
        helper.make_node("GlobalAveragePool", ["relu2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", const("fc_w", rng.normal(0, 0.5, (classes, c))), const("fc_b", np.zeros(classes))],
                         ["logits"], transB=1),
    ]
    graph = helper.make_graph(nodes, "small_resnet",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch or "N", 3, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch or "N", classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def images_of(arr: np.ndarray):
    from trtfuse.calib.data import ImageSet

    return ImageSet(len(arr), arr.shape[-1], f"{len(arr)} test images", None, lambda a, b: arr[a:b])


# ---------------------------------------------------------------------------------------------------
# Histogram

def test_histogram_counts_every_element_and_tracks_absmax():
    rng = np.random.default_rng(1)
    h = AbsHistogram(64)
    parts = [rng.normal(0, s, 1000).astype(np.float32) for s in (1.0, 3.0, 0.5, 10.0)]
    for p in parts:
        h.add(p)
    allv = np.abs(np.concatenate(parts))
    assert h.total == allv.size
    assert h.absmax == pytest.approx(float(allv.max()))
    assert h.edge >= h.absmax


def test_histogram_range_growth_matches_direct_histogram():
    rng = np.random.default_rng(2)
    first = rng.uniform(-1, 1, 5000).astype(np.float32)
    later = rng.uniform(-7, 7, 5000).astype(np.float32)
    h = AbsHistogram(128)
    h.add(first)
    edge0 = h.edge
    h.add(later)
    # The range doubled three times (7 > 4 * edge0 for edge0 ~ 1): edges differ by a power of 2 ...
    assert h.edge == pytest.approx(edge0 * 8)
    # ... and the merged histogram equals a direct histogram of all data over the final range
    # (up to values lying within float rounding of a bin boundary).
    direct, _ = np.histogram(np.abs(np.concatenate([first, later])), bins=128, range=(0, h.edge))
    assert np.abs(h.counts - direct).sum() <= 4
    assert h.counts.sum() == direct.sum()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 1000.0), st.integers(1, 300)), min_size=1, max_size=6), st.integers(0, 2**31))
def test_histogram_growth_property(batches, seed):
    """Whatever order of ranges the batches come in, the grown histogram equals one made at once."""
    rng = np.random.default_rng(seed)
    parts = [rng.uniform(-s, s, n).astype(np.float32) for s, n in batches]
    h = AbsHistogram(64)
    for p in parts:
        h.add(p)
    allv = np.abs(np.concatenate(parts))
    assert h.total == allv.size and h.absmax == float(allv.max()) and h.edge > h.absmax
    direct, _ = np.histogram(allv, bins=64, range=(0, h.edge))
    assert np.abs(h.counts - direct).sum() <= 2 * len(parts)  # only values on a bin boundary may differ


def test_histogram_all_zero_then_values():
    h = AbsHistogram(16)
    h.add(np.zeros(10, np.float32))
    assert h.edge == 0.0 and h.counts[0] == 10
    h.add(np.array([0.0, 1.0, -2.0], np.float32))
    assert h.total == 13 and h.absmax == 2.0 and h.counts[0] == 11


# ---------------------------------------------------------------------------------------------------
# Calibrators

def gaussian_with_outliers(n=400_000, outliers=40, value=60.0, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    x[:outliers] = value * np.sign(rng.standard_normal(outliers))
    h = AbsHistogram()
    for chunk in np.array_split(x, 8):
        h.add(chunk)
    return x, h


def test_all_thresholds_positive_and_at_most_absmax():
    _, h = gaussian_with_outliers()
    for method in cal.METHODS:
        t = cal.compute_amax(h, method)
        assert 0 < t <= h.absmax, method


def test_entropy_and_percentile_clip_outliers_max_does_not():
    _, h = gaussian_with_outliers()
    assert cal.compute_amax(h, "max") == pytest.approx(60.0)
    entropy = cal.compute_amax(h, "entropy")
    percentile = cal.compute_amax(h, "percentile", 99.99)
    assert 2.5 < entropy < 10.0
    assert 3.0 < percentile < 5.0  # |N(0,1)| 99.99th percentile is 3.89


def test_percentile_matches_numpy():
    rng = np.random.default_rng(4)
    x = rng.exponential(1.0, 200_000).astype(np.float32)
    h = AbsHistogram()
    h.add(x)
    for p in (50.0, 99.0, 99.9):
        assert cal.amax_percentile(h, p) == pytest.approx(np.percentile(x, p), rel=0.01, abs=2 * h.bin_width)
    assert cal.amax_percentile(h, 100.0) == h.absmax


def test_mse_picks_near_optimal_gaussian_clip():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(400_000).astype(np.float32)
    h = AbsHistogram()
    h.add(x)
    t = cal.amax_mse(h)
    # Direct search of the quantization MSE on the samples themselves agrees within a few percent.
    def mse(th):
        s = th / 127
        return np.mean((np.clip(np.rint(x / s), -127, 127) * s - x) ** 2)
    grid = np.linspace(1.5, float(np.abs(x).max()), 200)
    best = grid[np.argmin([mse(g) for g in grid])]
    assert mse(t) <= mse(best) * 1.05
    assert 2.0 < t < h.absmax


def test_mse_keeps_outliers_when_clipping_them_costs_more():
    # 10% of the mass at 50: clipping it would dominate the error, so MSE must keep a wide range.
    x = np.concatenate([np.random.default_rng(6).standard_normal(90_000), np.full(10_000, 50.0)]).astype(np.float32)
    h = AbsHistogram()
    h.add(x)
    assert cal.amax_mse(h) > 45.0


def _entropy_reference_loop(bins: np.ndarray, start: int = 128, nbins: int = 128):
    """The published algorithm, element by element (after pytorch-quantization's `_compute_amax_entropy`)."""
    from collections import Counter

    from scipy.stats import entropy

    bins = bins.astype(np.float64).copy()
    bins[0] = bins[1]
    divergences = []
    for i in range(start, len(bins) + 1):
        space = np.linspace(0, i, num=nbins + 1)
        digitized = np.digitize(range(i), space) - 1
        digitized[bins[:i] == 0] = -1
        density = np.zeros(nbins)
        for idx, d in enumerate(digitized):
            if d != -1:
                density[d] += bins[idx]
        for key, val in Counter(digitized).items():
            if key != -1:
                density[key] /= val
        q = np.array([density[d] if d != -1 else 0.0 for d in digitized])
        p = bins[:i].copy()
        p[-1] += bins[i:].sum()
        divergences.append(entropy(p, q))
    divergences = np.array(divergences)
    return start + len(divergences) - 1 - int(np.argmin(divergences[::-1]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_entropy_matches_reference_loop(seed):
    rng = np.random.default_rng(seed)
    x = np.abs(rng.standard_t(3, 50_000)).astype(np.float32)
    x[rng.random(x.size) < 0.3] = 0  # ReLU-like zeros
    h = AbsHistogram(384)
    h.add(x)
    used = int(np.flatnonzero(h.counts)[-1]) + 1
    expected_bins = _entropy_reference_loop(h.counts[:used])
    assert cal.amax_entropy(h) == pytest.approx(min(expected_bins * h.bin_width, h.absmax))


def test_kl_divergence_is_zero_when_nothing_is_lost():
    counts = np.zeros(256)
    counts[::2] = 5.0  # 128 levels x 2 bins, one empty: merging and spreading back reproduces P
    candidates, kl = cal.kl_divergences(counts, start_bin=128)
    assert kl[candidates == 256][0] == pytest.approx(0.0, abs=1e-12)


def test_zero_tensor_gets_unit_threshold():
    h = AbsHistogram()
    h.add(np.zeros(100, np.float32))
    for method in cal.METHODS:
        assert cal.compute_amax(h, method) == cal.ZERO_TENSOR_THRESHOLD


def test_weight_scales_per_output_channel():
    w = np.zeros((4, 2, 3, 3), np.float32)
    w[0, 0, 0, 0] = -2.54
    w[1] = 0.5
    w[3, 1, 2, 2] = 127.0
    scales = cal.weight_scales(w)
    assert scales.shape == (4,)
    np.testing.assert_allclose(scales, [2.54 / 127, 0.5 / 127, 1.0, 1.0], rtol=1e-6)
    q, s = cal.quantize_weight(w)
    assert q.dtype == np.int8 and q[0, 0, 0, 0] == -127 and q[1].min() == 127 and q[2].max() == 0
    rng = np.random.default_rng(7)
    w = rng.normal(0, 1, (16, 8, 3, 3)).astype(np.float32)
    q, s = cal.quantize_weight(w)
    err = np.abs(q.astype(np.float32) * s[:, None, None, None] - w)
    assert np.all(err <= s[:, None, None, None] / 2 + 1e-7)


# ---------------------------------------------------------------------------------------------------
# Loaders

def _write_png(path, rgb):
    from PIL import Image

    Image.fromarray(rgb).save(path)


def test_folder_loader_with_val_map(tmp_path):
    rng = np.random.default_rng(8)
    for name in ("b.png", "a.png"):
        _write_png(tmp_path / name, rng.integers(0, 255, (40, 60, 3), dtype=np.uint8))
    (tmp_path / "val_map.txt").write_text("a.png 7\nb.png 3\n")
    (tmp_path / "notes.txt").write_text("ignored")
    images = load_image_folder(tmp_path, size=32)
    assert images.count == 2 and list(images.labels) == [7, 3]
    data = images.all()
    assert data.shape == (2, 3, 32, 32) and data.dtype == np.float32
    assert "val_map" in images.description
    assert load_data(str(tmp_path), count=1, size=32).count == 1


def test_folder_loader_errors(tmp_path):
    with pytest.raises(TrtfuseError, match="no JPEG or PNG images"):
        load_image_folder(tmp_path)
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(TrtfuseError, match="cannot read image .*broken.jpg"):
        load_image_folder(tmp_path).all()
    (tmp_path / "val_map.txt").write_text("other.jpg 1\n")
    with pytest.raises(TrtfuseError, match="no label for broken.jpg"):
        load_image_folder(tmp_path)
    with pytest.raises(TrtfuseError, match="no such file or folder"):
        load_data(str(tmp_path / "missing"))


def test_npy_float_and_uint8_and_npz(tmp_path):
    pre = np.random.default_rng(9).normal(0, 1, (5, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "pre.npy", pre)
    images = load_array_file(tmp_path / "pre.npy", size=32)
    assert "preprocessed NCHW" in images.description
    np.testing.assert_array_equal(images.all(), pre)
    raw = np.random.default_rng(10).integers(0, 255, (3, 50, 40, 3), dtype=np.uint8)
    np.savez(tmp_path / "raw.npz", a=raw[:2], b=raw[2:], labels=np.array([1, 2, 3]))
    images = load_array_file(tmp_path / "raw.npz", size=32)
    assert "raw HWC uint8" in images.description and images.all().shape == (3, 3, 32, 32)
    assert list(images.labels) == [1, 2, 3]
    assert load_array_file(tmp_path / "pre.npy", count=2).count == 2


def test_npy_shape_errors(tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((4, 5), np.float32))
    with pytest.raises(TrtfuseError, match="4-D batch"):
        load_array_file(tmp_path / "bad.npy")
    np.save(tmp_path / "hw.npy", np.zeros((2, 3, 16, 16), np.float32))
    with pytest.raises(TrtfuseError, match="the model expects 32x32"):
        load_array_file(tmp_path / "hw.npy", size=32)
    np.save(tmp_path / "c4.npy", np.zeros((2, 4, 16, 16), np.float32))
    with pytest.raises(TrtfuseError, match="3 channels"):
        load_array_file(tmp_path / "c4.npy")
    (tmp_path / "junk.npy").write_bytes(b"junk")
    with pytest.raises(TrtfuseError, match="cannot read"):
        load_array_file(tmp_path / "junk.npy")


def test_default_data_splits_are_distinct():
    calib = load_data("default", count=4, size=32, split="calib").all()
    held = load_data("default", count=4, size=32, split="heldout").all()
    assert calib.shape == held.shape == (4, 3, 32, 32)
    assert not np.allclose(calib, held)


def test_default_data_labels_are_photo_classes_and_the_train_split_is_its_own():
    from trtfuse.calib.data import DEFAULT_PHOTOS, default_images, default_labels

    assert len(set(DEFAULT_PHOTOS)) == len(DEFAULT_PHOTOS) == 16
    calib, held = load_data("default", 16, size=32, split="calib"), load_data("default", 16, size=32, split="heldout")
    assert list(calib.labels) == [i % 8 for i in range(16)]  # calibration photos are classes 0..7
    assert list(held.labels) == [8 + i % 8 for i in range(16)]  # held-out photos 8..15: never calibrated on
    assert list(default_labels(32, "train")) == [i % 16 for i in range(32)]  # the classifier sees all 16
    train = default_images(32, size=32, split="train")
    # train views are other crops: none equals a calibration or evaluation view of the same photo
    for split in (calib, held):
        views = split.all()
        for view, label in zip(train, default_labels(32, "train")):
            assert not any(np.array_equal(view, v) for v in views[split.labels == label])
    assert np.array_equal(default_images(3, size=32, split="train"), train[:3])  # a prefix of a longer draw
    with pytest.raises(ValueError, match="split"):
        default_labels(1, "val")


def test_default_labels_apply_only_to_models_trained_on_them():
    from trtfuse.calib.data import labels_apply_to

    held = load_data("default", 4, size=32, split="heldout")
    plain = small_resnet(size=32)
    assert held.labels is not None and not labels_apply_to(held, plain)  # e.g. an ImageNet ResNet: no meaning
    helper.set_model_props(plain, {"trtfuse.weights_recipe": "2"})
    assert labels_apply_to(held, plain)
    helper.set_model_props(plain, {"trtfuse.weights_recipe": "1"})  # the random-projection classifier
    assert not labels_apply_to(held, plain)


def test_users_labels_apply_to_any_model(tmp_path):
    from trtfuse.calib.data import labels_apply_to

    np.savez(tmp_path / "l.npz", x=np.zeros((2, 3, 16, 16), np.float32), labels=np.array([3, 4]))
    images = load_array_file(tmp_path / "l.npz")
    assert labels_apply_to(images, small_resnet()) and not labels_apply_to(load_data("default", 2, 32), None)


# ---------------------------------------------------------------------------------------------------
# Statistics on a model, scales files

def test_broad_tensor_selection_and_model_left_untouched():
    model = small_resnet()
    before = model.SerializeToString()
    names = broad_activation_tensors(model)
    assert names == ["input", "conv1", "bn1", "relu1", "conv2", "bn2", "add", "relu2", "gap"]
    extended = model_with_outputs(model, names)
    assert len(extended.graph.output) == 1 + len(names)
    assert model.SerializeToString() == before


def test_statistics_match_direct_onnxruntime_values():
    import onnxruntime as ort

    model = small_resnet()
    data = np.random.default_rng(11).normal(0, 1, (10, 3, 16, 16)).astype(np.float32)
    hists = collect_statistics(model, images_of(data), ["relu1", "add"], batch_size=4, show_progress=False)
    sess = ort.InferenceSession(model_with_outputs(model, ["relu1", "add"]).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    relu1, add = sess.run(["relu1", "add"], {"input": data})
    assert hists["relu1"].absmax == pytest.approx(float(np.abs(relu1).max()))
    assert hists["add"].total == add.size
    assert hists["relu1"].counts[0] >= np.sum(relu1 == 0)  # ReLU zeros land in bin 0


def test_static_batch_model_pads_last_batch():
    model = small_resnet(batch=4)
    data = np.random.default_rng(12).normal(0, 1, (6, 3, 16, 16)).astype(np.float32)
    hists = collect_statistics(model, images_of(data), ["relu2"], batch_size=32, show_progress=False)
    assert hists["relu2"].total == 6 * 8 * 16 * 16


def test_scales_document_schema_and_cache_roundtrip(tmp_path):
    from trtfuse.calib.calibrate import calibrate
    from trtfuse.io import save_model

    save_model(small_resnet(), tmp_path / "m.onnx")
    data = np.random.default_rng(13).normal(0, 1, (8, 3, 16, 16)).astype(np.float32)
    doc = calibrate(tmp_path / "m.onnx", images_of(data), "percentile", 99.9, selection="broad", show_progress=False)
    assert doc["format"] == FORMAT
    assert set(doc["activations"]) == set(broad_activation_tensors(small_resnet()))
    for name, scale in doc["activations"].items():
        assert scale == pytest.approx(doc["amax"][name] / 127)
    assert doc["metadata"]["method"] == "percentile" and doc["metadata"]["images"] == 8
    assert len(doc["metadata"]["model_sha256"]) == 64
    (tmp_path / "s.json").write_text(json.dumps(doc))
    assert read_scales(tmp_path / "s.json") == doc["activations"]
    text = calibration_cache_text(doc["activations"])
    assert text.startswith("TRT-8601-EntropyCalibration2\n")
    parsed = parse_calibration_cache(text)
    for name, scale in doc["activations"].items():
        assert parsed[name] == pytest.approx(scale, rel=1e-7)


def test_cache_hex_is_big_endian_float_bits():
    assert calibration_cache_text({"t": 1.0}).splitlines()[1] == "t: 3f800000"


@pytest.mark.parametrize("doc, message", [
    ({"activations": {"a": 1.0}}, "format"),
    ({"format": FORMAT, "activations": [1.0]}, "activations"),
    ({"format": FORMAT, "activations": {"a": 0.0}}, "positive"),
    ({"format": FORMAT, "activations": {"a": float("inf")}}, "positive"),
    ({"format": FORMAT, "activations": {"a": "x"}}, "positive"),
])
def test_scales_schema_errors(doc, message):
    with pytest.raises(TrtfuseError, match=message):
        validate_scales_document(doc)


def test_qdq_emulation_and_perturbation_gain():
    from trtfuse.calib.sensitivity import perturbation_gain, qdq_emulation

    model = small_resnet()
    data = np.random.default_rng(14).normal(0, 1, (8, 3, 16, 16)).astype(np.float32)
    hists = collect_statistics(model, images_of(data), ["relu1", "relu2"], show_progress=False)
    fine = {n: h.absmax / 127 for n, h in hists.items()}
    good = qdq_emulation(model, fine, data)
    coarse = qdq_emulation(model, {n: 16 * s for n, s in fine.items()}, data)  # 4 bits fewer
    assert good["logits_sqnr_db"] > coarse["logits_sqnr_db"] + 12 and good["logit_cosine_mean"] > 0.999
    quiet = perturbation_gain(model, "relu1", data, noise_db=40.0)
    loud = perturbation_gain(model, "relu1", data, noise_db=10.0)
    assert quiet["logits_sqnr_db"] > loud["logits_sqnr_db"] + 20  # noise 30 dB weaker -> logits ~30 dB cleaner
    assert perturbation_gain(model, "input", data, 20.0)["logits_sqnr_db"] < 60
