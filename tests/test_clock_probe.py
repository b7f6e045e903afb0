"""bench/clock_probe.py's plain-Python parts: nvidia-smi's sample lines, the throttle reasons, the summary and the
timeline binning (the probe itself needs a GPU and nvidia-smi)."""

import datetime

import pytest

from trtfuse.bench.clock_probe import parse_sample, summarize, throttle_names, timeline


def test_a_sample_line_parses_and_other_lines_do_not():
    t, mhz, watts, temp, mask = parse_sample("2026/11/26 06:21:54.123, 1650, 612.34, 51, 0x0000000000000004")
    assert t == datetime.datetime(2026, 11, 26, 6, 21, 54, 123000).timestamp()
    assert (mhz, watts, temp, mask) == (1650.0, 612.34, 51.0, 4)
    assert parse_sample("timestamp, clocks.current.sm [MHz], power.draw [W], temperature.gpu, clocks_event_reasons.active") is None
    assert parse_sample("2026/11/26 06:21:54.123, [N/A], 612.34, 51, 0x4") is None
    assert parse_sample("") is None


def test_throttle_reasons_name_their_bits():
    assert throttle_names(0) == ["none"]
    assert throttle_names(0x4) == ["sw power cap"]
    assert throttle_names(0x1 | 0x40) == ["gpu idle", "hw thermal slowdown"]


def test_summary_takes_medians_and_counts_reasons():
    s = summarize([(0.0, 1980, 300, 50, 0), (0.1, 1650, 695, 55, 4), (0.2, 1700, 690, 56, 4)])
    assert s["sm_mhz"] == 1700 and s["sm_mhz_min"] == 1650 and s["sm_mhz_max"] == 1980
    assert s["power_w"] == 690 and s["temp_c"] == 56
    assert s["throttle"] == {"none": 1, "sw power cap": 2}
    assert summarize([]) == {"samples": 0}


def test_timeline_bins_launches_and_samples_from_the_first_launch():
    t0 = 1000.0
    starts = [t0, t0 + 0.005, t0 + 0.015, t0 + 0.150]
    gpu_ms = [0.050, 0.054, 0.054, 0.060]
    samples = [(t0 + 0.004, 1980, 200, 50, 0), (t0 + 0.160, 1650, 695, 55, 4)]
    rows = timeline(starts, gpu_ms, samples, [0, 10, 20, 100, 200])
    assert [(r["from_ms"], r["sm_mhz"]) for r in rows] == [(0, 1980), (10, None), (100, 1650)]  # no launch in 20-100 ms
    assert [r["ms_per_launch"] for r in rows] == pytest.approx([0.052, 0.054, 0.060])
