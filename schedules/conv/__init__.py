"""conv2d: the layer as values (geometry), typed plans (plans), the compiled op (op), one module
per family (direct, grouped, winograd, depthwise, int8, each with applies() where a
layer's shape decides it, and schedule(); inverted fuses a 1x1 expand with the depthwise conv
after it), and dispatch, which alone imports the families."""

from .dispatch import conv2d, inverted_pays, inverted_residual, measure, schedule, schedule_args, schedule_inverted
from .geometry import NO_POST_OPS, ConvBlocking, ConvParams, Geometry, PostOps, Quantization
from .op import BoundConv2d, Conv2dOp, Scheduled
from .plans import DepthwisePlan, DirectPlan, Plan, WinogradPlan

__all__ = ["BoundConv2d", "Conv2dOp", "ConvBlocking", "ConvParams", "DepthwisePlan", "DirectPlan", "Geometry",
           "NO_POST_OPS", "Plan", "PostOps", "Quantization", "Scheduled", "WinogradPlan", "conv2d",
           "inverted_pays", "inverted_residual", "measure", "schedule", "schedule_args", "schedule_inverted"]
