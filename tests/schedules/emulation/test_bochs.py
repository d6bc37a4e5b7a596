"""schedules.emulation.bochs: x86 modules on the Bochs CPU. A kernel that runs past a buffer
stops on a fault that names the buffer, and a kept fault does not break the next run;
arguments are checked as qemu's are; functions are entered with the stack the ABI promises; an
op may be shared by threads. (Whole operators emulated, bit-exact with native runs:
tests/schedules/test_x86_targets.py.)"""

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import schedules
from microkernels import AVX512, GemmKernel
from schedules.emulation import bochs

from ...conftest import assert_close_f32
from ...test_adversarial import classify


def past_the_end():
    """A 28x16 beta=0 tile told to write 28 rows into a 27-row C, and its arguments."""
    kern = GemmKernel(AVX512, 28, 16, accumulate=False)
    sym, ir = kern.name, kern.llvm_ir()

    @T.prim_func(s_tir=True)
    def oob(A: T.Buffer((28, 8), "float32"), B: T.Buffer((8, 16), "float32"), C: T.Buffer((27, 16), "float32")):
        with T.attr(0, "pragma_import_llvm", ir):
            T.evaluate(T.call_extern("void", sym, A.access_ptr("r"), 8, B.access_ptr("r"), 16,
                                     C.access_ptr("w"), 16, 8))

    lib = tvm.compile(tvm.IRModule({"main": oob}), target=AVX512.target)
    return lib, [np.ones((28, 8), np.float32), np.ones((8, 16), np.float32), np.zeros((27, 16), np.float32)]


def test_a_kernel_running_past_its_buffer_is_stopped():
    """The last row of past_the_end's tile lands on the unmapped page behind C, and the run
    stops naming the buffer, not corrupting memory."""
    lib, args = past_the_end()
    with pytest.raises(bochs.EmulatorError, match=r"page fault .*write .*past the end of args\[2\]"):
        bochs.run(lib, args, [2])


def test_a_call_is_checked_before_the_emulator_runs():
    lib = None  # never reached: the arguments are refused first
    with pytest.raises(TypeError, match=r"args\[1\] must be a numpy.ndarray, got list"):
        bochs.run(lib, [np.zeros(4, np.float32), [1.0]], [0])
    with pytest.raises(IndexError, match="output index 2 out of range for 2 args"):
        bochs.run(lib, [np.zeros(4, np.float32), np.zeros(4, np.float32)], [2])


@pytest.mark.parametrize("mnk", [(1, 16, 4), (1, 32, 4), (1, 17, 4), (12, 37, 40), (13, 37, 19)], ids=str)
def test_matmul_whose_code_spills_to_aligned_stack_slots(mnk):
    """Issue 26: these shapes stopped on a general protection fault at `vmovaps %xmm0,
    -0x80(%rsp)`, LLVM's aligned spill, because the harness entered the module with rsp 16-byte
    aligned instead of the ABI's 8 mod 16. Natively they were always right."""
    m, n, k = mnk
    rng = np.random.default_rng(sum(mnk))
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    assert_close_f32(schedules.matmul(m, n, k, target="x86-avx512", emulate=True)(a, b), a, b)


# Stores the address of its own return address, i.e. rsp as it was on entry; noinline, so that
# it is a function called from the module's code, as the kernels' helpers are.
ENTRY_RSP_IR = """
define internal void @mk_entry_rsp(ptr %out) noinline {
  %slot = call ptr @llvm.addressofreturnaddress.p0()
  %rsp = ptrtoint ptr %slot to i64
  store i64 %rsp, ptr %out, align 8
  ret void
}
declare ptr @llvm.addressofreturnaddress.p0()
"""


def entry_rsp_module():
    @T.prim_func(s_tir=True)
    def main(out: T.Buffer((1,), "int64")):
        with T.attr(0, "pragma_import_llvm", ENTRY_RSP_IR):
            T.evaluate(T.call_extern("void", "mk_entry_rsp", out.access_ptr("w")))

    # Baseline x86-64: the probe runs natively on any x86 host, so both runs can be compared.
    return tvm.compile(tvm.IRModule({"main": main}), target={"kind": "llvm", "mtriple": "x86_64-linux-gnu"})


