"""Schedules that tensorize onto the intrinsics, and the public entry points."""

from . import layouts
from .compiled import aligned_empty
from .conv2d import BoundConv2d, Conv2dOp, ConvBlocking, PostOps, conv2d
from .matmul import Blocking, MatmulOp, matmul
from .targets import PRESETS, UnsupportedHostError, resolve

__all__ = ["aligned_empty", "Blocking", "BoundConv2d", "Conv2dOp", "ConvBlocking", "conv2d", "layouts", "MatmulOp", "PostOps", "PRESETS", "UnsupportedHostError", "matmul", "resolve"]
