"""MobileNetV2 (width 1.0, 224x224), inference form: batch norm folded into each conv's weights
and bias, ReLU6 as clip(0, 6). Inverted residual blocks: 1x1 expand + ReLU6 (not when the
expansion is 1), 3x3 depthwise + ReLU6, 1x1 linear projection, and the residual add where the
stride is 1 and the channels match. Weights random (seeded, He-scaled; projections scaled down
so the residual sums stay of order one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .resnet import Conv

# (expansion t, output channels c, blocks n, first stride s), as in the paper's Table 2.
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


@dataclass(frozen=True)
class Block:
    convs: tuple[Conv, ...]  # the last one, the projection, has no ReLU6
    residual: bool


@dataclass(frozen=True)
class MobileNetV2:
    stem: Conv
    blocks: tuple[Block, ...]
    head: Conv
    classes: int
    image: int

    @property
    def convs(self) -> list[Conv]:
        return [self.stem] + [c for b in self.blocks for c in b.convs] + [self.head]


def mobilenet_v2(settings=SETTINGS, image: int = 224, classes: int = 1000) -> MobileNetV2:
    stem = Conv("stem", 3, 32, 3, 2)
    blocks, cin = [], 32
    for si, (t, c, n, s) in enumerate(settings):
        for bi in range(n):
            stride, hidden, p = s if bi == 0 else 1, cin * t, f"s{si}b{bi}"
            convs = ([Conv(f"{p}exp", cin, hidden, 1)] if t != 1 else []) + [
                Conv(f"{p}dw", hidden, hidden, 3, stride, groups=hidden), Conv(f"{p}proj", hidden, c, 1)]
            blocks.append(Block(tuple(convs), stride == 1 and cin == c))
            cin = c
    return MobileNetV2(stem, tuple(blocks), Conv("head", cin, 1280, 1), classes, image)


def random_params(net: MobileNetV2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = {}
    linear = {b.convs[-1].name for b in net.blocks}
    for c in net.convs:
        fan_in = c.cin // c.groups * c.k * c.k
        scale = np.sqrt(2.0 / fan_in) * (0.3 if c.name in linear else 1.0)
        params[f"{c.name}.w"] = (rng.standard_normal((c.cout, c.cin // c.groups, c.k, c.k)) * scale).astype(np.float32)
        params[f"{c.name}.b"] = (rng.standard_normal(c.cout) * 0.05).astype(np.float32)
    params["fc.w"] = (rng.standard_normal((net.classes, 1280)) / np.sqrt(1280)).astype(np.float32)
    params["fc.b"] = (rng.standard_normal(net.classes) * 0.05).astype(np.float32)
    return params


def relax_module(net: MobileNetV2, params: dict[str, np.ndarray], batch: int = 1):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, 3, net.image, net.image), "float32"))

    def conv(v, c: Conv, relu6: bool = True):
        y = bb.emit(relax.op.nn.conv2d(v, relax.const(params[f"{c.name}.w"]), strides=c.stride, padding=c.pad,
                                       groups=c.groups))
        y = bb.emit(relax.op.add(y, relax.const(params[f"{c.name}.b"].reshape(1, -1, 1, 1))))
        return bb.emit(relax.op.clip(y, 0.0, 6.0)) if relu6 else y

    with bb.function("main", [x]):
        with bb.dataflow():
            y = conv(x, net.stem)
            for b in net.blocks:
                z = y
                for c in b.convs:
                    z = conv(z, c, relu6=c is not b.convs[-1])
                y = bb.emit(relax.op.add(z, y)) if b.residual else z
            y = conv(y, net.head)
            y = bb.emit(relax.op.mean(y, axis=[2, 3]))
            y = bb.emit(relax.op.linear(y, relax.const(params["fc.w"]), relax.const(params["fc.b"])))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def torch_module(net: MobileNetV2, params: dict[str, np.ndarray]):
    import torch
    from torch import nn

    def conv(c: Conv, relu6: bool = True) -> nn.Module:
        m = nn.Conv2d(c.cin, c.cout, c.k, c.stride, c.pad, groups=c.groups, bias=True)
        m.weight.data = torch.from_numpy(params[f"{c.name}.w"].copy())
        m.bias.data = torch.from_numpy(params[f"{c.name}.b"].copy())
        return nn.Sequential(m, nn.ReLU6()) if relu6 else m

    class Inverted(nn.Module):
        def __init__(self, b: Block):
            super().__init__()
            self.body = nn.Sequential(*(conv(c, relu6=c is not b.convs[-1]) for c in b.convs))
            self.residual = b.residual

        def forward(self, x):
            return self.body(x) + x if self.residual else self.body(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(conv(net.stem), *(Inverted(b) for b in net.blocks), conv(net.head))
            self.fc = nn.Linear(1280, net.classes)
            self.fc.weight.data = torch.from_numpy(params["fc.w"].copy())
            self.fc.bias.data = torch.from_numpy(params["fc.b"].copy())

        def forward(self, x):
            return self.fc(self.features(x).mean(dim=(2, 3)))

    return Net().eval()
