"""The board's own readings through NVML: energy counter, SM clock, power draw and why the clock is held down.

Under a sustained load an H200 runs at its power cap, and the SM clock the cap leaves differs from card to card of
one kind (docs/PERF.md, the card row): samples/s follows it. So a throughput record says which clock it ran at:
`CardMonitor` samples every GPU of a run in a background thread and `summarize_card` turns the readings into the
record's `cards` entry (`trtfuse offline`), and `bench/energy.py` reads the energy counter around each step.

NVML is read through ctypes from the driver's own libnvidia-ml: nothing to install, and read only (no clock or limit
is touched).
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time

NVML_SUCCESS = 0
NVML_CLOCK_SM = 1  # nvml.h: nvmlClockType_t
# nvml.h: nvmlClocksEventReason* (formerly nvmlClocksThrottleReason*), the bits that lower the clock under load
CLOCK_EVENT_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                       0x80: "hw_power_brake"}


class Nvml:
    """The NVML handle of a CUDA device (found by its PCI bus id, which CUDA's and NVML's orders share)."""

    def __init__(self, device_ordinal: int = 0, library: str = "libnvidia-ml.so.1"):
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as exc:
            raise RuntimeError(f"no NVML ({library}: {exc})") from None
        self._call("nvmlInit_v2")
        from ..plugins.cuda_driver import pci_bus_id

        self.handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByPciBusId_v2", ctypes.c_char_p(pci_bus_id(device_ordinal).encode()),
                   ctypes.byref(self.handle))

    def _call(self, name: str, *args) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != NVML_SUCCESS:
            raise RuntimeError(f"NVML {name} returned {rc}")

    def energy_mj(self) -> int:
        value = ctypes.c_ulonglong()
        self._call("nvmlDeviceGetTotalEnergyConsumption", self.handle, ctypes.byref(value))
        return value.value

    def sm_clock_mhz(self) -> int:
        value = ctypes.c_uint()
        self._call("nvmlDeviceGetClockInfo", self.handle, NVML_CLOCK_SM, ctypes.byref(value))
        return value.value

    def power_w(self) -> float:
        value = ctypes.c_uint()  # milliwatts
        self._call("nvmlDeviceGetPowerUsage", self.handle, ctypes.byref(value))
        return value.value / 1e3

    def clock_event_reasons(self) -> int:
        value = ctypes.c_ulonglong()
        # the older name of the same call (nvml.h keeps both): drivers before 535 have only it
        name = ("nvmlDeviceGetCurrentClocksEventReasons" if hasattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons")
                else "nvmlDeviceGetCurrentClocksThrottleReasons")
        self._call(name, self.handle, ctypes.byref(value))
        return value.value


def nvml_refusal(device_ordinal: int = 0) -> str | None:
    """Why the energy counter cannot be read here, in one line, or None."""
    try:
        Nvml(device_ordinal).energy_mj()
    except Exception as exc:  # no driver library, no GPU, or a GPU without the counter
        return str(exc) or type(exc).__name__
    return None


def summarize_card(readings: list[tuple[int, float, int]], joules: float, seconds: float) -> dict:
    """One GPU's readings over a run, each (SM MHz, watts, clock event reasons), and its energy counter's joules over
    `seconds`: the median SM clock, the mean power from the counter (the readings' median power beside it), and the
    share of readings in which each reason held the clock down. A run shorter than the counter's update period
    (about 0.1 s) sees it unchanged: then joules and the mean power are None rather than a false zero."""
    if not readings or seconds <= 0:
        raise ValueError("summarize_card needs at least one reading and a positive duration")
    reasons = {name: sum(1 for r in readings if r[2] & bit) / len(readings) for bit, name in CLOCK_EVENT_REASONS.items()}
    if joules <= 0:
        joules = None
    return {"sm_mhz_median": statistics.median(r[0] for r in readings),
            "sm_mhz_min": min(r[0] for r in readings), "sm_mhz_max": max(r[0] for r in readings),
            "watts_mean": None if joules is None else joules / seconds, "watts_median": statistics.median(r[1] for r in readings),
            "joules": joules, "seconds": seconds, "readings": len(readings),
            "clock_held_by": {name: share for name, share in reasons.items() if share > 0}}


class CardMonitor:
    """Samples each GPU's SM clock, power and clock event reasons every `interval` seconds between `start` and `stop`,
    in a daemon thread, and reads the energy counter at both ends. `stop` gives one `summarize_card` per GPU, in
    CUDA's order."""

    def __init__(self, device_ordinals: list[int], interval: float = 0.25):
        self.meters = [Nvml(d) for d in device_ordinals]
        self.ordinals, self.interval = list(device_ordinals), interval
        self.readings: list[list[tuple[int, float, int]]] = [[] for _ in self.meters]
        self.error: str | None = None  # an NVML call that failed mid-run ends the sampling; the record says why
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="card-monitor", daemon=True)

    def _sample(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                for meter, out in zip(self.meters, self.readings):
                    out.append(self._read(meter))
        except RuntimeError as exc:
            self.error = str(exc)

    @staticmethod
    def _read(meter: Nvml) -> tuple[int, float, int]:
        return meter.sm_clock_mhz(), meter.power_w(), meter.clock_event_reasons()

    def start(self) -> "CardMonitor":
        self._energy0 = [m.energy_mj() for m in self.meters]
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join()
        seconds = time.perf_counter() - self._t0
        out = []
        for d, meter, e0, readings in zip(self.ordinals, self.meters, self._energy0, self.readings):
            if not readings:  # a run shorter than one interval: one reading now
                readings.append(self._read(meter))
            card = {"gpu": d, **summarize_card(readings, (meter.energy_mj() - e0) / 1e3, seconds)}
            if self.error:
                card["sampling_stopped_by"] = self.error
            out.append(card)
        return out


def start_card_monitor(device_ordinals: list[int]) -> CardMonitor | None:
    """A started CardMonitor over `device_ordinals`, or None without GPUs or where NVML is not readable (nvml_refusal
    says why): the caller's run goes on without the readings."""
    if not device_ordinals:
        return None
    try:
        return CardMonitor(device_ordinals).start()
    except RuntimeError:
        return None
