"""schedules.emulation.bochs: x86 modules on the Bochs CPU. A kernel that runs past a buffer
stops on a fault that names the buffer; arguments are checked as qemu's are. (Whole operators
emulated, bit-exact with native runs: tests/schedules/test_x86_targets.py.)"""

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from microkernels import AVX512, GemmKernel
from schedules.emulation import bochs

def test_a_kernel_running_past_its_buffer_is_stopped():
    """A 28x16 beta=0 tile told to write 28 rows into a 27-row C: the last row lands on the
    unmapped page behind C, and the run stops naming the buffer, not corrupting memory."""
    kern = GemmKernel(AVX512, 28, 16, accumulate=False)
    sym, ir = kern.name, kern.llvm_ir()

    @T.prim_func(s_tir=True)
    def oob(A: T.Buffer((28, 8), "float32"), B: T.Buffer((8, 16), "float32"), C: T.Buffer((27, 16), "float32")):
        with T.attr(0, "pragma_import_llvm", ir):
            T.evaluate(T.call_extern("void", sym, A.access_ptr("r"), 8, B.access_ptr("r"), 16,
                                     C.access_ptr("w"), 16, 8))

    lib = tvm.compile(tvm.IRModule({"main": oob}), target=AVX512.target)
    args = [np.ones((28, 8), np.float32), np.ones((8, 16), np.float32), np.zeros((27, 16), np.float32)]
    with pytest.raises(bochs.EmulatorError, match=r"page fault .*write .*past the end of args\[2\]"):
        bochs.run(lib, args, [2])


def test_a_call_is_checked_before_the_emulator_runs():
    lib = None  # never reached: the arguments are refused first
    with pytest.raises(TypeError, match=r"args\[1\] must be a numpy.ndarray, got list"):
        bochs.run(lib, [np.zeros(4, np.float32), [1.0]], [0])
    with pytest.raises(IndexError, match="output index 2 out of range for 2 args"):
        bochs.run(lib, [np.zeros(4, np.float32), np.zeros(4, np.float32)], [2])
