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
     compile cache's copy of the same module), and runs on `relax.VirtualMachine`;
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

Frozen weights: the values at compile time are the ones used. Before each call the frozen
tensors are checked (same object, version counter, data pointer: an optimizer step,
load_state_dict or `p.data = ...` changes one of them); a change recompiles with the new values,
at most REFREEZES times per graph, after which the graph runs eagerly.

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
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import logging
import time
import warnings
import weakref

import numpy as np
import torch
import tvm
from tvm import relax

from ..common import cache
from ..common.targets import set_threads, thread_count
from .functional import functionalize, wrongly_imported
from .pipeline import build, llvm_target, optimize_pass

LOG = logging.getLogger("tvm_microkernels.torch")

OPTIONS = {"threads": None, "algorithm": "auto", "target": "native", "autotune": False}  # accepted names, defaults
MAX_SHAPES = 8  # compiled modules per dynamic graph
REFREEZES = 2  # recompiles after the frozen weights changed, per graph
ALIGN = 64  # bytes: what tvm.runtime.from_dlpack requires of a tensor's data pointer
_REPORTS: collections.deque = collections.deque(maxlen=256)
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # graph name -> its newest _Compiled
_COUNTER = itertools.count(1)
# Functional ops whose `training` argument switches on batch statistics or random dropout.
_TRAINING_ARG = "training"
# Modules (a graph that calls them rather than inlining them) that behave so in training mode.
_TRAINING_MODULES = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.Dropout,
                     torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
                     torch.nn.FeatureAlphaDropout)


def backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None):
    """The torch.compile backend: a callable that runs `gm` on our kernels, or `gm.forward`
    where the graph cannot run there (the module doc). Options are checked first: a wrong
    option name or value raises, it does not fall back."""
    opts = checked_options(options, mode)
    graph = _Graph(gm, list(example_inputs), opts)
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


def reports() -> list[dict]:
    """One dict per graph dynamo handed over (and per shape of a dynamic one) since the last
    clear_reports(), oldest first: where it runs ("microkernels" or "eager") and why."""
    return list(_REPORTS)


def last_report() -> dict | None:
    """The newest reports() entry, or None."""
    return _REPORTS[-1] if _REPORTS else None


def clear_reports() -> None:
    _REPORTS.clear()


def virtual_machine(graph: str):
    """The relax.VirtualMachine a graph (reports()'s "graph" name) runs on, as compiled for its
    newest input signature, while the compiled model is alive; else None. For profiling: its
    "main" takes the graph's tensor inputs (the report's "inputs") as TVM tensors."""
    compiled = _LIVE.get(graph)
    return compiled.vm if compiled is not None else None


class _Fallback(Exception):
    """A reason to run a graph eagerly (the message says which)."""


class _Compiled:
    """One graph compiled for one input-shape signature."""

    def __init__(self, main, vm):
        self.main = main
        self.vm = vm  # keeps the executable's memory alive


