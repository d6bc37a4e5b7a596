"""A graph dynamo captured, compiled per input signature and called (the package doc says how)."""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
import warnings

import torch
import tvm
from tvm import relax

from ...common import cache
from ...common.targets import set_threads
from ..functional import functionalize, wrongly_imported
from ..pipeline import build
from .frozen import Frozen, Weights
from .report import LIVE, LOG, REPORTS, Fallback, first_line
from .values import ALIGN, aligned_copy, detached, pairs, rebuild

MAX_SHAPES = 8  # compiled modules per dynamic graph
REFREEZES = 2  # recompiles after the frozen weights changed, per graph
_COUNTER = itertools.count(1)
# Functional ops whose `training` argument switches on batch statistics or random dropout.
_TRAINING_ARG = "training"
# Modules (a graph that calls them rather than inlining them) that behave so in training mode.
_TRAINING_MODULES = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.Dropout,
                     torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
                     torch.nn.FeatureAlphaDropout)


class Compiled:
    """One graph compiled for one input-shape signature: its executable, shared, and a VM per
    calling thread (a VM's registers and frames are its own state: two threads on one VM
    crashed, "Check failed: reg < frame->register_file.size()"), made on a thread's first call."""

    def __init__(self, executable):
        self.executable = executable
        self.local = threading.local()
        self.vm = self._vm()  # the compiling thread's, which virtual_machine() hands to profilers

    def _vm(self):
        vm = relax.VirtualMachine(self.executable, tvm.cpu())
        self.local.vm, self.local.main = vm, vm["main"]
        return vm

    def main(self, *args):
        """The graph's function on this thread's VM."""
        try:
            fn = self.local.main
        except AttributeError:
            self._vm()
            fn = self.local.main
        return fn(*args)


