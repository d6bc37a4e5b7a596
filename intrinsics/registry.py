"""The one table of the TensorIntrins this library defines, every family's.

TVM's own table is process-wide and refuses a name it already holds, while a family is asked
for the same tile by every schedule that uses it: `register` is therefore idempotent. A name
says everything that distinguishes a kernel (DESIGN.md, naming), so the same name arriving
with another description or implementation means a name lost a parameter; that is refused
rather than answered with the first definition, which would compute the wrong thing.
The families memoize their `register_*` (functools.lru_cache) only because building the TIR,
parsing it, is the slow part; what makes a repeat harmless is this module.
"""

from __future__ import annotations

import threading

import tvm_ffi
from tvm import s_tir

# Held across the check and TVM's registration: two threads asking for one new tile would
# otherwise both find it missing, and TVM refuses the second.
_LOCK = threading.Lock()
_DEFINED: dict = {}  # name -> (desc, impl), in registration order


def register(name: str, desc, impl) -> str:
    """Register `desc` and `impl` under `name` unless they already are; return `name`."""
    with _LOCK:
        known = _DEFINED.get(name)
        if known is None:
            s_tir.TensorIntrin.register(name, desc, impl)
            _DEFINED[name] = (desc, impl)
        elif not (tvm_ffi.structural_equal(known[0], desc) and tvm_ffi.structural_equal(known[1], impl)):
            raise ValueError(f"intrinsic {name!r} is already registered with another definition: "
                             "its name must say what distinguishes the two")
    return name


def names() -> list[str]:
    """Names of the intrinsics registered so far, every family's, in registration order."""
    with _LOCK:
        return list(_DEFINED)
