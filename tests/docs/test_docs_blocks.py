"""The docs' code blocks, as a reader meets them: every op a block defines is checked by the
block itself (jaxbind.testing.check, enforced by the root conftest.py for every block), and
every optional package a page imports comes from an extra that the page names.
"""

import pathlib
import re
import shutil
import sys
import textwrap
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```(\{[^}\n]*\}|python)[^\n]*\n(.*?)^```", re.M | re.S)

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r)[0].lower().replace("-", "_") for r in requirements}


# What installing jaxbind (`pip install .`) brings, by import name; jaxbind.contrib needs the
# ducc extra.
BASE = _names(PROJECT["dependencies"]) | {"jaxbind"}


def _extras() -> dict[str, set[str]]:
    """The import names each extra installs."""
    return {e: _names(r) for e, r in PROJECT["optional-dependencies"].items()}


def _python_blocks(page: pathlib.Path):
    for match in BLOCK.finditer(page.read_text(encoding="utf-8")):
        fence, source = match.groups()
        classes = set(re.findall(r"\.([\w-]+)", fence)) if fence.startswith("{") else {"python"}
        if "python" in classes and not source.strip().startswith("--8<--"):
            yield classes, source


def _imports(source: str) -> set[str]:
    """The packages a block needs: those it imports, and flatbuffers for a serialized
    export (jax.export imports it only then, and JAX does not install it)."""
    found = {"flatbuffers"} if re.search(r"\bserialize\(|\bdeserialize\(", source) else set()
    for line in source.splitlines():
        m = re.match(r"\s*import ([\w., ]+)|\s*from ([\w.]+) import", line)
        if m is None:
            continue
        for name in (m[1] or m[2]).split(","):
            name = name.strip().split(" as ")[0]
            found.add("ducc0" if name.startswith("jaxbind.contrib") else name.split(".")[0])
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_optional_imports_come_from_an_extra_the_page_names(page):
    text = page.read_text(encoding="utf-8")
    named = set(re.findall(r"(?:jaxbind|\.)\[(\w+)\]", text))
    extras = _extras()
    given = BASE.union(*(extras[e] for e in named if e in extras))
    missing = {}
    for classes, source in _python_blocks(page):
        if "gpu" in classes:  # CUDA libraries (CuPy) come with the reader's CUDA setup
            continue
        needs = {c.removeprefix("needs-") for c in classes if c.startswith("needs-")}
        for module in _imports(source) - given - needs - set(sys.stdlib_module_names):
            where = sorted(e for e, names in extras.items() if module in names)
            missing[module] = where
    assert not missing, (
        f"{page.name} imports {sorted(missing)} without naming an extra that installs them "
        f'(extras that do: {missing}); name one on the page, e.g. pip install ".[...]" in the clone'
    )


UNCHECKED_OP = """\
    # A page

    ```python
    import jax, jax.numpy as jnp, jaxbind

    def double(out, args, kwargs_dump):
        out[0][...] = 2 * args[0]

    same = lambda x, **kw: ((x.shape, x.dtype),)
    op = jaxbind.get_linear_call(double, double, same, name="{name}")
    {check}
    ```
"""


def test_a_block_that_defines_an_op_must_check_it(pytester):
    for checked in (False, True):
        pytester.makefile(
            ".md",
            **{
                f"page_{checked}": textwrap.dedent(UNCHECKED_OP).format(
                    name=f"tests.docs_block_{checked}",
                    check="jaxbind.testing.check(op, jnp.ones(3), verbose=False)"
                    if checked
                    else "",
                )
            },
        )
    shutil.copy(ROOT / "conftest.py", pytester.path / "conftest.py")
    result = pytester.runpytest_subprocess(  # a process of its own: it imports jaxbind again
        "-p", "no:cacheprovider", "--markdown-docs", "--markdown-docs-syntax=superfences"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*defines the op(s) 'tests.docs_block_False' and does not check them*"]
    )
