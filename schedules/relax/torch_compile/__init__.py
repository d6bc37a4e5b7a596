"""`torch.compile(model, backend="microkernels")`: each graph dynamo captures runs on our kernels.

The backend is registered through the `torch_dynamo_backends` entry point (pyproject.toml), so
torch finds it by name without an import. Per captured FX graph:
  1. inputs are sorted: the module's parameters and buffers, which dynamo (inlining the module,
     torch >= 2.5) passes as graph inputs marked `_dynamo_static_input_type` (every nn.Parameter
     and every tensor attribute of a module), are *frozen*: bound as constants, so the Relax pass
     folds the batch norms into the convs and packs the weights at compile time (as inductor's
     freezing does). The other tensors stay inputs of the VM function. Dynamo's size symbols
     (SymInt inputs of a dynamic graph) and the Python numbers it passes as 0-d tensors
     (`dynamic=True` does so with batch norm's eps) are taken at the call being compiled;
  2. the graph, with the frozen tensors as buffers of a wrapper module, goes through
     torch.export (functionalized), `tvm.relax.frontend.torch.from_exported_program(
     keep_params_as_input=False)` and `build` (pipeline.py: `optimize` and `tvm.compile`, or the
     compile cache's copy of the same module), and runs on a `relax.VirtualMachine` per thread;
  3. calls pass torch tensors to the VM and back through DLPack, without copies: an input that is
     not contiguous or not 64-byte aligned (TVM's DLPack import refuses both) is copied into an
     aligned buffer first, and an output computed from the weights alone (a constant of the
     module, the same memory on every call) is copied out; outputs come back in the structure
     the graph returns. Outputs carry no autograd history (the weights are constants).

A graph runs eagerly instead (`gm.forward`, a graph break in spirit, logged once on the
"tvm_microkernels.torch" logger with the reason) when: an input is not a dense CPU tensor or a
size; a floating input is not float32; an op runs in training mode (batch norm with batch
statistics, active dropout); the graph updates an input or a buffer in place; it holds an op
TVM's importer would compute wrongly (functional.wrongly_imported: avg_pool2d's
divisor_override); export, import, optimize or compile fails; or nothing in it would run on our
kernels. A call runs eagerly when
grad mode is on and a non-frozen input requires grad (autograd needs the eager graph).

Frozen weights: the values at compile time are the ones used. Every write to a frozen tensor
after that (in place through it, its `.data` or a view, `p.data = ...`, load_state_dict, on
inference tensors too) is seen before the next call (frozen.py: copy-on-write storages, or a
comparison with a copy where the memory has other holders); a change recompiles with the new
values, at most REFREEZES times per graph, after which the graph runs eagerly.

Threads: a compiled model is callable from several threads at once, as an eager module is. The
compiled executable is shared, each thread runs a VM of its own (made on its first call), and
the check of the frozen tensors and any compile a call needs run under the graph's lock, so a
shape two threads meet at once compiles once.

Shapes: dynamo guards on input shapes, so a new shape recompiles. Dynamic graphs (`dynamic=True`,
or dynamo's automatic dynamic shapes after a shape change) are compiled for each concrete
signature they meet (shapes, sizes, those numbers), since our kernels are planned for static
shapes: one compiled module per signature, up to MAX_SHAPES per graph, then new ones run eagerly.

`options` (torch.compile(..., options={...})): "threads" (the TVM thread pool size for planning
and running; default one per core), "algorithm" ("auto" or "direct"), "autotune" (True: time each
conv layer's plans on this host first, see conv2d) and "target" (a preset name or a
tvm.target.Target, default "native") go to `optimize`; any other name, or a value optimize
refuses, raises (torch wraps it in BackendCompilerFailed).

What ran where: `reports()` lists one dict per graph dynamo handed over, and per signature of a
dynamic one ("graph", "inputs", "frozen", "runs_on": "microkernels" or "eager", "reason", "ops":
optimize's per-op report, "seconds"), `last_report()` is the newest, `clear_reports()` empties it.

Modules: graph.py (a captured graph: compile, call, threads), frozen.py (the export wrapper and
the frozen tensors' watch), values.py (tensors in and out), report.py (reports, the logger).
"""

from __future__ import annotations

from ...common.targets import set_threads, thread_count
from ..pipeline import build, llvm_target, optimize_pass
from .graph import MAX_SHAPES, REFREEZES, Compiled, Graph, imported
from .report import LOG, Fallback, clear_reports, last_report, reports, virtual_machine
from .values import ALIGN, aligned_copy

__all__ = ["ALIGN", "LOG", "MAX_SHAPES", "OPTIONS", "REFREEZES", "Fallback", "aligned_copy", "backend", "build",
           "checked_options", "clear_reports", "last_report", "reports", "set_threads", "virtual_machine"]

OPTIONS = {"threads": None, "algorithm": "auto", "target": "native", "autotune": False}  # accepted names, defaults


def backend(gm, example_inputs, options: dict | None = None, mode: str | None = None):
    """The torch.compile backend: a callable that runs `gm` on our kernels, or `gm.forward`
    where the graph cannot run there (the module doc). Options are checked first: a wrong
    option name or value raises, it does not fall back."""
    opts = checked_options(options, mode)
    graph = Graph(gm, list(example_inputs), opts)
    return graph.entry()


def checked_options(options: dict | None, mode: str | None = None) -> dict:
    """OPTIONS updated with `options`, each value checked by optimize_pass's own checks."""
    if mode not in (None, "default"):
        raise ValueError(f"torch.compile mode={mode!r} means nothing to the microkernels backend; "
                         f"pass options={{...}} with any of {sorted(OPTIONS)}")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for the microkernels backend; "
                         f"accepted: {', '.join(sorted(OPTIONS))}")
    opts = {**OPTIONS, **options}
    opts["threads"] = thread_count(opts["threads"])
    # refuses a bad target, algorithm or autotune
    optimize_pass(opts["target"], opts["algorithm"], opts["threads"], autotune=opts["autotune"])
    llvm_target(opts["target"])
    return opts
