"""docs/layout.md, the code map, names every module of the package and every folder of
the test suite, and names nothing that is gone; and the package's comments and docstrings
(and the trampoline's) point at modules, names and files that exist.

The map is one code block. A line that starts at its left edge names a path from the
repository root (``src/jaxbind/_spec.py``, ``src/jaxbind/_rules/``, ``tests/``); the
lines indented by two spaces below a folder's line name what is in that folder
(``  trees.py``, ``  written.py, inputs.py, ...``, ``  ops/``). A package is named by
its folder (its ``__init__``), or its ``__init__.py``.
"""

import importlib
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
        "src/jaxbind/_pytree_api/trees.py",
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


# --- pointers: what the package's comments and docstrings name exists ---------------------

_DOTTED = re.compile(r"(?<![\w./])(?:jaxbind\.)?(_[a-z]\w*(?:\.\w+)+)")
_PATH = re.compile(r"(?<![\w/.])((?:src|tests|cpp|docs|benchmarks|demos)/[\w./-]*\w)")
_IN_PACKAGE = re.compile(r"(?<![\w/.])(_[a-z]\w*/[\w/]*\w\.py)")  # _runtime/report.py


def _sources():
    yield from sorted(PACKAGE.rglob("*.py"))
    yield from sorted((ROOT / "cpp").glob("*.*"))
    yield from sorted((PACKAGE / "include").rglob("*.h"))


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _resolves(dotted: str, modules: dict) -> bool | None:
    """Whether `dotted` (``_rules.batching.batch_looped``) names a module of the package
    and something in it; None if it names no module of the package."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if module in modules:
            obj = importlib.import_module(f"jaxbind.{module}")
            for name in parts[i:]:
                if not hasattr(obj, name):  # an attribute set in a body (self.name = ...)
                    return (
                        re.search(rf"\b{re.escape(name)}\b", modules[module].read_text())
                        is not None
                    )
                obj = getattr(obj, name)
            return True
    return None


def test_comments_point_at_what_exists():
    modules = _modules()
    stale = []
    for path in _sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            for match in _DOTTED.finditer(line):
                dotted = match.group(1).rstrip(".")
                if dotted.split(".")[0] in modules and _resolves(dotted, modules) is False:
                    stale.append(f"{where}: {dotted}")
            for match in _PATH.finditer(line):
                if not (ROOT / match.group(1)).exists():
                    stale.append(f"{where}: {match.group(1)}")
            for match in _IN_PACKAGE.finditer(line):
                if not (PACKAGE / match.group(1)).exists():
                    stale.append(f"{where}: {match.group(1)}")
    assert not stale, "comments name what is gone:\n" + "\n".join(stale)