class _Graph:
    """A graph dynamo captured, and its compiled modules (one per shape signature)."""

    def __init__(self, gm, example_inputs: list, opts: dict):
        self.gm = gm
        self.opts = opts
        self.name = f"graph {next(_COUNTER)}"
        self.compiled: dict = {}
        self.eager = None  # the reason this graph runs eagerly, once it does
        self.refreezes = 0
        self.logged: set = set()
        self.kinds = self._input_kinds(example_inputs)
        self.tensors = [i for i, k in enumerate(self.kinds) if k == "tensor"]
        self.static = [i for i, k in enumerate(self.kinds) if k == "static"]
        self.dynamic = "size" in self.kinds or "scalar" in self.kinds
        self.frozen: list = []  # (position, tensor, version, data pointer) of what is bound
        self.output = gm.graph.find_nodes(op="output")[0].args[0]  # the graph's output structure
        self.positions = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
        self.constant_outputs = self._constant_outputs()

    # -- compile ---------------------------------------------------------------------------

    def entry(self):
        """What the backend returns: gm.forward when the graph cannot run on ours."""
        try:
            try:
                self._check_graph()
            except _Fallback as e:
                _REPORTS.append(self._entry(self.example, str(e)))
                raise
            if not self.dynamic:  # compile now: the example inputs are the shapes every call has
                self._compile(self._key(self.example), self.example)
        except _Fallback as e:
            self._fall_back(str(e))
            return self.gm.forward
        finally:
            self.example = None  # the user's first inputs, not to be kept alive
        return self

    def _input_kinds(self, example_inputs: list) -> list[str]:
        placeholders = self.gm.graph.find_nodes(op="placeholder")
        self.example = example_inputs
        kinds = []
        for i, t in enumerate(example_inputs):
            meta = placeholders[i].meta if i < len(placeholders) else {}
            if isinstance(t, torch.Tensor) and getattr(meta.get("grapharg"), "pass_arg_as_tensor", False) \
                    and t.dim() == 0:
                # A Python number dynamo passes as a 0-d tensor (dynamic=True does so for a
                # module's float attributes, batch norm's eps and momentum): a new tensor every
                # call, so it is compiled for by value, as sizes are.
                kinds.append("scalar")
            elif isinstance(t, torch.Tensor):
                static = getattr(t, "_dynamo_static_input_type", None) \
                    or meta.get("tensor_dict", {}).get("_dynamo_static_input_type")
                kinds.append("static" if static else "tensor")
            elif isinstance(t, (int, torch.SymInt)) and not isinstance(t, bool):
                kinds.append("size")
            else:
                kinds.append(f"unsupported {type(t).__name__}")
        return kinds

    def _constant_outputs(self) -> set[int]:
        """Indices (among the computed outputs) of outputs no input tensor reaches: computed from
        frozen weights alone, they are constants of the compiled module, the same memory on every
        call, so each call hands out a copy."""
        reached = set()
        for n in self.gm.graph.nodes:  # in topological order
            if (n.op == "placeholder" and self.kinds[self.positions[n]] == "tensor") \
                    or any(a in reached for a in n.all_input_nodes):
                reached.add(n)
        computed = [n for n, _ in _pairs(self.output, self.output) if n.op != "placeholder"]
        return {k for k, n in enumerate(computed) if n not in reached}

    def _check_graph(self) -> None:
        """The reasons found before exporting anything."""
        bad = [k for k in self.kinds if k.startswith("unsupported")]
        if bad:
            raise _Fallback(f"graph input of type {bad[0].split()[1]}")
        for i in self.tensors + self.static:
            t = self.example[i]
            if t.device.type != "cpu" or t.layout != torch.strided:
                raise _Fallback(f"input on {t.device}" if t.device.type != "cpu" else f"{t.layout} input")
            if t.is_floating_point() and t.dtype != torch.float32:
                raise _Fallback(f"{t.dtype} input (our kernels are float32)")
        ops = [n for n in self.gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
        if not ops:
            raise _Fallback("nothing to compute")
        for n in ops:
            if n.op == "call_function" and _training(n, self.gm):
                raise _Fallback(f"{getattr(n.target, '__name__', n.target)} in training mode")
            if n.op == "call_module" and self.gm.get_submodule(n.target).training \
                    and isinstance(self.gm.get_submodule(n.target), _TRAINING_MODULES):
                raise _Fallback(f"{n.target} in training mode")
        if not self.tensors:
            raise _Fallback("no tensor input to pass")

    def _key(self, args) -> tuple:
        if not self.dynamic:
            return ()
        return tuple(tuple(args[i].shape) if k == "tensor" else int(args[i]) if k == "size" else
                     (str(args[i].dtype), args[i].item()) for i, k in enumerate(self.kinds) if k != "static")

    def _compile(self, key: tuple, args) -> _Compiled:
        """Export, import, optimize, compile; _Fallback on any failure, or when nothing would
        run on our kernels."""
        start = time.perf_counter()
        entry = self._entry(args, "")
        _REPORTS.append(entry)
        try:
            compiled = self._build(args, entry["ops"])
        except _Fallback as e:
            entry["reason"] = str(e)
            raise
        except Exception as e:  # any failure of export/import/optimize/compile runs eagerly
            entry["reason"] = f"{type(e).__name__}: {_first_line(e)}"
            raise _Fallback(entry["reason"]) from e
        finally:
            entry["seconds"] = time.perf_counter() - start
        ours = [r for r in entry["ops"] if r.get("runs_on") == "ours"]
        convs = [r for r in entry["ops"] if r.get("op") == "conv2d"]
        entry["runs_on"] = "microkernels"
        entry["reason"] = (f"{sum(r['runs_on'] == 'ours' for r in convs)}/{len(convs)} convs and "
                           f"{len(ours) - sum(r.get('op') == 'conv2d' for r in ours)} other ops on ours")
        LOG.info("%s %s: %s, %d weights frozen (%.1f s)", self.name, entry["inputs"], entry["reason"],
                 len(self.static), entry["seconds"])
        if torch.is_grad_enabled() and any(args[i].requires_grad for i in self.static):
            self._once("frozen", "%s: grad mode is on, but the weights are frozen: outputs carry no grad")
        self.compiled[key] = compiled
        _LIVE[self.name] = compiled
        self.frozen = [(i, args[i], _version(args[i]), args[i].data_ptr()) for i in self.static]
        return compiled

    def _entry(self, args, reason: str) -> dict:
        """A reports() entry, as it stands before compiling (or when refused before that)."""
        return {"graph": self.name, "inputs": [tuple(args[i].shape) for i in self.tensors],
                "frozen": len(self.static), "runs_on": "eager", "reason": reason, "ops": [], "seconds": 0.0}

    def _build(self, args, report: list) -> _Compiled:
        from tvm.relax.frontend.torch import from_exported_program

        # A graph compiled before, by any process, with the same code, inputs, frozen values and
        # options: its library from the compile cache, with no export, import or optimize.
        gkey = self._graph_key(args) if cache.enabled() else None
        hit = self._cached(gkey, report) if gkey else None
        if hit is not None:
            return hit
        wrapper = _Frozen(self.gm, self.kinds, args, self.output)
        user = tuple(_detached(args[i]) for i in self.tensors)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree deprecation notice
            # Functionalized here rather than in the importer, so in-place updates of an input
            # or a buffer, which the VM would not make, show in the signature.
            # In-place ops on values nothing reads again become functional here (functional.py),
            # which spares the second trace run_decompositions() takes; any other graph, or one
            # with an op TVM's importer takes only decomposed, goes through it.
            ep = torch.export.export(wrapper, user)
            wrong = wrongly_imported(ep)
            if wrong:
                raise _Fallback(wrong)
            mod = _imported(ep) if functionalize(ep) else None
            if mod is None:
                ep = ep.run_decompositions()
                sig = ep.graph_signature
                if sig.buffers_to_mutate or sig.user_inputs_to_mutate:
                    raise _Fallback("the graph mutates an input or buffer in place")
                mod = from_exported_program(ep, keep_params_as_input=False, run_ep_decomposition=False)
        # build: optimize + tvm.compile, or the compile cache's copy (the frozen weights are part
        # of the module, hence of its key), so a second process compiles nothing.
        keys: list = []
        ex = build(mod, self.opts["target"], algorithm=self.opts["algorithm"], threads=self.opts["threads"],
                   report=report, autotune=self.opts["autotune"], keys=keys)
        if not any(r.get("runs_on") == "ours" for r in report):
            raise _Fallback("nothing in it runs on our kernels")
        if gkey and keys:  # the graph's entry names the model's (autotune: under its new measurements)
            cache.put(self._graph_key(args) if self.opts["autotune"] else gkey, keys[0])
        vm = relax.VirtualMachine(ex, tvm.cpu())
        return _Compiled(vm["main"], vm)

    def _graph_key(self, args) -> str:
        """The compile cache's key of this graph at these inputs: its code (dynamo writes the
        ops and every Python constant into it), the kinds and shapes of its inputs, a digest of
        the frozen tensors' values and of any tensor the graph module holds, the options."""
        h = hashlib.blake2b(digest_size=20)
        held = sorted(self.gm.state_dict(keep_vars=True).items())
        for name, t in [(f"input {i}", args[i]) for i in self.static] + held:
            t = _detached(t)
            h.update(f"{name} {tuple(t.shape)} {t.dtype}\0".encode())
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy())
        inputs = [(tuple(args[i].shape), str(args[i].dtype)) for i in self.tensors]
        return cache.key("graph", self.gm.code, tuple(self.kinds), self._key(args), inputs, h.hexdigest(),
                         sorted((k, str(v)) for k, v in self.opts.items()), torch.__version__)

    def _cached(self, gkey: str, report: list) -> _Compiled | None:
        model = cache.get(gkey)
        hit = cache.load_library(model) if isinstance(model, str) else None
        if hit is None:
            return None
        lib, meta = hit
        LOG.info("%s loaded from the compile cache (%s)", self.name, model)
        report += meta["report"]
        vm = relax.VirtualMachine(lib, tvm.cpu())
        return _Compiled(vm["main"], vm)

    def _fall_back(self, reason: str) -> None:
        self.eager = reason
        LOG.warning("%s runs eagerly: %s", self.name, reason)

    # -- call ------------------------------------------------------------------------------

    def __call__(self, *args):
        if self.eager is not None:
            return self.gm.forward(*args)
        if torch.is_grad_enabled() and any(args[i].requires_grad for i in self.tensors):
            self._once("grad", "%s: an input requires grad: these calls run eagerly (autograd)")
            return self.gm.forward(*args)
        compiled = self._compiled_for(args)
        if compiled is None:
            return self.gm.forward(*args)
        set_threads(self.opts["threads"])
        out = compiled.main(*(self._to_tvm(args, i) for i in self.tensors))
        if hasattr(out, "__dlpack__"):
            out = [out]
        out = [torch.from_dlpack(o) for o in out]
        for k in self.constant_outputs:
            out[k] = out[k].clone()
        return self._structured(out, args)

    def _compiled_for(self, args) -> _Compiled | None:
        """The module for these inputs: compiled now for a new shape, or again after the frozen
        weights changed; None where the graph or this shape runs eagerly."""
        key = self._key(args)
        try:
            if not self._weights_unchanged(args):
                if self.refreezes >= REFREEZES:
                    raise _Fallback(f"frozen weights changed more than {REFREEZES} times")
                self.refreezes += 1
                LOG.info("%s: frozen weights changed since compile; compiling again with the new values", self.name)
                self.compiled.clear()
            compiled = self.compiled.get(key)
            if compiled is None:
                if len(self.compiled) >= MAX_SHAPES:
                    self._once("shapes", f"%s: more than {MAX_SHAPES} shapes; new ones run eagerly")
                    return None
                compiled = self._compile(key, args)
        except _Fallback as e:
            self._fall_back(str(e))
            return None
        return compiled

    def _weights_unchanged(self, args) -> bool:
        """The frozen tensors are the ones bound, unchanged: the same objects (a new Parameter
        in the module changes the object), the same version counter (every in-place update bumps
        it) and data pointer (`p.data = ...` does not bump it). About 60 us for ResNet-50's 320."""
        for i, t, version, ptr in self.frozen:
            a = args[i]
            if a is not t or (version is not None and a._version != version) or a.data_ptr() != ptr:
                return False
        return True

    def _to_tvm(self, args, i: int):
        t = _detached(args[i])
        if not t.is_contiguous() or t.data_ptr() % ALIGN:
            why = "not contiguous" if not t.is_contiguous() else f"not {ALIGN}-byte aligned"
            self._once(("copy", i), f"%s: input {i} is {why}: copied before each call")
            t = aligned_copy(t)
        return tvm.runtime.from_dlpack(t)

    def _structured(self, computed: list, args):
        """The VM's outputs (the graph's computed tensors, in output order) in the graph's own
        output structure; outputs that are graph inputs are those inputs, as eagerly."""
        it = iter(computed)

        def leaf(node):
            return args[self.positions[node]] if node.op == "placeholder" else next(it)

        return _rebuild(self.output, leaf)

    def _once(self, what, message: str) -> None:
        if what not in self.logged:
            self.logged.add(what)
            LOG.info(message, self.name)


