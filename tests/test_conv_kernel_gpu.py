"""The fused conv kernel against the golden reference on the GPU: fresh random data each run,
output poisoned first, every tactic, split-K, the small-channel stem path and edge shapes.
Skips (saying why) where there is no GPU."""

import numpy as np
import pytest

from trtfuse.bench.conv_problem import ConvProblem, DeviceConv, compare, passes_lsb_rule
from trtfuse.bench.layers import edge_layers, resnet50_layers
from trtfuse.plugins.conv import ConvLaunch
from trtfuse.plugins.cuda_driver import gpu_available
from trtfuse.plugins.tactics import TACTICS, ConvShape

ok, why = gpu_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ok, reason=f"needs a CUDA GPU: {why}")]


def _check(shape, has_res, tactic_id=None, splits=None, relu=True):
    problem = ConvProblem.random(shape, has_res, relu)
    dev = DeviceConv(problem, ConvLaunch.plan(shape, tactic_id, splits))
    out, raw = dev.run_checked()
    stats = compare(out, problem.golden())
    assert passes_lsb_rule(stats), (shape, tactic_id, splits, stats)
    padded = raw.transpose(0, 1, 4, 2, 3).reshape(shape.n, -1, *raw.shape[2:4])
    assert not padded[:, shape.k:].any(), "CHW32 padding channels must be written as 0"
    return stats


@pytest.mark.parametrize("name,shape,has_res", edge_layers(), ids=[n for n, _, _ in edge_layers()])
def test_edge_shapes_default_plan(name, shape, has_res):
    _check(shape, has_res)


@pytest.mark.parametrize("tactic", TACTICS, ids=[t.name for t in TACTICS])
def test_every_tactic(tactic):
    c, in_vec = {4: (3, 0), 16: (12, 16), 32: (64, 0)}[tactic.vec]
    _check(ConvShape(2, c, 14, 14, 96, 3, 3, (1, 1), (1, 1, 1, 1), in_vec), tactic.vec == 32, tactic.id)


@pytest.mark.parametrize("shape", [ConvShape(3, 3, 64, 64, 64, 7, 7, (2, 2), (3, 3, 3, 3)),
                                   ConvShape(2, 3, 33, 30, 40, 5, 5, (2, 2), (2, 1, 2, 2)),
                                   ConvShape(2, 4, 20, 21, 64, 3, 3, (2, 2), (1, 1, 1, 1))], ids=str)
def test_space_to_depth_stem_equals_the_original_conv(shape):
    """The folded stride-1 CHW16 conv (plugins/stem.py) on the GPU against the golden of the original
    stride-2 conv: the fold must change nothing."""
    problem = ConvProblem.random(shape, False)
    folded = problem.folded()
    for tactic_id in (None, 15, 16, 17):
        out, _ = DeviceConv(folded, ConvLaunch.plan(folded.shape, tactic_id)).run_checked()
        assert passes_lsb_rule(compare(out, problem.golden())), (shape, tactic_id)


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_split_k_matches_and_workspace_self_cleans(splits):
    shape = ConvShape(1, 256, 7, 7, 64, 3, 3, (1, 1), (1, 1, 1, 1))
    problem = ConvProblem.random(shape, True)
    dev = DeviceConv(problem, ConvLaunch.plan(shape, 4, splits))
    ref = problem.golden()
    for _ in range(3):  # replays reuse the workspace: it must be left zeroed
        out, _ = dev.run_checked()
        assert passes_lsb_rule(compare(out, ref))


@pytest.mark.parametrize("relu", [True, False])
def test_relu_flag(relu):
    _check(ConvShape(2, 64, 8, 8, 64, 1, 1), True, relu=relu)


@pytest.mark.parametrize("name,shape,has_res", resnet50_layers(1), ids=[n for n, _, _ in resnet50_layers(1)])
def test_resnet50_layers_batch1(name, shape, has_res):
    _check(shape, has_res)


def test_the_bench_fma_on_the_gpu_rounds_once_as_the_reference_does():
    """bench kernels' golden on the GPU (fma_f32_on_device) against plugins/reference.py's fma_f32, on products that
    cancel against the addend, where a product and a sum each rounded would differ."""
    torch = pytest.importorskip("torch")
    from trtfuse.bench.kernels import fma_f32_on_device
    from trtfuse.plugins.reference import fma_f32

    rng = np.random.default_rng()
    a = rng.normal(size=1 << 20).astype(np.float32)
    b = rng.normal(size=1 << 20).astype(np.float32)
    c = (-(a * b) * (1 + rng.normal(scale=1e-6, size=1 << 20))).astype(np.float32)  # near-cancellation
    c[::2] = rng.normal(size=1 << 19).astype(np.float32)
    got = fma_f32_on_device(torch, *(torch.from_numpy(v).cuda() for v in (a, b, c))).cpu().numpy()
    want = fma_f32(a, b, c)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    assert not np.array_equal(want, (a * b + c).astype(np.float32))  # the data does tell one rounding from two


@pytest.mark.parametrize("has_res,relu", [(True, True), (False, True), (True, False)])
def test_the_bench_golden_on_the_gpu_equals_the_numpy_reference(has_res, relu):
    torch = pytest.importorskip("torch")
    from trtfuse.bench.kernels import golden_on_device

    problem = ConvProblem.random(ConvShape(4, 64, 20, 20, 96, 3, 3, (1, 1), (1, 1, 1, 1)), has_res, relu)
    assert np.array_equal(golden_on_device(torch, problem).cpu().numpy(), problem.golden())
