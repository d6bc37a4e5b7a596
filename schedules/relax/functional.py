"""An exported program imported as exported: its in-place ops as their functional forms, where
that changes nothing, so the torch.compile backend can skip `run_decompositions()`.

torch.export's graph keeps in-place ops (`relu_`, `add_`, `hardswish_`, `silu_`, `dropout_`:
`nn.ReLU(inplace=True)`, `out += identity`), which the VM would not carry out. Functionalizing
them is what `run_decompositions()` does, by tracing the whole graph again: on a 2-core Zen 3,
2.5 s of ResNet-50's first call and 5.0 s of DenseNet-121's, for graphs whose in-place ops are
almost always on a value nothing reads afterwards.

TVM's importer names most ops at both levels, but not every undecomposed converter is right:
TVM 0.27's `batch_norm.default` reads momentum as epsilon and sets training. So the graph is
taken as it is only when each op is one of `OPS`, whose conversion tests/schedules/relax/
test_functional.py checks against eager op by op; batch_norm (inference) is rewritten first into
the `_native_batch_norm_legit_no_training` the decomposition would make.

`functionalize(ep)` replaces `op_(x, ...)` by `op(x, ...)` when that is exact:
  - x is a fresh tensor made by an op of this graph (not an input, a weight or a buffer, and not
    a view or alias of anything), or the output of an in-place op replaced before;
  - every other user of x comes before the in-place op (it read the value before the update, as
    the functional form gives it) and makes a fresh tensor (no view of x sees the update);
  - only x is written, and `op` exists with the same overload and writes nothing.
It returns whether the graph is then free of mutation and made of `OPS` alone; on False, the
graph may be partly rewritten, every rewrite exact, and the caller runs `run_decompositions()`
on it as before.
"""

from __future__ import annotations

import operator

import torch

aten = torch.ops.aten
# The ops taken undecomposed (after the in-place ones become functional): those of the zoo's
# classifiers, each checked against eager (module doc).
OPS = frozenset([
    aten.adaptive_avg_pool2d.default, aten.add.Tensor, aten.avg_pool2d.default, aten.cat.default,
    aten.chunk.default, aten.contiguous.default, aten.conv2d.default, aten.dropout.default,
    aten.flatten.using_ints, aten.gelu.default, aten.hardsigmoid.default, aten.hardswish.default,
    aten.hardtanh.default, aten.layer_norm.default, aten.linear.default, aten.max_pool2d.default, aten.mean.dim,
    aten.mul.Tensor, aten.permute.default, aten.relu.default, aten.relu6.default, aten.sigmoid.default, aten.silu.default,
    aten.transpose.int, aten.view.default, aten._native_batch_norm_legit_no_training.default,
])


def _schema(node):
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _fresh(node, replaced: set) -> bool:
    """Whether `node` makes a tensor of its own (no alias of an input, weight or other value)."""
    if node in replaced:
        return True
    if node.op == "call_function" and node.target is operator.getitem:  # an output of a multi-output op
        return _fresh(node.args[0], replaced)
    s = _schema(node)
    return s is not None and not s.is_mutable and all(r.alias_info is None for r in s.returns)


def _functional_op(target):
    """The functional overload of in-place `target` (aten.relu_.default -> aten.relu.default), or None."""
    name = target.overloadpacket.__name__
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    op = getattr(packet, target._overloadname, None) if packet is not None else None
    return op if op is not None and not op._schema.is_mutable else None


def _inference_batch_norm(graph, node) -> bool:
    """Replace batch_norm.default in inference (training=False, all four tensors given) by
    _native_batch_norm_legit_no_training and its first output; False where it is not one."""
    x, w, b, mean, var, training, momentum, eps = (list(node.args) + [None] * 9)[:8]
    if training is not False or any(t is None for t in (w, b, mean, var)) or node.kwargs:
        return False
    with graph.inserting_before(node):
        bn = graph.call_function(aten._native_batch_norm_legit_no_training.default, (x, w, b, mean, var, momentum, eps))
        out = graph.call_function(operator.getitem, (bn, 0))
    val = node.meta.get("val")
    if val is not None:
        out.meta["val"] = val
        bn.meta["val"] = (val, None, None)
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    return True


def functionalize(ep) -> bool:
    """Rewrite `ep`'s exactly-functionalizable in-place ops and its inference batch norms (module
    doc); True when no mutation is left and every op is one of OPS."""
    graph = ep.graph_module.graph
    replaced: set = set()  # in-place nodes made functional
    clean, changed = True, False
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.batch_norm.default:
            rewritten = _inference_batch_norm(graph, node)
            clean, changed = clean and rewritten, changed or rewritten
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        s = _schema(node)
        if s is None:
            if node.op == "call_function" and node.target is not operator.getitem:
                clean = False  # a Python callable: nothing says what it writes
            continue
        if not s.is_mutable:
            clean = clean and node.target in OPS
            continue
        writes = [i for i, a in enumerate(s.arguments) if a.alias_info is not None and a.alias_info.is_write]
        op = _functional_op(node.target)
        x = node.args[0] if node.args else None
        if op is None or writes != [0] or not hasattr(x, "users") or not _fresh(x, replaced) \
                or any(u is not node and (order[u] > order[node] or not _fresh(u, replaced)) for u in x.users):
            clean = False
            continue
        node.target = op
        replaced.add(node)
        clean = clean and op in OPS
    if replaced or changed:
        ep.graph_module.recompile()
    return clean


def wrongly_imported(ep) -> str | None:
    """Why TVM 0.27's importer would compute this graph wrongly, decomposed or not, or None:
    avg_pool2d with divisor_override (the converter ignores it and divides by the window)."""
    for node in ep.graph_module.graph.nodes:
        if node.op == "call_function" and node.target is aten.avg_pool2d.default:
            args = list(node.args) + [None] * 7
            if (node.kwargs.get("divisor_override") or args[6]) is not None:
                return "avg_pool2d with divisor_override, which TVM's importer ignores"
    return None