class _Frozen(torch.nn.Module):
    """The graph as torch.export sees it: the frozen inputs are buffers (constants after the
    import), sizes are the call's values, the user's tensors are the only arguments, and the
    outputs are the graph's computed tensors, flattened."""

    def __init__(self, gm, kinds: list[str], args, output):
        super().__init__()
        self.graph_module = gm
        self.kinds = kinds
        self.output = output
        self.sizes = {i: int(a) for i, (k, a) in enumerate(zip(kinds, args)) if k == "size"}
        self.scalars = {i: (a.item(), a.dtype) for i, (k, a) in enumerate(zip(kinds, args)) if k == "scalar"}
        for i, k in enumerate(kinds):
            if k == "static":
                self.register_buffer(f"frozen_{i}", args[i].detach())

    def forward(self, *tensors):
        it = iter(tensors)
        args = [getattr(self, f"frozen_{i}") if k == "static" else self.sizes[i] if k == "size" else
                torch.tensor(self.scalars[i][0], dtype=self.scalars[i][1]) if k == "scalar" else next(it)
                for i, k in enumerate(self.kinds)]
        computed = []
        for node, value in _pairs(self.output, self.graph_module(*args)):
            if node.op != "placeholder":
                if not isinstance(value, torch.Tensor):
                    raise _Fallback(f"the graph returns a {type(value).__name__}")
                computed.append(value)
        return tuple(computed)


