"""bench/energy.py and runtime/nvml.py: the per-kind energy table's arithmetic (CPU), the one-line refusal where
NVML's counter cannot be read, and on a GPU the real counter (libnvidia-ml) rising while a kernel runs."""

import pytest

from trtfuse.bench.e2e import add_arguments
from trtfuse.bench.energy import per_batch_energy
from trtfuse.runtime.nvml import Nvml, nvml_refusal
from trtfuse.plugins.cuda_driver import gpu_available

ok, why = gpu_available()


def test_steps_sum_per_kind_of_layer_with_time_weighted_power_and_clock():
    steps = [{"step": "conv1__fused + max-pool", "mj": 120.0, "ms": 0.2, "watts": 600.0, "sm_mhz": 1900},
             {"step": "layer3.1.conv2__fused", "mj": 60.0, "ms": 0.1, "watts": 600.0, "sm_mhz": 1800},
             {"step": "layer3.2.conv2__fused", "mj": 140.0, "ms": 0.2, "watts": 700.0, "sm_mhz": 1700},
             {"step": "layer1.0.conv3__fused + layer1.1.conv1__fused (chain)", "mj": 80.0, "ms": 0.1, "watts": 800.0,
              "sm_mhz": 1600}]
    table = per_batch_energy(steps, batch=400, forward={"mj_per_image": 0.9})
    rows = {r["group"]: r for r in table["rows"]}
    assert list(rows) == ["stem 7x7/2 conv + ReLU + max-pool 3x3/2", "res4 conv2", "res2 conv3 + residual + next conv1"]
    res4 = rows["res4 conv2"]
    assert res4["count"] == 2 and res4["mj"] == pytest.approx(200.0) and res4["ms"] == pytest.approx(0.3)
    assert res4["watts"] == pytest.approx(200.0 / 0.3)  # mJ / ms = W
    assert res4["sm_mhz"] == pytest.approx((1800 * 0.1 + 1700 * 0.2) / 0.3)
    assert res4["mj_per_image"] == pytest.approx(0.5)
    assert table["sum_of_steps_mj"] == pytest.approx(400.0)
    assert sum(r["share"] for r in table["rows"]) == pytest.approx(1.0) and res4["share"] == pytest.approx(0.5)
    assert table["forward_mj_per_batch"] == pytest.approx(360.0)
    assert per_batch_energy(steps, batch=400)["forward_mj_per_batch"] is None


def test_the_flag_is_on_bench_e2e():
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["--energy"]).energy and not p.parse_args([]).energy


@pytest.mark.skipif(ok, reason="this machine has a GPU: the refusal is for machines without one")
def test_without_a_gpu_the_refusal_is_one_line():
    refused = nvml_refusal()
    assert refused and "\n" not in refused


@pytest.mark.gpu
@pytest.mark.skipif(not ok, reason=f"needs a CUDA GPU: {why}")
def test_the_counter_rises_while_a_kernel_runs():
    import time

    from trtfuse.plugins import cuda_driver as cd

    meter = Nvml(cd.current_device())
    assert meter.sm_clock_mhz() > 0
    a, b = cd.DeviceBuffer(1 << 26), cd.DeviceBuffer(1 << 26)
    stream = cd.Stream()
    e0, t0 = meter.energy_mj(), time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        for _ in range(50):
            cd.copy_device(b.ptr, a.ptr, 1 << 26, stream.handle)
        stream.synchronize()
    watts = (meter.energy_mj() - e0) / 1e3 / (time.perf_counter() - t0)
    assert 30 < watts < 2000  # a busy GPU draws tens to hundreds of watts: the counter moves, in millijoules
