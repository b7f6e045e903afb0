"""`--split-k measure`: decide split-K per GEMM by timing the candidates on the GPU, as TensorRT's builder
times tactics, and remember the answer per (device, shape, dtype).

For each eligible GEMM the plain GEMM and the rewrite's exact op sequence for every candidate split
count are timed from a CUDA graph (bench/splitk.py's `time_graph`: launch gaps removed, as in an engine);
the fastest split is taken when it is `min_gain` faster than the plain GEMM, else the node is left alone.
Decisions are cached in `<trtfuse cache>/splitk-measure.json` (TRTFUSE_CACHE or ~/.cache/trtfuse),
keyed by device name, dtype and the GEMM's shape and flags, so a model rewritten twice is timed once.

Where there is no GPU (or no PyTorch to time with), or the GEMM is one the timing harness does not
reproduce (batched, transposed or computed B, transA), the analytic cost model (cost_model.py) decides,
and the reason says so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from .cost_model import DeviceParams, GemmProblem, decide, padded_k

# timer(problem, candidate splits) -> (plain_us, {splits: us}); None when there is nothing to time on
Timer = Callable[[GemmProblem, list], tuple]


def cache_path() -> Path:
    root = os.environ.get("TRTFUSE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "trtfuse") / "splitk-measure.json"


def cache_key(device: str, p: GemmProblem) -> str:
    return (f"{device}|{p.dtype}|M{p.m}|N{p.n}|K{p.k}|batch{p.batch}|bias{int(p.has_bias)}|transA{int(p.a_transposed)}"
            f"|transB{int(p.b_transposed)}|constB{int(p.b_constant)}|alpha{int(p.alpha_scale)}")


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def _store(path: Path, key: str, entry: dict) -> None:
    from trtfuse.io import atomic_write_json

    data = _load(path)
    data[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, data)


def torch_gpu_timer() -> tuple[str, Timer] | None:
    """(device name, timer) when PyTorch sees a CUDA GPU, else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    from trtfuse.bench.splitk import make_plain, make_rewritten, time_graph

    def timer(p: GemmProblem, candidates: list) -> tuple:
        dtype = getattr(torch, p.dtype)
        gen = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(p.m, p.k, device="cuda", dtype=dtype, generator=gen)
        w = torch.randn(p.k, p.n, device="cuda", dtype=dtype, generator=gen) / p.k ** 0.5
        bias = torch.randn(p.n, device="cuda", dtype=dtype, generator=gen) if p.has_bias else None
        plain = time_graph(torch, make_plain(torch, a, w, bias), 400, 0.15)
        return plain, {s: time_graph(torch, make_rewritten(torch, a, w, bias, s), 400, 0.15) for s in candidates}

    return torch.cuda.get_device_name(), timer


def timeable(p: GemmProblem) -> str | None:
    """Why the harness cannot time this GEMM as the rewrite runs it (None: it can)."""
    if p.batch != 1:
        return "a batched GEMM"
    if p.a_transposed or p.b_transposed or not p.b_constant or p.alpha_scale:
        return "transA/transB, a computed B or alpha != 1"
    return None


def measure_decision(p: GemmProblem, dev: DeviceParams, gpu: tuple[str, Timer] | None = None,
                     cache: Path | None = None) -> tuple[int, str]:
    """(split count or 0, reason): timed on the GPU (cached), or the cost model where nothing can be timed."""
    why_not = "no GPU to time on" if gpu is None else timeable(p)
    if why_not is not None:
        d = decide(p, dev)
        return d.splits, f"measure: {why_not}, cost model: {d.reason}"
    device, timer = gpu
    path = cache or cache_path()
    key = cache_key(device, p)
    entry = _load(path).get(key)
    if entry is None:
        candidates = [s for s in dev.candidate_splits if padded_k(p.k, s) // s >= 128]
        if not candidates:
            return 0, f"measure: K={p.k} leaves fewer than 128 per split"
        plain, timed = timer(p, candidates)
        best = min(timed, key=timed.get)
        splits = best if timed[best] * (1 + dev.min_gain) <= plain else 0
        entry = {"splits": splits, "plain_us": plain, "split_us": {str(s): t for s, t in timed.items()},
                 "min_gain": dev.min_gain}
        _store(path, key, entry)
        source = "timed on"
    else:
        source = "cached timing on"
    best_s = min(entry["split_us"], key=entry["split_us"].get)
    verdict = (f"{entry['splits']} splits" if entry["splits"] else "no split")
    return int(entry["splits"]), (f"measure ({source} {device}): plain {entry['plain_us']:.1f} us, best split "
                                  f"{best_s} {entry['split_us'][best_s]:.1f} us -> {verdict}")
