"""docs/layout.md, the code map, names every module of the package and every folder of
the test suite, and names nothing that is gone.

The map is one code block. A line that starts at its left edge names a path from the
repository root (``src/jaxbind/_spec.py``, ``src/jaxbind/_rules/``, ``tests/``); the
lines indented by two spaces below a folder's line name what is in that folder
(``  trees.py``, ``  written.py, inputs.py, ...``, ``  ops/``). A package is named by
its folder (its ``__init__``), or its ``__init__.py``.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "docs" / "layout.md"
PACKAGE = ROOT / "src" / "jaxbind"

# the names at the start of a folder's indented line: `name.py`, `name/`, comma-separated
_INDENTED = re.compile(r"^  ((?:[\w.-]+(?:\.\w+|/)(?:, |,$)?)+)")


def _named() -> set[str]:
    """The paths docs/layout.md's map names, from the repository root (folders end in /)."""
    text = LAYOUT.read_text()
    block = text.split("```", 2)[1]
    named: set[str] = set()
    folder = None
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            token = line.split()[0]
            path_like = "/" in token or re.fullmatch(r"[\w.-]+\.\w+", token)
            if path_like:
                named.add(token)
            folder = token if path_like and token.endswith("/") else None
        elif folder and (match := _INDENTED.match(line)):
            named.update(
                folder + name.strip() for name in match.group(1).split(",") if name.strip()
            )
    return named


def _unnamed_modules(named: set[str]) -> list[str]:
    """The package's modules that `named` does not name (a package's ``__init__`` is named
    by its folder, or itself)."""
    unnamed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        folder = relative.removesuffix("__init__.py")
        if relative not in named and not (path.name == "__init__.py" and folder in named):
            unnamed.append(relative)
    return unnamed


def _test_folders() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix() + "/"
        for path in (ROOT / "tests").iterdir()
        if path.is_dir() and path.name != "__pycache__"
    }


def test_the_map_is_read():
    named = _named()
    # one of each form: a file at the edge, a folder, a file in a folder, a list, a test folder
    assert {
        "src/jaxbind/_spec.py",
        "src/jaxbind/_rules/",
        "src/jaxbind/_native/trees.py",
        "src/jaxbind/testing/inputs.py",
        "tests/ops/",
        "cpp/call.h",
    } <= named


def test_layout_names_every_module_of_the_package():
    missing = _unnamed_modules(_named())
    assert not missing, (
        "docs/layout.md does not name these modules (add a line each, in their folder's "
        f"block): {', '.join(missing)}"
    )


def test_layout_names_every_test_folder():
    missing = sorted(_test_folders() - _named())
    assert not missing, f"docs/layout.md does not name these test folders: {', '.join(missing)}"


def test_layout_names_nothing_that_is_gone():
    gone = sorted(path for path in _named() if path.rstrip("/") and not (ROOT / path).exists())
    assert not gone, f"docs/layout.md names paths that do not exist: {', '.join(gone)}"
