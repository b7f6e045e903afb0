"""Network ops around the fused convs: the numpy references against ONNX Runtime's own operators on
the CPU, and the CUDA kernels against the references on the GPU (fresh random data, output poisoned)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtfuse.plugins import reference as ref
from trtfuse.plugins.cuda_driver import gpu_available
from trtfuse.plugins.layout import pack_nchwv, round_up, unpack_nchwv


def _ort(node, inputs, out_type, out_shape, opset=13):
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT if v.dtype == np.float32 else TensorProto.INT8, v.shape)
           for n, v in inputs.items()]
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", out_type, out_shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]


def test_quantize_matches_onnx_quantizelinear():
    rng = np.random.default_rng()
    x = (rng.normal(size=(2, 3, 7, 5)) * 3).astype(np.float32)
    x.flat[:4] = [0.5, 1.5, -2.5, 1000.0]  # ties to even, saturation (with scale 1 below)
    for scale in (np.float32(1.0), np.float32(0.0173)):
        node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
        got = _ort(node, {"x": x, "s": np.array(scale, np.float32), "z": np.array(0, np.int8)}, TensorProto.INT8, x.shape)
        assert np.array_equal(ref.quantize(x, scale), got)


def test_maxpool_matches_onnx_on_int8():
    x = np.random.default_rng().integers(-128, 128, (2, 5, 9, 11), dtype=np.int8)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    got = _ort(node, {"x": x}, TensorProto.INT8, None)
    assert np.array_equal(ref.maxpool_int8(x, 3, 2, 1), got)


def test_global_avgpool_is_the_dequantized_mean_requantized():
    x = np.random.default_rng().integers(-128, 128, (2, 64, 7, 7), dtype=np.int8)
    y = ref.global_avgpool_int8(x, 0.05, 0.01)
    expect = np.clip(np.rint(x.astype(np.float64).mean(axis=(2, 3)) * 0.05 / 0.01), -128, 127)
    assert np.abs(y.astype(np.int32) - expect).max() <= 1


def test_classifier_gemm_reference():
    rng = np.random.default_rng()
    x = rng.integers(-128, 128, (3, 64), dtype=np.int8)
    w = rng.integers(-127, 128, (10, 64), dtype=np.int8)
    scale, bias = rng.uniform(1e-4, 1e-3, 32).astype(np.float32), rng.normal(size=32).astype(np.float32)
    y = ref.gemm_int8_f32out(x, w, scale, bias)
    np.testing.assert_allclose(y, (x.astype(np.float64) @ w.T.astype(np.float64)) * scale[:10] + bias[:10], rtol=1e-6)


_ok, _why = gpu_available()


def needs_gpu(test):
    """Marked `gpu` (selected by `pytest -m gpu`) and skipped, saying why, where there is no GPU."""
    return pytest.mark.gpu(pytest.mark.skipif(not _ok, reason=f"needs a CUDA GPU: {_why}")(test))


@pytest.mark.parametrize("c,vec", [(3, 4), (3, 32), (64, 32), (40, 32)])
@needs_gpu
def test_quantize_kernel(c, vec):
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    x = (np.random.default_rng().normal(size=(3, c, 13, 9)) * 4).astype(np.float32)
    scale = np.array([0.031], np.float32)
    xb, sb = cd.DeviceBuffer.from_array(x), cd.DeviceBuffer.from_array(scale)
    shape = (3, round_up(c, vec) // vec, 13, 9, vec)
    yb = cd.DeviceBuffer(int(np.prod(shape)))
    yb.fill(0x5A)
    network_ops.quantize(xb.ptr, sb.ptr, 3, c, 13, 9, yb.ptr, vec)
    raw = yb.download(shape, np.int8)
    assert np.array_equal(raw, pack_nchwv(ref.quantize(x, scale[0]), vec))


@pytest.mark.parametrize("c,h,w", [(3, 14, 10), (3, 13, 9), (4, 6, 7), (1, 5, 8)])
@needs_gpu
def test_quantize_space_to_depth_kernel(c, h, w):
    """fp32 NCHW -> the stem's folded CHW16 input (plugins/stem.py), odd sizes zero-padded."""
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops, stem

    x = (np.random.default_rng().normal(size=(3, c, h, w)) * 4).astype(np.float32)
    scale = np.array([0.031], np.float32)
    xb, sb = cd.DeviceBuffer.from_array(x), cd.DeviceBuffer.from_array(scale)
    shape = (3, 1, (h + 1) // 2, (w + 1) // 2, 16)
    yb = cd.DeviceBuffer(int(np.prod(shape)))
    yb.fill(0x5A)
    network_ops.quantize_s2d(xb.ptr, sb.ptr, 3, c, h, w, yb.ptr)
    raw = yb.download(shape, np.int8)
    assert np.array_equal(raw, pack_nchwv(stem.fold_input(ref.quantize(x, scale[0])), 16))


@needs_gpu
def test_maxpool_and_avgpool_kernels():
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    rng = np.random.default_rng()
    for n, c, h, w in ((2, 64, 112, 112), (3, 40, 9, 11)):
        x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
        xb = cd.DeviceBuffer.from_array(pack_nchwv(x, 32))
        oh, ow = (h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1
        yb = cd.DeviceBuffer(n * round_up(c, 32) * oh * ow)
        yb.fill(0x5A)
        network_ops.maxpool(xb.ptr, n, c, h, w, 3, 2, 1, yb.ptr)
        got = unpack_nchwv(yb.download((n, round_up(c, 32) // 32, oh, ow, 32), np.int8), c)
        assert np.array_equal(got, ref.maxpool_int8(x, 3, 2, 1))
        s_in, s_out = np.array([0.05], np.float32), np.array([0.013], np.float32)
        ab = cd.DeviceBuffer(n * round_up(c, 32))
        ab.fill(0x5A)
        s_in_b, s_out_b = cd.DeviceBuffer.from_array(s_in), cd.DeviceBuffer.from_array(s_out)  # keep alive
        network_ops.global_avgpool(xb.ptr, s_in_b.ptr, s_out_b.ptr, n, c, h, w, ab.ptr)
        cd.check(cd._driver().cuCtxSynchronize())
        got = ab.download((n, round_up(c, 32)), np.int8)
        assert np.array_equal(got[:, :c], ref.global_avgpool_int8(x, s_in[0], s_out[0]))
        assert not got[:, c:].any()


@pytest.mark.parametrize("batch,splits", [(1, 1), (1, 8), (8, 4), (256, 1)])
@needs_gpu
def test_classifier_gemm_kernel(batch, splits):
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins.conv import ConvLaunch
    from trtfuse.plugins.layout import pack_weight
    from trtfuse.plugins.tactics import ConvShape

    rng = np.random.default_rng()
    x = rng.integers(-128, 128, (batch, 2048), dtype=np.int8)
    w = rng.integers(-127, 128, (1000, 2048), dtype=np.int8)
    scale = np.zeros(1024, np.float32)
    scale[:1000] = rng.uniform(1e-6, 1e-5, 1000)
    bias = np.zeros(1024, np.float32)
    bias[:1000] = rng.normal(size=1000)
    shape = ConvShape(batch, 2048, 1, 1, 1000, 1, 1)
    plan = ConvLaunch.plan(shape, 4, splits, out_f32=True)
    bufs = [cd.DeviceBuffer.from_array(a) for a in (x, pack_weight(w.reshape(1000, 2048, 1, 1)), scale, bias, np.ones(1, np.float32))]
    y = cd.DeviceBuffer(batch * 1000 * 4)
    y.fill(0xFF)  # NaN pattern
    ws = cd.DeviceBuffer(max(plan.workspace_bytes, 4))
    ws.fill(0)
    for _ in range(2):  # the second run reuses the self-cleaned workspace
        plan.launch(*(b.ptr for b in bufs), y.ptr, workspace=ws.ptr if splits > 1 else 0)
        cd.check(cd._driver().cuCtxSynchronize())
        got = y.download((batch, 1000), np.float32)
        assert np.array_equal(got, ref.gemm_int8_f32out(x, w, scale, bias))


@needs_gpu
def test_gather_rows_kernel():
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    rng = np.random.default_rng()
    src = rng.integers(-128, 128, (50, 3 * 16 * 16 * 4), dtype=np.int8)
    index = rng.integers(0, 50, 17).astype(np.int64)
    sb, ib = cd.DeviceBuffer.from_array(src), cd.DeviceBuffer.from_array(index)
    db = cd.DeviceBuffer(17 * src.shape[1])
    db.fill(0x5A)
    network_ops.gather_rows(sb.ptr, ib.ptr, src.shape[1], 17, db.ptr)
    assert np.array_equal(db.download((17, src.shape[1]), np.int8), src[index])
