"""Install lines, as a newcomer copies them: each gets this project. jaxbind 2 is not on the
package index, where the name `jaxbind` is JAXbind 1.3.1's, so an install line names the
clone (``pip install ".[ducc]"``), never the index (``pip install "jaxbind[ducc]"``); and the
extras an install line names exist and bring what the command after it runs.
"""

import ast
import pathlib
import re
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Where a reader meets install lines: the pages, the demos, the changelog, and the messages
# and docstrings of the package and of the tests' skips.
TEXTS = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "demos").glob("*.py")),
    *sorted((ROOT / "src" / "jaxbind").rglob("*.py")),
    *sorted(p for p in (ROOT / "tests").rglob("*.py") if p != pathlib.Path(__file__).resolve()),
]

# `pip install jaxbind...` (any options before it), or an extra of the index's jaxbind
# ("jaxbind[ducc]"; not a jaxpr's jaxbind[spec=...])
FROM_INDEX = re.compile(
    r"""pip3?\s+install\s+(?:-\S+\s+)*["'`]?(jaxbind\b[^\s"'`]*)|(?<![\w.])jaxbind\[\w+(?:,\w+)*\]"""
)
# A clone's extras: ".[ducc]", '.[ducc,kernels]'
CLONE_EXTRAS = re.compile(r"""["'`]?\.\[([\w,]+)\]""")


def _index_installs(text: str):
    """(line number, line) of each install line that would fetch jaxbind from the index
    as it is today: one that says so (JAXbind 1.3.1) or asks for jaxbind 2 is fine."""
    for number, line in enumerate(text.splitlines(), 1):
        for match in FROM_INDEX.finditer(line):
            requirement = match[1] or ""
            if "1.3.1" in line or re.match(r"jaxbind>=2\b", requirement):
                continue
            yield number, line.strip()


def test_the_pattern_finds_installs_from_the_index_and_not_from_the_clone():
    found = lambda text: [line for _, line in _index_installs(text)]
    for line in (
        'pip install "jaxbind[ducc]"',
        "pip install 'jaxbind[demo]'",
        "pip install -U jaxbind",
        "pip install jaxbind",
        "needs ducc0 (jaxbind[ducc])",
    ):
        assert found(line) == [line], line
    for line in (
        'pip install ".[ducc]"',
        "pip install .",
        "pip install '.[ducc,kernels]'",
        "`pip install jaxbind` installs JAXbind 1.3.1",
        'once released, pip install "jaxbind>=2"',
        "a jaxpr shows jaxbind[spec=my.fft:f]",
    ):
        assert found(line) == [], line


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_install_line_fetches_jaxbind_from_the_package_index(path):
    bad = list(_index_installs(path.read_text(encoding="utf-8")))
    assert not bad, (
        f"{path.relative_to(ROOT)} tells readers to install jaxbind from the package index, "
        f"which gives JAXbind 1.3.1, not this project: {bad}. Install from the clone: "
        'pip install . (extras: pip install ".[ducc]")'
    )


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_extras_an_install_line_names_exist(path):
    extras = set(PROJECT["optional-dependencies"])
    named = {
        e
        for match in CLONE_EXTRAS.finditer(path.read_text(encoding="utf-8"))
        for e in match[1].split(",")
    }
    assert named <= extras, f"{path.name} names extras pyproject.toml lacks: {named - extras}"


def _names(requirements) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r)[0].lower().replace("-", "_") for r in requirements}


def _needs(script: pathlib.Path) -> set[str]:
    """The packages a script needs: the top-level packages it imports (jaxbind.contrib:
    ducc0), and flatbuffers where it serializes an export."""
    source = script.read_text(encoding="utf-8")
    needs = {"flatbuffers"} if re.search(r"\bserialize\(", source) else set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module]
        else:
            continue
        for module in modules:
            needs.add("ducc0" if module.startswith("jaxbind.contrib") else module.split(".")[0])
    return needs


QUICKSTART = re.compile(
    r"""pip install ["']\.\[(\w+)\]["']\s*&&\s*\S*python\S*\s+(demos/\S+\.py)"""
)


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_quickstart_installs_what_its_demo_imports(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    runs = QUICKSTART.findall(text)
    assert runs, f'{page}: no quickstart line (pip install ".[extra]" && python demos/...)'
    base = _names(PROJECT["dependencies"]) | {"jaxbind"}
    for extra, demo in runs:
        given = base | _names(PROJECT["optional-dependencies"][extra])
        missing = _needs(ROOT / demo) - given - set(__import__("sys").stdlib_module_names)
        assert not missing, f'{page}: pip install ".[{extra}]" does not install {missing}'


def test_installing_jaxbind_brings_what_serializing_an_export_needs():
    # jaxbind.export and docs/export.md promise exports with a plain `pip install .`; JAX
    # imports flatbuffers to serialize one, and does not declare it
    assert "flatbuffers" in _names(PROJECT["dependencies"])
