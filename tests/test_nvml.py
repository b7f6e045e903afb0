"""runtime/nvml.py: a run's card readings summarized (CPU), the monitor refused cleanly where NVML is not readable,
and on a GPU the real NVML (the driver's libnvidia-ml) sampled while a copy loop runs."""

import time

import pytest

from trtfuse.plugins.cuda_driver import gpu_available
from trtfuse.runtime.cli import card_rows
from trtfuse.runtime.nvml import CardMonitor, nvml_refusal, start_card_monitor, summarize_card

ok, why = gpu_available()


def test_a_cards_readings_give_its_median_clock_mean_power_and_what_held_the_clock():
    readings = [(1980, 400.0, 0x0), (1860, 690.0, 0x4), (1845, 695.0, 0x4), (1830, 700.0, 0x4 | 0x20)]
    card = summarize_card(readings, joules=1380.0, seconds=2.0)
    assert card["sm_mhz_median"] == 1852.5 and card["sm_mhz_min"] == 1830 and card["sm_mhz_max"] == 1980
    assert card["watts_mean"] == 690.0  # the energy counter's joules over the run's seconds, not the readings' mean
    assert card["watts_median"] == 692.5 and card["readings"] == 4
    assert card["clock_held_by"] == {"sw_power_cap": 0.75, "sw_thermal": 0.25}  # reasons never seen are left out
    with pytest.raises(ValueError):
        summarize_card([], 1.0, 1.0)


def test_a_run_too_short_for_the_energy_counter_has_no_energy_figure():
    # the counter advances about every 0.1 s: a 70 ms accuracy run reads the same value at both ends
    card = summarize_card([(1980, 183.2, 0x0)], joules=0.0, seconds=0.07)
    assert card["joules"] is None and card["watts_mean"] is None and card["watts_median"] == 183.2
    assert card_rows([{"gpu": 0, **card}]) == [
        ["card 0", "SM 1980 MHz (median), 183 W (median reading; too short for the energy counter), clock held by nothing"]]


def test_the_summary_table_has_one_row_per_card():
    cards = [{"gpu": 0, "sm_mhz_median": 1860.0, "watts_mean": 691.2, "clock_held_by": {"sw_power_cap": 0.98}},
             {"gpu": 1, "sm_mhz_median": 1980.0, "watts_mean": 120.0, "clock_held_by": {}}]
    assert card_rows(cards) == [["card 0", "SM 1860 MHz (median), 691 W, clock held by sw_power_cap 98 %"],
                                ["card 1", "SM 1980 MHz (median), 120 W, clock held by nothing"]]
    assert card_rows(None) == []


def test_no_gpus_no_monitor():
    assert start_card_monitor([]) is None


@pytest.mark.skipif(ok, reason="this machine has a GPU: the refusal is for machines without one")
def test_without_nvml_the_run_goes_on_unmonitored():
    assert nvml_refusal() is not None
    assert start_card_monitor([0]) is None


@pytest.mark.gpu
@pytest.mark.skipif(not ok, reason=f"needs a CUDA GPU: {why}")
def test_the_monitor_samples_a_busy_gpu():
    from trtfuse.plugins import cuda_driver as cd

    monitor = CardMonitor([cd.current_device()], interval=0.05).start()
    a, b = cd.DeviceBuffer(1 << 26), cd.DeviceBuffer(1 << 26)
    stream = cd.Stream()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.6:
        for _ in range(50):
            cd.copy_device(b.ptr, a.ptr, 1 << 26, stream.handle)
        stream.synchronize()
    (card,) = monitor.stop()
    assert card["readings"] >= 5 and 100 < card["sm_mhz_median"] < 5000
    assert 30 < card["watts_mean"] < 2000 and 0 < card["watts_median"] < 2000  # watts, not milliwatts
    assert "sampling_stopped_by" not in card
