"""`--backend cuda`: a `--fuse all` ResNet run on trtfuse's kernels equals the CPU golden execution of
the same rewritten model (every fused conv's int8 output within the 1-LSB rule, logits ~equal), and
anything it cannot run is refused naming the node."""

import numpy as np
import pytest

from trtfuse.errors import TrtfuseError
from trtfuse.graph_passes.pipeline import rewrite
from trtfuse.models.cache import load_cached_model
from trtfuse.plugins.cuda_driver import gpu_available
from trtfuse.plugins.op_schema import DOMAIN

_ok, _why = gpu_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _ok, reason=f"needs a CUDA GPU: {_why}")]


@pytest.mark.parametrize("arch,size,options", [("resnet50", 64, {}), ("resnet18", 96, {}),
                                               ("resnet18", 64, {"fold_stem": False}), ("resnet18", 64, {"autotune": True})],
                         ids=["resnet50", "resnet18", "resnet18-chw4-stem", "resnet18-autotune"])
def test_fuse_all_resnet_matches_cpu_golden(arch, size, options):
    from trtfuse.runtime.cpu_executor import run_model
    from trtfuse.runtime.gpu_runner import CudaRunner

    model = load_cached_model(arch, image_size=size, batch=2)
    images = np.random.default_rng().normal(size=(2, 3, size, size)).astype(np.float32)
    fused, _ = rewrite(model, "all", calib_images=images)
    runner = CudaRunner(fused, 2, **options)
    logits = runner.run(images)
    names = [n.output[0] for n in fused.graph.node if n.domain == DOMAIN]
    cpu = run_model(fused, {fused.graph.input[0].name: images}, names + [fused.graph.output[0].name])
    for name, want in zip(names, cpu):
        got = runner.fetch(name)
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and (diff == 0).mean() >= 0.999, name
    ref = cpu[-1]
    cos = np.sum(ref * logits, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(logits, axis=1))
    assert cos.min() > 0.9999 and (np.argmax(ref, 1) == np.argmax(logits, 1)).all()


def test_residual_only_model_is_refused_naming_the_node():
    from trtfuse.runtime.gpu_runner import CudaRunner

    model = load_cached_model("resnet18", image_size=64, batch=1)
    fused, _ = rewrite(model, "residual", calib_images=np.zeros((1, 3, 64, 64), np.float32) + 0.5)
    with pytest.raises(TrtfuseError, match="cannot run node"):
        CudaRunner(fused, 1)
