"""Parsing the TVMScript text this library generates, without two costs that buy it nothing.

Every template (intrinsic descriptions and implementations, layer schedules) is text parsed
into a PrimFunc, dozens per network, so the parser's fixed costs add up to seconds:
- `@T.prim_func(...)`: TVM's decorator starts with inspect.stack(), which reads the source
  line of every frame on the stack, to find the Python variables a decorated function closes
  over. Generated text closes over nothing (its names come in `names`), and the parser needs
  only the decorator's dispatch token; it reads the keywords (s_tir=True) from the syntax tree.
  Deep inside a Relax pass that call cost about as much as parsing a small function.
- The well-formedness check after parsing: the templates are fixed code, their output the
  same shapes of TIR every time. The test suite turns it on (CHECK_WELL_FORMED, conftest.py),
  where a template that writes malformed TIR fails loudly.
Together: 37 ms to 17 ms for a direct conv layer's schedule text.
"""

from __future__ import annotations

import types

from tvm.script import parser
from tvm.script import tirx as T

from . import interrupts

CHECK_WELL_FORMED = False


class _TirToken:
    dispatch_token = "tirx"


# The `T` the text sees: TVM's own, but for a prim_func that returns the dispatch token at once.
_T = types.ModuleType("T")
_T.__dict__.update(vars(T))
_T.prim_func = lambda **_: _TirToken


def parse(text: str, **names):
    """The PrimFunc of TVMScript `text` written with `T` (tvm.script.tirx); `names` are the
    other Python values it refers to. A Ctrl-C meanwhile is raised once TVM has parsed (its
    parser would drop it: interrupts.py)."""
    with interrupts.deferred():
        return parser.parse(text, extra_vars={"T": _T, **names}, check_well_formed=CHECK_WELL_FORMED)
