"""`trtfuse bench e2e`'s per-batch table (bench/e2e.py: per_batch_table): each step of the forward attributed to its
kind of layer, weighted by how often the kind occurs, checked on the repository's own H200 record. CPU only."""

import json
import re
from pathlib import Path

import pytest

from trtfuse.bench.e2e import per_batch_table, step_group

RECORD = Path(__file__).resolve().parents[1] / "bench" / "results" / "e2e-NVIDIA_H200.json"


@pytest.mark.parametrize("label,group", [
    ("quantize input (space-to-depth)", "input quantize"),
    ("conv1__fused", "stem 7x7/2 conv + ReLU"),
    ("conv1__fused + max-pool", "stem 7x7/2 conv + ReLU + max-pool 3x3/2"),
    ("conv1__fused + max-pool + layer1.0.conv1__fused", "stem 7x7/2 conv + ReLU + max-pool 3x3/2 + res2 first conv1"),
    ("maxpool", "max-pool 3x3/2"),
    ("layer1.0.downsample.0__fused", "res2 downsample"),
    ("layer3.5.conv2__fused", "res4 conv2"),
    ("layer1.2.conv3__fused + layer2.0.conv1__fused (chain)", "res2 conv3 + residual + next conv1"),
    ("layer1.0.downsample.0__fused+layer1.0.conv3__fused+layer1.1.conv1__fused (chain + downsample)",
     "res2 downsample + conv3 + residual + next conv1"),
    ("fc", "average pool, classifier, top-1"),
])
def test_step_groups(label, group):
    assert step_group(label) == group


def test_the_stored_record_attributes_every_step():
    if not RECORD.exists():
        pytest.skip(f"{RECORD.name} is not in this copy")
    rec = json.loads(RECORD.read_text())
    table = per_batch_table(rec["breakdown"], rec["samples_per_s"], rec["batch"])
    counts = {r["group"]: r["count"] for r in table["rows"]}
    # ResNet-50's bottlenecks per stage: 3, 4, 6, 3, each with conv1, conv2, conv3 and one downsample per stage. A
    # block's conv3 run with the next block's conv1 as one kernel (a "(chain)" step) is one row, and counts as both:
    # each of the step's two nodes is counted in the stage its name says (three with the stage's downsample inside), and
    # so is res2's first conv1 run inside the stem's step.
    stages = ("res2", "res3", "res4", "res5")
    found = {(stage, kind): 0 for stage in stages for kind in ("conv1", "conv2", "conv3", "downsample")}
    for b in rec["breakdown"]:
        # the chain step is the FusedConvAddConv node, named "<conv3>+<conv1>" by the chain pass
        for node in re.sub(r" \(chain( \+ downsample)?\)$", "", b["step"]).split("+"):
            group = step_group(node.strip())
            if node.strip().startswith("layer") and group.startswith("res"):
                found[tuple(group.split(" ", 1))] += 1
    for stage, blocks in zip(stages, (3, 4, 6, 3)):
        assert [found[stage, kind] for kind in ("conv1", "conv2", "conv3", "downsample")] == [blocks] * 3 + [1]
    chains = [b["step"] for b in rec["breakdown"] if re.search(r"\(chain( \+ downsample)?\)$", b["step"])]
    assert sum(counts.get(f"{stage}{ds} conv3 + residual + next conv1", 0) for stage in stages
               for ds in ("", " downsample +")) == len(chains)
    assert sum(counts.values()) == len(rec["breakdown"])
    assert table["sum_of_steps_ms"] == pytest.approx(sum(b["ms"] for b in rec["breakdown"]))
    assert table["sum_of_steps_ms"] == pytest.approx(rec["forward_ms_sum_of_steps"])
    assert table["batch_ms_in_flight"] == pytest.approx(1e3 * rec["batch"] / rec["samples_per_s"])
    assert sum(r["share"] for r in table["rows"]) == pytest.approx(1.0)
    if "per_batch" in rec:  # what the run printed and stored is this table
        assert [(r["group"], r["count"]) for r in rec["per_batch"]["rows"]] == [(r["group"], r["count"]) for r in table["rows"]]
        assert [r["ms"] for r in rec["per_batch"]["rows"]] == pytest.approx([r["ms"] for r in table["rows"]])
