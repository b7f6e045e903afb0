"""The fused identity-bottleneck kernel (plugins/kernels/bottleneck.cu) on the GPU: fresh random blocks, output poisoned
first, against the golden chain (fused_conv_int8 three times, the residual the block input) by docs/ops.md's 1-LSB rule,
and bit-identical to the three fused-conv kernels it replaces run one after another. Skips (saying why) where there is
no GPU, or where the GPU's shared memory cannot hold the kernel's tiles."""

import numpy as np
import pytest

from trtfuse.bench.conv_problem import BottleneckProblem, DeviceBottleneck, compare, passes_lsb_rule, run_separate_convs
from trtfuse.plugins import bottleneck
from trtfuse.plugins.cuda_driver import gpu_available

ok, why = gpu_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ok, reason=f"needs a CUDA GPU: {why}")]


@pytest.fixture(autouse=True)
def _fits_the_gpu():
    from trtfuse.plugins import cuda_driver as cd

    refused = bottleneck.device_refusal(cd.device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", cd.current_device()))
    if refused:
        pytest.skip(refused)


# res2 at batch 2 (whole 8x14 tiles), one tile exactly, odd sizes whose last tiles are partial in both directions
# (9x13: the last tile row has 1 of 8 rows), and batch 6 at 56x56: 168 tiles, more than an H100's 132 resident CTAs,
# so CTAs loop (and with two patch buffers prefetch) over several tiles
SIZES = [(2, 56, 56), (1, 8, 14), (1, 9, 13), (2, 23, 31), (6, 56, 56)]


@pytest.mark.parametrize("relu", [True, False], ids=["relu", "no-relu"])
@pytest.mark.parametrize("n,h,w", SIZES, ids=lambda v: str(v))
def test_bottleneck_equals_golden_and_the_three_convs(n, h, w, relu):
    problem = BottleneckProblem.random(n, h, w, relu, seed=n * 1000 + h * 10 + w)
    assert bottleneck.refusal(*problem.shapes) is None
    fused = DeviceBottleneck(problem)
    out, raw = fused.run_checked()
    stats = compare(out, problem.golden())
    assert passes_lsb_rule(stats), stats
    assert np.array_equal(run_separate_convs(problem), raw), "the fused block must equal the three convs bit for bit"


def test_bottleneck_replays_give_the_same_bits():
    fused = DeviceBottleneck(BottleneckProblem.random(2, 23, 31, seed=7))
    first, _ = fused.run_checked()
    for _ in range(3):
        again, _ = fused.run_checked()
        assert np.array_equal(first, again)
