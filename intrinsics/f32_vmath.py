"""The vector math (microkernels/f32_vmath/) over whole tensors: a PrimFunc y = fn(x) that
calls the row kernel of microkernels/f32_vmap.py on contiguous chunks, in parallel where the
tensor is large enough to pay for the thread pool. The Relax pass legalizes sigmoid, SiLU, GELU
(both forms), tanh and exp onto it (schedules/relax/rest.py).

`map_func(fn, shape, isa, threads)`: main(x, y), both float32 of `shape`, any alignment.
`layer_norm_func(shape, isa, threads, eps)`: main(x, gamma, beta, y), LayerNorm over the last
axis through microkernels/f32_layernorm.py, in chunks of whole rows.
Chunks: equal whole shares of CHUNK values or fewer, their count a multiple of the threads, so
each thread gets the same number of equal chunks (TVM's parallel loop hands out contiguous
iteration ranges); below SERIAL values one call, no parallel region.
"""

from __future__ import annotations

import math
import os

from tvm import tirx

from microkernels.f32_layernorm import LayerNormKernel
from microkernels.f32_vmap import VmapKernel

from .script import parse

CHUNK = 1 << 14  # values per call at most (64 KiB of input): in L2 beside its output
SERIAL = 1 << 14  # below this many values a parallel region costs more than it saves


def chunks(n: int, lanes: int, threads: int | None) -> tuple[int, int]:
    """(calls, values per call, a multiple of lanes): n split as the module doc says."""
    t = max(1, threads if threads is not None else (os.cpu_count() or 1))
    if n < SERIAL or t == 1:
        return 1, n
    calls = t * math.ceil(n / (t * CHUNK))
    per = math.ceil(math.ceil(n / calls) / lanes) * lanes
    return math.ceil(n / per), per


def describe(fn: str, shape: tuple, isa, threads: int | None = None) -> str:
    """What map_func makes of these arguments, in a few words (for reports)."""
    calls, per = chunks(math.prod(shape), isa.lanes, threads)
    where = "one call" if calls == 1 else f"{calls} parallel calls of {per} values"
    return f"{VmapKernel(fn, isa).name}, {where}"


def describe_layer_norm(shape: tuple, isa, threads: int | None = None, eps: float = 1e-5) -> str:
    """What layer_norm_func makes of these arguments, in a few words (for reports)."""
    c = shape[-1]
    calls, per = chunks(math.prod(shape), c, threads)
    where = "one call" if calls == 1 else f"{calls} parallel calls of {per // c} rows"
    return f"{LayerNormKernel(isa, c, eps).name}, {where}"


def map_func(fn: str, shape: tuple, isa, threads: int | None = None, alpha: float | None = None):
    """PrimFunc main(x, y) with y = fn(x) elementwise (float32 tensors of `shape`), through the
    row kernel of `fn` for `isa` (alpha: the parameter of leaky ReLU and ELU)."""
    kern = VmapKernel(fn, isa, alpha)  # refuses an unknown name or a stray alpha
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    buf = f"T.Buffer({shape}, 'float32', align=4)"
    return _chunked(kern, f"x: {buf}, y: {buf}", n, *chunks(n, isa.lanes, threads),
                    lambda o, k: f"x.access_ptr('r', offset={o}), y.access_ptr('w', offset={o}), T.Cast('int64', {k})")


def layer_norm_func(shape: tuple, isa, threads: int | None = None, eps: float = 1e-5):
    """PrimFunc main(x, gamma, beta, y): LayerNorm of float32 x of `shape` over its last axis
    (C values), gamma and beta of shape (C,), through microkernels/f32_layernorm.py's row
    kernel, rows in parallel chunks as map_func splits values."""
    shape = tuple(int(d) for d in shape)
    kern = LayerNormKernel(isa, shape[-1], eps)
    c, rows = shape[-1], math.prod(shape[:-1])
    calls, per = chunks(rows * c, c, threads)  # per: whole rows' values
    buf, vec = f"T.Buffer({shape}, 'float32', align=4)", f"T.Buffer(({c},), 'float32', align=4)"
    return _chunked(kern, f"x: {buf}, g: {vec}, b: {vec}, y: {buf}", rows, calls, per // c,
                    lambda o, k: (f"x.access_ptr('r', offset={o} * {c}), g.access_ptr('r'), b.access_ptr('r'), "
                                  f"y.access_ptr('w', offset={o} * {c}), T.Cast('int64', {k})"))


def _chunked(kern, params: str, n: int, calls: int, per: int, args) -> tirx.PrimFunc:
    """main(params) calling `kern` on n units (values, rows) in `calls` chunks of `per`, in
    parallel when there are several; args(first unit, units) is the call's argument text."""
    call = "T.evaluate(T.call_extern('void', '{name}', {args}))"
    lines = ["@T.prim_func(s_tir=True)", f"def main({params}):",
             "    T.func_attr({'tirx.noalias': True})",
             # A root block, as Relax's analyses of a PrimFunc expect one.
             "    with T.sblock('root'):"]
    if calls == 1:
        lines += ["        with T.attr(0, 'pragma_import_llvm', IR):",
                  "            " + call.format(name=kern.name, args=args(0, n))]
    else:
        lines += [f"        for chunk in T.parallel({calls}):",
                  "            with T.attr(0, 'pragma_import_llvm', IR):",
                  "                " + call.format(name=kern.name,
                                                  args=args(f"chunk * {per}", f"T.min({per}, {n} - chunk * {per})"))]
    return parse("\n".join(lines), IR=kern.llvm_ir())
