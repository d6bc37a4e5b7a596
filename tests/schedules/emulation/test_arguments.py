"""schedules.emulation.arguments: what both emulators accept as a call's arguments."""

import numpy as np
import pytest

from schedules.emulation.arguments import DLPACK_CODE, check_args


def test_native_ints_uints_and_floats_are_accepted():
    check_args([np.zeros(3, np.int8), np.zeros((2, 2), np.uint16), np.zeros(1, np.float64)], [0, 2])
    assert DLPACK_CODE == {"i": 0, "u": 1, "f": 2}  # DLPack's kDLInt, kDLUInt, kDLFloat


@pytest.mark.parametrize("args, outputs, exc, msg", [
    ([[1, 2]], [], TypeError, r"args\[0\] must be a numpy.ndarray, got list"),
    ([np.zeros(2, np.complex64)], [], TypeError, r"args\[0\] has dtype complex64"),
    ([np.zeros(2, ">f4")], [], TypeError, "native-endian"),
    ([np.zeros(2, bool)], [], TypeError, "has dtype bool"),
    ([np.zeros((3, 3), np.float32).T], [], ValueError, r"args\[0\] must be C-contiguous"),
    ([np.zeros(2, np.float32)], [1], IndexError, "output index 1 out of range for 1 args"),
    ([np.zeros(2, np.float32)], [-1], IndexError, "output index -1 out of range"),
])
def test_refused(args, outputs, exc, msg):
    with pytest.raises(exc, match=msg):
        check_args(args, outputs)
