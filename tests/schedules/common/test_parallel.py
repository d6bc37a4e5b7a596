"""schedules/common/parallel.py: results in order and equal to a serial run, the work really
shared among processes, a failed item or a dead worker giving None instead of an error, and
TVM_MICROKERNELS_JOBS honoured."""

import os
import time

import numpy as np
import pytest

from schedules.common import parallel

from ...interrupting import interrupt_once_forked


def _item(i):
    time.sleep(0.02)  # long enough that the child takes its share before the parent drains the queue
    return i * i, os.getpid()


def test_results_in_order_and_shared_among_processes():
    got = parallel.run([lambda i=i: _item(i) for i in range(30)], processes=2)
    assert [v for v, _ in got] == [i * i for i in range(30)]
    pids = {pid for _, pid in got}
    assert os.getpid() in pids and len(pids) == 2, pids


def test_large_results_come_back_whole():
    """More than a pipe's buffer from the child: the parent reads while the child writes."""
    got = parallel.run([lambda i=i: (time.sleep(0.02), np.full(100_000, i, np.float64))[1] for i in range(12)],
                       processes=2)
    assert all(np.array_equal(a, np.full(100_000, i, np.float64)) for i, a in enumerate(got))


def test_a_failed_item_is_none_and_the_rest_are_made():
    def item(i):
        time.sleep(0.01)
        if i == 5:
            raise RuntimeError("no")
        return i

    got = parallel.run([lambda i=i: item(i) for i in range(12)], processes=2)
    assert got == [None if i == 5 else i for i in range(12)]


def test_a_worker_that_dies_loses_only_its_items():
    parent = os.getpid()

    def item(i):
        time.sleep(0.02)
        if os.getpid() != parent:
            os._exit(3)  # the child dies on its first item, sending nothing
        return i

    got = parallel.run([lambda i=i: item(i) for i in range(20)], processes=2)
    lost = [i for i, v in enumerate(got) if v is None]
    assert len(lost) == 1 and all(got[i] == i for i in range(20) if i not in lost), got


def test_jobs_one_runs_everything_here(monkeypatch):
    monkeypatch.setenv(parallel.ENV_JOBS, "1")
    got = parallel.run([lambda i=i: _item(i) for i in range(6)])
    assert {pid for _, pid in got} == {os.getpid()}


@pytest.mark.parametrize("raw", ["0", "two", "-1"])
def test_a_bad_jobs_setting_is_refused(monkeypatch, raw):
    monkeypatch.setenv(parallel.ENV_JOBS, raw)
    with pytest.raises(ValueError, match=parallel.ENV_JOBS):
        parallel.jobs()


_SLOW_ITEMS = """
import time
import tvm_ffi
from schedules.common import parallel
sleep = tvm_ffi.convert(lambda: time.sleep(0.05))  # the work calls Python through TVM, as scheduling does
parallel.run([lambda: (sleep(), 1)[1] for _ in range(400)], processes=2)
"""


@pytest.mark.parametrize("group", [False, True], ids=["the-process", "its-group"])
def test_an_interrupt_ends_the_run_and_its_workers_at_once(group):
    """SIGINT to a process sharing 10 s of work with a forked worker: it ends within 3 s (its
    interpreter's exit included) with KeyboardInterrupt, and the worker is gone. The run took
    the RuntimeError TVM's FFI made of the interrupt for a failed item and finished the queue
    (a KeyboardInterrupt it did see waited for the worker to finish it). Sent to the process,
    or to its whole group as a terminal's Ctrl-C is."""
    ending = interrupt_once_forked(_SLOW_ITEMS, timeout=60, group=group)
    assert ending.last_exception == "KeyboardInterrupt", ending.stderr
    assert ending.seconds < 3.0, (ending.seconds, ending.stderr)
    assert ending.left == [], ending.left
