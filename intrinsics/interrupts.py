"""Ctrl-C while TVM runs our Python, or ours runs TVM.

- A KeyboardInterrupt raised in Python that TVM called (a Relax pass, the TVMScript parser, any
  FFI callback) crosses the FFI back as itself: registered here as an error kind. Unregistered,
  the FFI turned it into a RuntimeError with no message, which callers took for a failure (an
  item to make again) or reported as an error.
- `deferred()`: a section in which an interrupt is noted and raised at its end, for code that
  must not be cut short (forking and reaping workers: common/parallel.py) or code that would
  drop it (TVM's TVMScript parser wraps ast.parse in a bare `except:` and parses again).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import tvm_ffi

tvm_ffi.register_error("KeyboardInterrupt", KeyboardInterrupt)


@contextlib.contextmanager
def deferred():
    """An interrupt inside is taken on the way out: Python's SIGINT handler is swapped for one
    that notes it, then put back and called. (Not a signal mask: TVM's and PyTorch's threads
    take the signal for the process, and Python then runs the handler in the main thread
    wherever it is.) In a thread other than the main one, which never sees a KeyboardInterrupt,
    or under a handler set outside Python (which could not be put back), it does nothing."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, caught[0])  # Python's default raises KeyboardInterrupt
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)
