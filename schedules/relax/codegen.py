"""`tvm.compile` of an optimized model with its PrimFuncs' machine code made on every core.

`tvm.compile` lowers the Relax graph, then hands every PrimFunc to LLVM in one module, on one
core; the machine code itself is emitted later still, by the JIT, on the model's first call.
On a 2-core Zen 3, DenseNet-121's 146 functions took 12.4 s to compile and 18.2 s more in its
first call; ResNet-50's 2.2 s and 2.3 s. Here the functions are cut into chunks that this
process and forked children (common/parallel.py) each build and write as object files, which
one shared library links (no constants in it: 0.1 s) and the executable imports: 18.0 s and 3.2 s
in all for the same two models, the first call then paying nothing.

The executable runs in this process; for the compile cache, `Executable.export_library` makes
the exportable form again (the graph's bytecode with no library, the objects linked beside its
constants), since a loaded shared library cannot be exported. Graphs with external modules
(BYOC), a system library, a single function or a single core go through `tvm.compile` itself.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import tvm
from tvm import relax
from tvm.relax import vm_build

from ..common import parallel

CHUNKS_PER_JOB = 4  # chunks per process: enough for the faster one to take more (DenseNet: 4 -> 18.3 s, 8 -> 17.9 s)


class Executable(relax.VMExecutable):
    """The executable, runnable here (its library loaded), exported as the module doc says."""

    def __init__(self, mod, lowered: tvm.IRModule, target, params: dict, objects: list[bytes]):
        super().__init__(mod)
        self._lowered, self._target, self._params, self._objects = lowered, target, params, objects

    def export_library(self, path: str, **_kwargs) -> None:
        builder = relax.ExecBuilder()
        vm_build._vmcodegen(builder, self._lowered, "bytecode")
        exe = relax.VMExecutable(vm_build._ffi_api.VMLink(builder, self._target, None, [], self._params))
        with tempfile.TemporaryDirectory(prefix="mk-objects-") as tmp:
            exe.export_library(path, addons=_written(self._objects, tmp))


def _written(objects: list[bytes], folder: str) -> list[str]:
    """The object files' bytes written into `folder`: their paths, in order."""
    paths = [str(Path(folder) / f"part{i}.o") for i in range(len(objects))]
    for path, data in zip(paths, objects):
        Path(path).write_bytes(data)
    return paths


def compile_model(mod: tvm.IRModule, target: tvm.target.Target):
    """tvm.compile(mod, target=target), its PrimFuncs built on every core (module doc)."""
    jobs = parallel.jobs()
    if jobs <= 1 or not sys.platform.startswith("linux") or target.kind.name != "llvm" \
            or (mod.attrs and "external_mods" in mod.attrs) or "system-lib" in str(target):
        return tvm.compile(mod, target=target)
    with target:
        lowered = relax.get_pipeline("default")(mod)
    attrs = dict(lowered.attrs) if lowered.attrs else {}
    if attrs.get("external_mods"):
        return tvm.compile(mod, target=target)
    params = dict(attrs.get("const_name_to_constant", {}))
    builder = relax.ExecBuilder()
    tir = vm_build._filter_tir(vm_build._vmcodegen(builder, lowered, "bytecode"))
    items = list(tir.functions.items()) if tir is not None else []
    if len(items) < 2:
        return tvm.compile(mod, target=target)
    n = min(len(items), jobs * CHUNKS_PER_JOB)
    chunks = [dict(items[i::n]) for i in range(n)]

    def part(chunk: dict):
        def build() -> bytes:
            lib = tvm.tirx.build(tvm.IRModule(chunk, attrs=tir.attrs), target=target)
            fd, path = tempfile.mkstemp(suffix=".o")
            os.close(fd)
            try:
                lib.write_to_file(path)
                return Path(path).read_bytes()
            finally:
                os.unlink(path)
        return build

    objects = parallel.run([part(c) for c in chunks], jobs)
    for i, data in enumerate(objects):  # a chunk that failed in a child: built again here, its error raised
        if data is None:
            objects[i] = part(chunks[i])()
    from tvm.support import cc

    with tempfile.TemporaryDirectory(prefix="mk-objects-") as tmp:
        cc.create_shared(str(Path(tmp) / "functions.so"), _written(objects, tmp))
        functions = tvm.runtime.load_module(str(Path(tmp) / "functions.so"))  # mapped: the file may go
    return Executable(vm_build._ffi_api.VMLink(builder, target, functions, [], params), lowered, target, params, objects)
