"""The code blocks of README.md and docs/ run as tests (pytest-markdown-docs).

Every ```python block is a test (pyproject.toml turns the plugin on for README.md and
docs/). Three kinds are skipped, each with its reason:

- a block that only includes a demo's source (``--8<-- "demos/x.py"``): tests/docs/test_demos.py
  runs the demo itself;
- a block marked ``{.python .gpu}``: it needs a CUDA GPU, and runs where JAX has one;
- a block marked ``{.python .needs-<module>}``: it needs an optional package that the test
  extra installs only on some platforms (``needs-finufft``), and runs where it is importable;
  ``needs-nvcc`` runs where CUDA's compiler is on the PATH.

Every op a block defines must pass ``jaxbind.testing.check``, called by the block itself
(its last lines, for the reader to see): a block that defines an op and does not check it
fails, naming the op (`_audit_ops`). Ops of pages other work is rewriting are listed, with
the reason, in `UNCHECKED`.

The summary at the end counts the blocks: how many ran, passed, failed and were skipped.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import pathlib
import re
import shutil

import pytest

_DOCSTRING_COLLECTOR = "MarkdownDocstringCodeModule"  # the plugin's collector of .py files
_INCLUDE = re.compile(r'^--8<-- "([^"]+)"$')


@functools.cache
def _lines(path: pathlib.Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _fence_classes(definition) -> set[str]:
    """The classes on the block's opening fence (``{.python .gpu}`` -> {"python", "gpu"})."""
    lines = _lines(pathlib.Path(definition.source_path))
    fence = lines[definition.start_line - 1].strip() if definition.start_line >= 1 else ""
    return set(re.findall(r"\.([\w-]+)", fence.split("```", 1)[-1]))


@functools.cache
def _has_cuda() -> bool:
    try:
        import jax

        return bool(jax.devices("cuda"))
    except Exception:
        return False


def _is_block(item) -> bool:
    return getattr(item, "test_definition", None) is not None and "::[CodeFence#" in item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_collect_file(file_path, parent):
    """Markdown files only: the plugin would also import every .py file under testpaths to
    read its docstrings, and the scripts in tests/ that run in subprocesses (sharding_cases,
    distributed_worker, ...) change JAX's configuration when imported."""
    outcome = yield
    if file_path.suffix == ".py":
        found = outcome.get_result()
        outcome.force_result([c for c in found if type(c).__name__ != _DOCSTRING_COLLECTOR])


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not _is_block(item):
            continue
        definition = item.test_definition
        include = _INCLUDE.match(definition.source.strip())
        if include:
            item.add_marker(
                pytest.mark.skip(reason=f"shows {include[1]}, which tests/docs/test_demos.py runs")
            )
        elif "gpu" in _fence_classes(definition) and not _has_cuda():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (JAX has none here)"))
        else:
            needs = [
                c[len("needs-") :] for c in _fence_classes(definition) if c.startswith("needs-")
            ]
            missing = [m for m in needs if not _available(m)]
            if missing:
                item.add_marker(
                    pytest.mark.skip(reason=f"needs {', '.join(missing)} (not installed)")
                )


def _available(need: str) -> bool:
    """Whether a block's ``needs-<need>`` is met: a program (nvcc) or a module."""
    if need == "nvcc":
        return shutil.which("nvcc") is not None
    return importlib.util.find_spec(need) is not None


# Ops of the docs that no block checks, by page and name (a default name, for an op defined
# without name=, starts with "fence.", the module the blocks run in), each with the reason.
UNCHECKED = {
    ("docs/kernels.md", "docs.rebinds"): "a wrong body on purpose (it rebinds out), shown failing",
    ("docs/gpu.md", "docs.gpu_double"): "CuPy on CUDA arrays; check calls bodies on NumPy's",
    ("docs/gpu.md", "docs.gpu_scale"): "a CUDA kernel; check calls bodies on NumPy arrays",
}


def _exempt(page: str, name: str) -> bool:
    return any(page == p and name.startswith(n) for p, n in UNCHECKED)


def _binding_of(op):
    """The binding of an op as `jaxbind.testing.check` takes it (an Op, a PytreeOp, or a
    functools.partial of one), or None."""
    while isinstance(op, functools.partial):
        op = op.func
    return getattr(op, "binding", None)


def _defined_in_jaxbind(binding) -> bool:
    """Whether the op's function comes from jaxbind itself (contrib's ops, made when a block
    first imports them), not from the block."""
    import jaxbind

    package = str(pathlib.Path(jaxbind.__file__).parent)
    fn = binding.f
    for _ in range(4):  # a pytree-API op's body (.fn), a numba kernel's function (._fn)
        code = getattr(fn, "__code__", None)
        if code is not None:
            return code.co_filename.startswith(package)
        fn = getattr(fn, "fn", None) or getattr(fn, "_fn", None) or getattr(fn, "__wrapped__", None)
    return False


@contextlib.contextmanager
def _audit_ops(monkeypatch, page: str):
    """Yields a function that names the ops made while the block of `page` ran and not
    checked by it. (Both APIs register an op's binding through _api.register; the bindings
    are held here, so that an op the block dropped is still seen.)"""
    import jaxbind
    from jaxbind import _api

    made, checked = [], set()
    register, check = _api.register, jaxbind.testing.check

    def recording_register(*args, **kwargs):
        binding, *rest = register(*args, **kwargs)
        made.append(binding)
        return (binding, *rest)

    def recording_check(op, *args, **kwargs):
        binding = _binding_of(op)
        if binding is not None:
            checked.add(id(binding))
        return check(op, *args, **kwargs)

    def unchecked() -> list[str]:
        return sorted(
            {
                b.name
                for b in made
                if id(b) not in checked and not _defined_in_jaxbind(b) and not _exempt(page, b.name)
            }
        )

    with monkeypatch.context() as patch:
        patch.setattr(_api, "register", recording_register)
        patch.setattr(jaxbind.testing, "check", recording_check)
        yield unchecked


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _is_block(item):
        return (yield)
    page = pathlib.Path(item.path).relative_to(item.config.rootpath).as_posix()
    with _audit_ops(pytest.MonkeyPatch(), page) as unchecked:
        result = yield
        missing = unchecked()
    if missing:
        listed = ", ".join(f"'{name}'" for name in missing)
        raise AssertionError(
            f"this block defines the op(s) {listed} and does not check them: end it with "
            "jaxbind.testing.check(op, *example_args, **kwargs) for each (every op the docs "
            "define passes check; conftest.py)"
        )
    return result


def pytest_terminal_summary(terminalreporter):
    outcomes: dict[str, set[str]] = {"passed": set(), "failed": set(), "skipped": set()}
    for name, reports in terminalreporter.stats.items():
        for report in reports:
            nodeid = getattr(report, "nodeid", "")
            if "::[CodeFence#" not in nodeid:
                continue
            if name == "passed" and report.when == "call":
                outcomes["passed"].add(nodeid)
            elif name in ("failed", "error"):
                outcomes["failed"].add(nodeid)
            elif name == "skipped":
                outcomes["skipped"].add(nodeid)
    total = len(set().union(*outcomes.values()))
    if total:
        terminalreporter.write_line(
            f"code blocks of README.md and docs/: {total} collected, "
            f"{len(outcomes['passed'])} passed, {len(outcomes['failed'])} failed, "
            f"{len(outcomes['skipped'])} skipped"
        )
