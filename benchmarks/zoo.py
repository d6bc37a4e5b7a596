"""The models users bring, by name: torchvision and timm classifiers (`torchvision:NAME`,
`timm:NAME`) built with seeded random weights in eval mode, nothing downloaded, and ONNX files.

Random weights keep the numbers honest without a download: every parameter from torch's own
initialization under a fixed seed, then each batch norm's running statistics and affine terms
drawn at random too (freshly initialized ones are the identity, which would let a wrong fold pass).

torchvision's registry wheel links the CUDA build of torch; beside the CPU build its C operators
(nms, roi_align) are missing, and `import torchvision` fails while registering their fake kernels
(torchvision/_meta_registrations.py). The classification and segmentation model definitions are
plain Python: `import_torchvision` retries without that registration, which only the detection
operators need. timm imports torchvision, so it goes through the same door.
"""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass
from pathlib import Path

# `bench zoo`'s default list: classifiers of different families (residual, grouped, depthwise
# with squeeze-and-excitation and hardswish or SiLU, dense concatenation, inception branches,
# channel shuffle, LayerNorm and GELU), as torchvision and timm define them.
DEFAULT = (
    "torchvision:resnet50", "torchvision:resnext50_32x4d", "torchvision:mobilenet_v2",
    "torchvision:mobilenet_v3_large", "torchvision:efficientnet_b0", "torchvision:regnet_y_400mf",
    "torchvision:regnet_x_1_6gf", "torchvision:densenet121", "torchvision:googlenet",
    "torchvision:shufflenet_v2_x1_0", "torchvision:convnext_tiny", "timm:efficientnet_b0", "timm:resnet18",
)
EXTRA = 'pip install -e ".[zoo]"'
IMAGE = (3, 224, 224)


@dataclass
class Source:
    """A model to run: `name` as given; a torch module (eval mode) or an ONNX file's path; the
    input's shape per image (C, H, W)."""

    name: str
    module: object = None
    onnx_path: str | None = None
    image: tuple = IMAGE

    @property
    def kind(self) -> str:
        return "onnx" if self.onnx_path else "torch"


def import_torchvision():
    """torchvision, imported as it is where it can be, else without its fake-kernel registration
    for the detection operators (module doc)."""
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as e:  # "operator torchvision::nms does not exist"
        if "torchvision::" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    return importlib.import_module("torchvision")


def missing(kind: str) -> str | None:
    """Why models of `kind` ("torchvision" or "timm") cannot be built here, or None."""
    try:
        import_torchvision()
        if kind == "timm":
            importlib.import_module("timm")
    except Exception as e:  # noqa: BLE001 (a broken install fails with more than ImportError)
        return f"{kind} models need the zoo extra ({EXTRA}): {type(e).__name__}: {e}"
    return None


def randomize_batch_norms(model, seed: int) -> None:
    """Each batch norm's running mean and variance, weight and bias drawn at random (seeded)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                c = m.running_mean.shape[0]
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                    m.bias.copy_(torch.randn(c, generator=gen) * 0.1)


def load(source: str, seed: int = 0) -> Source:
    """`torchvision:NAME`, `timm:NAME` or the path of an ONNX file, as a Source. Raises
    ValueError for a source of no known form or an unknown model name, RuntimeError (naming
    the extra) where the zoo extra is missing."""
    if source.endswith(".onnx") or Path(source).is_file():
        if not Path(source).is_file():
            raise ValueError(f"no ONNX file at {source!r}")
        return Source(source, onnx_path=str(source), image=onnx_image(source))
    kind, _, name = source.partition(":")
    if kind not in ("torchvision", "timm") or not name:
        raise ValueError(f"a model source is an ONNX file's path, torchvision:NAME or timm:NAME; got {source!r}")
    why = missing(kind)
    if why:
        raise RuntimeError(why)
    import torch

    torch.manual_seed(seed)
    if kind == "torchvision":
        tv = import_torchvision()
        if name not in tv.models.list_models():
            raise ValueError(f"torchvision has no model {name!r}; e.g. {', '.join(tv.models.list_models()[:8])}, ...")
        model = tv.models.get_model(name, weights=None)
        image = IMAGE
    else:
        import timm

        if not timm.list_models(name):
            raise ValueError(f"timm has no model {name!r} (timm.list_models('*{name}*') lists near names)")
        model = timm.create_model(name, pretrained=False)
        image = tuple(model.pretrained_cfg.get("input_size", IMAGE))
    randomize_batch_norms(model, seed)
    return Source(source, module=model.eval(), image=image)


def onnx_image(path: str) -> tuple:
    """The (C, H, W) of an ONNX model's first input, from its static dimensions; IMAGE's where a
    dimension is symbolic."""
    import onnx

    first = first_input(onnx.load(path, load_external_data=False))
    dims = [d.dim_value if d.HasField("dim_value") else None for d in first.type.tensor_type.shape.dim]
    if len(dims) != 4:
        raise ValueError(f"{path}: its input {first.name!r} has {len(dims)} dimensions; bench model takes NCHW images")
    return tuple(d or dflt for d, dflt in zip(dims[1:], IMAGE))


def first_input(model):
    """An ONNX model's first graph input that is not an initializer (its ValueInfoProto)."""
    inits = {i.name for i in model.graph.initializer}
    return next(i for i in model.graph.input if i.name not in inits)
