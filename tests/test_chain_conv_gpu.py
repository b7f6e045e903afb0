"""The chained 1x1 convs kernel (plugins/kernels/chain_conv.cu) on the GPU: fresh random data, both outputs poisoned
first, bit-identical to the golden pair (fused_conv_int8 twice, plugins/reference.py) and to the two fused-conv kernels
it replaces run one after the other. Skips (saying why) where there is no GPU, or where the GPU is not an sm_90 one."""

import numpy as np
import pytest

from trtfuse.bench.conv_problem import ChainProblem, DeviceChain, compare, run_separate_chain
from trtfuse.plugins import chain_conv
from trtfuse.plugins.cuda_driver import gpu_available

ok, why = gpu_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ok, reason=f"needs a CUDA GPU: {why}")]


@pytest.fixture(autouse=True)
def _hopper():
    refused = chain_conv.device_refusal()
    if refused:
        pytest.skip(refused)


VARIANTS = list(chain_conv.VARIANTS)
IDS = [chain_conv.VARIANTS[k].name for k in VARIANTS]

# res2 at batch 2 (98 whole tiles of 64 pixels); 3 x 28 x 28 (2352 pixels: the last tile has 48, boxes of 2 groups);
# 9 x 8 (72 pixels, 9 groups: one-group boxes, a last tile of 8 pixels); 4 x 6 (24 pixels, less than one tile).
# res3 (C1 = 512) at batch 2 (1568 pixels: a last tile of 32); 8 x 8 (one tile an image, res3 at 64 x 64 images).
SIZES = {256: [(2, 56, 56), (3, 28, 28), (1, 9, 8), (1, 4, 6)], 512: [(2, 28, 28), (3, 8, 8), (1, 9, 8), (1, 4, 6)]}
CASES = [(key, size) for key in VARIANTS for size in SIZES[key[1]]]


def random_problem(key, n, h, w, relu=(True, True), seed=None) -> ChainProblem:
    k1, c1, c2 = key
    return ChainProblem.random(n, h, w, c2, relu, seed=seed, k1=k1, c1=c1)


def check(problem: ChainProblem, fused: DeviceChain) -> None:
    """Both outputs against the golden pair and against the two fused-conv kernels run in turn (with a downsample
    inside: its golden output being the residual they read, while the kernel's residual buffer holds poison; with y
    stored at stride 2: the golden y's pixels at even rows and columns, every stored byte written over the poison)."""
    y, z, y_raw, z_raw = fused.run_checked()
    y_ref, z_ref = problem.golden()
    s = fused.y_stride
    assert np.array_equal(y, y_ref[:, :, ::s, ::s]), ("y", compare(y, y_ref[:, :, ::s, ::s]))
    assert np.array_equal(z, z_ref), ("z", compare(z, z_ref))
    y_sep, z_sep = run_separate_chain(problem)
    assert np.array_equal(y_raw, y_sep[:, :, ::s, ::s]) and np.array_equal(z_raw, z_sep), \
        "the chain must equal the two convs bit for bit"


@pytest.mark.parametrize("relu2", [True, False], ids=["relu", "no-relu"])
@pytest.mark.parametrize("key,size", CASES, ids=[f"{chain_conv.VARIANTS[k].name}-{'x'.join(map(str, s))}" for k, s in CASES])
def test_chain_equals_golden_and_the_two_convs(key, size, relu2):
    n, h, w = size
    problem = random_problem(key, n, h, w, (True, relu2), seed=n * 1000 + h * 10 + w + key[2] + key[1])
    assert chain_conv.refusal(*problem.shapes) is None
    check(problem, DeviceChain(problem))


@pytest.mark.parametrize("key", VARIANTS, ids=IDS)
@pytest.mark.parametrize("max_ctas", [1, 3])
def test_ctas_walking_many_tiles(key, max_ctas):
    """Few CTAs: each consumer warpgroup takes many tiles, the rings' phases (the streamed W2's too) wrap round many
    times."""
    side = 56 if key[1] == 256 else 28
    problem = random_problem(key, 2, side, side, seed=max_ctas + key[2] + key[1])
    check(problem, DeviceChain(problem, max_ctas=max_ctas))


@pytest.mark.parametrize("key", [(64, 256, 64), (128, 512, 128), (128, 512, 256)],
                         ids=lambda k: chain_conv.VARIANTS[k].name)
def test_without_relu_on_the_first_conv(key):
    problem = random_problem(key, 3, 28, 28, (False, True), seed=11)
    check(problem, DeviceChain(problem))


@pytest.mark.parametrize("key", [(64, 256, 128), (128, 512, 256)], ids=lambda k: chain_conv.VARIANTS[k].name)
def test_chain_replays_give_the_same_bits(key):
    fused = DeviceChain(random_problem(key, 3, 28, 28, seed=7), max_ctas=2)
    first = fused.run_checked()
    for _ in range(3):
        again = fused.run_checked()
        assert all(np.array_equal(a, b) for a, b in zip(first, again))


DS_SIZES = [(2, 56, 56), (3, 28, 28), (1, 9, 8), (1, 4, 6)]


@pytest.mark.parametrize("ds_relu", [False, True], ids=["ds", "ds-relu"])
@pytest.mark.parametrize("size", DS_SIZES, ids=lambda s: "x".join(map(str, s)))
def test_chain_with_the_downsample_inside(size, ds_relu):
    """res2's first block (chain_conv.DOWNSAMPLE_VARIANTS): the residual computed in the kernel from x0 by the 1x1
    downsample gives the golden pair bit for bit, the downsample's golden output being the residual."""
    n, h, w = size
    for key, v in chain_conv.DOWNSAMPLE_VARIANTS.items():
        problem = ChainProblem.random(n, h, w, key[2], seed=n * 1000 + h * 10 + w, k1=key[0], c1=key[1], ds_k=v.ds_k,
                                      ds_relu=ds_relu)
        assert chain_conv.downsample_refusal(*problem.shapes, problem.downsample.shape) is None
        check(problem, DeviceChain(problem))


@pytest.mark.parametrize("max_ctas", [1, 3])
def test_chain_with_the_downsample_inside_walking_many_tiles(max_ctas):
    for key, v in chain_conv.DOWNSAMPLE_VARIANTS.items():
        problem = ChainProblem.random(2, 56, 56, key[2], seed=max_ctas, k1=key[0], c1=key[1], ds_k=v.ds_k)
        check(problem, DeviceChain(problem, max_ctas=max_ctas))


# y at stride 2: even and odd sides, a map of one 8-pixel group (a tile spans images), many CTAs or few
STRIDE2_CASES = [((64, 256, 128), (2, 56, 56), None), ((64, 256, 128), (3, 28, 28), 3), ((64, 256, 64), (1, 9, 8), None),
                 ((64, 256, 64), (2, 7, 8), None), ((128, 512, 128), (2, 28, 28), 1), ((128, 512, 256), (1, 9, 8), None)]


@pytest.mark.parametrize("key,size,max_ctas", STRIDE2_CASES,
                         ids=[f"{chain_conv.VARIANTS[k].name}-{'x'.join(map(str, s))}-ctas{c}" for k, s, c in STRIDE2_CASES])
def test_y_stored_at_stride_2(key, size, max_ctas):
    """y_stride 2 (where y's only readers are 1x1 stride-2 convs): y holds exactly the golden y's pixels at even rows and
    columns, compacted, and z is unchanged."""
    n, h, w = size
    problem = random_problem(key, n, h, w, seed=n * 100 + h + w + key[2])
    check(problem, DeviceChain(problem, max_ctas=max_ctas, y_stride=2))
