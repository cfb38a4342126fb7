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
    "_primitive",
    "_spec",
    "_export",
    "testing",
    # the primitive's rules, grouped with their registration block
    "_rules",
    "_rules.abstract",
    "_rules.ad",
    "_rules.batching",
    "_rules.lowering",
    "_rules.partitioning",
    "_rules.jaxfn",
    "_rules.effects",
    "_rules.jaxlib07",
}
SHARED = {
    "_binding",
    "_roles",
    "_kernels",
    "_options",
    "_kwargs",
    "_avals",
    "_callformat",
    "_compat",
    "_errors",
    "_versions",
    "_buildcheck",
}


def _path(module: str) -> pathlib.Path:
    parts = module.split(".")
    package = PACKAGE.joinpath(*parts)
    return (
        package / "__init__.py"
        if package.is_dir()
        else PACKAGE.joinpath(*parts[:-1], f"{parts[-1]}.py")
    )


def _imports(module: str) -> set[str]:
    """The jaxbind modules that `module` imports (relative imports, any depth)."""
    tree = ast.parse(_path(module).read_text())
    here = module.split(".")[:-1] if not _path(module).name == "__init__.py" else module.split(".")
    found = set()
    for node in ast.walk(tree):
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
    return {m for m in found if m} - {"_ext"}


def _modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] == "contrib":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            found.add(".".join(parts))
    return found


def test_every_module_has_a_layer():
    modules = _modules()
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
