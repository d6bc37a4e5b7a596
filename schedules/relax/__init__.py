"""Whole models through TVM's Relax: the float32 pass that puts every conv2d it can on our
kernels (conv2d: optimize, optimize_pass, build, llvm_target; its module doc says what runs
where; rest: schedule_rest, every other op lowered and scheduled), and the legalization of quantized convs to the int16 form (int8)."""

from .conv2d import LOG
from .pipeline import build, llvm_target, optimize, optimize_pass
from .int8 import legalize_int8_conv2d
from .rest import schedule_rest

__all__ = ["LOG", "build", "legalize_int8_conv2d", "llvm_target", "optimize", "optimize_pass", "schedule_rest"]
