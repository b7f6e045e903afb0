"""runtime/memory_plan.py: activations that share memory by lifetime never overlap while both are live."""

import numpy as np
import pytest

from trtfuse.runtime.memory_plan import assign_offsets, lifetimes, peak_live_bytes


def test_lifetimes_span_first_to_last_touch():
    steps = [("in", "a"), ("a", "b"), ("b", "c", "a"), ("c", "out")]
    assert lifetimes(steps) == {"in": (0, 0), "a": (0, 2), "b": (1, 2), "c": (2, 3), "out": (3, 3)}


def test_a_chain_reuses_the_bytes_of_what_is_dead():
    # x -> y -> z -> w, each read once by the next step: two buffers' worth of memory serves all four
    steps = [("x", "y"), ("y", "z"), ("z", "w")]
    lives = lifetimes(steps)
    sizes = dict.fromkeys(lives, 4096)
    offsets, arena = assign_offsets(sizes, lives, align=1024)
    assert arena == 2 * 4096 == peak_live_bytes(sizes, lives)
    assert offsets["x"] == offsets["z"] and offsets["y"] == offsets["w"] and offsets["x"] != offsets["y"]


def test_a_residual_stays_apart_until_its_add():
    # the block input r is read again by the last step: nothing written in between may take its bytes
    steps = [("r", "a"), ("a", "b"), ("b", "r", "out")]
    lives = lifetimes(steps)
    offsets, arena = assign_offsets(dict.fromkeys(lives, 100), lives, align=100)
    assert len({offsets["r"], offsets["a"]}) == 2 and len({offsets["r"], offsets["b"]}) == 2
    assert arena == 300


@pytest.mark.parametrize("seed", range(20))
def test_random_plans_never_overlap_live_buffers(seed):
    rng = np.random.default_rng(seed)
    steps = [tuple(f"t{j}" for j in rng.choice(30, size=rng.integers(1, 4), replace=False)) for _ in range(40)]
    lives = lifetimes(steps)
    sizes = {b: int(rng.integers(1, 10_000_000)) for b in lives}
    align = 2 << 20
    offsets, arena = assign_offsets(sizes, lives, align)
    rounded = {b: -(-n // align) * align for b, n in sizes.items()}
    for a in lives:
        assert offsets[a] % align == 0 and offsets[a] + rounded[a] <= arena
        for b in lives:
            if a < b and lives[a][0] <= lives[b][1] and lives[b][0] <= lives[a][1]:
                assert offsets[a] + rounded[a] <= offsets[b] or offsets[b] + rounded[b] <= offsets[a], (a, b)
    assert peak_live_bytes(sizes, lives, align) <= arena <= sum(rounded.values())


def test_alignment_must_be_positive():
    with pytest.raises(ValueError):
        assign_offsets({"a": 1}, {"a": (0, 0)}, 0)


def test_describe_gives_both_footprints_or_nothing():
    from trtfuse.runtime.memory_plan import describe

    assert describe({"placed": 9_881_780_224, "separate": 40_640_708_608}) == "9.88 GB (40.64 GB unshared)"
    assert describe({}) is None and describe(None) is None
