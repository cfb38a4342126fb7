"""The package's layers: trace time and run time import each other only through the
common modules; compile time (what XLA's partitioner calls while it compiles a
program) sits beside trace time, which only the package's face registers it from.

Trace time builds and lowers programs (the APIs, the primitive's rules). Run time is
what the trampoline calls while XLA runs a program. A run-time module that imported a
trace-time one (or the reverse) would tie the hot path to tracing, or tracing to the
trampoline; only the package's face (``__init__``) wires the two together.

Within the layers, the import graph stays flat, measured two ways so that the
yardstick cannot move unnoticed: by the imports a module loads with it (its imports
outside function bodies; an import inside a function, such as numba's code generator,
loaded where a numba kernel is first checked, is no floor) no chain is longer than
`MAX_FLOORS` modules, and by every import at any depth no chain is longer than
`MAX_FLOORS_EVERY_IMPORT` (a module's floor is one above the highest it imports). The
graph of every import has no cycle. Imports under ``if TYPE_CHECKING:`` (for
annotations only; Python never runs them) count in neither.
"""

import ast
import functools
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "jaxbind"
if not PACKAGE.is_dir():  # an installed jaxbind (CI's wheel setups)
    import jaxbind

    PACKAGE = pathlib.Path(jaxbind.__file__).parent

RUN_TIME = {
    "_runtime",
    "_runtime.sites",
    "_runtime.old_formats",
    "_runtime.fits",
    "_runtime.report",
    "_runtime.gpu",
    "_runtime.state",
}
TRACE_TIME = {
    "_api",
    "_pytree_api",
    "_pytree_api.trees",
    "_pytree_api.bodies",
    "_primitive",
    "_spec",
    "_export",
    "_bundle",
    "_references",
    "_pickling",
    # jaxbind.testing.check: the entry point, its report and case, one module per row family
    "testing",
    "testing.report",
    "testing.collectives",
    "testing.mesh",
    "testing.case",
    "testing.kernels",
    "testing.written",
    "testing.inputs",
    "testing.agreement",
    "testing.state",
    "testing.watch",
    "testing.linearity",
    "testing.first_order",
    "testing.second_order",
    "testing.batching",
    "testing.reference",
    # the primitive's rules, grouped with their registration block
    "_rules",
    "_rules.abstract",
    "_rules.ad",
    "_rules.batching",
    "_rules.lowering",
    "_rules.targets",
    "_rules.partitioning",
    "_rules.jaxfn",
    "_rules.reference",
    "_rules.effects",
    "_rules.jaxlib07",
}
# Called by XLA while it compiles a program (the partitioner of calls with a declared
# sharding rule): it may build programs as trace time does, and use trace time's rules;
# nothing but the package's face imports it, and it imports no run-time module.
COMPILE_TIME = {"_rules.spmd"}
COMMON = {
    "_binding",
    "_sites",
    "_roles",
    "_kernels",
    "_kernels.abi",
    "_kernels.cuda",
    "_kernels.numba_codegen",
    "_kernels.numba_support",
    "_kernels.source",
    "_kernels.state",
    "_kernels.c_state",
    "_options",
    "_where",
    "_sharding",
    # keyword arguments: the dump and its blobs (__init__), the JSON form as one table of
    # kinds (codec), a dtype's form, values held in this process, the copies a dump keeps
    # and hands out, JAXbind 1.3's pickled dumps; the package imports no other jaxbind module
    "_kwargs",
    "_kwargs.codec",
    "_kwargs.dtypes",
    "_kwargs.held",
    "_kwargs.copies",
    "_kwargs.pickled",
    "_state",
    "_avals",
    "_callformat",
    "_definition",
    "_compat",
    "_errors",
    "_versions",
    "_buildcheck",
}


MAX_FLOORS = 8  # by the imports a module loads with it
MAX_FLOORS_EVERY_IMPORT = 10  # by every import, at any depth (today's figure: a rise fails)


def _path(module: str) -> pathlib.Path:
    parts = module.split(".")
    package = PACKAGE.joinpath(*parts)
    return (
        package / "__init__.py"
        if package.is_dir()
        else PACKAGE.joinpath(*parts[:-1], f"{parts[-1]}.py")
    )


