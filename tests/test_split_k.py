"""Split-K rewrite: numerically equal to the original GEMM (ONNX Runtime, fp32), bias once, cost model."""

from __future__ import annotations

import itertools
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from trtfuse.errors import TrtfuseError
from trtfuse.graph_passes.cost_model import H200, DeviceParams, GemmProblem, decide, device_params, predict_plain, predict_split
from trtfuse.graph_passes.split_k import parse_split_mode, split_k
from trtfuse.plugins.op_schema import DOMAIN, SPLIT_K_GEMM

REL_TOL = 1e-5  # max |rewritten - original| / max |original|, fp32


def _model(nodes, inputs, outputs, initializers, opset):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # every onnxruntime reads it
    onnx.checker.check_model(model)
    return model


def gemm_model(m, n, k, trans_a, trans_b, bias_shape, b_const, c_const, opset, alpha=0.75, beta=1.5, seed=0, bias_scale=1.0):
    """One Gemm; returns (model, feeds). bias_shape None means no C."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    feeds = {"a": a}
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))]
    inits = []
    if b_const:
        inits.append(numpy_helper.from_array(b, "b"))
    else:
        feeds["b"] = b
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b.shape)))
    node_inputs = ["a", "b"]
    if bias_shape is not None:
        c = np.asarray(bias_scale * rng.standard_normal(bias_shape), dtype=np.float32)
        if c_const:
            inits.append(numpy_helper.from_array(c, "c"))
        else:
            feeds["c"] = c
            inputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, list(c.shape)))
        node_inputs.append("c")
    node = helper.make_node("Gemm", node_inputs, ["y"], name="gemm", transA=int(trans_a), transB=int(trans_b), alpha=alpha, beta=beta)
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])
    return _model([node], inputs, [out], inits, opset), feeds


def matmul_model(a_shape, b_shape, b_const, opset, seed=0, a_input_shape=None):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    feeds = {"a": a}
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_input_shape or list(a_shape))]
    inits = []
    if b_const:
        inits.append(numpy_helper.from_array(b, "b"))
    else:
        feeds["b"] = b
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape)))
    out_shape = list(np.matmul(a, b).shape)
    if a_input_shape:  # a symbolic batch dim stays symbolic in the output
        out_shape = a_input_shape[: len(out_shape) - 2] + out_shape[len(out_shape) - 2 :]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    return _model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], inputs, [out], inits, opset), feeds


def run(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def assert_split_equal(model, feeds, splits):
    before = model.SerializeToString()
    result = split_k(model, splits)
    assert model.SerializeToString() == before, "the input model was modified"
    assert [r.action for r in result.nodes] == ["rewrite"], result.nodes
    ops = [n.op_type for n in result.model.graph.node]
    assert "ReduceSum" in ops and ops.count("MatMul") == 1 and "Gemm" not in ops
    onnx.checker.check_model(result.model, full_check=True)
    want, got = run(model, feeds), run(result.model, feeds)
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= REL_TOL, f"max relative error {rel:.3g}"
    return result


BIAS_SHAPES = {"none": None, "scalar": (), "n": ("N",), "1n": (1, "N"), "mn": ("M", "N"), "m1": ("M", 1)}


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("k", [48, 50], ids=["k-divisible", "k-padded"])
@pytest.mark.parametrize("bias", list(BIAS_SHAPES))
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([0, 1], [0, 1])))
def test_gemm_every_combination(trans_a, trans_b, bias, k, opset):
    m, n, splits = 5, 7, 4
    shape = BIAS_SHAPES[bias]
    bias_shape = None if shape is None else tuple({"M": m, "N": n}.get(d, d) for d in shape)
    # constant and computed operands alternate so that both paths meet every other combination
    b_const = (trans_a + trans_b + k) % 2 == 0
    c_const = opset == 13
    model, feeds = gemm_model(m, n, k, trans_a, trans_b, bias_shape, b_const, c_const, opset)
    assert_split_equal(model, feeds, splits)


@pytest.mark.parametrize("b_const", [True, False])
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([0, 1], [0, 1])))
def test_gemm_single_row_uses_reshape_not_transpose(trans_a, trans_b, b_const):
    model, feeds = gemm_model(1, 9, 70, trans_a, trans_b, (9,), b_const, True, 17)
    result = assert_split_equal(model, feeds, 8)
    a_consumers = [n.op_type for n in result.model.graph.node if "a" in n.input]
    assert "Transpose" not in a_consumers


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("k", [64, 61], ids=["k-divisible", "k-padded"])
@pytest.mark.parametrize("b_const", [True, False], ids=["const-b", "dynamic-b"])
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((6, "K"), ("K", 5)),
        ((2, 6, "K"), ("K", 5)),
        ((2, 3, 6, "K"), ("K", 5)),
        ((6, "K"), (3, "K", 5)),
        ((2, 6, "K"), (2, "K", 5)),
        ((2, 3, 6, "K"), (3, "K", 5)),
        ((3, 1, 6, "K"), (1, 4, "K", 5)),
        ((2, 1, "K"), ("K", 5)),
    ],
    ids=["2d", "3d-a", "4d-a", "3d-b", "batched", "broadcast-b", "broadcast-both", "m1-batched"],
)
def test_matmul_batch_dims(a_shape, b_shape, b_const, k, opset):
    fill = lambda s: tuple(k if d == "K" else d for d in s)  # noqa: E731
    model, feeds = matmul_model(fill(a_shape), fill(b_shape), b_const, opset)
    assert_split_equal(model, feeds, 4)


def test_opset_11_reduce_sum_axes_attribute():
    model, feeds = gemm_model(4, 6, 40, 0, 1, (6,), False, True, 11)
    result = assert_split_equal(model, feeds, 4)
    (reduce,) = [n for n in result.model.graph.node if n.op_type == "ReduceSum"]
    assert len(reduce.input) == 1 and [a.name for a in reduce.attribute if a.name == "axes"]


def test_dynamic_batch_dim_passes_through_reshape():
    model, feeds = matmul_model((3, 5, 96), (96, 7), True, 17, a_input_shape=["batch", 5, 96])
    assert_split_equal(model, feeds, 3)
    assert split_k(model, "auto").nodes[0].action == "skip"  # the cost model needs the batch


def test_bias_added_once_after_the_reduction():
    # a bias 1000x the products: added once per split it would be off by (S - 1) * |bias|
    model, feeds = gemm_model(3, 8, 64, 0, 0, (8,), True, True, 17, alpha=1.0, beta=1.0, bias_scale=1000.0)
    result = assert_split_equal(model, feeds, 8)
    nodes = result.model.graph.node
    (add,) = [n for n in nodes if n.op_type == "Add"]
    (reduce,) = [n for n in nodes if n.op_type == "ReduceSum"]
    (matmul,) = [n for n in nodes if n.op_type == "MatMul"]
    assert reduce.output[0] in add.input and add.output[0] == "y"
    assert "c" not in matmul.input and len(matmul.input) == 2


def test_alpha_and_beta_applied_once():
    model, feeds = gemm_model(3, 8, 64, 1, 1, (3, 8), False, False, 17, alpha=3.0, beta=-2.0)
    result = assert_split_equal(model, feeds, 4)
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("Mul") == 2 and ops.count("Add") == 1
    assert ops.index("ReduceSum") < ops.index("Add")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    b_batched=st.booleans(),
    m=st.integers(1, 9),
    n=st.integers(1, 9),
    k=st.integers(4, 130),
    splits=st.integers(2, 9),
    b_const=st.booleans(),
    opset=st.sampled_from([13, 17]),
    seed=st.integers(0, 2**16),
)
def test_property_random_matmul_shapes(batch, b_batched, m, n, k, splits, b_const, opset, seed):
    if k < 2 * splits:
        splits = k // 2
    b_shape = (tuple(batch) if b_batched else ()) + (k, n)
    model, feeds = matmul_model(tuple(batch) + (m, k), b_shape, b_const, opset, seed=seed)
    assert_split_equal(model, feeds, splits)


# ---- what the pass leaves alone --------------------------------------------------------------------


def test_off_leaves_model_unchanged():
    model, _ = gemm_model(4, 6, 512, 0, 0, (6,), True, True, 17)
    result = split_k(model, "off")
    assert result.model.SerializeToString() == model.SerializeToString() and result.nodes == []


def test_forced_split_needs_two_elements_per_split():
    model, _ = matmul_model((4, 10), (10, 3), True, 17)
    (report,) = split_k(model, 6).nodes
    assert report.action == "skip" and "K=10" in report.reason


def test_dynamic_k_is_skipped():
    model, _ = matmul_model((4, 10), (10, 3), False, 17, a_input_shape=[4, "k"])
    graph = model.graph
    graph.input[1].type.tensor_type.shape.dim[0].dim_param = "k"
    (report,) = split_k(model, 2).nodes
    assert report.action == "skip" and "K" in report.reason


def test_integer_matmul_is_skipped():
    a = helper.make_tensor_value_info("a", TensorProto.INT32, [4, 64])
    b = numpy_helper.from_array(np.ones((64, 3), np.int32), "b")
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [4, 3])
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], [a], [y], [b], 17)
    (report,) = split_k(model, 2).nodes
    assert report.action == "skip" and "int32" in report.reason


def test_matrix_vector_is_skipped():
    model, _ = matmul_model((4, 64), (64,), True, 17)
    (report,) = split_k(model, 2).nodes
    assert report.action == "skip" and "1-D" in report.reason


@pytest.mark.parametrize("bad", ["1", "0", "-3", "many", "1.5"])
def test_bad_split_values_are_user_errors(bad):
    with pytest.raises(TrtfuseError):
        parse_split_mode(bad)


def test_split_mode_values():
    assert parse_split_mode("AUTO") == "auto" and parse_split_mode("off") == "off" and parse_split_mode("8") == 8


def test_bad_emit_is_user_error():
    model, _ = matmul_model((4, 64), (64, 3), True, 17)
    with pytest.raises(TrtfuseError, match="emit"):
        split_k(model, 2, emit="kernel")


# ---- plugin emission (the hook for a split-K kernel) ------------------------------------------------


def _split_k_gemm_reference():
    from onnx.reference.op_run import OpRun

    class SplitKGemm(OpRun):
        op_domain = DOMAIN

        def _run(self, a, weight, bias, splits=None, plugin_namespace=None, aot=None):
            k = a.shape[-1]
            step = -(-k // splits)
            y = np.zeros(a.shape[:-1] + (weight.shape[1],), np.float32)
            for s in range(splits):
                y += a[..., s * step : (s + 1) * step] @ weight[s * step : (s + 1) * step]
            return (y + bias,)

    return SplitKGemm


@pytest.mark.parametrize("bias", ["none", "n", "1n", "scalar"])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_plugin_node_follows_op_schema(trans_b, bias):
    from onnx.reference import ReferenceEvaluator

    shape = {"none": None, "n": (7,), "1n": (1, 7), "scalar": ()}[bias]
    model, feeds = gemm_model(5, 7, 50, 0, trans_b, shape, True, True, 17)
    result = split_k(model, 4, emit="plugin")
    assert [r.action for r in result.nodes] == ["plugin"]
    onnx.checker.check_model(result.model, full_check=True)
    (node,) = result.model.graph.node
    assert (node.op_type, node.domain) == (SPLIT_K_GEMM.name, DOMAIN)
    assert len(node.input) == len(SPLIT_K_GEMM.inputs)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert set(SPLIT_K_GEMM.attribute_names) | set(SPLIT_K_GEMM.parser_attributes) == set(attrs)
    assert attrs["splits"] == 4
    got = ReferenceEvaluator(result.model, new_ops=[_split_k_gemm_reference()]).run(None, feeds)[0]
    want = run(model, feeds)
    assert np.abs(got - want).max() / np.abs(want).max() <= REL_TOL


def test_plugin_declines_what_the_op_cannot_express():
    model, _ = gemm_model(5, 7, 50, 0, 0, (5, 7), True, True, 17)
    (report,) = split_k(model, 4, emit="plugin").nodes
    assert report.action == "skip" and "per column" in report.reason
    model, _ = gemm_model(5, 7, 50, 0, 0, (7,), False, True, 17)
    assert split_k(model, 4, emit="plugin").nodes[0].action == "skip"


# ---- the cost model ---------------------------------------------------------------------------------


def test_auto_declines_seed_example_on_h200():
    # seed 001: [1, 49, 2016] x [2016, 448]; measured on the H200: 14.6 us plain, 20.5 us with 8 splits
    seed = GemmProblem(m=49, n=448, k=2016)
    decision = decide(seed, H200)
    assert not decision.accepted and "gain below" in decision.reason
    assert predict_split(seed, H200, 8).total_us > predict_plain(seed, H200).total_us
    model, _ = matmul_model((1, 49, 2016), (2016, 448), True, 17)
    result = split_k(model, "auto", device="h200")
    assert result.nodes[0].action == "skip" and len(result.model.graph.node) == 1


def test_auto_splits_a_skinny_long_k_gemm():
    # 8 output tiles of 32x32, K = 16384: the plain GEMM streams 16 MB of weight through 8 SMs
    decision = decide(GemmProblem(m=8, n=256, k=16384, has_bias=True), H200)
    assert decision.accepted and decision.split_us < decision.plain_us
    model, feeds = gemm_model(8, 256, 16384, 0, 0, (256,), True, True, 17, alpha=1.0, beta=1.0)
    result = assert_split_equal(model, feeds, "auto")
    assert result.nodes[0].splits == decision.splits


def test_matrix_vector_plain_gemm_streams_at_full_bandwidth():
    # M == 1 runs as a GEMV: measured 5.6 us at batch 1 vs 16 us at batch 2 for ResNet-50's fc (CUDA graph)
    assert predict_plain(GemmProblem(m=1, n=1000, k=2048), H200).total_us < predict_plain(GemmProblem(m=2, n=1000, k=2048), H200).total_us


def test_measured_results_fitted_constants_reproduce_their_record():
    # bench/results holds the H200 sweep. Its fitted (CUDA-graph, fp32) constants, run through today's cost model,
    # must be wrong on exactly the shapes the file records (a cost-model change without a refit fails here), and
    # must decline ResNet-50's fc at batch 1 (measured slower split) and split it at batch 2..8 (measured 1.5x faster)
    from pathlib import Path

    from trtfuse.bench.splitk import summarize

    path = Path(__file__).resolve().parents[1] / "bench" / "results" / "splitk-NVIDIA_H200.json"
    if not path.is_file():
        pytest.skip("no H200 results file in this checkout")
    data = json.loads(path.read_text())
    fitted = device_params(str(path))
    rows = summarize(data["records"], fitted, "float32", "graph_us")
    assert sorted(r["name"] for r in rows if r["decision_right"] is False) == sorted(data["fitted"]["graph_us"]["wrong"])
    assert [decide(GemmProblem(m=b, n=1000, k=2048, has_bias=True), fitted).accepted for b in (1, 2, 4, 8)] == [False, True, True, True]


def test_auto_declines_when_tiles_fill_the_gpu():
    decision = decide(GemmProblem(m=512, n=4096, k=16384), H200)
    assert not decision.accepted and "fill" in decision.reason


def test_ctas_per_sm_counts_underfilled_grids():
    # 256 x 1024 in 32 x 32 tiles is 256 CTAs: they fill 132 SMs one CTA each, but an SM that needs 4 resident
    # CTAs to reach its peak runs them at half rate, and splitting K fills the remaining slots
    problem = GemmProblem(m=256, n=1024, k=8192)
    assert "fill" in decide(problem, H200).reason
    latency_bound = H200.replace(ctas_per_sm=4)
    assert predict_plain(problem, latency_bound).total_us > predict_plain(problem, H200).total_us
    assert decide(problem, latency_bound).accepted


def test_auto_respects_min_k_per_split():
    decision = decide(GemmProblem(m=1, n=256, k=400), H200)
    assert not decision.accepted and "per split" in decision.reason
    for s in range(2, 65):
        d = decide(GemmProblem(m=1, n=256, k=256 * s), H200)
        assert d.splits == 0 or 256 * s // d.splits >= H200.min_k_per_split


def test_fewer_kernel_overheads_make_splitting_pay_sooner():
    seed = GemmProblem(m=49, n=448, k=2016)
    assert decide(seed, H200.replace(kernel_overhead_us=0.5)).accepted
    assert decide(seed, H200, fused=True).accepted  # one kernel: no transpose, no separate reduction


def test_device_params_from_json(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(H200.replace(name="mine", tile_m=64).to_dict()))
    assert device_params(str(path)) == H200.replace(name="mine", tile_m=64)
    path.write_text(json.dumps({**H200.to_dict(), "warp_speed": 9}))
    with pytest.raises(TrtfuseError, match="warp_speed"):
        device_params(str(path))
    with pytest.raises(TrtfuseError, match="unknown split-K device"):
        device_params("a100")
    assert isinstance(device_params(None), DeviceParams)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 9),
    n=st.integers(1, 9),
    k=st.integers(4, 130),
    splits=st.integers(2, 9),
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    bias=st.sampled_from(list(BIAS_SHAPES)),
    b_const=st.booleans(),
    c_const=st.booleans(),
    alpha=st.sampled_from([1.0, -0.5, 2.0]),
    beta=st.sampled_from([1.0, 0.0, 3.0]),
    seed=st.integers(0, 2**16),
)
def test_property_random_gemm(m, n, k, splits, trans_a, trans_b, bias, b_const, c_const, alpha, beta, seed):
    splits = min(splits, k // 2)
    shape = BIAS_SHAPES[bias]
    bias_shape = None if shape is None else tuple({"M": m, "N": n}.get(d, d) for d in shape)
    model, feeds = gemm_model(m, n, k, trans_a, trans_b, bias_shape, b_const, c_const, 17, alpha, beta, seed)
    assert_split_equal(model, feeds, splits)


# ---- bench/splitk.py: everything but the GPU timing ---------------------------------------------------


def test_bench_sweep_covers_the_issue_shapes():
    from trtfuse.bench.splitk import sweep_shapes

    shapes = sweep_shapes()
    assert 40 <= len(shapes) <= 80 and len({s.name for s in shapes}) == len(shapes)
    assert {s.m for s in shapes} >= {1, 512} and {s.n for s in shapes} >= {256, 4096} and {s.k for s in shapes} >= {512, 16384}
    assert any((s.m, s.n, s.k, s.bias) == (49, 448, 2016, False) for s in shapes)
    assert {s.m for s in shapes if (s.n, s.k) == (1000, 2048)} == {1, 2, 4, 8}
    assert len(sweep_shapes(quick=True)) < len(shapes)


def test_bench_split_counts_and_names():
    from trtfuse.bench.splitk import device_slug, params_for_device, record_name, splits_to_time

    assert splits_to_time(512) == [2, 4] and splits_to_time(16384) == [2, 4, 8, 16, 32, 64] and splits_to_time(2048) == [2, 4, 8, 16]
    assert device_slug("NVIDIA H200") == "nvidia-h200"
    assert record_name("float32") == "splitk" and record_name("float16") == "splitk-fp16"
    assert params_for_device("NVIDIA H100 80GB HBM3", None).name == "h100"
    assert params_for_device("NVIDIA H200", None).name == "h200"


def test_bench_judges_decisions():
    from trtfuse.bench.splitk import judge

    assert judge(0, 10.0, {2: 12.0, 4: 9.5}, 0.1) is True  # 5% gain is below the 10% threshold
    assert judge(0, 10.0, {2: 12.0, 4: 8.0}, 0.1) is False  # missed a 25% gain
    assert judge(4, 10.0, {2: 12.0, 4: 8.0}, 0.1) is True
    assert judge(2, 10.0, {2: 12.0, 4: 8.0}, 0.1) is False
    assert judge(0, None, {}, 0.1) is None


def _synthetic_records(true_params, dtype="float32"):
    from trtfuse.bench.splitk import splits_to_time, sweep_shapes
    from trtfuse.graph_passes.cost_model import padded_k, predict_us

    records = []
    for shape in sweep_shapes(quick=True):
        p = shape.problem(dtype)
        plain = predict_us(p, true_params, 1)
        # only the split counts `auto` may choose: a split it may not choose (K / S < min_k_per_split) that is 10 %
        # faster makes even the model that made the timings decline wrongly
        for s in [s for s in splits_to_time(shape.k) if padded_k(shape.k, s) // s >= true_params.min_k_per_split]:
            t = predict_us(p, true_params, s)
            records.append(
                {"name": shape.name, "M": shape.m, "N": shape.n, "K": shape.k, "bias": shape.bias, "splits": s,
                 "plain_us": plain, "rewritten_us": t, "plain_graph_us": None, "rewritten_graph_us": None}
            )
    return records


def test_bench_fit_recovers_the_constants_that_made_the_timings():
    from trtfuse.bench.splitk import observations, summarize
    from trtfuse.graph_passes.cost_model import fit

    truth = H200.replace(tile_m=64, tile_n=64, kernel_overhead_us=1.5, sm_dram_bytes_per_s=8 * H200.dram_bytes_per_s / H200.sms)
    records = _synthetic_records(truth)
    fitted, err = fit(list(observations(records, "float32", "us")), H200)
    assert err < 1e-9  # every timing reproduced exactly
    # the sweep's shapes pin the tile and the overhead; several per-SM DRAM shares x CTAs per SM explain these
    # DRAM-bound timings equally well, so only the tile and overhead are asserted
    assert (fitted.tile_m, fitted.kernel_overhead_us) == (64, 1.5)
    rows = summarize(records, fitted, "float32", "us")
    assert all(r["decision_right"] for r in rows)


def test_bench_results_file_feeds_the_pass(tmp_path):
    fitted = H200.replace(name="h200-fitted", kernel_overhead_us=0.5)
    path = tmp_path / "splitk-nvidia-h200-2026-11-22.json"
    path.write_text(json.dumps({"benchmark": "splitk", "fitted": {"us": {"params": fitted.to_dict()}}}))
    assert device_params(str(path)) == fitted
    model, _ = matmul_model((1, 49, 2016), (2016, 448), True, 17)
    assert split_k(model, "auto", device=str(path)).nodes[0].action == "rewrite"


def test_bench_without_torch_is_a_clear_error():
    import argparse
    import importlib.util

    from trtfuse.bench import splitk

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    parser = argparse.ArgumentParser()
    splitk.add_arguments(parser)
    args = parser.parse_args([])
    args.output, args.json = None, False
    with pytest.raises(TrtfuseError, match="PyTorch"):
        splitk.run(args)


def test_cli_options_reach_the_pass():
    import argparse

    from trtfuse.graph_passes.split_k import add_split_k_arguments, split_k_from_args

    parser = argparse.ArgumentParser()
    add_split_k_arguments(parser)
    model, feeds = matmul_model((3, 64), (64, 5), True, 17)
    assert split_k_from_args(model, parser.parse_args([])).nodes == []
    result = split_k_from_args(model, parser.parse_args(["--split-k", "4"]))
    assert result.nodes[0].splits == 4
    assert split_k_from_args(model, parser.parse_args(["--split-k", "4", "--split-k-emit", "plugin"])).nodes[0].action == "plugin"
    with pytest.raises(TrtfuseError, match="split count"):
        split_k_from_args(model, parser.parse_args(["--split-k", "1"]))


def test_measure_times_on_the_gpu_once_then_uses_the_cache(tmp_path):
    """`--split-k measure` with a GPU timer: the fastest split wins when it is min_gain faster; a second rewrite of
    the same shape on the same device reads the cache instead of timing; another device times again."""
    calls = []

    def timer(problem, candidates):
        calls.append((problem.m, problem.n, problem.k, tuple(candidates)))
        return 20.0, {s: 40.0 / s for s in candidates}  # the most splits are fastest: 40 / 8 = 5 us < 20 / 1.1

    model, feeds = matmul_model((1, 49, 2016), (2016, 448), True, 17)
    cache = tmp_path / "measure.json"
    first = split_k(model, "measure", gpu=("GPU A", timer), measure_cache=cache)
    assert first.nodes[0].splits == 8 and "timed on GPU A" in first.nodes[0].reason  # 2016 / 8 >= 128; 16 leaves 126
    assert calls == [(49, 448, 2016, (2, 4, 8))]
    again = split_k(model, "measure", gpu=("GPU A", timer), measure_cache=cache)
    assert len(calls) == 1 and "cached timing on GPU A" in again.nodes[0].reason and again.nodes[0].splits == 8
    np.testing.assert_allclose(run(again.model, feeds), run(model, feeds), rtol=1e-4, atol=1e-4)
    split_k(model, "measure", gpu=("GPU B", timer), measure_cache=cache)
    assert len(calls) == 2 and len(json.loads(cache.read_text())) == 2


def test_measure_declines_what_is_not_min_gain_faster_and_uses_the_model_without_a_gpu(tmp_path):
    model, _ = matmul_model((1, 49, 2016), (2016, 448), True, 17)
    slow = lambda p, cands: (20.0, {s: 19.0 for s in cands})  # 5 % faster: under min_gain
    result = split_k(model, "measure", gpu=("GPU A", slow), measure_cache=tmp_path / "m.json")
    assert result.nodes[0].action == "skip" and "no split" in result.nodes[0].reason
    result = split_k(model, "measure", gpu=None, measure_cache=tmp_path / "m.json")
    auto = split_k(model, "auto")
    assert "no GPU to time on" in result.nodes[0].reason and result.nodes[0].splits == auto.nodes[0].splits


def test_bench_heldout_rate_is_judged_on_shapes_the_fit_never_saw():
    from trtfuse.bench.splitk import heldout_evaluation, heldout_split

    truth = H200.replace(tile_m=64, tile_n=64, kernel_overhead_us=1.5, sm_dram_bytes_per_s=8 * H200.dram_bytes_per_s / H200.sms)
    records = _synthetic_records(truth)
    fit_half, judged_half = heldout_split(records)
    assert not set(fit_half) & set(judged_half) and len(fit_half) + len(judged_half) == len({r["name"] for r in records})
    result = heldout_evaluation(records, H200, "float32", "us")
    assert [r["judged_shapes"] for r in result["rounds"]] == [judged_half, fit_half]
    assert result["judged"] == len(fit_half) + len(judged_half) and result["rate"] == 1.0  # a model that made the timings


def test_bench_measured_rate_needs_repeat_timings():
    from trtfuse.bench.splitk import measured_evaluation

    records = [{"name": "a", "splits": 2, "plain_graph_us": 10.0, "rewritten_graph_us": 5.0,
                "plain_graph_us_repeat": 10.0, "rewritten_graph_us_repeat": 12.0},
               {"name": "b", "splits": 2, "plain_graph_us": 10.0, "rewritten_graph_us": 9.5,
                "plain_graph_us_repeat": 10.0, "rewritten_graph_us_repeat": 9.6}]
    m = measured_evaluation(records, H200)
    assert (m["right"], m["judged"], m["wrong"]) == (1, 2, ["a"])  # a: split on the first timing, slower on the second
    assert measured_evaluation([{**r, "plain_graph_us_repeat": None} for r in records], H200) is None


def test_stored_results_rates_are_recomputed_from_their_timings():
    # both H200 results files: the right-decision rates they state (in-sample and held out, both timing kinds) are
    # what today's cost model and fit make of their timings; and the fp32 CUDA-graph held-out rate is the stated one
    from pathlib import Path

    from trtfuse.bench.splitk import fit_to_records, heldout_evaluation

    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    paths = [results / "splitk-NVIDIA_H200.json", results / "splitk-fp16-NVIDIA_H200.json"]
    if not all(p.is_file() for p in paths):
        pytest.skip("no H200 results files in this checkout")
    for path in paths:
        data = json.loads(path.read_text())
        base = DeviceParams.from_dict(data["cost_model"])
        for timing, rates in data["right_decision_rates"].items():
            if timing == "measured":
                continue
            fitted = fit_to_records(data["records"], base, data["dtype"], timing)
            assert fitted["decisions_right"] / fitted["decisions_judged"] == rates["fitted_all_shapes"], (path.name, timing)
            assert fitted["params"] == data["fitted"][timing]["params"], (path.name, timing)
            held = heldout_evaluation(data["records"], base, data["dtype"], timing)
            assert held["rate"] == rates["fitted_heldout"] == data["heldout"][timing]["rate"], (path.name, timing)
    fp32 = json.loads(paths[0].read_text())
    # the acceptance figure: fp32 CUDA-graph timings, constants fitted on one half of the shapes, judged on the other
    assert (fp32["heldout"]["graph_us"]["right"], fp32["heldout"]["graph_us"]["judged"]) == (70, 77)
    assert fp32["heldout"]["graph_us"]["rate"] >= 0.90


def test_fit_decides_the_whole_grid_as_decide_does():
    # fit scores every grid point's decisions at once (numpy); they must be decide()'s, flags and all
    import random

    from trtfuse.graph_passes.cost_model import _decisions, _grid

    rng = random.Random(7)
    problems = [GemmProblem(m=rng.choice([1, 2, 7, 49, 256, 512]), n=rng.choice([1, 64, 256, 1000, 4096]), k=rng.choice([300, 512, 2016, 16384]),
                            batch=rng.choice([1, 3]), a_transposed=rng.random() < 0.3, b_constant=rng.random() < 0.7,
                            b_transposed=rng.random() < 0.3, alpha_scale=rng.random() < 0.3, has_bias=rng.random() < 0.5)
                for _ in range(40)]
    combos, grid = _grid(H200)
    chosen = _decisions(problems, grid, H200)
    for i in rng.sample(range(len(combos)), 25):
        tile_m, tile_n, cps, overhead, share, gemv_cols = combos[i]
        dev = H200.replace(tile_m=int(tile_m), tile_n=int(tile_n), ctas_per_sm=int(cps), kernel_overhead_us=float(overhead),
                           sm_dram_bytes_per_s=float(share * H200.dram_bytes_per_s / H200.sms), gemv_cols_per_cta=int(gemv_cols))
        assert [decide(p, dev).splits for p in problems] == list(chosen[i]), combos[i]


def test_plain_gemm_picks_its_tile_and_m1_streams():
    from trtfuse.graph_passes.cost_model import gemm_us

    # a large GEMM fills the GPU with some tile of the menu: near the fp32 peak, so splitting cannot pay
    big = GemmProblem(m=512, n=4096, k=16384)
    ideal_us = 1e6 * 2 * big.m * big.n * big.k / H200.flops_for("float32")
    assert ideal_us <= predict_plain(big, H200).total_us < 1.1 * ideal_us
    half = GemmProblem(m=256, n=4096, k=16384)  # 64 tiles of 128 x 128 would leave half the SMs idle; 64 x 128 fills them
    assert 1.9 < predict_plain(half, H200.replace(plain_tiles=((128, 128),))).total_us / predict_plain(half, H200).total_us < 2.1
    # rows past M are computed: with M = 4 a 32-row tile costs as much as M = 32
    assert gemm_us(GemmProblem(m=4, n=256, k=4096), H200) == gemm_us(GemmProblem(m=32, n=256, k=4096), H200)
    # M == 1: the rewrite's batched GEMM streams the weight like the plain GEMV, so splitting never pays
    fc = GemmProblem(m=1, n=1000, k=2048)
    assert gemm_us(fc, H200, 8) == pytest.approx(gemm_us(fc, H200, 1), rel=0.05)
    assert not decide(fc, H200).accepted
    # ... unless the GEMV's outputs fit on so few CTAs that the per-SM cap holds it back (a narrow B, small N)
    narrow = GemmProblem(m=1, n=64, k=16384)
    assert gemm_us(narrow, H200, 1) > 1.5 * gemm_us(narrow, H200.replace(gemv_cols_per_cta=1), 1)


def test_device_params_plain_tiles_round_trip(tmp_path):
    path = tmp_path / "dev.json"
    mine = H200.replace(name="mine", plain_tiles=((32, 32), (64, 128)))
    path.write_text(json.dumps(mine.to_dict()))
    assert device_params(str(path)) == mine
    older = {k: v for k, v in H200.to_dict().items() if k != "plain_tiles"}  # files written before the menu existed
    path.write_text(json.dumps(older))
    assert device_params(str(path)) == H200
    path.write_text(json.dumps({**H200.to_dict(), "plain_tiles": [32, 64]}))
    with pytest.raises(TrtfuseError, match="plain_tiles"):
        device_params(str(path))
