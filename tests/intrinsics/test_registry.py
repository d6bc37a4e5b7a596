"""intrinsics.registry: one table for every family, idempotent, and a name never means two things."""

import threading
import time

import pytest
from tvm import s_tir
from tvm.script import tirx as T

import intrinsics
from intrinsics import registry
from intrinsics.f32_dwconv import DwRow, register_dw
from intrinsics.f32_wino import register as register_wino
from intrinsics.int_conv import IntConvTile, register_int_conv
from microkernels import AVX2, GemmKernel
from microkernels.f32_dwconv import DwKernel
from microkernels.f32_wino import WinoKernel
from microkernels.int_mac import default_mac_kernel


def scale(factor: float):
    """A one-statement description, a fresh object per call: what a family hands the registry."""

    @T.prim_func(s_tir=True)
    def f(a: T.handle):
        A = T.match_buffer(a, (4,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(A[0:4])
            T.writes(A[0:4])
            for i in T.serial(4):
                with T.sblock("update"):
                    vi = T.axis.remap("S", [i])
                    A[vi] = A[vi] * T.float32(factor)

    return f


def test_every_family_is_in_names():
    """The Winograd and depthwise families were missing from intrinsics.names()."""
    got = [
        intrinsics.avx2_fma_gemm(6, 16, 32),
        intrinsics.register_conv(intrinsics.ConvTile(GemmKernel(AVX2, 6, 16, accumulate=False, batch_reduce=True),
                                                     nb=1, kh=3, kw=3, bi=8)),
        register_dw(DwRow(DwKernel(AVX2, 3, 3, 4), 8)),
        register_wino(WinoKernel(AVX2, "in", 2)),
        intrinsics.neon_int16_mac(4, 8, 32),
        register_int_conv(IntConvTile(default_mac_kernel("neon"), kh=3, kw=3, ci=4)),
    ]
    assert set(got) <= set(intrinsics.names()), set(got) - set(intrinsics.names())
    assert intrinsics.names == registry.names


def test_same_definition_again_is_the_same_name():
    name = "test_registry_same"
    assert registry.register(name, scale(2.0), scale(2.0)) == name
    assert registry.register(name, scale(2.0), scale(2.0)) == name  # built anew: equal, not identical
    assert registry.names().count(name) == 1
    assert s_tir.TensorIntrin.get(name) is not None


def test_another_definition_under_a_taken_name_is_refused():
    name = "test_registry_taken"
    registry.register(name, scale(2.0), scale(2.0))
    with pytest.raises(ValueError, match=f"'{name}' is already registered with another definition"):
        registry.register(name, scale(3.0), scale(3.0))
    with pytest.raises(ValueError, match="its name must say what distinguishes"):
        registry.register(name, scale(2.0), scale(3.0))


def test_threads_registering_one_new_name_all_get_it(monkeypatch):
    """TVM's registration made slow, so every thread finds the name missing unless the check
    and the registration are one step."""
    name = "test_registry_threads"
    real = s_tir.TensorIntrin.register

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(s_tir.TensorIntrin, "register", staticmethod(slow))
    start = threading.Barrier(8)
    results, errors = [], []

    def worker():
        desc, impl = scale(5.0), scale(5.0)
        start.wait()
        try:
            results.append(registry.register(name, desc, impl))
        except Exception as err:  # noqa: BLE001 (any failure of a thread is the finding)
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [name] * 8
    assert registry.names().count(name) == 1
