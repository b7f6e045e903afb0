"""Network ops around the fused convs: the numpy references against ONNX Runtime's own operators on
the CPU, and the CUDA kernels against the references on the GPU (fresh random data, output poisoned)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtfuse.plugins import reference as ref
from trtfuse.plugins.cuda_driver import gpu_available
from trtfuse.plugins.layout import pack_nchwv, round_up


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
    product = (x.astype(np.float64) @ w.T.astype(np.float64)) * scale[:10]  # |acc| <= 2^20: exact in fp32 too
    exact = product + bias[:10]
    # fp32 rounds the product and the sum once each: within 2^-24 of each (2^-23 for margin). A relative tolerance on y
    # alone fails where the two terms cancel (y ~ 0.05 from terms ~ 1; seen once in CI with rtol 1e-6).
    assert np.all(np.abs(y - exact) <= 2.0**-23 * (np.abs(product) + np.abs(exact)))


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
    from trtfuse.bench.sanitize import device_maxpool
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    rng = np.random.default_rng()
    for n, c, h, w in ((2, 64, 112, 112), (3, 40, 9, 11), (2, 2048, 7, 7), (1, 40, 8, 8)):  # ResNet-50 last map: 7x7, 2048 channels
        x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
        xb = cd.DeviceBuffer.from_array(pack_nchwv(x, 32))
        for k, stride, pad in ((3, 2, 1), (2, 2, 0), (3, 1, 1), (5, 3, 2)):  # ResNet's first; other windows
            got, returned = device_maxpool(x, k, stride, pad)
            assert returned == ((h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
            assert np.array_equal(got, ref.maxpool_int8(x, k, stride, pad)), (n, c, h, w, k, stride, pad)
        s_in, s_out = np.array([0.05], np.float32), np.array([0.013], np.float32)
        ab = cd.DeviceBuffer(n * round_up(c, 32))
        ab.fill(0x5A)
        s_in_b, s_out_b = cd.DeviceBuffer.from_array(s_in), cd.DeviceBuffer.from_array(s_out)  # keep alive
        network_ops.global_avgpool(xb.ptr, s_in_b.ptr, s_out_b.ptr, n, c, h, w, ab.ptr)
        cd.check(cd._driver().cuCtxSynchronize())
        got = ab.download((n, round_up(c, 32)), np.int8)
        assert np.array_equal(got[:, :c], ref.global_avgpool_int8(x, s_in[0], s_out[0]))
        assert not got[:, c:].any()
        fb = cd.DeviceBuffer(n * c * 4)
        fb.fill(0x5A)
        network_ops.global_avgpool_f32(xb.ptr, s_in_b.ptr, n, c, h, w, fb.ptr)  # the fp32 tail's: the mean, dequantized
        cd.check(cd._driver().cuCtxSynchronize())
        mean = x.astype(np.int64).sum(axis=(2, 3)).astype(np.float32) / np.float32(h * w)
        assert np.array_equal(fb.download((n, c), np.float32).view(np.int32), (mean * s_in[0]).view(np.int32)), (n, c, h, w)


@needs_gpu
def test_avgpool_sums_hold_at_the_extremes():
    """Every byte 127 or -128 over a 112 x 112 map (passes of 256 pixels, 16-bit lane totals at their largest), and
    channel halves of opposite extremes: the sums stay exact."""
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    n, c, h, w = 2, 64, 112, 112
    x = np.empty((n, c, h, w), np.int8)
    x[0], x[1] = 127, -128
    x[:, 16:32] = -x[:, 16:32] - 1  # 127 <-> -128 in the second half of the first block
    xb = cd.DeviceBuffer.from_array(pack_nchwv(x, 32))
    s_in = cd.DeviceBuffer.from_array(np.array([0.05], np.float32))
    fb = cd.DeviceBuffer(n * c * 4)
    fb.fill(0x5A)
    network_ops.global_avgpool_f32(xb.ptr, s_in.ptr, n, c, h, w, fb.ptr)
    cd.check(cd._driver().cuCtxSynchronize())
    mean = x.astype(np.int64).sum(axis=(2, 3)).astype(np.float32) / np.float32(h * w)
    assert np.array_equal(fb.download((n, c), np.float32).view(np.int32), (mean * np.float32(0.05)).view(np.int32))


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


def test_linear_reference_is_a_sequential_fma_chain():
    """reference.linear_f32 (what the GPU classifier must equal bit for bit) against a scalar loop over
    libm's fmaf, and on two cases where the answer shows the order and the fusing: a sum that an
    exact dot product or another order would get differently."""
    import ctypes
    import ctypes.util

    fmaf = ctypes.CDLL(ctypes.util.find_library("m")).fmaf
    fmaf.restype, fmaf.argtypes = ctypes.c_float, [ctypes.c_float] * 3
    rng = np.random.default_rng()
    x = rng.normal(size=(3, 37)).astype(np.float32)
    w = (rng.normal(size=(5, 37)) * rng.choice([1e-3, 1.0, 1e3], (5, 37))).astype(np.float32)
    bias = rng.normal(size=5).astype(np.float32)
    want = np.empty((3, 5), np.float32)
    for m in range(3):
        for n in range(5):
            acc = np.float32(0)
            for k in range(37):
                acc = np.float32(fmaf(x[m, k], w[n, k], acc))
            want[m, n] = acc + bias[n]
    assert np.array_equal(ref.linear_f32(x, w, bias).view(np.uint32), want.view(np.uint32))
    # 1e8 + 1 rounds back to 1e8 in float32 before -1e8 arrives: 0, where the exact sum is 1
    one_lost = ref.linear_f32(np.array([[1e8, 1, -1e8]], np.float32), np.ones((1, 3), np.float32), np.zeros(1, np.float32))
    assert one_lost[0, 0] == 0
    # fused: (1 + 2^-12)^2 - (1 + 2^-11) = 2^-24 exactly; rounding the product first would give 0
    t = 1 + 2.0**-12
    fused = ref.linear_f32(np.array([[1, t]], np.float32), np.array([[-(1 + 2.0**-11), t]], np.float32), np.zeros(1, np.float32))
    assert fused[0, 0] == np.float32(2.0**-24)


def test_linear_reference_pads_k_like_the_kernel():
    """The zero steps past K (to a multiple of 32) turn an accumulator of -0 into +0, which a bias of -0
    keeps visible. Every product here is a tiny negative that rounds to -0: with K = 32 there is no zero
    step and the -0 survives, with K = 33 the padding makes it +0."""
    neg_zero = np.array([-0.0], np.float32)
    for k, negative in ((32, True), (33, False)):
        y = ref.linear_f32(np.full((1, k), 1e-30, np.float32), np.full((1, k), -1e-30, np.float32), neg_zero)
        assert y[0, 0] == 0 and np.signbit(y[0, 0]) == negative, k


LINEAR_SHAPES = [(1, 1, 1), (3, 1001, 37), (5, 7, 4), (2, 3, 33), (33, 65, 64), (64, 130, 300), (130, 257, 100),
                 (256, 1000, 2048)]


def test_linear_tile_goes_wide_once_its_grid_fills_the_gpu():
    from trtfuse.plugins import network_ops

    assert network_ops.linear_tile(2048, 1000, 132) == "wide"  # 16 x 8 = 128 CTAs of 128 x 128
    assert network_ops.linear_tile(1024, 1000, 132) == "narrow"  # 64 wide CTAs: half the SMs idle
    assert network_ops.linear_tile(256, 1000, 132) == "narrow"


@pytest.mark.parametrize("tile", ["narrow", "wide"])
@pytest.mark.parametrize("m,n,k", LINEAR_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in LINEAR_SHAPES])
@needs_gpu
def test_linear_f32_kernel_is_bit_exact(m, n, k, tile):
    """Both tiles of trtfuse_linear_f32 equal the sequential-fma reference bit for bit: any other summation
    order or an unfused multiply-add changes the last bits of most outputs of random data (ragged shapes take
    the bounds-checked paths, K % 4 != 0 the scalar loads, K % 32 != 0 the zero steps)."""
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    rng = np.random.default_rng()
    x = rng.normal(size=(m, k)).astype(np.float32)
    w = (rng.normal(size=(n, k)) * 0.05).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    xb, wb, bb = (cd.DeviceBuffer.from_array(a) for a in (x, w, bias))
    yb = cd.DeviceBuffer(m * n * 4)
    yb.fill(0xFF)  # NaN pattern
    network_ops.linear_f32(xb.ptr, wb.ptr, bb.ptr, m, n, k, yb.ptr, tile=tile)
    got = yb.download((m, n), np.float32)
    assert np.array_equal(got.view(np.uint32), ref.linear_f32(x, w, bias).view(np.uint32))


@pytest.mark.parametrize("tile", ["narrow", "wide"])
@needs_gpu
def test_linear_f32_kernel_takes_scalar_loads_for_misaligned_rows(tile):
    """K % 4 == 0 but x starts 4 bytes into its buffer: the float4 loads would fault or misread."""
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    rng = np.random.default_rng()
    m, n, k = 9, 70, 64
    x = rng.normal(size=(m, k)).astype(np.float32)
    w = rng.normal(size=(n, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    xb = cd.DeviceBuffer.from_array(np.concatenate([np.zeros(1, np.float32), x.ravel()]))
    wb, bb = cd.DeviceBuffer.from_array(w), cd.DeviceBuffer.from_array(bias)
    yb = cd.DeviceBuffer(m * n * 4)
    yb.fill(0xFF)
    network_ops.linear_f32(xb.ptr + 4, wb.ptr, bb.ptr, m, n, k, yb.ptr, tile=tile)
    got = yb.download((m, n), np.float32)
    assert np.array_equal(got.view(np.uint32), ref.linear_f32(x, w, bias).view(np.uint32))


def _argmax_rows_cases(n: int) -> np.ndarray:
    """Random rows, then rows whose answer hangs on numpy's rules: ties (the first index wins, also when
    the later one sits in a lower lane of the warp), NaN (the maximum; the first NaN wins), -inf only,
    -0 against +0."""
    rng = np.random.default_rng()
    rows = [rng.normal(size=n) for _ in range(40)]

    def row(fill=-1.0, **at):
        r = np.full(n, fill)
        for i, v in at.items():
            if int(i[1:]) < n:
                r[int(i[1:])] = v
        return r

    last = f"i{n - 1}"
    rows += [
        np.full(n, 3.0),  # all equal: 0
        row(**{"i5": 7.0, last: 7.0}),
        row(**{"i31": 2.0, "i32": 2.0}),  # lane 31 against lane 0 of the next pass
        row(**{"i33": 2.0, "i1": 2.0}),
        row(**{"i40": np.nan, "i3": np.nan}),
        row(**{"i2": np.inf, "i40": np.nan}),  # NaN beats +inf
        row(**{last: np.nan}),
        np.full(n, np.nan),
        np.full(n, -np.inf),
        row(-np.inf, **{last: -1e30}),
        row(**{"i2": -0.0, "i5": 0.0}),  # -0 == +0: the first
        row(**{"i0": 0.0, "i1": -0.0}),
    ]
    return np.stack(rows)


@pytest.mark.parametrize("n", [1, 31, 32, 33, 1000, 1001])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@needs_gpu
def test_argmax_rows_kernel_is_numpy_argmax(n, dtype):
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    x = _argmax_rows_cases(n).astype(dtype)
    xb = cd.DeviceBuffer.from_array(x)
    yb = cd.DeviceBuffer(4 * len(x))
    yb.fill(0x7F)
    network_ops.argmax_rows(xb.ptr, len(x), n, yb.ptr, dtype)
    got = yb.download(len(x), np.int32)
    want = np.argmax(x, axis=1)
    assert np.array_equal(got, want), np.nonzero(got != want)


def test_argmax_rows_refuses_what_it_cannot_read():
    from trtfuse.plugins import network_ops

    with pytest.raises(ValueError, match="float32 or float16"):
        network_ops.argmax_rows(0, 4, 10, 0, "int8")
    with pytest.raises(ValueError, match="M, N >= 1"):
        network_ops.argmax_rows(0, 4, 0, 0)


def _argmax_key(v: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The classifier's fused top-1 key (linear::argmax_key in plugins/kernels/network_ops.cu), in numpy."""
    bits = np.where(v == 0, np.float32(0), v).astype(np.float32).view(np.uint32)
    ordered = np.where(np.isnan(v), np.uint32(0xFFFFFFFF), np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000)))
    return (ordered.astype(np.uint64) << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - n.astype(np.uint64))


