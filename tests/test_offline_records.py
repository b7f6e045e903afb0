"""The repository's LoadGen records (bench/results/offline-*.json): each carries LoadGen's verdict and the settings it
was reached under, and a several-GPU record its scaling against one GPU of the same call. CPU only."""

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
RECORDS = sorted(RESULTS.glob("offline-*.json"))


@pytest.mark.skipif(not RECORDS, reason="no bench/results/offline-*.json in this copy")
@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_every_offline_record_says_how_it_was_judged(path):
    rec = json.loads(path.read_text())
    for key in ("command", "date", "device", "gpus", "min_duration_s"):
        assert rec.get(key) is not None, key
    if rec.get("mode", "performance") == "accuracy":  # no performance verdict: the answers are what is judged
        assert rec["accuracy_responses"] == rec["count"] and "golden_top1_agreement" in rec
        return
    assert rec["result"] in ("VALID", "INVALID") and rec["samples_per_s"] > 0
    if rec["gpus"] > 1:
        one = rec["one_gpu"]
        assert one["result"] == "VALID" and one["min_duration_s"] == rec["min_duration_s"]
        assert rec["scaling_vs_1gpu"] == pytest.approx(rec["samples_per_s"] / one["samples_per_s"])
