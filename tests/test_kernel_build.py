"""Every kernel variant compiles with NVRTC for every supported architecture, on the CPU, with no
local-memory spills; and the plain-Python parts of the kernel API (tactics, heuristic, launch plans)."""

import dataclasses

import pytest

from trtfuse.bench import PROBE_KERNEL_DIR
from trtfuse.bench.layers import resnet50_layers, seed000_layers
from trtfuse.plugins.conv import ENTRY, ENTRY_F32, ENTRY_F32_SPLIT_K, ENTRY_SPLIT_K, ConvLaunch, ConvParamsStruct
from trtfuse.plugins.nvrtc import ARCHS, compile_kernel
from trtfuse.plugins.tactics import TACTICS, ConvShape, choose

CONV_ENTRIES = {ENTRY, ENTRY_SPLIT_K, ENTRY_F32, ENTRY_F32_SPLIT_K, "trtfuse_fused_conv_aot", "trtfuse_fused_conv_add_aot"}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tactic", TACTICS, ids=[t.name for t in TACTICS])
def test_conv_variant_compiles_without_spills(tactic, arch):
    k = compile_kernel("fused_conv.cu", tactic.defines(), arch, "cubin")
    assert k.image[:4] == b"\x7fELF"
    assert set(k.resources) == CONV_ENTRIES, k.log
    assert not k.spills(), f"{tactic.name} {arch} spills: {k.spills()}"
    assert all(r["registers"] * tactic.threads * tactic.min_blocks <= 65536 for n, r in k.resources.items() if "splitk" not in n)


@pytest.mark.parametrize("arch", ARCHS)
def test_elementwise_and_network_ops_compile(arch):
    k = compile_kernel("elementwise.cu", {}, arch, "cubin")
    assert "trtfuse_add_relu_requant" in k.resources and not k.spills()
    k = compile_kernel("network_ops.cu", {}, arch, "cubin")
    assert set(k.resources) == {"trtfuse_quantize_chw32", "trtfuse_quantize_chw4", "trtfuse_quantize_s2d16", "trtfuse_maxpool_chw32",
                                "trtfuse_global_avgpool_chw32", "trtfuse_global_avgpool_chw32_f32", "trtfuse_linear_f32", "trtfuse_linear_f32_wide",
                                "trtfuse_argmax_rows_f32", "trtfuse_argmax_rows_f16", "trtfuse_gather_rows", "trtfuse_softmax_rows_f32"}
    assert not k.spills() and all(r["stack"] == 0 for r in k.resources.values())


def test_ptx_for_tensorrt_aot_names_the_entries():
    ptx = compile_kernel("fused_conv.cu", TACTICS[0].defines(), "sm_90", "ptx").image.decode(errors="replace")
    assert ".entry trtfuse_fused_conv_aot(" in ptx and ".entry trtfuse_fused_conv_add_aot(" in ptx
    assert ".target sm_90" in ptx


def test_params_struct_layout_matches_the_kernel():
    # 11 pointers, 15 int32, then two FastDivmod of 3 uint32 (plugins/kernels/conv_params.cuh), padded to 8 bytes.
    assert ConvParamsStruct.N.offset == 88 and ConvParamsStruct.splits.offset == 88 + 14 * 4
    assert ConvParamsStruct.div_ohw_d.offset == 148 and ConvParamsStruct.div_ow_shr.offset == 168
    assert __import__("ctypes").sizeof(ConvParamsStruct) == 176


