"""The row-pipeline bottleneck block kernel (plugins/kernels/block_rows.cu) on the GPU: fresh random data, the output
poisoned first, bit-identical to the golden (fused_conv_int8 three times, plugins/reference.py) and to the three
fused-conv kernels it replaces run one after the other. Skips (saying why) where there is no GPU, or where the GPU is
not an sm_90 one."""

from dataclasses import replace

import numpy as np
import pytest

from trtfuse.bench.conv_problem import BlockProblem, DeviceBlockRows, compare, fused_conv_golden, run_separate_convs
from trtfuse.plugins import block_rows
from trtfuse.plugins.cuda_driver import gpu_available

ok, why = gpu_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ok, reason=f"needs a CUDA GPU: {why}")]


@pytest.fixture(autouse=True)
def _hopper():
    refused = block_rows.device_refusal()
    if refused:
        pytest.skip(refused)


def check(problem: BlockProblem, fused: DeviceBlockRows) -> np.ndarray:
    y, raw = fused.run_checked()
    ref = problem.golden()
    assert np.array_equal(y, ref), compare(y, ref)
    assert np.array_equal(raw, run_separate_convs(problem)), "the block must equal the three convs bit for bit"
    return raw


# res2 at 224 x 224 (batch 2: two CTAs); 8 x 8 (res2 at 32 x 32 images); 5 x 7 (a row under one 8-pixel group);
# one pixel (conv2's taps all but one the zero tile); 64-pixel rows (no junk tile rows).
SIZES = [(2, 56, 56), (3, 8, 8), (1, 5, 7), (1, 1, 1), (2, 3, 64)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_block_equals_golden_and_the_three_convs(size):
    n, h, w = size
    problem = BlockProblem.random(n, h, w, seed=n * 1000 + h * 10 + w)
    assert block_rows.refusal(*problem.shapes) is None
    check(problem, DeviceBlockRows(problem))


@pytest.mark.parametrize("max_ctas", [1, 3])
def test_ctas_walking_many_images(max_ctas):
    """Few CTAs: each walks several images, every ring's phases wrap round many times across image boundaries."""
    problem = BlockProblem.random(7, 56, 56, seed=max_ctas)
    check(problem, DeviceBlockRows(problem, max_ctas=max_ctas))


def test_without_relu_on_conv2():
    problem = BlockProblem.random(2, 14, 14, seed=11)
    c1, c2, c3 = problem.convs
    c2 = replace(c2, relu=False)
    problem = BlockProblem((c1, c2, replace(c3, x=fused_conv_golden(c2))), fused_conv_golden)
    check(problem, DeviceBlockRows(problem))


def test_replays_give_the_same_bits():
    fused = DeviceBlockRows(BlockProblem.random(3, 28, 28, seed=7), max_ctas=2)
    first = fused.run_checked()[1]
    for _ in range(3):
        assert np.array_equal(fused.run_checked()[1], first)
