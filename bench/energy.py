"""Where a batch's energy goes: the board's energy counter (NVML) read around each step of the forward run back to
back, and around the whole forward with its graphs in flight (device only; `trtfuse bench e2e --energy`).

Under LoadGen the H200 runs at its power cap (docs/PERF.md, "Method": clocks): samples/s is then the board's power
over the joules one image costs, so the joules per step, not only the milliseconds, say which layer to work on. A
step's figure is its energy while it runs alone and back to back: idle and static power included, at the clock the
cap lets it run at, the way it runs inside the forward. The counter is NVML's total energy (millijoules since the
driver loaded, nvmlDeviceGetTotalEnergyConsumption), read by runtime/nvml.py.
"""

from __future__ import annotations

import statistics
import time

from ..runtime.nvml import Nvml


def measure(run_once, meter: Nvml, seconds: float, warmup: float) -> dict:
    """Call `run_once()` (it queues work and waits for it, returning how many images it ran) for `warmup` seconds, then
    for `seconds` more between two reads of the energy counter: joules, mean watts, images, median SM clock."""
    start = time.perf_counter()
    while time.perf_counter() - start < warmup:
        run_once()
    clocks, images = [], 0
    e0, t0 = meter.energy_mj(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        images += run_once()
        clocks.append(meter.sm_clock_mhz())
    elapsed, joules = time.perf_counter() - t0, (meter.energy_mj() - e0) / 1e3
    return {"seconds": elapsed, "joules": joules, "watts": joules / elapsed, "images": images,
            "sm_mhz": statistics.median(clocks)}


def step_energy(runner, meter: Nvml, seconds: float = 0.6, warmup: float = 0.3, launches: int = 20) -> list[dict]:
    """Each step of the runner's forward run back to back on its stream, `launches` at a time: millijoules per run of
    the step (one batch), with the step's mean power and SM clock while it ran."""
    out = []
    for label, step in runner.steps:
        def run_once(step=step):
            for _ in range(launches):
                step(runner.stream.handle)
            runner.stream.synchronize()
            return launches * runner.batch
        m = measure(run_once, meter, seconds, warmup)
        runs = m["images"] / runner.batch
        out.append({"step": label, "mj": 1e3 * m["joules"] / runs, "ms": 1e3 * m["seconds"] / runs,
                    "watts": m["watts"], "sm_mhz": m["sm_mhz"]})
    return out


def forward_energy(runners, meter: Nvml, seconds: float, warmup: float = 1.0) -> dict:
    """The whole forward with len(runners) graphs in flight, round-robin (bench/e2e.py: time_runners' loop): joules
    per image, mean watts, samples/s and the median SM clock over `seconds`."""
    from .e2e import launch_round

    m = measure(lambda: launch_round(runners), meter, seconds, warmup)
    return {"mj_per_image": 1e3 * m["joules"] / m["images"], "watts": m["watts"],
            "samples_per_s": m["images"] / m["seconds"], "sm_mhz": m["sm_mhz"], "seconds": m["seconds"]}


def per_batch_energy(steps: list[dict], batch: int, forward: dict | None = None) -> dict:
    """The steps' millijoules summed per kind of layer (bench/e2e.py: step_group), with each kind's share, millijoules
    per image, and the time-weighted power and clock of its steps; next to the whole forward's millijoules per batch
    (from `forward_energy`) where given."""
    from .e2e import step_group

    rows: dict[str, dict] = {}
    for s in steps:
        group = step_group(s["step"])
        row = rows.setdefault(group, {"group": group, "count": 0, "mj": 0.0, "ms": 0.0, "_mhz_ms": 0.0})
        row["count"] += 1
        row["mj"] += s["mj"]
        row["ms"] += s["ms"]
        row["_mhz_ms"] += s["sm_mhz"] * s["ms"]
    total = sum(r["mj"] for r in rows.values())
    for r in rows.values():
        r["share"] = r["mj"] / total if total else None
        r["mj_per_image"] = r["mj"] / batch
        r["watts"] = r["mj"] / r["ms"] if r["ms"] else None
        r["sm_mhz"] = r.pop("_mhz_ms") / r["ms"] if r["ms"] else None
    return {"rows": list(rows.values()), "sum_of_steps_mj": total,
            "forward_mj_per_batch": forward["mj_per_image"] * batch if forward else None}
