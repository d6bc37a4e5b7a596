"""What both emulators (qemu for ARM, Bochs for x86) accept as a call's arguments."""

from __future__ import annotations

import numpy as np

DLPACK_CODE = {"i": 0, "u": 1, "f": 2}  # numpy kind -> DLPack kDLInt / kDLUInt / kDLFloat


def check_args(args: list, outputs: list[int]) -> None:
    """Each argument a C-contiguous numpy array of a native int, uint or float dtype (what the
    harnesses can describe as a DLTensor), and each output index one of them."""
    for i, a in enumerate(args):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"args[{i}] must be a numpy.ndarray, got {type(a).__name__}")
        if a.dtype.kind not in DLPACK_CODE or not a.dtype.isnative:
            raise TypeError(f"args[{i}] has dtype {a.dtype}; expected a native-endian int, uint or float")
        if not a.flags.c_contiguous:
            raise ValueError(f"args[{i}] must be C-contiguous")
    for k in outputs:
        if not 0 <= k < len(args):
            raise IndexError(f"output index {k} out of range for {len(args)} args")
