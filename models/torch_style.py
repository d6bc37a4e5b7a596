"""The benchmark networks as a PyTorch user writes them: nn.Conv2d(bias=False) + nn.BatchNorm2d
after every conv, nn.ReLU / nn.ReLU6 modules, nn.MaxPool2d where the architecture has one, and
`F.adaptive_avg_pool2d(x, 1)` + `torch.flatten(x, 1)` + nn.Linear as the head. Nothing is
folded: an importer (or an engine) sees the batch norms and has to deal with them.

`build(name, seed=0)` returns the network in eval() mode with seeded random weights and
non-trivial batch-norm statistics (running mean ~ U(-0.1, 0.1), running variance ~ U(0.5, 1.5),
gamma ~ U(0.5, 1.5), beta ~ U(-0.1, 0.1)). Convs are He-scaled and gamma is scaled by
1/sqrt(E[gamma^2 / var]) so one conv + batch norm keeps the activations' scale; the last batch
norm of each residual branch is scaled down further, as a
zero-initialized last gamma would, so the residual sums stay of order one. Input: 3x224x224
(IMAGE), any size that survives five stride-2 steps works.

torch is imported inside the functions: `import models` works without it.
"""

from __future__ import annotations

NAMES = ("resnet18", "resnet50", "mobilenet_v1", "mobilenet_v2", "resnext50_32x4d", "regnetx_like")
IMAGE = 224
CLASSES = 1000
# E[gamma^2] E[1/var] for gamma ~ U(0.5, 1.5), var ~ U(0.5, 1.5): 13/12 * ln 3.
_BN_GAIN = (13 / 12 * 1.0986122886681098) ** -0.5
_BRANCH_GAIN = 0.2  # the last batch norm of a residual branch


