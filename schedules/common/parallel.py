"""Work shared among forked processes, one per core: how the Relax pass schedules a network's
distinct layers.

Scheduling a layer is mostly Python (parsing its TVMScript, tensorize's bookkeeping) under the
GIL, so threads would only take turns. Forked children inherit the work as closures (nothing
is pickled on the way in) and send back pickled results (a scheduled layer is some 100 kB of
TIR, through TVM's JSON: 4 ms); this process works through the queue with them. The queue is
a pipe holding each item's index as 4 bytes: Linux reads a pipe whole up to PIPE_BUF, so two
processes never split an index, and the faster one simply takes more items.

A failed item comes back as None, not as an exception: the caller makes it again in context,
where the error is raised with its usual message (a child's exception may not even pickle).
A child that dies loses only its items, which come back as None too.

Ctrl-C (SIGINT) is the parent's to act on: the children ignore it, and the parent, once the
KeyboardInterrupt reaches it, kills and reaps them before it lets the interrupt go on; while it
forks and reaps, an interrupt waits (intrinsics/interrupts.py), so no child goes unrecorded.

Fork copies only the calling thread: a program that builds models from several threads at
once should set TVM_MICROKERNELS_JOBS=1 (a child could inherit a lock another thread held).
Off Linux, with one core or TVM_MICROKERNELS_JOBS=1, everything runs here in turn.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys

from intrinsics.interrupts import deferred

LOG = logging.getLogger("tvm_microkernels.parallel")
ENV_JOBS = "TVM_MICROKERNELS_JOBS"
_INDEX = 4  # bytes per queued index
_QUEUE_MAX = 4096  # indices the queue pipe holds without a reader (64 KiB / 4 with room to spare)


def jobs() -> int:
    """Processes to use: TVM_MICROKERNELS_JOBS, else the cores this process may run on."""
    raw = os.environ.get(ENV_JOBS, "")
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"{ENV_JOBS}={raw!r}: expected a number of processes") from None
        if n < 1:
            raise ValueError(f"{ENV_JOBS}={raw!r}: expected at least 1")
        return n
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run(thunks: list, processes: int | None = None) -> list:
    """[t() for t in thunks], an item that raised as None, shared among `processes` (default
    jobs()) processes: this one and forked children."""
    n = len(thunks)
    processes = min(processes or jobs(), n)
    if processes <= 1 or not sys.platform.startswith("linux") or n > _QUEUE_MAX:
        return [_attempt(t) for t in thunks]
    queue_r, queue_w = os.pipe()
    os.write(queue_w, b"".join(i.to_bytes(_INDEX, "little") for i in range(n)))
    os.close(queue_w)
    children: list[tuple[int, int]] = []  # (pid, the read end of its results), until reaped
    results: list = [None] * n
    try:
        with deferred():  # a child is in `children` before an interrupt can land
            for _ in range(processes - 1):
                out_r, out_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    _child(thunks, queue_r, out_r, out_w)
                os.close(out_w)
                children.append((pid, out_r))
        for i, value in _work(thunks, queue_r):
            results[i] = value
        while children:
            pid, out_r = children[0]
            data = _read_all(out_r)
            with deferred():  # reaped and out of `children` together
                os.waitpid(pid, 0)
                os.close(out_r)
                children.pop(0)
            try:
                for i, value in pickle.loads(data) if data else ():
                    results[i] = value
            except Exception as e:  # a child that died mid-write: its items are made again
                LOG.warning("a worker's results did not unpickle (%s: %s)", type(e).__name__, e)
    except BaseException:  # KeyboardInterrupt above all: the children go first
        _stop(children)
        raise
    finally:
        os.close(queue_r)
    return results


def _child(thunks: list, queue_r: int, out_r: int, out_w: int) -> None:
    """A forked child's life: work, send the results, leave without the parent's exit handlers."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent's call
        os.close(out_r)
        data = pickle.dumps(_work(thunks, queue_r), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(out_w, "wb") as f:
            f.write(data)
        code = 0
    finally:
        os._exit(code)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _stop(children: list[tuple[int, int]]) -> None:
    """Kill and reap the children not yet reaped (a second Ctrl-C deferred meanwhile), and close
    their pipes."""
    with deferred():
        for pid, _ in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid, out_r in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            os.close(out_r)
        children.clear()


def _work(thunks: list, queue_fd: int) -> list:
    done = []
    while len(raw := os.read(queue_fd, _INDEX)) == _INDEX:
        i = int.from_bytes(raw, "little")
        value = _attempt(thunks[i])
        if value is not None:
            done.append((i, value))
    return done


def _attempt(thunk):
    try:
        return thunk()
    except Exception as e:
        LOG.debug("a parallel item failed (%s: %s); its caller makes it again", type(e).__name__, e)
        return None
