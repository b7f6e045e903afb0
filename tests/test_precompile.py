"""Autotune's candidates compiled side by side (plugins/conv.py: precompile): every tactic's kernel lands in the disk
cache that the launches then load from, for both families, on threads. CPU only (NVRTC needs no GPU)."""

import pytest

from trtfuse.plugins import conv
from trtfuse.plugins.tactics import TACTICS
from trtfuse.plugins.wgmma_tactics import WGMMA_TACTICS

pytest.importorskip("cuda.bindings.nvrtc", reason="needs cuda-python's NVRTC")


def test_precompile_fills_the_cache_the_launches_read(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTFUSE_CACHE", str(tmp_path))
    tactics = [TACTICS[0], WGMMA_TACTICS[0], TACTICS[0]]  # a repeat is compiled once
    conv.precompile(tactics, "sm_90", workers=2)
    images = sorted(p.name.split("-")[0] for p in (tmp_path / "kernels").glob("*.cubin"))
    assert images == ["fused_conv", "wgmma_conv"]
    assert not list((tmp_path / "kernels").glob("*.tmp"))  # every write finished by its rename
    for t in tactics[:2]:  # what a launch compiles now comes from the cache: the same image, no new file
        before = set((tmp_path / "kernels").iterdir())
        again = conv.compile_for(t, "sm_90")
        assert again.image and set((tmp_path / "kernels").iterdir()) == before
