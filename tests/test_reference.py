"""The golden reference of the fused op against a brute-force loop, and the layout round trips."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trtfuse.plugins import layout
from trtfuse.plugins.reference import conv_int8_accumulate, fused_conv_int8, requantize_epilogue


def round_to_f32(q: Fraction) -> np.float32:
    """The float32 nearest to the exact rational q, ties to the even significand: one IEEE-754 rounding, done
    independently of reference.fma_f32 (float(q) is within one float32 step of it; pick the nearest of three)."""
    f = np.float32(float(q))
    candidates = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - q), int(np.array(c).view(np.uint32)) & 1))


def brute_force_fused(x, w, scale, bias, out_scale, residual, residual_scale, strides, pads, relu):
    """docs/ops.md "Semantics", literally: one output element at a time, Python ints, then the folded fp32 epilogue
    with every step computed exactly in rationals and rounded once to float32 (an FMA rounds once)."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    oh, ow = layout.conv_output_hw(h, wd, (r, s), strides, pads)
    exact = lambda v: Fraction(float(v))  # every float32 is a rational
    rs = round_to_f32(exact(residual_scale) / exact(out_scale)) if residual is not None else None
    y = np.zeros((n, k, oh, ow), np.int8)
    for ko in range(k):
        a = round_to_f32(exact(scale[ko]) / exact(out_scale))  # 2.1: correctly rounded divisions
        b = round_to_f32(exact(bias[ko]) / exact(out_scale))
        for bi in range(n):
            for i in range(oh):
                for j in range(ow):
                    acc = 0
                    for ci in range(c):
                        for dr in range(r):
                            for ds in range(s):
                                hi, wi = i * strides[0] - pads[0] + dr, j * strides[1] - pads[1] + ds
                                if 0 <= hi < h and 0 <= wi < wd:
                                    acc += int(x[bi, ci, hi, wi]) * int(w[ko, ci, dr, ds])
                    v = round_to_f32(Fraction(acc))  # int32 -> fp32, nearest even
                    v = round_to_f32(exact(v) * exact(a) + exact(b))  # 2.2: fma
                    if residual is not None:  # 2.3: fma
                        v = round_to_f32(Fraction(int(residual[bi, ko, i, j])) * exact(rs) + exact(v))
                    if relu:
                        v = max(v, np.float32(0))
                    y[bi, ko, i, j] = int(np.clip(np.rint(v), -128, 127))  # 3: round half to even, saturate
    return y


@settings(max_examples=25, deadline=None)
@given(
    c=st.integers(1, 40), k=st.integers(1, 40), hw=st.integers(1, 7), ksize=st.sampled_from([1, 3, 5]),
    stride=st.integers(1, 2), pad=st.integers(0, 2), residual=st.booleans(), relu=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
# One element here rounds differently in the unfolded order (scale, bias, residual, then / out_scale), which this brute
# force implemented until the epilogue was folded: the reference is checked against docs/ops.md as it stands.
@example(c=3, k=31, hw=7, ksize=3, stride=1, pad=2, residual=True, relu=False, seed=1374899)
def test_reference_matches_brute_force(c, k, hw, ksize, stride, pad, residual, relu, seed):
    if hw + 2 * pad < ksize:
        return
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, c, hw, hw), dtype=np.int8)
    w = rng.integers(-127, 128, (k, c, ksize, ksize), dtype=np.int8)
    k_pad = layout.round_up(k, 32)
    scale = np.zeros(k_pad, np.float32)
    scale[:k] = rng.uniform(1e-4, 3e-3, k)
    bias = np.zeros(k_pad, np.float32)
    bias[:k] = rng.normal(0, 2, k)
    out_scale = np.float32(rng.uniform(0.01, 0.2))  # small enough that saturation happens
    oh, ow = layout.conv_output_hw(hw, hw, (ksize, ksize), (stride, stride), [pad] * 4)
    res = rng.integers(-128, 128, (1, k, oh, ow), dtype=np.int8) if residual else None
    res_scale = np.float32(rng.uniform(0.01, 0.1)) if residual else None
    got = fused_conv_int8(
        x, layout.pack_weight(w), scale, bias, np.array([out_scale]), res,
        None if res_scale is None else np.array([res_scale]),
        in_channels=c, out_channels=k, kernel_shape=[ksize, ksize], strides=[stride, stride], pads=[pad] * 4,
        relu=int(relu),
    )
    want = brute_force_fused(x, w, scale, bias, out_scale, res, res_scale, (stride, stride), [pad] * 4, relu)
    np.testing.assert_array_equal(got, want)


def test_epilogue_rounds_half_to_even_and_saturates():
    # acc * 1 + 0, / 1: values land exactly on .5 ties and beyond the int8 range.
    acc = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, 200, -128.5, -129, -1000]) * 2
    acc = acc.astype(np.int64).reshape(1, -1, 1, 1)
    k = acc.shape[1]
    y = requantize_epilogue(acc, np.full(k, 0.5, np.float32), np.zeros(k, np.float32), 1.0, relu=False)
    assert y.reshape(-1).tolist() == [0, 2, 2, 0, -2, -2, 126, 127, 127, -128, -128, -128]
    y = requantize_epilogue(acc, np.full(k, 0.5, np.float32), np.zeros(k, np.float32), 1.0, relu=True)
    assert y.reshape(-1).tolist() == [0, 2, 2, 0, 0, 0, 126, 127, 127, 0, 0, 0]