def _layers():
    """The architectures' building blocks (torch imported here, once per call of build())."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def conv_bn(cin, cout, k, stride=1, groups=1, gain=1.0):
        conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)
        bn = nn.BatchNorm2d(cout)
        bn.init_gain = gain  # read by _initialize
        return conv, bn

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin, planes, stride):
            super().__init__()
            self.conv1, self.bn1 = conv_bn(cin, planes, 3, stride)
            self.relu = nn.ReLU(inplace=True)
            self.conv2, self.bn2 = conv_bn(planes, planes, 3, gain=_BRANCH_GAIN)
            self.downsample = None
            if stride != 1 or cin != planes:
                self.downsample = nn.Sequential(*conv_bn(cin, planes, 1, stride))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class Bottleneck(nn.Module):
        """ResNet v1.5 bottleneck (stride on the 3x3), ResNeXt's when groups > 1, RegNetX's X
        block with expansion 1."""

        def __init__(self, cin, planes, stride, groups=1, base_width=64, expansion=4, group_width=None):
            super().__init__()
            self.expansion = expansion
            width = planes if group_width else int(planes * base_width / 64) * groups  # torchvision's
            groups = width // group_width if group_width else groups
            out = planes * expansion
            self.conv1, self.bn1 = conv_bn(cin, width, 1)
            self.conv2, self.bn2 = conv_bn(width, width, 3, stride, groups)
            self.conv3, self.bn3 = conv_bn(width, out, 1, gain=_BRANCH_GAIN)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != out:
                self.downsample = nn.Sequential(*conv_bn(cin, out, 1, stride))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        """One builder for ResNet-18/50, ResNeXt and the RegNetX-like net: a stem, four stages
        of blocks (the first of each stage from the second on has stride 2), the head."""

        def __init__(self, block, depths, planes=(64, 128, 256, 512), stem=64, deep_stem=True, classes=CLASSES,
                     **block_args):
            super().__init__()
            if deep_stem:  # 7x7 stride 2 + 3x3 stride-2 max pool
                self.conv1, self.bn1 = conv_bn(3, stem, 7, 2)
                self.maxpool = nn.MaxPool2d(3, 2, 1)
            else:  # RegNet's 3x3 stride-2 stem, no pool
                self.conv1, self.bn1 = conv_bn(3, stem, 3, 2)
                self.maxpool = nn.Identity()
            self.relu = nn.ReLU(inplace=True)
            stages, cin = [], stem
            for i, (p, n) in enumerate(zip(planes, depths)):
                blocks = []
                for j in range(n):
                    stride = 2 if j == 0 and (i > 0 or not deep_stem) else 1
                    blocks.append(block(cin, p, stride, **block_args))
                    cin = p * blocks[-1].expansion
                stages.append(nn.Sequential(*blocks))
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            x = F.adaptive_avg_pool2d(x, 1)
            return self.fc(torch.flatten(x, 1))

    class MobileNetV1(nn.Module):
        """Depthwise-separable stack: a 3x3 stride-2 stem, then 13 (3x3 depthwise + 1x1) pairs."""

        # (output channels, stride of the depthwise conv)
        CFG = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), *[(512, 1)] * 5, (1024, 2), (1024, 1))

        def __init__(self, classes=CLASSES):
            super().__init__()
            layers, cin = [*conv_bn(3, 32, 3, 2), nn.ReLU(inplace=True)], 32
            for cout, stride in self.CFG:
                layers += [*conv_bn(cin, cin, 3, stride, groups=cin), nn.ReLU(inplace=True),
                           *conv_bn(cin, cout, 1), nn.ReLU(inplace=True)]
                cin = cout
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            x = F.adaptive_avg_pool2d(self.features(x), 1)
            return self.fc(torch.flatten(x, 1))

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, t):
            super().__init__()
            hidden = cin * t
            self.use_res = stride == 1 and cin == cout
            layers = [*conv_bn(cin, hidden, 1), nn.ReLU6(inplace=True)] if t != 1 else []
            layers += [*conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.ReLU6(inplace=True),
                       *conv_bn(hidden, cout, 1, gain=0.5 if self.use_res else 1.0)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res else self.conv(x)

    class MobileNetV2(nn.Module):
        # (expansion t, output channels c, blocks n, first stride s), as in the paper's Table 2.
        SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                    (6, 320, 1, 1))

        def __init__(self, classes=CLASSES):
            super().__init__()
            layers, cin = [*conv_bn(3, 32, 3, 2), nn.ReLU6(inplace=True)], 32
            for t, c, n, s in self.SETTINGS:
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers += [*conv_bn(cin, 1280, 1), nn.ReLU6(inplace=True)]
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(1280, classes)

        def forward(self, x):
            x = F.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(x, 1))

    return {
        "resnet18": lambda: ResNet(Basic, (2, 2, 2, 2)),
        "resnet50": lambda: ResNet(Bottleneck, (3, 4, 6, 3)),
        "resnext50_32x4d": lambda: ResNet(Bottleneck, (3, 4, 6, 3), groups=32, base_width=4),
        # RegNetX-400MF's widths and depths, X blocks (bottleneck ratio 1), group width 16.
        "regnetx_like": lambda: ResNet(Bottleneck, (1, 2, 7, 12), planes=(32, 64, 160, 400), stem=32,
                                       deep_stem=False, expansion=1, group_width=16),
        "mobilenet_v1": MobileNetV1,
        "mobilenet_v2": MobileNetV2,
    }


def _initialize(model, seed: int) -> None:
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=g) * (hi - lo) + lo

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                fan_in = m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
            elif isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(uniform(c, -0.1, 0.1))
                m.running_var.copy_(uniform(c, 0.5, 1.5))
                m.weight.copy_(uniform(c, 0.5, 1.5) * _BN_GAIN * m.init_gain)
                m.bias.copy_(uniform(c, -0.1, 0.1))
            elif isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.in_features ** 0.5)
                m.bias.copy_(uniform(m.out_features, -0.05, 0.05))


def build(name: str, seed: int = 0):
    """The network `name` (one of NAMES) as an nn.Module in eval() mode, seeded random weights."""
    nets = _layers()
    if name not in nets:
        raise ValueError(f"unknown network {name!r}; one of {', '.join(NAMES)}")
    model = nets[name]()
    _initialize(model, seed)
    return model.eval()