def test_functions_are_entered_with_the_abi_stack_alignment(monkeypatch):
    """What a function called from the module sees on entry: rsp = 8 mod 16, as natively (the
    call pushed an 8-byte return address onto a 16-byte aligned stack), whatever stack pointer
    the emulator starts with."""
    lib = entry_rsp_module()
    native = tvm.runtime.tensor(np.zeros(1, np.int64))
    lib["main"](native)
    assert native.numpy()[0] % 16 == 8, "the probe does not read what the ABI promises"
    top = bochs.STACK_TOP
    for offset in (0, 4, 8):
        monkeypatch.setattr(bochs, "STACK_TOP", top - offset)
        (rsp,) = bochs.run(lib, [np.zeros(1, np.int64)], [0])
        assert rsp[0] % 16 == 8, f"stack top - {offset}: entered with rsp {int(rsp[0]):#x}"


def test_a_kept_emulator_error_does_not_break_the_next_run():
    """A caller that keeps an EmulatorError (pytest does, for a failed test) kept the Bochs
    session alive through the traceback, and the next emulated call aborted the process
    ("free(): invalid pointer"). In a process of its own, so that abort fails only this test."""
    got = classify("""
        from schedules.emulation import bochs
        from tests.schedules.emulation.test_bochs import entry_rsp_module, past_the_end
        lib, args = past_the_end()
        kept = []
        for _ in range(2):
            try:
                bochs.run(lib, args, [2])
            except bochs.EmulatorError as err:
                kept.append(err)
        (rsp,) = bochs.run(entry_rsp_module(), [np.zeros(1, np.int64)], [0])
        return len(kept) == 2 and rsp[0] % 16 == 8
    """)
    assert got["outcome"] == "right", got


THREADS, CALLS = 4, 5
# What each op is built from (emulate= is added), its inputs' shapes, and how a result is
# checked against numpy where this host cannot run AVX-512 natively.
SHARED = {
    "matmul": ("matmul(13, 32, 9", [(13, 9), (9, 32)], "assert_close_f32(got, *inputs)"),
    "conv2d": ("conv2d((1, 16, 9, 11), (24, 16, 3, 3), padding=1, algorithm='direct'",
               [(1, 16, 9, 11), (24, 16, 3, 3)], "assert_conv_close(got, *inputs, padding=1)"),
}


@pytest.mark.parametrize("name", list(SHARED))
def test_emulated_op_shared_by_threads(name):
    """Issue 26: one emulated op called from 4 Python threads at once aborted the process
    ("double free or corruption": TVM's write_to_file on the shared module, unguarded). In a
    process of its own, so a crash fails this test instead of ending pytest. Each result is
    bit-exact with the native op where the host runs AVX-512, else within numpy's bound."""
    call, shapes, check = SHARED[name]
    got = classify(f"""
        import threading
        import schedules
        from microkernels import AVX512
        from tests.conftest import assert_close_f32
        from tests.conv_reference import assert_conv_close
        def build(emulate):
            return schedules.{call}, target="x86-avx512", emulate=emulate)
        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal(s, dtype=np.float32) for s in {shapes!r}]
        op = build(True)
        assert op.emulate
        results, errors = [], []
        # Every call of every thread starts together, the first too (no warm-up call).
        start = threading.Barrier({THREADS})
        def loop():
            try:
                for _ in range({CALLS}):
                    start.wait()
                    results.append(op(*inputs))
            except BaseException as err:
                errors.append(err)
                start.abort()  # the other threads stop waiting for this one
        threads = [threading.Thread(target=loop) for _ in range({THREADS})]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        if len(results) != {THREADS * CALLS}:
            return False
        if AVX512.host_supports():
            want = build(False)(*inputs)
            return all(np.array_equal(got, want) for got in results)
        try:
            for got in results:
                {check}
        except AssertionError:
            return False
        return True
    """)
    assert got["outcome"] == "right", got
