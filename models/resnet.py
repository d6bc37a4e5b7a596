"""ResNet-50 v1.5 and ResNeXt-50 32x4d (and smaller residual networks of the same blocks),
inference form.

Batch norm is folded into each convolution's weights and bias, as a deployment build does, so
a layer is conv2d + bias (+ residual) (+ ReLU). v1.5: a bottleneck's stride sits on its 3x3
conv, not its first 1x1; ResNeXt's 3x3 is grouped (resnet(groups=32, base_width=4)). Weights
are random (seeded), scaled so activations stay of order one through the 16 residual blocks
(He scaling; each block's last conv scaled down, as a zero-init last batch-norm gamma would).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESNET50_STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))  # (bottleneck width, blocks)


@dataclass(frozen=True)
class Conv:
    """One conv layer of a model (the models share it); padding keeps the map (k // 2)."""

    name: str
    cin: int
    cout: int
    k: int
    stride: int = 1
    groups: int = 1

    @property
    def pad(self) -> int:
        return self.k // 2


@dataclass(frozen=True)
class Block:
    convs: tuple[Conv, Conv, Conv]
    down: Conv | None  # projection shortcut


@dataclass(frozen=True)
class ResNet:
    stem: Conv
    blocks: tuple[Block, ...]
    classes: int
    image: int

    @property
    def convs(self) -> list[Conv]:
        out = [self.stem]
        for b in self.blocks:
            out += list(b.convs) + ([b.down] if b.down else [])
        return out

    @property
    def features(self) -> int:
        return self.blocks[-1].convs[2].cout


def resnet(stages=RESNET50_STAGES, stem_width: int = 64, image: int = 224, classes: int = 1000, groups: int = 1,
           base_width: int = 64) -> ResNet:
    """A bottleneck ResNet: resnet() is ResNet-50; fewer/narrower stages make small ones. groups and
    base_width (channels per group at the first stage) make ResNeXt's grouped 3x3, torchvision's way:
    resnext50_32x4d() is resnet(groups=32, base_width=4)."""
    stem = Conv("stem", 3, stem_width, 7, 2)
    blocks, cin = [], stem_width
    for si, (width, count) in enumerate(stages):
        inner = width * base_width // 64 * groups
        for bi in range(count):
            stride = 2 if bi == 0 and si > 0 else 1
            p = f"s{si}b{bi}"
            convs = (Conv(f"{p}c1", cin, inner, 1), Conv(f"{p}c2", inner, inner, 3, stride, groups),
                     Conv(f"{p}c3", inner, 4 * width, 1))
            down = Conv(f"{p}down", cin, 4 * width, 1, stride) if bi == 0 else None
            blocks.append(Block(convs, down))
            cin = 4 * width
    return ResNet(stem, tuple(blocks), classes, image)


def resnext50_32x4d(image: int = 224, classes: int = 1000) -> ResNet:
    return resnet(image=image, classes=classes, groups=32, base_width=4)


def random_params(net: ResNet, seed: int = 0) -> dict[str, np.ndarray]:
    """name.w (OIHW), name.b (O,) per conv (batch norm folded), fc.w (classes, C), fc.b."""
    rng = np.random.default_rng(seed)
    params = {}
    last = {b.convs[2].name for b in net.blocks}
    for c in net.convs:
        scale = np.sqrt(2.0 / (c.cin // c.groups * c.k * c.k)) * (0.2 if c.name in last else 1.0)
        w = rng.standard_normal((c.cout, c.cin // c.groups, c.k, c.k)) * scale
        params[f"{c.name}.w"] = w.astype(np.float32)
        params[f"{c.name}.b"] = (rng.standard_normal(c.cout) * 0.05).astype(np.float32)
    params["fc.w"] = (rng.standard_normal((net.classes, net.features)) / np.sqrt(net.features)).astype(np.float32)
    params["fc.b"] = (rng.standard_normal(net.classes) * 0.05).astype(np.float32)
    return params


def relax_module(net: ResNet, params: dict[str, np.ndarray], batch: int = 1):
    """The network as a Relax IRModule, weights as constants; main(x: NCHW) -> logits."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, 3, net.image, net.image), "float32"))
    const = lambda a: relax.const(a)  # noqa: E731

    def conv(v, c: Conv, relu: bool, residual=None):
        y = bb.emit(relax.op.nn.conv2d(v, const(params[f"{c.name}.w"]), strides=c.stride, padding=c.pad,
                                       groups=c.groups))
        y = bb.emit(relax.op.add(y, const(params[f"{c.name}.b"].reshape(1, -1, 1, 1))))
        if residual is not None:
            y = bb.emit(relax.op.add(y, residual))
        return bb.emit(relax.op.nn.relu(y)) if relu else y

    with bb.function("main", [x]):
        with bb.dataflow():
            y = conv(x, net.stem, True)
            y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=3, strides=2, padding=1))
            for b in net.blocks:
                short = conv(y, b.down, False) if b.down else y
                z = conv(y, b.convs[0], True)
                z = conv(z, b.convs[1], True)
                y = conv(z, b.convs[2], True, residual=short)
            y = bb.emit(relax.op.mean(y, axis=[2, 3]))
            y = bb.emit(relax.op.linear(y, const(params["fc.w"]), const(params["fc.b"])))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    assert isinstance(mod, tvm.IRModule)
    return mod


def torch_module(net: ResNet, params: dict[str, np.ndarray]):
    """The same network as a PyTorch nn.Module (eval mode) holding the same weights."""
    import torch
    from torch import nn

    def conv(c: Conv) -> nn.Conv2d:
        m = nn.Conv2d(c.cin, c.cout, c.k, c.stride, c.pad, groups=c.groups, bias=True)
        m.weight.data = torch.from_numpy(params[f"{c.name}.w"].copy())
        m.bias.data = torch.from_numpy(params[f"{c.name}.b"].copy())
        return m

    class Bottleneck(nn.Module):
        def __init__(self, b: Block):
            super().__init__()
            self.c1, self.c2, self.c3 = (conv(c) for c in b.convs)
            self.down = conv(b.down) if b.down else None

        def forward(self, x):
            short = self.down(x) if self.down is not None else x
            y = torch.relu(self.c1(x))
            y = torch.relu(self.c2(y))
            return torch.relu(self.c3(y) + short)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv(net.stem)
            self.pool = nn.MaxPool2d(3, 2, 1)
            self.blocks = nn.Sequential(*(Bottleneck(b) for b in net.blocks))
            self.fc = nn.Linear(net.features, net.classes)
            self.fc.weight.data = torch.from_numpy(params["fc.w"].copy())
            self.fc.bias.data = torch.from_numpy(params["fc.b"].copy())

        def forward(self, x):
            y = self.pool(torch.relu(self.stem(x)))
            y = self.blocks(y)
            return self.fc(y.mean(dim=(2, 3)))

    return Net().eval()
