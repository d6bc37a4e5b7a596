"""Both x86 targets' operators on every x86 host, whatever the suite's HOST target is: natively
where the CPU has the ISA, AVX-512 on the Bochs CPU where it does not (emulate=True;
tests/x86_exec.py, MK_EMULATE_AVX512=1 forces it).

Small shapes that take each path of the plans: matmul's edge tiles and K blocks; conv2d's bands
and whole-image packing, row tails, padding (asymmetric too), stride, dilation, groups, the
3-channel first layer, Winograd, fused post-ops. Then what emulation itself promises: bit-exact
with the native run where both exist, a kernel that runs past its buffer stops on a fault, and a
host without AVX-512 is told how to emulate.
"""

import numpy as np
import pytest

import schedules
from microkernels import AVX512
from schedules.conv import ConvBlocking

from ..conftest import assert_close_f32
from ..conv_reference import assert_conv_close, with_post_ops
from ..x86_exec import X86, X86_IDS, on

TARGET = "x86-avx512"
ISAS = pytest.mark.parametrize("isa", X86, ids=X86_IDS)


@ISAS
@pytest.mark.parametrize("mnk", [(1, 1, 1), (29, 17, 40), (57, 33, 300), (64, 48, 513)], ids=str)
def test_matmul(isa, mnk):
    rng = np.random.default_rng(sum(mnk))
    m, n, k = mnk
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    # 29 and 57 rows leave a tail op (or a packed A); K slices: test_matmul's Blocking(kc_max) cases.
    assert_close_f32(schedules.matmul(m, n, k, **on(isa))(a, b), a, b)


CONVS = {
    "first_layer_7x7s2": ((1, 3, 19, 23), (20, 3, 7, 7), dict(stride=2, padding=3)),
    "row_tails_unpadded": ((2, 16, 9, 37), (16, 16, 3, 3), dict()),  # 35 = 28 + 7: a narrower tile
    "bands": ((1, 32, 30, 30), (32, 32, 3, 3), dict(padding=1, blocking=ConvBlocking(l2_bytes=64 * 1024))),
    "asymmetric_pad_dilation": ((1, 16, 11, 13), (32, 16, 3, 3), dict(padding=(2, 0, 1, 3), dilation=2)),
    "stride3_5x5": ((1, 24, 17, 17), (16, 24, 5, 5), dict(stride=3, padding=2)),
    "groups": ((1, 24, 8, 9), (42, 8, 3, 3), dict(padding=1, groups=3)),
    "one_pixel_rows": ((1, 16, 5, 1), (16, 16, 1, 1), dict()),
    # 7- and 14-wide rows, an even number of output blocks: on AVX-512, tiles of two blocks.
    "two_block_tiles": ((1, 40, 7, 7), (64, 40, 3, 3), dict(padding=1)),
    "two_block_tiles_strided": ((2, 16, 9, 25), (32, 16, 1, 3), dict(stride=(1, 2), padding=(0, 1))),
    "winograd_f4": ((1, 32, 10, 10), (32, 32, 3, 3), dict(padding=1, algorithm="winograd", tile=4)),
    "winograd_f2": ((2, 16, 7, 7), (24, 16, 3, 3), dict(padding=1, algorithm="winograd", tile=2)),
}


@ISAS
@pytest.mark.parametrize("name", list(CONVS))
def test_conv2d(isa, name):
    ds, ws, kw = CONVS[name]
    rng = np.random.default_rng(len(name))
    x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    kw = {"algorithm": "direct"} | kw
    op = schedules.conv2d(ds, ws, **on(isa), **kw)
    conv = {k: v for k, v in kw.items() if k in ("stride", "padding", "dilation", "groups")}
    got = op(x, w)
    if kw["algorithm"] == "direct":
        assert_conv_close(got, x, w, **conv)
    else:  # Winograd's own bound lives in test_winograd; here: agreement to its accuracy class
        ref = with_post_ops(x, w, None, None, schedules.PostOps(), **conv)
        assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    if name == "bands":
        assert op.plan["band_parallel"] and op.plan["band_rows"] < 30, op.plan
    if name == "row_tails_unpadded":
        assert len(op.plan["segments"]) > 1, op.plan  # 35 columns: the tile, then a narrower one
    if name.startswith("two_block_tiles"):
        assert op.plan["output_blocks"] == (2 if isa.name == "avx512" else 1), op.plan


@ISAS
@pytest.mark.parametrize("algorithm", ["direct", "winograd"])
def test_post_ops(isa, algorithm):
    rng = np.random.default_rng(1)
    ds, ws = (1, 16, 9, 11), (24, 16, 3, 3)
    post = schedules.PostOps(bias=True, residual=True, activation="clip", clip=(-1.0, 2.0))
    op = schedules.conv2d(ds, ws, padding=1, **on(isa), algorithm=algorithm,
                          bias=True, residual=True, activation="clip", clip=(-1.0, 2.0))
    x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    b, r = rng.standard_normal(24, dtype=np.float32), rng.standard_normal((1, 24, 9, 11), dtype=np.float32)
    want = with_post_ops(x, w, b, r, post, padding=1)
    assert np.abs(op(x, w, bias=b, residual=r) - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.skipif(not AVX512.host_supports(), reason="needs an AVX-512 host to compare the emulated run against")
@pytest.mark.parametrize("name", ["first_layer_7x7s2", "groups", "winograd_f4", "two_block_tiles"])
def test_emulated_run_is_bit_exact_with_native(name):
    ds, ws, kw = CONVS[name]
    kw = {"algorithm": "direct"} | kw
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    native = schedules.conv2d(ds, ws, target=TARGET, **kw)(x, w)
    emul = schedules.conv2d(ds, ws, target=TARGET, emulate=True, **kw)(x, w)
    np.testing.assert_array_equal(emul, native)


def test_emulated_ops_refuse_timing_and_other_targets():
    op = schedules.matmul(4, 16, 4, target=TARGET, emulate=True)
    with pytest.raises(ValueError, match="cannot be timed"):
        op.time(np.ones((4, 4), np.float32), np.ones((4, 16), np.float32))
    with pytest.raises(ValueError, match="runs under qemu already"):
        schedules.conv2d((1, 8, 4, 4), (8, 8, 1, 1), dtype="int8", target="armv7-neon", emulate=True)
    with pytest.raises(TypeError, match="emulate must be True or False"):
        schedules.matmul(4, 4, 4, target=TARGET, emulate="yes")


def test_a_host_without_avx512_is_told_how_to_emulate(monkeypatch):
    import microkernels.isa as isa_mod

    monkeypatch.setattr(isa_mod, "host_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    op = schedules.matmul(4, 16, 4, target=TARGET)
    with pytest.raises(schedules.UnsupportedHostError, match="emulate=True"):
        op(np.ones((4, 4), np.float32), np.ones((4, 16), np.float32))