def _imported(ep):
    """TVM's import of `ep` as exported (no decomposition), or None where the importer takes one
    of its ops only decomposed (its table names most ops at both levels)."""
    from tvm.relax.frontend.torch import from_exported_program

    try:
        return from_exported_program(ep, keep_params_as_input=False, run_ep_decomposition=False)
    except Exception as e:  # noqa: BLE001 (the importer asserts, or fails inside a converter)
        LOG.debug("importing the graph undecomposed failed (%s); decomposing it first", _first_line(e))
        return None


def _rebuild(struct, leaf):
    """`struct` (the output node's argument: nodes in tuples, lists, dicts) with each node
    replaced by leaf(node); FX's immutable containers become plain ones, as gm.forward returns."""
    if isinstance(struct, torch.fx.Node):
        return leaf(struct)
    if isinstance(struct, tuple):
        return type(struct)(*(_rebuild(s, leaf) for s in struct)) if hasattr(struct, "_fields") \
            else tuple(_rebuild(s, leaf) for s in struct)
    if isinstance(struct, list):
        return [_rebuild(s, leaf) for s in struct]
    if isinstance(struct, dict):
        return {k: _rebuild(v, leaf) for k, v in struct.items()}
    return struct


def _pairs(struct, value):
    """(node, value) for each node of `struct` and the value at its place in `value`."""
    if isinstance(struct, torch.fx.Node):
        yield struct, value
    elif isinstance(struct, (tuple, list)):
        for s, v in zip(struct, value, strict=True):
            yield from _pairs(s, v)
    elif isinstance(struct, dict):
        for k, s in struct.items():
            yield from _pairs(s, value[k])


def aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `t` whose data starts on an ALIGN-byte boundary, copied by numpy on
    this thread. torch's copy_ runs on its OpenMP pool at more than one thread, and the worker it
    wakes spins on a core after the copy, right when TVM's pool starts the model there: on the
    Zen 3 at 2 threads, MobileNetV3-Large from a numpy-backed (16-byte aligned) input took
    19.9 ms per call that way, against 10.4 ms from an aligned one and 9.9 ms for the VM alone."""
    nbytes = t.numel() * t.element_size()
    buf = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
    off = (-buf.data_ptr()) % ALIGN
    out = buf[off:off + nbytes].view(t.dtype).view(t.shape)
    try:
        np.copyto(out.numpy(), t.numpy())
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16): torch's own copy
        out.copy_(t)
    return out


def _detached(t: torch.Tensor) -> torch.Tensor:
    return t.detach() if t.requires_grad else t


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter: their in-place updates go unseen
        return None


def _training(node, gm) -> bool:
    """A functional call with training=True (F.batch_norm with batch statistics, F.dropout...)."""
    if node.kwargs.get(_TRAINING_ARG) is True:
        return True
    try:
        normalized = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True)
    except Exception:  # noqa: BLE001 - ambiguous schemas (torch.conv2d's overloads): no training argument
        return False
    return normalized is not None and normalized.kwargs.get(_TRAINING_ARG) is True


def _first_line(e: Exception) -> str:
    lines = [s for s in str(e).splitlines() if s.strip()]
    return lines[0][:300] if lines else ""
