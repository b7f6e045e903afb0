"""Which calibration method serves a model best: one statistics pass, every method's scales, the rewrite,
and an evaluation of each on held-out images.

The histograms are collected once (the thresholds of all methods come from the same histograms), so
the comparison costs one calibration pass plus one evaluation per method.
"""

from __future__ import annotations

import time
from pathlib import Path

from trtfuse.errors import TrtfuseError

from .calibrators import METHODS


def rewrite_with_scales(model, scales: dict[str, float], fuse_mode: str = "residual"):
    """The INT8 rewrite (`trtfuse rewrite --scales`) of `model` with these activation scales."""
    try:
        from trtfuse.graph_passes.pipeline import rewrite
    except ImportError:
        raise TrtfuseError("this trtfuse has no rewrite pipeline (trtfuse.graph_passes.pipeline)") from None
    rewritten, _ = rewrite(model, fuse_mode, scales)
    return rewritten


def _score(row: dict) -> tuple:
    return (row["logit_cosine_mean"], row["top1_agreement"])


def compare_methods(model_path, calib_images, eval_images, methods=METHODS, percentile: float = 99.99,
                    fuse_mode: str = "residual", out_dir: str | Path | None = None, batch_size: int = 8,
                    show_progress: bool = True) -> dict:
    """{"rows": [per-method evaluation], "winner": ..., ...}; with `out_dir`, also every method's scales
    JSON and rewritten model, named `<model stem>.<method>.scales.json` / `.int8.onnx`."""
    from trtfuse.io import atomic_write_json, load_model, save_model

    from .calibrate import gather_statistics, scales_from_histograms
    from .evaluate import evaluate
    from .scales import file_sha256, scales_document

    model = load_model(model_path)
    hists, selection, stat_seconds = gather_statistics(model, calib_images, fuse_mode, "auto", batch_size,
                                                       show_progress=show_progress)
    out_dir = Path(out_dir) if out_dir else None
    if out_dir is not None and not out_dir.is_dir():
        raise TrtfuseError(f"output folder does not exist: {out_dir}")
    stem = Path(model_path).stem
    sha = file_sha256(model_path)
    rows = []
    fp32_accuracy = None
    for method in methods:
        start = time.perf_counter()
        scales, amax = scales_from_histograms(hists, method, percentile)
        int8 = rewrite_with_scales(model, scales, fuse_mode)
        if out_dir is not None:
            meta = {"method": method, "percentile": percentile if method == "percentile" else None,
                    "images": calib_images.count, "data": calib_images.description, "model": str(model_path),
                    "model_sha256": sha, "tensors": len(scales), "selection": selection, "fuse_mode": fuse_mode}
            atomic_write_json(out_dir / f"{stem}.{method}.scales.json", scales_document(scales, amax, meta))
            save_model(int8, out_dir / f"{stem}.{method}.int8.onnx", check=False)
        report = evaluate(model, int8, eval_images, batch_size=batch_size, show_progress=show_progress)
        fp32_accuracy = report["top1_accuracy_fp32"]  # the same for every method: same fp32 model, same images
        rows.append({
            "method": method + (f" {percentile}" if method == "percentile" else ""),
            "logit_cosine_mean": report["logit_cosine_mean"],
            "logit_cosine_min": report["logit_cosine_min"],
            "top1_agreement": report["top1_agreement"],
            "top1_accuracy_int8": report["top1_accuracy_int8"],
            "min_sqnr_db": report.get("min_sqnr_db"),
            "min_sqnr_layer": report.get("min_sqnr_layer"),
            "mean_sqnr_db": (sum(r["sqnr_db"] for r in report["layers"]) / len(report["layers"])) if report["layers"] else None,
            "layers": report["layers"],
            "seconds": round(time.perf_counter() - start, 1),
        })
    ranked = sorted(rows, key=_score, reverse=True)
    winner = ranked[0]
    by_method = {r["method"].split()[0]: r for r in rows}
    result = {
        "model": str(model_path),
        "calibration": calib_images.description,
        "evaluation": eval_images.description,
        "tensors": len(hists),
        "selection": selection,
        "statistics_seconds": round(stat_seconds, 1),
        "top1_accuracy_fp32": fp32_accuracy,
        "rows": rows,
        "winner": winner["method"],
        "margin_over_runner_up": None if len(ranked) < 2 else {
            "runner_up": ranked[1]["method"],
            "logit_cosine_mean": winner["logit_cosine_mean"] - ranked[1]["logit_cosine_mean"],
            "top1_agreement": winner["top1_agreement"] - ranked[1]["top1_agreement"]},
    }
    if "max" in by_method and winner is not by_method["max"]:
        result["margin_over_max"] = {
            "logit_cosine_mean": winner["logit_cosine_mean"] - by_method["max"]["logit_cosine_mean"],
            "top1_agreement": winner["top1_agreement"] - by_method["max"]["top1_agreement"]}
    return result


def print_comparison(result: dict) -> None:
    from trtfuse.ui import print_table

    print(f"calibration: {result['calibration']}; {result['tensors']} tensors ({result['selection']}), "
          f"statistics {result['statistics_seconds']} s")
    print(f"evaluation:  {result['evaluation']}")
    labelled = result.get("top1_accuracy_fp32") is not None
    if labelled:
        print(f"fp32 top-1 accuracy: {100 * result['top1_accuracy_fp32']:.1f}%")
    print_table(["method", "cosine mean", "cosine min", "top-1 agree"] + (["int8 top-1 acc"] if labelled else [])
                + ["mean SQNR dB", "min SQNR dB (layer)", "s"],
                [[r["method"], f"{r['logit_cosine_mean']:.5f}", f"{r['logit_cosine_min']:.5f}",
                  f"{100 * r['top1_agreement']:.1f}%"]
                 + ([f"{100 * r['top1_accuracy_int8']:.1f}%"] if labelled else [])
                 + ["" if r["mean_sqnr_db"] is None else f"{r['mean_sqnr_db']:.2f}",
                    "" if r["min_sqnr_db"] is None else f"{r['min_sqnr_db']:.2f} ({r['min_sqnr_layer']})",
                    r["seconds"]] for r in result["rows"]])
    m = result.get("margin_over_runner_up")
    line = f"winner: {result['winner']}"
    if m:
        line += (f" (over {m['runner_up']}: cosine {m['logit_cosine_mean']:+.5f}, "
                 f"top-1 agreement {100 * m['top1_agreement']:+.1f} points")
        mm = result.get("margin_over_max")
        if mm and not m["runner_up"].startswith("max"):  # when max is the runner-up, that margin is said already
            line += f"; over max: cosine {mm['logit_cosine_mean']:+.5f}, top-1 agreement {100 * mm['top1_agreement']:+.1f} points"
        line += ")"
    print(line)
