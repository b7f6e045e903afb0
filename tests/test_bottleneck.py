"""The fused identity-bottleneck kernel (plugins/bottleneck.py, plugins/kernels/bottleneck.cu) on the CPU: which blocks
and GPUs it takes, that it compiles without spills, and that the golden chain its GPU tests compare with is the three
ops of docs/ops.md run one after another."""

import ctypes

import numpy as np
import pytest

from trtfuse.bench.conv_problem import BottleneckProblem
from trtfuse.errors import TrtfuseError
from trtfuse.plugins import bottleneck
from trtfuse.plugins.layout import pack_weight
from trtfuse.plugins.nvrtc import compile_kernel
from trtfuse.plugins.reference import fused_conv_int8
from trtfuse.plugins.tactics import ConvShape

H100_OPTIN, A100_OPTIN, ADA_OPTIN = 227 * 1024, 163 * 1024, 99 * 1024


def res2_block(n=256, h=56, w=56):
    return (ConvShape(n, 256, h, w, 64, 1, 1), ConvShape(n, 64, h, w, 64, 3, 3, (1, 1), (1, 1, 1, 1)),
            ConvShape(n, 64, h, w, 256, 1, 1))


def test_resnet_res2_identity_block_is_taken():
    assert bottleneck.refusal(*res2_block()) is None
    assert bottleneck.refusal(*res2_block(1, 9, 13)) is None


def _with(shapes, i, **changes):
    from dataclasses import replace

    out = list(shapes)
    out[i] = replace(out[i], **changes)
    return tuple(out)


@pytest.mark.parametrize("shapes,reason", [
    # res3's identity block: width 128
    ((ConvShape(1, 512, 28, 28, 128, 1, 1), ConvShape(1, 128, 28, 28, 128, 3, 3, (1, 1), (1, 1, 1, 1)),
      ConvShape(1, 128, 28, 28, 512, 1, 1)), "conv1 is 512 -> 128 channels, the kernel computes 256 -> 64"),
    # res2's first block: its input has 64 channels (the downsample path projects the residual)
    (_with(res2_block(1), 0, c=64), "conv1 is 64 -> 64 channels"),
    # a strided conv2 (the first block of res3 .. res5 in torchvision's layout)
    (_with(res2_block(1), 1, stride=(2, 2)), "conv2 has stride 2x2"),
    (_with(res2_block(1), 1, pads=(0, 0, 0, 0)), "conv2 pads (0, 0, 0, 0)"),
    (_with(res2_block(1), 1, r=1, s=1, pads=(0, 0, 0, 0)), "conv2 is 1x1, the kernel runs 3x3"),
    (_with(res2_block(1), 2, k=128), "conv3 is 64 -> 128 channels"),
    (_with(res2_block(1), 1, h=28, w=28), "conv2's input 1x28x28 is not its producer's output 1x56x56"),
    (_with(res2_block(1), 2, n=2), "conv3's input 2x56x56 is not its producer's output 1x56x56"),
], ids=["width-128", "64-in", "stride-2", "no-pad", "1x1-middle", "128-out", "size-mismatch", "batch-mismatch"])
def test_other_blocks_are_refused_with_the_reason(shapes, reason):
    assert reason in bottleneck.refusal(*shapes)


def test_two_patch_buffers_where_they_fit_one_on_a100_none_on_small_shared_memory():
    assert bottleneck.variant("sm_90", H100_OPTIN)[1]["BOTTLENECK_PATCH_BUFFERS"] == 2
    assert bottleneck.variant("sm_80", A100_OPTIN)[1]["BOTTLENECK_PATCH_BUFFERS"] == 1
    assert bottleneck.smem_bytes(2) > A100_OPTIN >= bottleneck.smem_bytes(1)
    assert bottleneck.variant("sm_89", ADA_OPTIN) is None
    assert "at most 101376" in bottleneck.device_refusal(ADA_OPTIN)
    assert bottleneck.device_refusal(A100_OPTIN) is None


@pytest.mark.parametrize("device_arch,optin", [("sm_80", A100_OPTIN), ("sm_90", H100_OPTIN)])
def test_bottleneck_compiles_without_spills(device_arch, optin):
    arch, defines, smem = bottleneck.variant(device_arch, optin)
    k = compile_kernel(bottleneck.SOURCE, defines, arch, "cubin")
    assert set(k.resources) == {bottleneck.ENTRY}
    assert not k.spills() and all(r["stack"] == 0 for r in k.resources.values())
    # one CTA of THREADS threads per SM (shared memory allows no second): the register file must hold it
    assert k.resources[bottleneck.ENTRY]["registers"] * bottleneck.THREADS <= 65536


def test_the_kernel_rejects_a_shared_memory_count_other_than_its_own():
    _, defines, _ = bottleneck.variant("sm_90", H100_OPTIN)
    with pytest.raises(TrtfuseError, match="SMEM_BYTES disagrees"):
        compile_kernel(bottleneck.SOURCE, {**defines, "BOTTLENECK_SMEM_BYTES": defines["BOTTLENECK_SMEM_BYTES"] - 16},
                       "sm_90", "cubin", use_cache=False)


def test_params_mirror_has_the_kernel_struct_size():
    # bottleneck.cu static_asserts sizeof(BottleneckParams) == 15 pointers + 6 ints
    assert ctypes.sizeof(bottleneck.BottleneckParamsStruct) == 15 * 8 + 6 * 4


def _reference_chain(problem: BottleneckProblem) -> np.ndarray:
    """The block as its three ONNX nodes state it: fused_conv_int8 on packed weights, each output the next input."""
    y = problem.x
    for i, c in enumerate(problem.convs):
        sh = c.shape
        residual = (problem.x, c.residual_scale) if i == 2 else (None, None)
        y = fused_conv_int8(y, pack_weight(c.w, 32), c.scale, c.bias, c.out_scale, *residual, in_channels=sh.c,
                            out_channels=sh.k, kernel_shape=(sh.r, sh.s), strides=sh.stride, pads=sh.pads, relu=int(c.relu))
    return y


@pytest.mark.parametrize("n,h,w,relu", [(2, 9, 13, True), (1, 16, 30, True), (1, 7, 5, False)])
def test_golden_chain_is_the_three_reference_ops(n, h, w, relu):
    p = BottleneckProblem.random(n, h, w, relu, seed=3)
    assert np.array_equal(p.convs[2].residual, p.x)
    golden = p.golden()
    assert golden.shape == (n, 256, h, w) and golden.dtype == np.int8
    assert np.array_equal(golden, _reference_chain(p))
    # the data exercises the epilogue: outputs spread over the int8 range, neither all zero nor all saturated
    assert 0.2 < (golden == 0).mean() < 0.8 if relu else (golden < 0).mean() > 0.2
    assert len(np.unique(golden)) > 32


def test_golden_chain_depends_on_each_conv():
    """A chain that skipped a conv or the residual would not notice changes to it: each one moves the output."""
    from dataclasses import replace

    p = BottleneckProblem.random(1, 9, 13, seed=5)
    base = p.golden()
    conv3 = p.convs[2]
    assert not np.array_equal(base, replace(conv3, residual=np.zeros_like(conv3.residual)).golden())
    assert not np.array_equal(base, replace(conv3, x=np.zeros_like(conv3.x)).golden())
