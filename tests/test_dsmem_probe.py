"""bench/dsmem_probe.py's expected results, checked on the CPU against a direct replay of the kernel's loops
(bench/probe_kernels/dsmem_probe.cu): the probe refuses a timing whose buffer or sums differ from these."""

import numpy as np
import pytest

from trtfuse.bench.dsmem_probe import SLOTS, THREADS, expected_load, expected_store, slot_words


def replay_load(ctas, cluster, iters, remote):
    sums = np.zeros((ctas, THREADS), np.uint64)
    for cta in range(ctas):
        rank = cta % cluster
        owner = (rank + 1) % cluster if remote else rank
        words = slot_words(owner, 0).astype(np.uint64)
        for t in range(THREADS):
            total = 0
            for it in range(iters):
                for i in range(t, SLOTS, THREADS):
                    j = (i + it) % SLOTS
                    total += int(words[j]) + owner + 0 + j
            sums[cta, t] = total & 0xFFFFFFFF
    return sums.astype(np.uint32)


@pytest.mark.parametrize("remote", [False, True])
@pytest.mark.parametrize("iters", [1, 3, 258])
def test_expected_load_is_the_kernels_sum(remote, iters):
    assert np.array_equal(expected_load(4, 2, iters, remote), replay_load(4, 2, iters, remote))


def test_expected_store_names_the_writer():
    out = expected_store(8, 4, 5, remote=True)
    assert out.shape == (8, SLOTS, 4)
    assert list(out[:, 0, 1]) == [3, 0, 1, 2, 3, 0, 1, 2]  # each buffer written by the previous rank of its cluster
    assert (out[:, :, 2] == 4).all() and (out[5, :, 3] == np.arange(SLOTS)).all()
    assert np.array_equal(out[1, :, 0], slot_words(0, 4))
    local = expected_store(8, 4, 5, remote=False)
    assert list(local[:, 0, 1]) == [0, 1, 2, 3, 0, 1, 2, 3]


def test_slot_words_wrap_like_uint32():
    i = 4095
    assert slot_words(7, 1999)[i] == ((7 * 131 + 1999 * 7) ^ (i * 2654435761)) & 0xFFFFFFFF
