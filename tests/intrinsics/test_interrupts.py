"""Ctrl-C inside TVM (intrinsics/interrupts.py): a KeyboardInterrupt crosses TVM's FFI as itself,
and one that lands while TVM parses our TVMScript is not lost in the parser."""

import ast
import os
import signal

import pytest
import tvm_ffi

from intrinsics import interrupts, script

TEXT = """
@T.prim_func(s_tir=True)
def main(A: T.Buffer((4,), "float32")):
    for i in range(4):
        with T.sblock("b"):
            vi = T.axis.spatial(4, i)
            A[vi] = T.float32(0)
"""


def test_an_interrupt_through_tvms_ffi_stays_a_keyboard_interrupt():
    """Ctrl-C inside Python that TVM called (a Relax pass, the TVMScript parser, any FFI
    callback) came out of the call as a RuntimeError with no message: the FFI knew no error
    kind for KeyboardInterrupt."""
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tvm_ffi.convert(interrupted)()


def test_an_interrupt_while_tvm_parses_is_raised_once_it_has_parsed(monkeypatch):
    """TVM's doc.parse wraps ast.parse in a bare `except:` and parses again: a Ctrl-C that landed
    there was dropped, and the build went on (one SIGINT in ten to a building network). Here
    SIGINT arrives inside ast.parse; parse raises KeyboardInterrupt after the parser is done."""
    real, calls = ast.parse, []

    def interrupted_parse(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kw)

    monkeypatch.setattr(ast, "parse", interrupted_parse)
    with pytest.raises(KeyboardInterrupt):
        script.parse(TEXT)
    assert calls, "the parser did not call ast.parse"


def test_deferred_takes_an_interrupt_on_the_way_out_and_restores_the_handler():
    before = signal.getsignal(signal.SIGINT)
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            steps += ["went on"]
    assert steps == ["went on"] and signal.getsignal(signal.SIGINT) is before
    with interrupts.deferred():
        steps += ["nothing"]
    assert signal.getsignal(signal.SIGINT) is before
