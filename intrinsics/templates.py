"""The TVMScript every conv-family intrinsic writes alike (f32_conv's tiles, f32_dwconv's rows,
int_conv's tiles): the element body and epilogue a description shares with the schedule's
blocks, and the frame (signature, buffers, root reads and writes) a description shares with
its implementation."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import tvm

from . import registry
from .script import parse

DEFAULT_CLIP = (0.0, 6.0)  # ReLU6


def element_body(c_ref: str, a_ref: str, b_ref: str, red: list[tuple[str, int]], indent: str,
                 bias_ref: str | None = None, res_ref: str | None = None, act: str | None = None,
                 clip: tuple[float, float] = DEFAULT_CLIP, init: bool = True) -> list[str]:
    """TVMScript of one output element: zero (unless not `init`: the reduction adds to what C
    holds), the reduction loops over `red`, the epilogue.

    The single spelling of the statement sequence, used by the description here and by the
    convolution schedule's blocks, which tensorize can only match if they are identical.
    """
    if not red:  # one product: a single statement, so the block stays complete (vectorizable)
        product = f"{a_ref} * {b_ref}" if init else f"{c_ref} + {a_ref} * {b_ref}"
        return [f"{indent}{c_ref} = {epilogue_expr(product, bias_ref, res_ref, act, clip)}"]
    lines = [f"{indent}{c_ref} = T.float32(0)"] if init else []
    lines.append(f"{indent}for {', '.join(n for n, _ in red)} in T.grid({', '.join(str(e) for _, e in red)}):")
    lines.append(f"{indent}    {c_ref} = {c_ref} + {a_ref} * {b_ref}")
    value = epilogue_expr(c_ref, bias_ref, res_ref, act, clip)
    if value != c_ref:
        lines.append(f"{indent}{c_ref} = {value}")
    return lines


def epilogue_expr(value: str, bias_ref: str | None = None, res_ref: str | None = None, act: str | None = None,
                  clip: tuple[float, float] = DEFAULT_CLIP) -> str:
    """TVMScript of the epilogue applied to `value`, in the kernel's order: + bias, + residual, act."""
    if bias_ref:
        value = f"{value} + {bias_ref}"
    if res_ref:
        value = f"{value} + {res_ref}"
    # The bound first: TVM lowers max(a, b) to a > b ? a : b, so a NaN value passes through, as
    # it does through the unfused np.maximum / torch.relu / torch.clamp (one vmaxps all the same).
    if act == "relu":
        value = f"T.max(T.float32(0), {value})"
    elif act == "clip":
        value = f"T.min({f32(clip[1])}, T.max({f32(clip[0])}, {value}))"
    elif act is not None:
        value = VECTOR_ACTIVATION_EXPRS[act].format(v=f"({value})")
    return value


# The vector math's activations (microkernels.VECTOR_ACTIVATIONS) as TIR: what the kernel's
# epilogue computes, for the description tensorize matches (both sides write the same text);
# nothing lowers these where a kernel applies them, and Winograd's output transform, which
# would, refuses them (schedules/conv/winograd.refusal).
VECTOR_ACTIVATION_EXPRS = {
    "sigmoid": "T.sigmoid({v})",
    "silu": "{v} * T.sigmoid({v})",
    "tanh": "T.tanh({v})",
    "gelu": "{v} * (T.float32(0.5) + T.float32(0.5) * T.erf({v} * T.float32(0.7071067811865476)))",
    "gelu_tanh": ("T.float32(0.5) * {v} * (T.float32(1) + T.tanh(T.float32(0.7978845608028654) * "
                  "({v} + T.float32(0.044715) * {v} * {v} * {v})))"),
    "hardsigmoid": "T.min(T.max({v} + T.float32(3), T.float32(0)), T.float32(6)) / T.float32(6)",
    "hardswish": "{v} * T.min(T.max({v} + T.float32(3), T.float32(0)), T.float32(6)) / T.float32(6)",
}


def f32(v: float) -> str:
    """A float32 constant as TVMScript; an infinite clip bound (no clamp on that side) by name,
    since repr's inf would read as a variable."""
    return f'T.float32("{v!r}")' if math.isinf(v) else f"T.float32({v!r})"


