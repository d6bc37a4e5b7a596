"""The init TVM leaves in front of a beta=0 intrinsic, removed.

Tensorizing a reduction block (one with a `T.init()`) onto an intrinsic keeps the block's init:
a zero fill of the output tile before every kernel call. A beta=0 kernel overwrites its whole
tile, so that fill is dead, but LLVM does not always see it (the kernel's stores come after its
K loop): it survived as one memset per output tile. The Winograd GEMM tiles use this; the
direct conv's tiles are spatial blocks with no init (intrinsics.f32_conv). `drop_dead_inits`
removes the init of the blocks it is told about, which must be exactly blocks tensorized onto
a beta=0 (overwriting) intrinsic; their reads of the output then never happen, so the TIR
reads as an accumulation into a tile the kernel overwrites, which is what the call does.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx


def _rebuild(stmt, names: frozenset):
    if isinstance(stmt, s_tir.SBlockRealize):
        block = _rebuild(stmt.block, names)
        return stmt if block.same_as(stmt.block) else s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)
    if isinstance(stmt, s_tir.SBlock):
        body = _rebuild(stmt.body, names)
        drop = stmt.name_hint in names and stmt.init is not None
        if body.same_as(stmt.body) and not drop:
            return stmt
        return s_tir.SBlock(stmt.iter_vars, stmt.reads, stmt.writes, stmt.name_hint, body,
                            None if drop else stmt.init, stmt.alloc_buffers, stmt.match_buffers, stmt.annotations)
    if isinstance(stmt, tirx.For):
        body = _rebuild(stmt.body, names)
        return stmt if body.same_as(stmt.body) else tirx.For(
            stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations, stmt.step)
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_rebuild(s, names) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    return stmt  # no block below any other statement kind in the modules built here


def drop_dead_inits(mod: tvm.IRModule, block_names) -> tvm.IRModule:
    """`mod` with the init of every block named in `block_names` removed (its "main")."""
    func = mod["main"]
    names = frozenset(block_names)
    missing = names - set(_block_names(func.body))
    if missing:
        raise ValueError(f"no blocks named {sorted(missing)} in the module")
    return tvm.IRModule({"main": func.with_body(_rebuild(func.body, names))})


def _block_names(stmt):
    if isinstance(stmt, s_tir.SBlockRealize):
        yield from _block_names(stmt.block)
    elif isinstance(stmt, s_tir.SBlock):
        yield stmt.name_hint
        yield from _block_names(stmt.body)
    elif isinstance(stmt, tirx.For):
        yield from _block_names(stmt.body)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from _block_names(s)
