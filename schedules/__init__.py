"""Schedules that tensorize onto the intrinsics, and the public entry points.

Layout: common/ (targets, argument checks, compiled-op plumbing, layouts, the TVMScript
toolkit), conv/ (conv2d: geometry, plans, the op, one module per family, dispatch), matmul,
relax/ (whole models), emulation/ (qemu and Bochs), golden (the conv dumps).
"""

import sys

from .common import compiled, layouts, targets
from .common.layouts import aligned_empty
from .common.targets import PRESETS, UnsupportedHostError, resolve
from .conv import BoundConv2d, Conv2dOp, ConvBlocking, ConvParams, PostOps, conv2d, inverted_residual
from .conv import depthwise, winograd
from .conv import int8 as conv2d_int8
from .emulation import bochs
from .emulation import qemu as emulate
from .matmul import Blocking, MatmulOp, matmul
from .relax import int8 as relax_int8

# The modules' paths before the package split (schedules.targets, schedules.emulate, ...) name
# the modules that moved, so code written against them keeps working.
for _name, _module in {"targets": targets, "layouts": layouts, "compiled": compiled, "emulate": emulate,
                       "bochs": bochs, "relax_int8": relax_int8, "winograd": winograd, "depthwise": depthwise,
                       "conv2d_int8": conv2d_int8}.items():
    sys.modules[f"{__name__}.{_name}"] = _module
del _name, _module

__all__ = ["aligned_empty", "Blocking", "BoundConv2d", "Conv2dOp", "ConvBlocking", "ConvParams", "conv2d",
           "inverted_residual", "layouts", "MatmulOp", "PostOps", "PRESETS", "UnsupportedHostError", "matmul", "resolve"]
