"""Conv shapes the kernels are proven and timed on: every distinct ResNet-50 v1.5 conv layer, seed
000's six shapes (as int8), and edge cases. Shapes are trtfuse.plugins.tactics.ConvShape."""

from __future__ import annotations

import dataclasses

from ..plugins.tactics import ConvShape


def _with_residual_flags(layers: list[tuple[str, ConvShape, bool]]) -> list[tuple[str, ConvShape, bool]]:
    """Each shape's `residual` set to its layer's has_residual, so the tactics a layer may take are its own."""
    return [(name, dataclasses.replace(shape, residual=res), res) for name, shape, res in layers]


def resnet50_layers(batch: int) -> list[tuple[str, ConvShape, bool]]:
    """(name, shape, has_residual) for each distinct conv of ResNet-50 v1.5 at 224x224."""
    out = [("stem 7x7/2 3->64", ConvShape(batch, 3, 224, 224, 64, 7, 7, (2, 2), (3, 3, 3, 3)), False)]
    stages = [(64, 56, 1), (128, 56, 2), (256, 28, 2), (512, 14, 2)]  # width, input HW, first stride
    in_ch = 64
    for idx, (width, hw, stride) in enumerate(stages, start=2):
        out_hw = hw // stride
        out.append((f"res{idx} first conv1 1x1 {in_ch}->{width}", ConvShape(batch, in_ch, hw, hw, width, 1, 1), False))
        out.append((f"res{idx} first conv2 3x3/{stride} {width}", ConvShape(batch, width, hw, hw, width, 3, 3, (stride, stride), (1, 1, 1, 1)), False))
        out.append((f"res{idx} conv3 1x1 {width}->{4 * width} +res", ConvShape(batch, width, out_hw, out_hw, 4 * width, 1, 1), True))
        out.append((f"res{idx} downsample 1x1/{stride} {in_ch}->{4 * width}", ConvShape(batch, in_ch, hw, hw, 4 * width, 1, 1, (stride, stride)), False))
        out.append((f"res{idx} conv1 1x1 {4 * width}->{width}", ConvShape(batch, 4 * width, out_hw, out_hw, width, 1, 1), False))
        if stride != 1:
            out.append((f"res{idx} conv2 3x3 {width}", ConvShape(batch, width, out_hw, out_hw, width, 3, 3, (1, 1), (1, 1, 1, 1)), False))
        in_ch = 4 * width
    return _with_residual_flags(out)


def seed000_layers() -> list[tuple[str, ConvShape, bool]]:
    """Seed 000's six 3x3 convs ([N, C, H, W, K, R, S], stride 1, pad 1) as int8."""
    shapes = [(16, 128, 64, 64, 27, 3, 3), (16, 256, 32, 32, 256, 3, 3), (16, 64, 128, 128, 64, 3, 3),
              (2, 1920, 32, 32, 640, 3, 3), (2, 640, 64, 64, 640, 3, 3), (2, 320, 64, 64, 4, 3, 3)]
    return _with_residual_flags([(f"seed000 {n}x{c}x{h}x{w} k{k}", ConvShape(n, c, h, w, k, r, s, (1, 1), (1, 1, 1, 1)), False)
                                 for n, c, h, w, k, r, s in shapes])


def edge_layers() -> list[tuple[str, ConvShape, bool]]:
    return _with_residual_flags([
        ("edge C=40 K=40 3x3 odd HW", ConvShape(2, 40, 13, 11, 40, 3, 3, (1, 1), (1, 1, 1, 1)), True),
        ("edge C=3 K=20 5x5/2 asym pad", ConvShape(3, 3, 17, 19, 20, 5, 5, (2, 2), (2, 1, 2, 1)), False),
        ("edge C=1 K=33 3x3/2", ConvShape(2, 1, 15, 15, 33, 3, 3, (2, 2), (1, 1, 1, 1)), True),
        ("edge 1x1/2 C=96 K=200 pad0", ConvShape(3, 96, 9, 9, 200, 1, 1, (2, 2)), False),
        ("edge 7x7 C=64 K=64 pad3", ConvShape(1, 64, 10, 10, 64, 7, 7, (1, 1), (3, 3, 3, 3)), True),
        ("edge tiny M=1", ConvShape(1, 32, 1, 1, 32, 1, 1), True),
    ])
