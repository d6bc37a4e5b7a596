"""The vector math (microkernels/f32_vmath.py) over whole tensors: a PrimFunc y = fn(x) that
calls the row kernel of microkernels/f32_vmap.py on contiguous chunks, in parallel where the
tensor is large enough to pay for the thread pool. The Relax pass legalizes sigmoid, SiLU, GELU
and exp onto it (schedules/relax/rest.py).

`map_func(fn, shape, isa, threads)`: main(x, y), both float32 of `shape`, any alignment.
Chunks: equal whole shares of CHUNK values or fewer, their count a multiple of the threads, so
each thread gets the same number of equal chunks (TVM's parallel loop hands out contiguous
iteration ranges); below SERIAL values one call, no parallel region.
"""

from __future__ import annotations

import math
import os

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


def map_func(fn: str, shape: tuple, isa, threads: int | None = None, alpha: float | None = None):
    """PrimFunc main(x, y) with y = fn(x) elementwise (float32 tensors of `shape`), through the
    row kernel of `fn` for `isa` (alpha: the parameter of leaky ReLU and ELU)."""
    kern = VmapKernel(fn, isa, alpha)  # refuses an unknown name or a stray alpha
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    calls, per = chunks(n, isa.lanes, threads)
    buf = f"T.Buffer({shape}, 'float32', align=4)"
    call = (f"T.evaluate(T.call_extern('void', '{kern.name}', x.access_ptr('r', offset={{o}}), "
            f"y.access_ptr('w', offset={{o}}), T.Cast('int64', {{len}})))")
    lines = ["@T.prim_func(s_tir=True)", f"def main(x: {buf}, y: {buf}):",
             "    T.func_attr({'tirx.noalias': True})",
             # A root block, as Relax's analyses of a PrimFunc expect one.
             "    with T.sblock('root'):"]
    if calls == 1:
        lines += ["        with T.attr(0, 'pragma_import_llvm', IR):",
                  "            " + call.format(o=0, len=n)]
    else:
        lines += [f"        for b in T.parallel({calls}):",
                  "            with T.attr(0, 'pragma_import_llvm', IR):",
                  "                " + call.format(o=f"b * {per}", len=f"T.min({per}, {n} - b * {per})")]
    return parse("\n".join(lines), IR=kern.llvm_ir())
