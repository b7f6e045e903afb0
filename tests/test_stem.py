"""The space-to-depth stem (plugins/stem.py) on the CPU: folding the input and the weight turns a
stride-2 conv into a stride-1 conv with exactly the same integer result, for ResNet's 7x7/2 stem and
odd sizes, paddings and kernels; the folded conv reads CHW16 with a GEMM-K close to CHW4's."""

import numpy as np
import pytest

from trtfuse.plugins import stem
from trtfuse.plugins.reference import conv_int8_accumulate
from trtfuse.plugins.tactics import ConvShape, candidate_tactics, choose

SHAPES = [
    ConvShape(2, 3, 32, 32, 8, 7, 7, (2, 2), (3, 3, 3, 3)),
    ConvShape(2, 3, 31, 30, 8, 5, 5, (2, 2), (2, 1, 2, 2)),
    ConvShape(1, 4, 17, 18, 8, 3, 3, (2, 2), (1, 1, 1, 1)),
    ConvShape(1, 1, 20, 20, 8, 7, 7, (2, 2), (0, 0, 0, 0)),
    ConvShape(2, 2, 9, 9, 8, 4, 4, (2, 2), (1, 2, 0, 1)),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_folded_conv_is_the_original_conv(shape):
    rng = np.random.default_rng()
    x = rng.integers(-128, 128, (shape.n, shape.c, shape.h, shape.w), dtype=np.int8)
    w = rng.integers(-128, 128, (shape.k, shape.c, shape.r, shape.s), dtype=np.int8)
    fc = stem.fold(shape)
    want = conv_int8_accumulate(x, w, shape.stride, shape.pads)
    got = conv_int8_accumulate(stem.fold_input(x), stem.fold_weight(w, fc), (1, 1), fc.shape.pads)
    assert fc.shape.out_hw == shape.out_hw and np.array_equal(got, want)


def test_resnet_stem_folds_to_a_4x4_chw16_conv():
    shape = ConvShape(256, 3, 224, 224, 64, 7, 7, (2, 2), (3, 3, 3, 3))
    fc = stem.fold(shape).shape
    assert (fc.c, fc.h, fc.w, fc.r, fc.s, fc.stride, fc.pads) == (12, 112, 112, 4, 4, (1, 1), (2, 2, 1, 1))
    assert fc.vec == 16 and fc.gemm == (256 * 112 * 112, 64, 256)  # 16 taps x 16 bytes
    assert all(t.vec == 16 for t in candidate_tactics(fc)) and choose(fc)[0].vec == 16


@pytest.mark.parametrize("shape", [ConvShape(1, 8, 16, 16, 8, 3, 3, (2, 2)), ConvShape(1, 3, 16, 16, 8, 3, 3, (1, 1))], ids=str)
def test_fold_refuses_what_it_cannot_do(shape):
    assert not stem.applies(shape)
    with pytest.raises(ValueError):
        stem.fold(shape)
