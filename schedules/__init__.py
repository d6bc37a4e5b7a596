"""Schedules that tensorize onto the intrinsics, and the public entry points."""

from .matmul import Blocking, MatmulOp, matmul
from .targets import PRESETS, UnsupportedHostError, resolve

__all__ = ["Blocking", "MatmulOp", "PRESETS", "UnsupportedHostError", "matmul", "resolve"]
