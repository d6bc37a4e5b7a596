"""Ctrl-C during a model build whose layers are being scheduled by forked workers
(common/parallel.py): the build ends in KeyboardInterrupt and leaves no process behind."""

import pytest

from ...interrupting import interrupt_once_forked

pytest.importorskip("torch", reason="PyTorch is in the test extra; the network is a PyTorch module")

# Nine distinct conv layers, scheduled two at a time by this process and one forked worker.
_BUILD = """
import numpy as np
import torch
from torch import nn
from tvm.relax.frontend.torch import from_exported_program
from schedules import relax as mkrelax

torch.manual_seed(0)
layers, c = [], 3
for o, stride in ((16, 1), (24, 2), (32, 1), (40, 2), (48, 1), (56, 2), (64, 1), (72, 1), (80, 1)):
    layers += [nn.Conv2d(c, o, 3, stride, 1), nn.ReLU()]
    c = o
model = nn.Sequential(*layers).eval()
x = torch.zeros(1, 3, 32, 32)
mod = from_exported_program(torch.export.export(model, (x,)))
mkrelax.build(mod, "native")
"""


def test_an_interrupted_build_raises_keyboard_interrupt_and_leaves_no_worker():
    """SIGINT once the build has forked its worker (the compile cache off, two jobs). It ended in
    a RuntimeError with no message (the pass runs inside TVM, whose FFI made the interrupt one),
    or finished the build as if nothing had happened (an item that raised the RuntimeError was
    taken for a failed one and made again)."""
    ending = interrupt_once_forked(_BUILD, env={"TVM_MICROKERNELS_CACHE": "off", "TVM_MICROKERNELS_JOBS": "2",
                                                "TVM_MICROKERNELS_TUNE": "off"})
    assert ending.returncode != 0 and ending.last_exception == "KeyboardInterrupt", ending.stderr[-3000:]
    assert ending.left == [], ending.left