class Operand(NamedTuple):
    """One buffer of an intrinsic: its parameter, its name, shape and dtype, and its strides as
    TVMScript (None: compact)."""

    param: str
    name: str
    shape: tuple
    dtype: str = "float32"
    strides: str | None = None


def frame(operands: list[Operand], reads_output: bool = True) -> list[str]:
    """The signature, the buffers and the root block's reads and writes of an intrinsic whose
    operands are given in parameter order, the output last: what a description and its
    implementation share. The output leads the reads, as in the block TIR infers around an
    update that reads it, which is the block tensorize builds around the workload's loops;
    a beta=0 intrinsic (reads_output=False) reads no output, as the block around a reduction
    with its init."""
    region = lambda o: f"{o.name}[{', '.join(f'0:{e}' for e in o.shape)}]"  # noqa: E731
    out = operands[-1]
    return [
        "@T.prim_func(s_tir=True)",
        f"def f({', '.join(f'{o.param}: T.handle' for o in operands)}):",
        *(f"    {o.name} = T.match_buffer({o.param}, {o.shape}, '{o.dtype}', offset_factor=1"
          + (f", strides={o.strides})" if o.strides else ")") for o in operands),
        "    with T.sblock('root'):",
        f"        T.reads({', '.join(region(o) for o in ([out] if reads_output else []) + operands[:-1])})",
        f"        T.writes({region(out)})",
    ]


def free_stride(_name: str) -> str:
    """A description's spelling of a free stride: a fresh variable, which nothing names."""
    return "T.int32()"


def implementation_text(frame_of, body: list[str]) -> str:
    """An implementation: `frame_of(stride)` with each stride spelled by its name and declared
    after the signature (the first two lines), for `body` to pass to the kernel; `body` runs
    under the attribute that carries the kernel's IR, `kernel_ir`, into the module that uses it
    (LLVM links and inlines it there)."""
    names: list[str] = []

    def named(name: str) -> str:
        names.append(name)
        return name

    lines = frame_of(named)
    return template(lines[:2] + [f"    {n} = T.int32()" for n in names] + lines[2:]
                    + ["        with T.attr(0, 'pragma_import_llvm', kernel_ir):"] + body)


def register_text(name: str, description: str, implementation: str, kernel_ir: str) -> str:
    """Register a description and an implementation written as TVMScript; the implementation
    names the kernel's IR `kernel_ir`."""
    return registry.register(name, parse(description), parse(implementation, kernel_ir=kernel_ir))


# A count no template writes for any other reason (a prime past 2**20): the text of a tile
# rendered with it for one of its extents parses once for every value of that extent.
SYMBOL = 1048583


@functools.lru_cache(maxsize=None)
def _symbolic(text: str, kernel_ir: str | None):
    if str(SYMBOL) not in text:
        raise ValueError(f"the template was not rendered with SYMBOL ({SYMBOL}) for the extent to specialize")
    lines = text.split("\n")
    i = next(k for k, line in enumerate(lines) if line.startswith("def f("))
    lines[i] = lines[i][:-len("):")] + ", symbol_: T.int32):"
    names = {"kernel_ir": kernel_ir} if kernel_ir is not None else {}
    return parse("\n".join(lines).replace(str(SYMBOL), "symbol_"), **names)


def specialized(text: str, value: int, kernel_ir: str | None = None):
    """The PrimFunc of `text` (rendered with SYMBOL for one extent) with that extent `value`.

    The text is parsed once with SYMBOL as a trailing int32 parameter, then PrimFunc.specialize
    binds it: 0.3 ms instead of a 40 ms parse. The result is the PrimFunc a parse of the text
    rendered with `value` would give, structurally, as long as SYMBOL appears in the text only
    as the extent itself, never folded into another number (tests/intrinsics/test_templates.py
    holds conv tiles of every kind to that)."""
    f = _symbolic(text, kernel_ir)
    return f.specialize({f.params[-1]: tvm.tirx.IntImm("int32", value)})


def template(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"
