"""bench/kernels.py without a GPU: the records the chain pair feeding the next stage adds (y stored at stride 2, and
that stage's downsample on the stored map) are named after resnet50_layers' own layers and enter the history line
beside what they are compared with, outside the distinct layers' sum."""

from trtfuse.bench.kernels import CHAIN_PAIRS, kernel_key_figures, next_stage_downsample
from trtfuse.bench.layers import resnet50_layers
from trtfuse.plugins import chain_conv


def test_only_the_runners_pair_into_the_next_stage_has_a_stored_map_downsample():
    layers = {name: shape for name, shape, _ in resnet50_layers(8)}
    found = {key: next_stage_downsample(key, 8) for key in CHAIN_PAIRS}
    assert [k for k, v in found.items() if v] == [(64, 256, 128), (128, 512, 256)]  # the pairs into res3 and res4
    (strided_name, strided), (stored_name, stored) = found[(64, 256, 128)]
    assert layers[strided_name] == strided  # the very layer resnet50_layers times: its record is reused
    assert stored_name == "res3 downsample 1x1 256->512 on y stored at stride 2"
    assert (stored.h, stored.w, stored.stride, stored.c, stored.k) == (28, 28, (1, 1), 256, 512)
    assert stored.out_hw == strided.out_hw and not stored.residual
    # the runner chains the pair into res3 only, so only it gets the stride-2 records
    assert chain_conv.VARIANTS[(64, 256, 128)].in_runner and not chain_conv.VARIANTS[(128, 512, 256)].in_runner


def test_key_figures_put_each_new_record_beside_what_it_replaces():
    def rec(layer, ms, **extra):
        return {"layer": layer, "batch": 256, "ours_ms": ms, "correct": True, **extra}

    records = [rec("res3 downsample 1x1/2 256->512", 0.072),
               rec("res2 conv3 + residual -> conv1 256->128, one kernel", 0.173, fused_block=True, replaces=2,
                   unfused_ms=0.215),
               rec("res2 conv3 + residual -> conv1 256->128, y stored at stride 2, one kernel", 0.160, fused_block=True,
                   replaces=1, unfused_ms=0.173, compared_with="y whole"),
               rec("res3 downsample 1x1 256->512 on y stored at stride 2", 0.061, reads_stored_map=True, unfused_ms=0.072,
                   compared_with="y whole, read at stride 2")]
    f = kernel_key_figures(records)
    assert f["res2 conv3 + residual -> conv1 256->128, one kernel (two kernels)"] == 0.215
    assert f["res2 conv3 + residual -> conv1 256->128, y stored at stride 2, one kernel (y whole)"] == 0.173
    assert f["res3 downsample 1x1 256->512 on y stored at stride 2"] == 0.061
    assert f["res3 downsample 1x1 256->512 on y stored at stride 2 (y whole, read at stride 2)"] == 0.072
    assert f["distinct_layers_b256_sum_ms"] == 0.072  # the stored-map conv is not one of the distinct layers
    assert f["records"] == 4 and f["all_correct"]