def _type_checking(node: ast.AST) -> bool:
    """`node` is an ``if TYPE_CHECKING:`` block (imports for annotations only, which
    Python never runs: no floor and no edge of the graph)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _nodes(tree: ast.AST, loaded: bool):
    """Every node of `tree` but those of ``if TYPE_CHECKING:`` blocks; with `loaded`,
    none inside a function body either."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                todo.extend(child.orelse)
            elif not (
                loaded and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            ):
                todo.append(child)


def _imports(module: str, loaded: bool = False) -> set[str]:
    """The jaxbind modules that `module` imports (relative imports, any depth; with
    `loaded`, those it loads with it: none imported inside a function)."""
    tree = ast.parse(_path(module).read_text())
    here = module.split(".")[:-1] if not _path(module).name == "__init__.py" else module.split(".")
    found = set()
    for node in _nodes(tree, loaded):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = here[: len(here) - (node.level - 1)]
            if node.module:
                found.add(".".join([*base, node.module]))
            else:
                found.update(".".join([*base, alias.name]) for alias in node.names)
        elif (node.module or "").startswith("jaxbind."):
            found.add(node.module.removeprefix("jaxbind."))
    modules = _modules()
    named = set()
    for m in found - {"", "_ext"}:  # `from . import name` may name a module's attribute
        while m not in modules and "." in m:
            m = m.rsplit(".", 1)[0]
        named.add(m)
    return named


@functools.cache
def _modules() -> frozenset[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] == "contrib":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            found.add(".".join(parts))
    return frozenset(found)


def test_every_module_has_a_layer():
    modules = _modules()
    assert modules == RUN_TIME | TRACE_TIME | COMPILE_TIME | COMMON, (
        "a module was added or removed: give it a layer here"
    )


@pytest.mark.parametrize("module", sorted(RUN_TIME))
def test_run_time_imports_no_trace_time_module(module):
    assert not _imports(module) & TRACE_TIME


@pytest.mark.parametrize("module", sorted(TRACE_TIME))
def test_trace_time_imports_no_run_time_module(module):
    assert not _imports(module) & RUN_TIME


@pytest.mark.parametrize("module", sorted(COMPILE_TIME))
def test_compile_time_imports_no_run_time_module(module):
    assert not _imports(module) & RUN_TIME


@pytest.mark.parametrize("module", sorted(RUN_TIME | TRACE_TIME | COMMON))
def test_only_the_package_face_imports_compile_time(module):
    assert not _imports(module) & COMPILE_TIME


@pytest.mark.parametrize("module", sorted(COMMON))
def test_common_modules_import_only_common_ones(module):
    assert _imports(module) <= COMMON


def _floors(loaded: bool = True) -> dict[str, int]:
    """Each module's floor (`loaded`: by the imports it loads with it, else by every
    import at any depth); an import cycle fails."""
    modules = _modules()
    imports = {m: _imports(m, loaded) & modules for m in modules}
    floors: dict[str, int] = {}

    def floor(module: str, path: tuple = ()) -> int:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module not in floors:
            below = (floor(m, (*path, module)) for m in imports[module] if m != module)
            floors[module] = 1 + max(below, default=0)
        return floors[module]

    for module in modules:
        floor(module)
    return floors


def _tallest(floors: dict[str, int]) -> str:
    return ", ".join(m for m, f in sorted(floors.items(), key=lambda x: (-x[1], x[0]))[:3])


def test_import_graph_is_flat_and_acyclic():
    every = _floors(loaded=False)  # every import, at any depth: no cycle
    floors = _floors()
    top, top_every = max(floors.values()), max(every.values())
    print(
        f"import floors: {top} by module-level imports (at most {MAX_FLOORS}), "
        f"{top_every} by every import (at most {MAX_FLOORS_EVERY_IMPORT})"
    )
    assert top <= MAX_FLOORS, (
        f"the package's imports are {top} floors tall (module-level): {_tallest(floors)}"
    )
    assert top_every <= MAX_FLOORS_EVERY_IMPORT, (
        f"the package's imports are {top_every} floors tall (every import): {_tallest(every)}"
    )
    # the bottom floor holds the values everything shares; nothing there imports jaxbind
    assert {"_roles", "_sharding", "_kwargs.dtypes", "_kwargs.copies"} <= {
        m for m, f in floors.items() if f == 1
    }
    assert floors["_options"] == 2  # the option set: bottom-floor values (the sharding rule)


def test_keyword_arguments_import_no_jaxbind_module_outside_their_package():
    package = {m for m in _modules() if m.split(".")[0] == "_kwargs"}
    for module in package:
        assert _imports(module) <= package, module
