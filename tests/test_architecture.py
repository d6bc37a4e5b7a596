"""The shape of the code, checked: the three layers import only from below, the conv families
never import each other, no module imports one that imports it back, no module reaches into
another's _private names, and no public function takes more than 10 parameters."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("microkernels", "intrinsics", "schedules", "benchmarks", "models")
# What each layer may import from the project (DESIGN: data flows one way).
ALLOWED = {
    "microkernels": {"microkernels"},
    "intrinsics": {"microkernels", "intrinsics"},
    "schedules": {"microkernels", "intrinsics", "schedules"},
    "models": {"models"},
    "benchmarks": set(PACKAGES),
}
# `python -m microkernels` is the command line, which sits on top of everything.
ENTRY_POINTS = {"microkernels.__main__"}
FAMILIES = {f"schedules.conv.{f}" for f in ("direct", "grouped", "winograd", "depthwise", "int8", "inverted")}
MAX_PARAMETERS = 10


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in `name`, relative ones resolved."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            names = [a.name for a in node.names]
            # `from pkg import sub`: the submodule is what is imported
            subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in MODULES]
            out += [(s, []) for s in subs] + [(mod, [n for n in names if f"{mod}.{n}" not in MODULES])]
    return [(m, n) for m, n in out if m.split(".")[0] in PACKAGES]


GRAPH = {name: {m for m, _ in _imports(name)} for name in MODULES}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_layers_import_only_from_below(name):
    if name in ENTRY_POINTS:
        return
    allowed = ALLOWED[name.split(".")[0]]
    wrong = sorted(m for m in GRAPH[name] if m.split(".")[0] not in allowed)
    assert not wrong, f"{name} imports {wrong}, above its layer"


def _family(module: str) -> str | None:
    """The conv family a module belongs to (a family may be a package), or None."""
    return next((f for f in FAMILIES if module == f or module.startswith(f + ".")), None)


def test_conv_families_never_import_each_other():
    for name, deps in GRAPH.items():
        if fam := _family(name):
            others = sorted(d for d in deps if _family(d) not in (None, fam))
            assert not others, f"{name} imports {others}"
    importers = {m for m, deps in GRAPH.items() if not _family(m) and any(map(_family, deps))}
    # dispatch picks the family; the package and the compatibility aliases re-export them.
    assert importers <= {"schedules.conv.dispatch", "schedules.conv", "schedules", "benchmarks.arm",
                         "benchmarks.conv2d", "schedules.relax.int8"}, importers


INT8 = "schedules.conv.int8"
INT8_FORMS = {m for m in MODULES if m.startswith(f"{INT8}.forms.")} - {f"{INT8}.forms.common"}
# What a form may take from the rest of the family: nothing that imports the forms back.
FORM_BASES = {f"{INT8}.values", f"{INT8}.tiles", f"{INT8}.output", f"{INT8}.forms.common"}


def test_int8_forms_never_import_each_other():
    """Each pack form (schedules/conv/int8/forms/) stands alone beside the others, takes only the
    family's lower modules, and has the functions forms/__init__ dispatches to."""
    assert len(INT8_FORMS) >= 5, INT8_FORMS
    for form in sorted(INT8_FORMS):
        assert not GRAPH[form] & (INT8_FORMS - {form}), f"{form} imports {sorted(GRAPH[form] & INT8_FORMS)}"
        family = {d for d in GRAPH[form] if d.startswith(INT8 + ".")}
        assert family <= FORM_BASES, f"{form} imports {sorted(family - FORM_BASES)}"
        defined = {n.name for n in ast.parse(MODULES[form].read_text()).body if isinstance(n, ast.FunctionDef)}
        missing = {"applies", "note", "buffers", "pack", "parallel"} - defined
        assert not missing, f"{form} lacks {sorted(missing)}"


# A module past this many lines becomes a package (DESIGN); the int8 family's own limit is lower.
MAX_LINES = 600
MAX_INT8_LINES = 400


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.split(".")[0] in ("microkernels", "intrinsics",
                                                                                    "schedules", "benchmarks")))
def test_no_module_grows_past_a_few_hundred_lines(name):
    lines = len(MODULES[name].read_text().splitlines())
    limit = MAX_INT8_LINES if name == INT8 or name.startswith(INT8 + ".") else MAX_LINES
    assert lines <= limit, f"{name}: {lines} lines (at most {limit}: split it into a package)"


def _cycle() -> list[str] | None:
    """A cycle of module imports (a package importing its own submodules excepted: that is how
    a package exposes them), or None."""
    def edges(m):
        return {d for d in GRAPH[m] if d in MODULES and d != m and not d.startswith(m + ".")}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(edges(m)):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(MODULES):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_module_imports_a_module_that_imports_it_back():
    assert _cycle() is None, " -> ".join(_cycle())


def _module_aliases(name: str) -> dict[str, str]:
    """Local name -> project module, for the modules `name` imports as modules."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                if f"{mod}.{a.name}" in MODULES:
                    out[a.asname or a.name] = f"{mod}.{a.name}"
    return out


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_takes_anothers_private_names(name):
    taken = [f"{m}.{n}" for m, names in _imports(name) for n in names if n.startswith("_") and m != name]
    aliases = _module_aliases(name)
    taken += [f"{aliases[n.value.id]}.{n.attr}" for n in ast.walk(ast.parse(MODULES[name].read_text()))
              if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases
              and n.attr.startswith("_") and not n.attr.startswith("__") and aliases[n.value.id] != name]
    assert not taken, f"{name} uses {taken}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_public_functions_take_at_most_ten_parameters(name):
    tree = ast.parse(MODULES[name].read_text())
    long = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            a = node.args
            count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            count -= bool(a.args) and a.args[0].arg in ("self", "cls")
            if count > MAX_PARAMETERS:
                long.append(f"{node.name} ({count})")
    assert not long, f"{name}: {long}"


def test_the_checks_see_the_code():
    """The walkers find what is there (a check over nothing passes vacuously)."""
    assert {"schedules.conv.dispatch", "schedules.common.tir", "microkernels.f32_gemm"} <= set(MODULES)
    assert "schedules.conv.winograd" in GRAPH["schedules.conv.dispatch"]
    assert "microkernels" in {m.split(".")[0] for m in GRAPH["intrinsics.f32_gemm"]}
    assert _module_aliases("schedules.conv.int8.op")["qemu"] == "schedules.emulation.qemu"
    assert "schedules.conv.int8.forms.winograd" in GRAPH["schedules.conv.int8.forms"]
