"""Assembly of every Winograd transform kernel, compiled through its intrinsic as one transform
inside larger buffers (golden.compiled_function, the module its golden dump shows). Nothing is
run, so the AVX-512 kernels are checked on any host."""

from collections import defaultdict

import pytest

from intrinsics import golden
from microkernels import asm
from microkernels.f32_wino import BLOCK

CASES = golden.wino_cases()
REG = {512: "zmm", 256: "ymm"}

# Stack accesses measured with LLVM as TVM 0.27 ships it. Each pass is a loop over lines whose
# body is one 1-D transform, so only q inputs and the temporaries are live; the F(6) input
# transform on AVX2 needs one register more than the 16 ymm and spills one value (a store and
# a reload). A change either way fails, so the table follows the kernels.
KNOWN_STACK_ACCESSES = {"mk_f32_wino_in_6x3_avx2": 2}


@pytest.fixture(scope="module", params=CASES, ids=lambda k: k.name)
def compiled(request):
    kern = request.param
    return kern, golden.compiled_function(kern)


def folded(prog) -> int:
    """Operations of one 1-D program that LLVM is entitled to fold away: a multiply by -1 whose
    result is not an output is an fneg, absorbed by its user (fadd becomes fsub; an FMA takes
    fmsub/fnmadd); a multiply whose one user is an add or subtract (one per user) is fused with
    it into an FMA, as TVM compiles with floating-point contraction on."""
    users = defaultdict(list)
    for op in prog.ops:
        for v in (op.a, op.b):
            users[v].append(op)
    count, fused_into = 0, set()
    for op in prog.ops:
        if op.code != "mul" or op.dst in prog.outputs:
            continue
        if op.c == -1:
            count += 1
        elif len(users[op.dst]) == 1 and users[op.dst][0].code in ("add", "sub") and users[op.dst][0].dst not in fused_into:
            fused_into.add(users[op.dst][0].dst)
            count += 1
    return count


def static_ops(kern) -> int:
    """Arithmetic instructions in the code: each lane chunk has two loops (pass 1 over columns,
    pass 2 over rows), each with one 1-D program as its body."""
    return 2 * (kern.program.count - folded(kern.program)) * (BLOCK // kern.isa.lanes)


def test_arithmetic_is_the_program(compiled):
    """The packed-single arithmetic (add, sub, mul, FMA forms, sign-flip xor) is all on the ISA's
    vector registers, and there is exactly static_ops of it: the 1-D program twice per lane
    chunk, less what `folded` says LLVM fuses. An instruction more is work the program does not
    do; one fewer, part of the program is dead or the passes were unrolled and merged. What a
    call executes, vector_ops, stays below the dense matrix products' count."""
    kern, fn = compiled
    reg = REG[kern.isa.vector_bits]
    arith = asm.vector_arithmetic(fn)
    stray = {cls: ins[:3] for cls, ins in arith.items() if cls != reg}
    assert not stray, f"{kern.name}: arithmetic off the {reg} registers: {stray}"
    count = len(arith.get(reg, []))
    assert count == static_ops(kern), \
        f"{kern.name}: {count} arithmetic instructions, expected {static_ops(kern)} ({folded(kern.program)} folded per pass)"
    assert kern.vector_ops < kern.dense_vector_ops


def test_passes_are_loops_not_unrolled(compiled):
    """Two backward branches per lane chunk: the passes stayed loops, which is what keeps a
    tile's pass-1 result in memory instead of live in registers."""
    kern, fn = compiled
    loops = asm.single_block_loops(fn)
    assert len(loops) == 2 * (BLOCK // kern.isa.lanes), f"{kern.name}: {len(loops)} loops"


def test_stack_traffic_is_the_known_spills(compiled):
    """No stack access beyond the spills measured in KNOWN_STACK_ACCESSES (none for a kernel
    not listed); a change either way fails, so the table follows the kernels."""
    kern, fn = compiled
    found = asm.stack_accesses(fn)
    assert len(found) == KNOWN_STACK_ACCESSES.get(kern.name, 0), f"{kern.name}: {len(found)} stack accesses: {found[:4]}"
