"""The PyTorch fp16 baseline of `trtfuse offline --compare-torch` and `trtfuse bench e2e` (bench/e2e.py): timed at its
own best batch no larger than ours, so a large batch of ours never meets a PyTorch slowed by that batch. CPU only: the
timing of one batch is replaced, the choice among batches is what is checked."""

import pytest

from trtfuse.bench import e2e


@pytest.mark.parametrize("batch,tried", [
    (4096, [4096, 2048, 1024, 512, 256]),
    (2048, [2048, 1024, 512, 256]),
    (1536, [1536, 768, 384]),
    (512, [512, 256]),
    (256, [256]),
    (64, [64]),
    (300, [300]),
])
def test_torch_is_timed_at_the_runs_batch_and_each_halving_down_to_256(batch, tried):
    assert e2e.torch_batches(batch) == tried


def test_the_best_batch_is_kept_with_every_batchs_figure(monkeypatch):
    # the shape of the H200's curve: flat from 512 to 2048, batch 4096 far slower
    rates = {4096: 12_547.0, 2048: 17_798.0, 1024: 17_811.0, 512: 17_634.0, 256: 17_152.0}
    timed = []

    def fake(batch, seconds):
        timed.append((batch, seconds))
        return rates[batch]

    monkeypatch.setattr(e2e, "torch_fp16_samples_per_s", fake)
    best = e2e.torch_fp16_best(4096, 5.0)
    assert best["samples_per_s"] == 17_811.0 and best["batch"] == 1024
    assert best["by_batch"] == {str(b): r for b, r in rates.items()}
    assert timed == [(b, 5.0) for b in (4096, 2048, 1024, 512, 256)]


def test_a_batch_that_does_not_fit_is_recorded_and_the_others_still_compete(monkeypatch):
    rates = {8192: None, 4096: 12_547.0, 2048: 17_798.0, 1024: 17_811.0, 512: 17_634.0, 256: 17_152.0}
    monkeypatch.setattr(e2e, "torch_fp16_samples_per_s", lambda batch, seconds: rates[batch])
    best = e2e.torch_fp16_best(8192, 1.0)
    assert best["batch"] == 1024 and best["by_batch"]["8192"] is None


def test_no_batch_fitting_is_a_one_line_error(monkeypatch):
    from trtfuse.errors import TrtfuseError

    monkeypatch.setattr(e2e, "torch_fp16_samples_per_s", lambda batch, seconds: None)
    with pytest.raises(TrtfuseError, match="^PyTorch fp16 ran out of GPU memory at every batch from 512 down to 256: "):
        e2e.torch_fp16_best(512, 1.0)
