"""Export a torchvision ResNet to ONNX the way users do (needs torch + torchvision; weights=None, eval mode).

    python scripts/export_torchvision.py ARCH VARIANT OUT.onnx [--size 224]

VARIANT:
  torchscript   torch.onnx.export, TorchScript-based exporter (dynamo=False), opset 17, dynamic batch
  dynamo        torch.onnx.export(dynamo=True) (opset 18: torch's exporter starts there), static batch 1
  qat           QAT-style fake quantization as pytorch-quantization writes it: a per-tensor input quantizer
                (amax 4) before every conv, per-channel weight quantizers on axis 0 (amax = max|w| per filter,
                narrow range), BN left unfolded; TorchScript exporter, opset 17, exported as QuantizeLinear/
                DequantizeLinear pairs
  qat-resq      qat plus a quantizer on each block's residual branch with its own amax (6): the residual
                tensor is then quantized with two scales
tests/data holds weight-stripped copies of these exports (scripts/strip_onnx_weights.py).
"""

import argparse

import torch
import torchvision
from torch import nn


class QConv(nn.Module):
    def __init__(self, conv, amax_in):
        super().__init__()
        self.conv, self.amax_in = conv, amax_in
        w = conv.weight.detach()
        self.register_buffer("w_scale", (w.abs().amax(dim=(1, 2, 3)) / 127).clamp(min=1e-8))

    def forward(self, x):
        x = torch.fake_quantize_per_tensor_affine(x, self.amax_in / 127, 0, -128, 127)
        zero = torch.zeros_like(self.w_scale, dtype=torch.int32)
        # |w| <= amax, so the integers stay in [-127, 127]; ONNX export needs the (-128, 127) range spelled
        w = torch.fake_quantize_per_channel_affine(self.conv.weight, self.w_scale, zero, 0, -128, 127)
        c = self.conv
        return nn.functional.conv2d(x, w, c.bias, c.stride, c.padding, c.dilation, c.groups)


class ResidualQ(nn.Module):
    def __init__(self, block, amax):
        super().__init__()
        self.block, self.amax = block, amax

    def forward(self, x):
        b = self.block
        identity = x if b.downsample is None else b.downsample(x)
        identity = torch.fake_quantize_per_tensor_affine(identity, self.amax / 127, 0, -128, 127)
        out = b.relu(b.bn1(b.conv1(x)))
        if hasattr(b, "conv3"):
            out = b.relu(b.bn2(b.conv2(out)))
            out = b.bn3(b.conv3(out))
        else:
            out = b.bn2(b.conv2(out))
        return b.relu(out + identity)


def quantize(model, amax):
    for name, mod in list(model.named_children()):
        if isinstance(mod, nn.Conv2d):
            setattr(model, name, QConv(mod, amax))
        else:
            quantize(mod, amax)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arch")
    ap.add_argument("variant", choices=["torchscript", "dynamo", "qat", "qat-resq"])
    ap.add_argument("output")
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.arch)(weights=None).eval()
    x = torch.randn(1, 3, args.size, args.size)
    names = dict(input_names=["input"], output_names=["logits"])
    if args.variant == "dynamo":
        torch.onnx.export(model, (x,), args.output, opset_version=18, dynamo=True, **names)
        return
    if args.variant.startswith("qat"):
        model = quantize(model, 4.0)
        if args.variant == "qat-resq":
            for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
                for i in range(len(layer)):
                    layer[i] = ResidualQ(layer[i], 6.0)
    # the QAT export keeps its weight QuantizeLinear nodes (do_constant_folding off, as pytorch-quantization's docs
    # export); the plain one is exported with the exporter's defaults
    torch.onnx.export(model, x, args.output, opset_version=17, dynamo=False, do_constant_folding=args.variant == "torchscript",
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}}, **names)


if __name__ == "__main__":
    main()