@pytest.mark.parametrize("d", [1, 2, 3, 7, 49, 196, 784, 3136, 12544, 50176, 2**20 + 1])
def test_fast_divmod_divides_every_pixel_index(d):
    """The host's magic numbers (the kernels divide pixel indices < 2^31 with them)."""
    import numpy as np

    from trtfuse.plugins.conv import fast_divmod

    _, mul, shr = fast_divmod(d)
    n = np.concatenate([np.arange(0, 200000), np.random.default_rng().integers(0, 2**31 - 1, 200000),
                        [2**31 - 1, d - 1, d, d + 1, 2 * d - 1]]).astype(np.uint64)
    q = n if d == 1 else ((n * np.uint64(mul)) >> np.uint64(32)) >> np.uint64(shr)
    assert np.array_equal(q, n // np.uint64(d))


@pytest.mark.parametrize("batch", [1, 8, 256])
def test_heuristic_fills_the_gpu_and_respects_the_vector_width(batch):
    for name, shape, _ in resnet50_layers(batch) + seed000_layers():
        tactic, splits = choose(shape)
        assert tactic.vec == shape.vec, name
        plan = ConvLaunch(shape, tactic, splits)
        grid = plan.grid
        assert grid[1] == splits and grid[0] >= 1
        ktiles = -(-shape.gemm[2] // 64)
        assert splits == 1 or ktiles // splits >= 4, name  # each slice keeps >= 4 k-tiles
        if splits > 1:
            assert plan.workspace_bytes == 4 * shape.gemm[0] * shape.gemm[1] + 4 * grid[0]


def test_stem_uses_the_small_channel_path():
    shape = ConvShape(256, 3, 224, 224, 64, 7, 7, (2, 2), (3, 3, 3, 3))
    assert shape.vec == 4 and shape.gemm[2] == 224  # 7*7*4 = 196 padded to 224, not 7*7*32 = 1568
    assert choose(shape)[0].vec == 4


def test_shared_memory_fits_every_architecture():
    for name, shape, _ in resnet50_layers(256) + seed000_layers():
        for t in TACTICS:
            if t.vec == shape.vec:
                assert t.shared_bytes(shape.c, (shape.r, shape.s)) <= 99 * 1024, (name, t.name)  # sm_86/89 limit


# ---- Hopper wgmma tactic (plugins/kernels/wgmma_conv.cu): sm_90a only ----
from trtfuse.plugins.tactics import TACTICS_BY_ID, WGMMA_TACTICS  # noqa: E402
from trtfuse.plugins.wgmma import compile_tactic  # noqa: E402


@pytest.mark.parametrize("tactic", WGMMA_TACTICS, ids=[t.name for t in WGMMA_TACTICS])
def test_wgmma_variant_compiles_for_sm90a_without_spills(tactic):
    k = compile_tactic(tactic, "cubin")
    assert k.image[:4] == b"\x7fELF"
    assert set(k.resources) == {"trtfuse_wgmma_conv"}, k.log
    assert not k.spills(), f"{tactic.name} spills: {k.spills()}"
    res = k.resources["trtfuse_wgmma_conv"]
    assert res["stack"] == 0 and res["registers"] * tactic.threads <= 65536
    assert "serialized" not in k.log, k.log  # ptxas' "wgmma.mma_async instructions are serialized" advisory
    assert tactic.shared_bytes() <= 227 * 1024


@pytest.mark.parametrize("diag", [1, 3, 6, 7, 8, 9])
def test_wgmma_profiling_builds_compile(diag):
    # bench/wgmma_diag.py's builds of the ping-pong pixel-major tactic: each must still compile, unserialized and
    # without spills, or its timing would say nothing about the kernel it takes apart.
    import dataclasses

    tactic = dataclasses.replace(next(t for t in WGMMA_TACTICS if t.pingpong), diag=diag)
    k = compile_tactic(tactic, "cubin")
    assert not k.spills() and "serialized" not in k.log, k.log


def test_timeline_build_compiles():
    # bench/wgmma_timeline.py's build (its hooks in bench/probe_kernels/wgmma_timeline.cuh) of a channel-major ping-pong tactic
    tactic = dataclasses.replace(next(t for t in WGMMA_TACTICS if t.pingpong and not t.pixel_major), timeline=1)
    k = compile_tactic(tactic, "cubin")
    assert not k.spills() and "serialized" not in k.log, k.log


def test_probes_compile_only_with_the_bench_folder():
    # The probes live in bench/probe_kernels/: a build that names only plugins/kernels/ (every production build) cannot
    # find them, nor the profiling hooks a production tactic would include.
    from trtfuse.errors import TrtfuseError
    from trtfuse.plugins.wgmma import include_dirs

    with pytest.raises(TrtfuseError, match="no kernel source wgmma_peak.cu"):
        compile_kernel("wgmma_peak.cu", {}, "sm_90a", "cubin")
    assert all(include_dirs(t) == () for t in WGMMA_TACTICS)
    assert include_dirs(dataclasses.replace(WGMMA_TACTICS[0], diag=1)) == (PROBE_KERNEL_DIR,)


@pytest.mark.parametrize("variant", ["208:2:1", "128:1:0:2", "208:1:0:1:1", "128:1:0:2:1", "128:2:0:1:1:36", "128:1:3:1:1:36:29", "208:2:3", "128:2:3:1:1:36:29:1", "208:2:3:1:0:36:29:1"])
def test_wgmma_peak_variants_compile(variant):
    # bench/wgmma_peak.py's ceilings (incl. two accumulator chains and operand A from registers) are only worth their
    # figures if the wgmmas issue unserialized and nothing spills
    from trtfuse.bench.wgmma_peak import parse_variant

    n, wgs, layout, chains, rs, kt, pitch, turn = parse_variant(variant)
    defines = {"PEAK_N": n, "PEAK_WGS": wgs, "PEAK_B": layout, "PEAK_CHAINS": chains, "PEAK_RS": rs, "PEAK_RS_KT": kt, "PEAK_PITCH": pitch,
               "PEAK_TURN": turn}
    k = compile_kernel("wgmma_peak.cu", defines, "sm_90a", "cubin", include_dirs=(PROBE_KERNEL_DIR,))
    assert set(k.resources) == {"wgmma_peak"} and not k.spills() and "serialized" not in k.log, k.log
    ptx = compile_kernel("wgmma_peak.cu", defines, "sm_90a", "ptx", include_dirs=(PROBE_KERNEL_DIR,)).image.decode(errors="replace")
    operand_a = "{%r" if rs else "%rd"  # four A registers, or a descriptor, after the accumulator list
    assert any(operand_a in line.split("}, ", 1)[1] for line in ptx.splitlines() if f"m64n{n}k32.s32.s8.s8" in line)


@pytest.mark.parametrize("defines", [{}, {"PROBE_AHEAD": 0, "PROBE_STORE": 16}, {"PROBE_BLOCKS": 4}])
def test_stream_probe_compiles(defines):
    k = compile_kernel("stream_probe.cu", defines, "sm_90", "cubin", include_dirs=(PROBE_KERNEL_DIR,))
    assert set(k.resources) == {"probe_flat", "probe_tiles"} and not k.spills()


@pytest.mark.parametrize("cluster", [2, 4, 8])
def test_dsmem_probe_compiles(cluster):
    # bench/dsmem_probe.py: 16-byte accesses to a peer CTA's shared memory through mapa's cluster address
    k = compile_kernel("dsmem_probe.cu", {"CLUSTER": cluster}, "sm_90", "cubin", include_dirs=(PROBE_KERNEL_DIR,))
    assert set(k.resources) == {"probe_store", "probe_load"} and not k.spills()
    ptx = compile_kernel("dsmem_probe.cu", {"CLUSTER": cluster}, "sm_90", "ptx", include_dirs=(PROBE_KERNEL_DIR,)).image.decode(errors="replace")
    for needle in ("mapa.shared::cluster.u32", "st.shared::cluster.v4.u32", "ld.shared::cluster.v4.u32", f".reqnctapercluster {cluster}, 1, 1"):
        assert needle in ptx, needle


def test_wgmma_ptx_uses_the_hopper_instructions():
    ptx = compile_tactic(WGMMA_TACTICS[0], "ptx").image.decode(errors="replace")
    assert ".target sm_90a" in ptx
    for needle in ("wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8", "cp.async.bulk.tensor.5d", "cp.async.bulk.tensor.2d",
                   "mbarrier.try_wait.parity", "setmaxnreg.inc", "setmaxnreg.dec", ".param .align 64 .b8 trtfuse_wgmma_conv_param_0[128]"):
        assert needle in ptx, needle


def test_wgmma_pingpong_tile_stores_by_tma():
    # the channel-major ping-pong tile's output map (the kernel's third parameter), its bulk tensor stores from shared
    # memory and the waits before the staging tile is rewritten and before the CTA exits
    ptx = compile_tactic(TACTICS_BY_ID[70], "ptx").image.decode(errors="replace")
    for needle in (".param .align 64 .b8 trtfuse_wgmma_conv_param_2[128]", "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group",
                   "cp.async.bulk.commit_group", "cp.async.bulk.wait_group.read 0", "cp.async.bulk.wait_group 0",
                   "fence.proxy.async.shared::cta"):
        assert needle in ptx, needle
    row_box = compile_tactic(TACTICS_BY_ID[31], "ptx").image.decode(errors="replace")
    assert "cp.async.bulk.tensor.5d.global" not in row_box  # the other channel-major tiles store through the threads


@pytest.mark.parametrize("tactic", [t for t in WGMMA_TACTICS if t.early_release], ids=lambda t: t.name)
def test_early_release_gives_the_window_back_between_the_batch_halves(tactic):
    # A stride-2 window batch with early_release issues its first taps, commits them, waits for the previous batch
    # (wait_group 1) and gives that window back (an mbarrier arrive), then issues the rest: the window goes back
    # without waiting for the whole next batch to be issued.
    import re

    ptx = compile_tactic(tactic, "ptx").image.decode(errors="replace")
    ops = []
    for line in ptx.splitlines():
        m = re.match(r"\s*(wgmma\.mma_async|wgmma\.commit_group|wgmma\.wait_group\.sync\.aligned \d|mbarrier\.arrive\.shared)", line)
        if m:
            ops.append({"wgmma.mma_async": "M", "wgmma.commit_group": "C", "mbarrier.arrive.shared": "A"}.get(m.group(1), "W" + m.group(1)[-1]))
    per_tap = 2 if tactic.quad_windows else 1
    first, rest = tactic.early_release * per_tap, (9 - tactic.early_release) * per_tap
    assert "M" * first + "CW1A" + "M" * rest + "C" in "".join(ops), "".join(ops)
    whole = compile_tactic(dataclasses.replace(tactic, early_release=0), "ptx")
    assert "M" * 9 * per_tap + "C" in "".join(
        {"wgmma.mma_async": "M", "wgmma.commit_group": "C"}.get(m.group(1), "x")
        for m in (re.match(r"\s*(wgmma\.mma_async|wgmma\.commit_group)", l) for l in whole.image.decode(errors="replace").splitlines()) if m)


def test_wgmma_kernel_refuses_plain_sm90():
    with pytest.raises(Exception, match="sm_90a"):
        compile_tactic(WGMMA_TACTICS[0], "cubin", arch="sm_90", use_cache=False)


def test_wgmma_struct_mirrors_the_kernel():
    import ctypes
    import re
    from pathlib import Path

    from trtfuse.plugins.wgmma import WgmmaTileStruct

    # the kernel's struct WgmmaTile, field by field (a FastDivmod is its d, mul, shr), read from the source
    source = (Path(__file__).resolve().parents[1] / "plugins" / "kernels" / "wgmma_tile.cuh").read_text()
    body = re.search(r"struct WgmmaTile \{(.*?)\n\};", source, re.S).group(1)
    fields = []
    for ctype, name in re.findall(r"^\s*(int|FastDivmod) (\w+);", body, re.M):
        fields += [f"{name}_{part}" for part in ("d", "mul", "shr")] if ctype == "FastDivmod" else [name]
    assert "pitch" in fields and "div_groups_shr" in fields
    assert [f for f, _ in WgmmaTileStruct._fields_] == fields
    assert ctypes.sizeof(WgmmaTileStruct) == 4 * len(fields)


# ---- the chained 1x1 convs (plugins/kernels/chain_conv.cu): sm_90a only ----
from trtfuse.plugins import chain_conv  # noqa: E402


CHAIN_BUILDS = [(key, False) for key in chain_conv.VARIANTS] + [(key, True) for key in chain_conv.DOWNSAMPLE_VARIANTS]


@pytest.mark.parametrize("key,downsample", CHAIN_BUILDS,
                         ids=[chain_conv.variant_of(chain_conv.pair_shapes(1, k[0], 8, 8, k[1], k[2])[0], k[2], ds).name
                              for k, ds in CHAIN_BUILDS])
def test_chain_conv_compiles_for_sm90a_without_spills(key, downsample):
    v = (chain_conv.DOWNSAMPLE_VARIANTS if downsample else chain_conv.VARIANTS)[key]
    k = chain_conv.compile_chain(key, downsample=downsample)
    assert k.image[:4] == b"\x7fELF"
    assert set(k.resources) == {chain_conv.ENTRY}, k.log
    res = k.resources[chain_conv.ENTRY]
    assert not k.spills() and res["stack"] == 0, k.log
    assert res["registers"] * chain_conv.THREADS <= 65536
    assert "serialized" not in k.log, k.log  # ptxas' "wgmma.mma_async instructions are serialized" advisory
    assert "warning" not in k.log, k.log
    assert v.smem_bytes <= chain_conv.SHARED_LIMIT
    ptx = chain_conv.compile_chain(key, "ptx", downsample=downsample).image.decode(errors="replace")
    # GEMM1 in passes of at most 256 channels (one wgmma's N), GEMM2 in one
    for needle in (f"wgmma.mma_async.sync.aligned.m64n{min(v.c1, 256)}k32.s32.s8.s8", f"wgmma.mma_async.sync.aligned.m64n{v.c2}k32.s32.s8.s8",
                   "cp.async.bulk.tensor.5d", "fence.proxy.async.shared::cta", "setmaxnreg.inc", "setmaxnreg.dec"):
        assert needle in ptx, needle
    # every k32 step its own wgmma, unrolled: GEMM1's passes x K1 / 32, then GEMM2's C1 / 32
    wgmmas = sum("wgmma.mma_async" in line for line in ptx.splitlines())
    # (with the downsample inside, GEMM0's K_DS / 32 before them)
    assert wgmmas == v.c1 // min(v.c1, 256) * (v.k1 // 32) + v.c1 // 32 + v.ds_k // 32


def test_chain_conv_refuses_plain_sm90():
    from trtfuse.plugins.nvrtc import compile_kernel

    with pytest.raises(Exception, match="sm_90a"):
        compile_kernel(chain_conv.SOURCE, chain_conv.VARIANTS[64, 256, 64].defines(), "sm_90", "cubin", use_cache=False)


# ---- the row-pipeline bottleneck block (plugins/kernels/block_rows.cu): sm_90a only ----
from trtfuse.plugins import block_rows  # noqa: E402


def test_block_rows_compiles_for_sm90a_without_spills():
    k = block_rows.compile_block_rows()
    assert k.image[:4] == b"\x7fELF"
    assert set(k.resources) == {block_rows.ENTRY}, k.log
    res = k.resources[block_rows.ENTRY]
    assert not k.spills() and res["stack"] == 0, k.log
    assert res["registers"] * block_rows.THREADS <= 65536
    assert "serialized" not in k.log, k.log  # ptxas' "wgmma.mma_async instructions are serialized" advisory
    assert "warning" not in k.log, k.log
    assert block_rows.smem_bytes() <= block_rows.SHARED_LIMIT
    ptx = block_rows.compile_block_rows("ptx").image.decode(errors="replace")
    for needle in ("cp.async.bulk.tensor.5d", "fence.proxy.async.shared::cta", "mbarrier.try_wait.parity"):
        assert needle in ptx, needle
    # every k32 step its own wgmma, unrolled: conv1 8 and conv2 18 of m64n64; conv3 (one code path for all its
    # warpgroups) 2 per pass of CONV3_N channels, as many passes as a warpgroup's share of the 256 takes
    wgmmas = [line.split()[0] for line in ptx.splitlines() if "wgmma.mma_async" in line]
    n64 = "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8"
    conv3 = f"wgmma.mma_async.sync.aligned.m64n{block_rows.CONV3_N}k32.s32.s8.s8"
    passes = block_rows.CHANNELS // block_rows.CONV3_WGS // block_rows.CONV3_N
    assert wgmmas.count(n64) + (wgmmas.count(conv3) if conv3 != n64 else 0) == len(wgmmas) == 8 + 18 + 2 * passes


def test_block_rows_refuses_plain_sm90():
    with pytest.raises(Exception, match="sm_90a"):
        compile_kernel(block_rows.SOURCE, block_rows.defines(), "sm_90", "cubin", use_cache=False)


def test_block_rows_smem_define_is_checked_by_the_kernel():
    # a launcher whose budget drifted from the kernel's Smem does not compile
    with pytest.raises(Exception, match="smem_bytes"):
        compile_kernel(block_rows.SOURCE, {**block_rows.defines(), "BLOCK_ROWS_SMEM": block_rows.smem_bytes() + 8},
                       "sm_90a", "cubin", use_cache=False)
