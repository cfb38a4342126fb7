"""The package's layers: trace time and run time import each other only through the
modules they share.

Trace time builds and lowers programs (the APIs, the primitive's rules). Run time is
what the trampoline calls while XLA runs a program. A run-time module that imported a
trace-time one (or the reverse) would tie the hot path to tracing, or tracing to the
trampoline; only the package's face (``__init__``) wires the two together.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "jaxbind"
if not PACKAGE.is_dir():  # an installed jaxbind (CI's wheel setups)
    import jaxbind

    PACKAGE = pathlib.Path(jaxbind.__file__).parent

RUN_TIME = {"_runtime", "_gpu"}
TRACE_TIME = {
    "_api",
    "_native",
    "_abstract",
    "_ad",
    "_batching",
    "_lowering",
    "_partitioning",
    "_jaxfn",
    "_rules",
    "_primitive",
    "_spec",
    "_effects",
    "_export",
    "_jaxlib07",
    "testing",
}
SHARED = {
    "_binding",
    "_roles",
    "_options",
    "_kwargs",
    "_avals",
    "_callformat",
    "_compat",
    "_errors",
    "_versions",
    "_buildcheck",
}


def _imports(module: str) -> set[str]:
    """The jaxbind modules that `module` imports (relative imports, any depth)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxbind."):
            found.add(node.module.split(".")[1])
    return found - {"_ext"}


def test_every_module_has_a_layer():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == RUN_TIME | TRACE_TIME | SHARED, (
        "a module was added or removed: give it a layer here"
    )


@pytest.mark.parametrize("module", sorted(RUN_TIME))
def test_run_time_imports_no_trace_time_module(module):
    assert not _imports(module) & TRACE_TIME


@pytest.mark.parametrize("module", sorted(TRACE_TIME))
def test_trace_time_imports_no_run_time_module(module):
    assert not _imports(module) & RUN_TIME


@pytest.mark.parametrize("module", sorted(SHARED))
def test_shared_modules_import_only_shared_ones(module):
    assert _imports(module) <= SHARED