class Graph:
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
        self.weights: Weights | None = None  # the frozen tensors bound, and their watch
        # Held while a call checks the frozen tensors and finds (or compiles) its module: two
        # threads meeting a new shape compile it once; the VMs then run outside it.
        self.lock = threading.Lock()
        self.output = gm.graph.find_nodes(op="output")[0].args[0]  # the graph's output structure
        self.positions = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
        self.constant_outputs = self._constant_outputs()

    # -- compile ---------------------------------------------------------------------------

    def entry(self):
        """What the backend returns: gm.forward when the graph cannot run on ours."""
        try:
            try:
                self._check_graph()
            except Fallback as e:
                REPORTS.append(self._entry(self.example, str(e)))
                raise
            if not self.dynamic:  # compile now: the example inputs are the shapes every call has
                self._compile(self._key(self.example), self.example)
        except Fallback as e:
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
        computed = [n for n, _ in pairs(self.output, self.output) if n.op != "placeholder"]
        return {k for k, n in enumerate(computed) if n not in reached}

    def _check_graph(self) -> None:
        """The reasons found before exporting anything."""
        bad = [k for k in self.kinds if k.startswith("unsupported")]
        if bad:
            raise Fallback(f"graph input of type {bad[0].split()[1]}")
        for i in self.tensors + self.static:
            t = self.example[i]
            if t.device.type != "cpu" or t.layout != torch.strided:
                raise Fallback(f"input on {t.device}" if t.device.type != "cpu" else f"{t.layout} input")
            if t.is_floating_point() and t.dtype != torch.float32:
                raise Fallback(f"{t.dtype} input (our kernels are float32)")
        ops = [n for n in self.gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
        if not ops:
            raise Fallback("nothing to compute")
        for n in ops:
            if n.op == "call_function" and _training(n, self.gm):
                raise Fallback(f"{getattr(n.target, '__name__', n.target)} in training mode")
            if n.op == "call_module" and self.gm.get_submodule(n.target).training \
                    and isinstance(self.gm.get_submodule(n.target), _TRAINING_MODULES):
                raise Fallback(f"{n.target} in training mode")
        if not self.tensors:
            raise Fallback("no tensor input to pass")

    def _key(self, args) -> tuple:
        if not self.dynamic:
            return ()
        return tuple(tuple(args[i].shape) if k == "tensor" else int(args[i]) if k == "size" else
                     (str(args[i].dtype), args[i].item()) for i, k in enumerate(self.kinds) if k != "static")

    def _compile(self, key: tuple, args) -> Compiled:
        """Export, import, optimize, compile; Fallback on any failure, or when nothing would
        run on our kernels."""
        start = time.perf_counter()
        entry = self._entry(args, "")
        REPORTS.append(entry)
        try:
            compiled = self._build(args, entry["ops"])
        except Fallback as e:
            entry["reason"] = str(e)
            raise
        except Exception as e:  # any failure of export/import/optimize/compile runs eagerly
            entry["reason"] = f"{type(e).__name__}: {first_line(e)}"
            raise Fallback(entry["reason"]) from e
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
        LIVE[self.name] = compiled
        self.weights = Weights({i: args[i] for i in self.static})
        self._tell_unwatched()
        return compiled

    def _entry(self, args, reason: str) -> dict:
        """A reports() entry, as it stands before compiling (or when refused before that)."""
        return {"graph": self.name, "inputs": [tuple(args[i].shape) for i in self.tensors],
                "frozen": len(self.static), "runs_on": "eager", "reason": reason, "ops": [], "seconds": 0.0}

    def _build(self, args, report: list) -> Compiled:
        from tvm.relax.frontend.torch import from_exported_program

        # A graph compiled before, by any process, with the same code, inputs, frozen values and
        # options: its library from the compile cache, with no export, import or optimize.
        gkey = self._graph_key(args) if cache.enabled() else None
        hit = self._cached(gkey, report) if gkey else None
        if hit is not None:
            return hit
        wrapper = Frozen(self.gm, self.kinds, args, self.output)
        user = tuple(detached(args[i]) for i in self.tensors)
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
                raise Fallback(wrong)
            mod = imported(ep) if functionalize(ep) else None
            if mod is None:
                ep = ep.run_decompositions()
                sig = ep.graph_signature
                if sig.buffers_to_mutate or sig.user_inputs_to_mutate:
                    raise Fallback("the graph mutates an input or buffer in place")
                mod = from_exported_program(ep, keep_params_as_input=False, run_ep_decomposition=False)
        # build: optimize + tvm.compile, or the compile cache's copy (the frozen weights are part
        # of the module, hence of its key), so a second process compiles nothing.
        keys: list = []
        ex = build(mod, self.opts["target"], algorithm=self.opts["algorithm"], threads=self.opts["threads"],
                   report=report, autotune=self.opts["autotune"], keys=keys)
        if not any(r.get("runs_on") == "ours" for r in report):
            raise Fallback("nothing in it runs on our kernels")
        if gkey and keys:  # the graph's entry names the model's (autotune: under its new measurements)
            cache.put(self._graph_key(args) if self.opts["autotune"] else gkey, keys[0])
        return Compiled(ex)

    def _graph_key(self, args) -> str:
        """The compile cache's key of this graph at these inputs: its code (dynamo writes the
        ops and every Python constant into it), the kinds and shapes of its inputs, a digest of
        the frozen tensors' values and of any tensor the graph module holds, the options."""
        h = hashlib.blake2b(digest_size=20)
        held = sorted(self.gm.state_dict(keep_vars=True).items())
        for name, t in [(f"input {i}", args[i]) for i in self.static] + held:
            t = detached(t)
            h.update(f"{name} {tuple(t.shape)} {t.dtype}\0".encode())
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy())
        inputs = [(tuple(args[i].shape), str(args[i].dtype)) for i in self.tensors]
        return cache.key("graph", self.gm.code, tuple(self.kinds), self._key(args), inputs, h.hexdigest(),
                         sorted((k, str(v)) for k, v in self.opts.items()), torch.__version__)

    def _cached(self, gkey: str, report: list) -> Compiled | None:
        model = cache.get(gkey, valid=lambda v: cache.is_key(v, "model"))
        hit = cache.load_library(model) if model is not None else None
        if hit is None:
            return None
        lib, meta = hit
        LOG.info("%s loaded from the compile cache (%s)", self.name, model)
        report += meta["report"]
        return Compiled(lib)

    def _tell_unwatched(self) -> None:
        """A WARNING, once per graph, when frozen tensors are compared with a copy on each call."""
        unwatched = self.weights.unwatched()
        self.weights.lost = False
        if unwatched:
            i, why, _ = unwatched[0]
            mb = sum(n for _, _, n in unwatched) / 1e6
            self._once("unwatched", f"%s: {len(unwatched)} frozen tensor(s) ({mb:.1f} MB; input {i}: {why}) are "
                       "compared with a copy before each call, as in-place writes to them could go unseen "
                       "otherwise; release the other holders (or copy the weights) before compiling to spare "
                       "that", level=logging.WARNING)

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
        with self.lock:
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

    def _compiled_for(self, args) -> Compiled | None:
        """The module for these inputs: compiled now for a new shape, or again after the frozen
        weights changed; None where the graph or this shape runs eagerly."""
        if self.eager is not None:  # another thread fell back while this one waited for the lock
            return None
        key = self._key(args)
        try:
            if self.weights is not None and not self.weights.unchanged(args):
                if self.refreezes >= REFREEZES:
                    raise Fallback(f"frozen weights changed more than {REFREEZES} times")
                self.refreezes += 1
                LOG.info("%s: frozen weights changed since compile; compiling again with the new values", self.name)
                self.compiled.clear()
            elif self.weights is not None and self.weights.lost:
                self._tell_unwatched()
            compiled = self.compiled.get(key)
            if compiled is None:
                if len(self.compiled) >= MAX_SHAPES:
                    self._once("shapes", f"%s: more than {MAX_SHAPES} shapes; new ones run eagerly")
                    return None
                compiled = self._compile(key, args)
        except Fallback as e:
            self._fall_back(str(e))
            return None
        return compiled

    def _to_tvm(self, args, i: int):
        t = detached(args[i])
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

        return rebuild(self.output, leaf)

    def _once(self, what, message: str, level: int = logging.INFO) -> None:
        if what not in self.logged:
            self.logged.add(what)
            LOG.log(level, message, self.name)


def imported(ep):
    """TVM's import of `ep` as exported (no decomposition), or None where the importer takes one
    of its ops only decomposed (its table names most ops at both levels)."""
    from tvm.relax.frontend.torch import from_exported_program

    try:
        return from_exported_program(ep, keep_params_as_input=False, run_ep_decomposition=False)
    except Exception as e:  # noqa: BLE001 (the importer asserts, or fails inside a converter)
        LOG.debug("importing the graph undecomposed failed (%s); decomposing it first", first_line(e))
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