def test_epilogue_order_residual_before_relu():
    acc = np.array([10], np.int64).reshape(1, 1, 1, 1)
    res = np.array([-30], np.int8).reshape(1, 1, 1, 1)
    # 10*1 + 0 + (-30 * 1) = -20 -> relu 0; relu before the add would give -20 -> saturate anyway, so use /out
    y = requantize_epilogue(acc, np.ones(1, np.float32), np.zeros(1, np.float32), 1.0, res, 1.0, relu=True)
    assert int(y.reshape(-1)[0]) == 0
    y = requantize_epilogue(acc, np.ones(1, np.float32), np.zeros(1, np.float32), 1.0, res, 1.0, relu=False)
    assert int(y.reshape(-1)[0]) == -20


def test_accumulator_is_exact_at_int32_extremes():
    # 512 channels * 3x3 taps of (-128)*(-127): |acc| = 74,907,648 needs exact integer arithmetic.
    x = np.full((1, 512, 3, 3), -128, np.int8)
    w = np.full((2, 512, 3, 3), -127, np.int8)
    acc = conv_int8_accumulate(x, w)
    assert acc.dtype == np.int64 and int(acc[0, 0, 0, 0]) == 512 * 9 * 128 * 127


@pytest.mark.parametrize("vec", [4, 32])
@pytest.mark.parametrize("channels", [1, 3, 4, 5, 31, 32, 33, 64, 100])
def test_vectorized_layout_round_trip(vec, channels):
    x = np.random.default_rng(channels).integers(-128, 128, (2, channels, 3, 5), dtype=np.int8)
    packed = layout.pack_nchwv(x, vec)
    assert packed.shape == (2, layout.round_up(channels, vec) // vec, 3, 5, vec)
    # element (n, c, h, w) at [n][c // V][h][w][c % V]; padding channels are zero
    assert packed[1, (channels - 1) // vec, 2, 4, (channels - 1) % vec] == x[1, channels - 1, 2, 4]
    flat = packed.transpose(0, 1, 4, 2, 3).reshape(2, -1, 3, 5)
    assert not flat[:, channels:].any()
    np.testing.assert_array_equal(layout.unpack_nchwv(packed, channels), x)
    if vec == 32:
        np.testing.assert_array_equal(layout.unpack_chw32(layout.pack_chw32(x), channels), x)


@pytest.mark.parametrize("k,c,r", [(1, 3, 7), (64, 3, 7), (33, 64, 3), (256, 64, 1), (10, 40, 3)])
def test_weight_pack_round_trip_and_gemm_order(k, c, r):
    w = np.random.default_rng(k * c).integers(-127, 128, (k, c, r, r), dtype=np.int8)
    packed = layout.pack_weight(w)
    vec = layout.channel_vector(c)
    kg, kg_pad = layout.gemm_k(c, (r, r))
    assert packed.shape == (layout.round_up(k, 32), kg_pad) and kg_pad % 32 == 0
    np.testing.assert_array_equal(layout.unpack_weight(packed, k, c, (r, r)), w)
    # column g = ((cb * R + r) * S + s) * V + cv walks channel vectors tap by tap
    ci, dr, ds = c - 1, r - 1, 0
    g = (((ci // vec) * r + dr) * r + ds) * vec + ci % vec
    assert packed[k - 1, g] == w[k - 1, ci, dr, ds]
    assert not packed[k:].any() and not packed[:, kg:].any()


def test_fma_f32_is_correctly_rounded():
    """reference.fma_f32 against exact rational arithmetic, on random values and on products whose
    exact sum sits on or next to a float32 rounding tie (where double rounding would go wrong)."""
    from fractions import Fraction

    from trtfuse.plugins.reference import fma_f32

    rng = np.random.default_rng()
    a = rng.normal(size=3000).astype(np.float32)
    b = rng.normal(size=3000).astype(np.float32)
    c = (rng.normal(size=3000) * rng.choice([1e-9, 1.0, 1e9], 3000)).astype(np.float32)
    # ties: (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 is half an ulp past 1 + 2^-11; a tiny c breaks the tie
    tie = np.float32(1 + 2.0**-12)
    a = np.concatenate([a, [tie] * 4]).astype(np.float32)
    b = np.concatenate([b, [tie] * 4]).astype(np.float32)
    c = np.concatenate([c, [0.0, 2.0**-60, -(2.0**-60), 2.0**-40]]).astype(np.float32)
    got = fma_f32(a, b, c)

    def correctly_rounded(x: Fraction) -> np.float32:
        near = np.float32(float(x))
        cands = [near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf))]
        return min(cands, key=lambda v: (abs(Fraction(float(v)) - x), int(np.array(v).view(np.int32)) & 1))

    for i in range(len(a)):
        want = correctly_rounded(Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i])))
        assert got[i] == want, (a[i], b[i], c[i], got[i], want)