@pytest.mark.parametrize("n", [1, 33, 1000])
def test_argmax_key_maximum_is_numpy_argmax(n):
    """The key's unsigned order is numpy.argmax's preference: the row's largest key names its argmax, on the rows
    whose answer hangs on ties, NaN (a negative one too) and signed zeros; and no key is 0, the scratch's "no column
    yet"."""
    negative_nan = np.full((1, n), 2.0, np.float32)
    negative_nan[0, n // 2] = np.uint32(0xFFC00000).view(np.float32)
    x = np.concatenate([_argmax_rows_cases(n).astype(np.float32), negative_nan])
    keys = _argmax_key(x, np.arange(n)[None, :])
    assert (keys > 0).all()
    assert np.array_equal(np.uint64(0xFFFFFFFF) - (keys.max(axis=1) & np.uint64(0xFFFFFFFF)), np.argmax(x, axis=1))


# Column pairs the ties and signed-zero cases make equal: adjacent lanes; the larger index in the lower lane (15 is the
# last column lane, 16 the first lane's next column); one thread's two columns (16 apart); other CTAs of either tile.
_TIE_PAIRS = [(0, 1), (15, 16), (5, 21), (3, 67), (60, 200), (130, 999), (2, 6)]


def _top1_cases(m: int, n: int, k: int, rng) -> dict:
    """Classifier inputs (x, w, bias) whose logits' argmax hangs on numpy's rules, by name, with each row's intended
    winner (None: a random row). ties: row r's column pair (r % (P + 1), none for the last) gets +100 from selector
    feature p, through identical weight rows and biases, so the pair's logits are the same bits. nan: x = +inf or -inf
    on feature 0 makes the columns of zero weight NaN (and a +inf before them), or +inf on feature 1 every logit -inf.
    signed zeros (K = 64, no zero steps past K): tiny products of one sign, the row's, and -0 biases make pair p's
    logits -0 and +0 (in either order), every other logit at most -1."""
    pairs = [p for p in _TIE_PAIRS if p[1] < n]
    cases = {"random": (rng.normal(size=(m, k)), rng.normal(size=(n, k)) * 0.05, rng.normal(size=n), [None] * m)}

    if pairs and k > len(pairs):
        x, w, bias = rng.normal(size=(m, k)) * 0.1, rng.normal(size=(n, k)) * 0.05, rng.normal(size=n)
        x[:, : len(pairs)] = 0
        w[:, : len(pairs)] = 0
        want = []
        for r in range(m):
            p = r % (len(pairs) + 1)
            want.append(pairs[p][0] if p < len(pairs) else None)
            if p < len(pairs):
                x[r, p] = 1
        for p, (a, b) in enumerate(pairs):
            w[a, p] = 100
            w[b], bias[b] = w[a], bias[a]
        cases["ties"] = (x, w, bias, want)

    if k >= 2:
        nan_cols = [c for c in (17, 3, 200, 999, 6) if c < n] or [0]
        inf_col = 2 if 2 < min(nan_cols) else None
        x, w, bias = rng.normal(size=(m, k)), rng.normal(size=(n, k)) * 0.05, rng.normal(size=n)
        x[:, :2] = 0
        w[:, :2] = -1
        w[nan_cols, 0] = 0
        if inf_col is not None:
            w[inf_col, 0] = 1
        x[0::4, 0], x[1::4, 0], x[3::4, 1] = np.inf, -np.inf, np.inf
        want = [min(nan_cols) if r % 4 < 2 else 0 if r % 4 == 3 else None for r in range(m)]
        cases["nan"] = (x, w, bias, want)

    if pairs:
        kz = 64
        x, w, bias = np.zeros((m, kz)), np.full((n, kz), -0.0), np.full(n, -1.0)
        x[:, :32] = np.where(np.arange(m) % 2, -1e-30, 1e-30)[:, None]
        w[:, :32] = rng.choice([-1e-30, 1e-30], (n, 32))
        w[:, 32 : 32 + len(pairs)] = -1  # a selected pair's feature: -1 for every other column
        want = []
        for r in range(m):
            p = r % len(pairs)
            x[r, 32 + p] = 1
            want.append(pairs[p][0])
        for p, (a, b) in enumerate(pairs):
            w[a, :32], w[b, :32] = -1e-30, 1e-30  # -0 then +0 on rows of positive x, +0 then -0 on the others
            w[[a, b], 32 + p] = -0.0  # on the rows selecting the pair, every product past k = 32 is -0: signs kept
            bias[[a, b]] = -0.0
        cases["signed zeros"] = (x, w, bias, want)
    return {name: tuple(np.asarray(a, np.float32) for a in c[:3]) + (c[3],) for name, c in cases.items()}


FUSED_TOP1_SHAPES = [(1, 1000, 64), (37, 1000, 100), (300, 1000, 64), (37, 7, 33), (300, 7, 64), (1, 1, 5), (130, 257, 40)]


@pytest.mark.parametrize("tile", ["narrow", "wide"])
@pytest.mark.parametrize("m,n,k", FUSED_TOP1_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in FUSED_TOP1_SHAPES])
@needs_gpu
def test_linear_f32_fused_top1_is_numpy_argmax(m, n, k, tile):
    """The classifier's fused top-1 equals numpy.argmax of the reference logits (which the launch still writes, bit
    for bit) on random rows and on rows of ties, NaN, infinities and signed zeros. Every case runs twice, in turn, on
    one scratch (zeroed once): a key or row-block count left behind by a launch would show in the next's answer."""
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    cases = _top1_cases(m, n, k, np.random.default_rng())
    keys, done = network_ops.linear_top1_scratch(m)
    for name in ["nan", "ties", "signed zeros", "random"] * 2:  # the largest keys first
        if name not in cases:
            continue
        x, w, bias, intended = cases[name]
        with np.errstate(invalid="ignore"):  # inf * 0
            want_logits = ref.linear_f32(x, w, bias)
        want = np.argmax(want_logits, axis=1)
        assert all(i is None or i == j for i, j in zip(intended, want)), name  # the case makes the logits it means to
        xb, wb, bb = (cd.DeviceBuffer.from_array(a) for a in (x, w, bias))
        yb, tb = cd.DeviceBuffer(m * n * 4), cd.DeviceBuffer(m * 4)
        yb.fill(0xFF)  # NaN pattern
        tb.fill(0x7F)
        network_ops.linear_f32(xb.ptr, wb.ptr, bb.ptr, m, n, x.shape[1], yb.ptr, tile=tile, top1=tb.ptr,
                               top1_keys=keys.ptr, row_block_done=done.ptr)
        cd.check(cd._driver().cuCtxSynchronize())
        logits = yb.download((m, n), np.float32)
        nan = np.isnan(want_logits)  # a NaN's sign and payload are the FPU's (numpy's inf * 0 is negative, the GPU's not)
        assert np.array_equal(np.isnan(logits), nan), name
        assert np.array_equal(logits[~nan].view(np.uint32), want_logits[~nan].view(np.uint32)), name
        got = tb.download(m, np.int32)
        assert np.array_equal(got, want), (name, np.nonzero(got != want))
    assert not keys.download(m, np.uint64).any() and not done.download(done.nbytes // 4, np.uint32).any()


def test_linear_f32_takes_the_top1_buffers_together():
    from trtfuse.plugins import network_ops

    with pytest.raises(ValueError, match="together"):
        network_ops.linear_f32(0, 0, 0, 4, 10, 8, 0, top1=1 << 20)
    with pytest.raises(ValueError, match="together"):
        network_ops.linear_f32(0, 0, 0, 4, 10, 8, 0, top1_keys=1 << 20, row_block_done=1 << 21)
