"""models.torch_style: each network as a PyTorch user writes it builds, in eval mode, with a batch
norm after every conv and statistics that are not the defaults, and a forward pass gives finite
logits of order one (a small input keeps it cheap)."""

import pytest

torch = pytest.importorskip("torch", reason="models.torch_style needs torch (pip install -e \".[bench]\")")

from models import torch_style


@pytest.mark.parametrize("name", torch_style.NAMES)
def test_network_builds_in_eval_mode_and_gives_finite_logits(name):
    from torch import nn

    model = torch_style.build(name)
    assert not any(m.training for m in model.modules()), "not in eval mode"
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert convs and len(bns) == len(convs) and all(c.bias is None for c in convs)
    bn = bns[len(bns) // 2]
    assert 0.5 <= float(bn.running_var.min()) and float(bn.running_var.max()) <= 1.5
    assert float(bn.running_mean.abs().max()) > 0.01  # not the default zeros
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = model(x)
    assert y.shape == (2, torch_style.CLASSES)
    assert torch.isfinite(y).all() and 0.1 < float(y.abs().max()) < 100, float(y.abs().max())


def test_build_is_seeded_and_names_are_checked():
    a, b = torch_style.build("mobilenet_v1", seed=3), torch_style.build("mobilenet_v1", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    c = torch_style.build("mobilenet_v1", seed=4)
    assert not torch.equal(a.fc.weight, c.fc.weight)
    with pytest.raises(ValueError, match="unknown network 'vgg'"):
        torch_style.build("vgg")


def test_grouped_networks_have_their_group_widths():
    from torch import nn

    def grouped(model):
        return {(m.in_channels // m.groups) for m in model.modules() if isinstance(m, nn.Conv2d) and m.groups > 1}

    assert grouped(torch_style.build("resnext50_32x4d")) == {4, 8, 16, 32}  # 32 groups of 128..1024 channels
    assert grouped(torch_style.build("regnetx_like")) == {16}
