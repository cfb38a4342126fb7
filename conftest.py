"""The code blocks of README.md and docs/ run as tests (pytest-markdown-docs).

Every ```python block is a test (pyproject.toml turns the plugin on for README.md and
docs/). Three kinds are skipped, each with its reason:

- a block that only includes a demo's source (``--8<-- "demos/x.py"``): tests/test_demos.py
  runs the demo itself;
- a block marked ``{.python .gpu}``: it needs a CUDA GPU, and runs where JAX has one;
- a block marked ``{.python .needs-<module>}``: it needs an optional package that the test
  extra installs only on some platforms (``needs-finufft``), and runs where it is importable.

The summary at the end counts the blocks: how many ran, passed, failed and were skipped.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import re

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
                pytest.mark.skip(reason=f"shows {include[1]}, which tests/test_demos.py runs")
            )
        elif "gpu" in _fence_classes(definition) and not _has_cuda():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (JAX has none here)"))
        else:
            needs = [
                c[len("needs-") :] for c in _fence_classes(definition) if c.startswith("needs-")
            ]
            missing = [m for m in needs if importlib.util.find_spec(m) is None]
            if missing:
                item.add_marker(
                    pytest.mark.skip(reason=f"needs {', '.join(missing)} (not installed)")
                )


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
