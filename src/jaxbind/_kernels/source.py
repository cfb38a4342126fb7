"""Generated Python source as a value: the text of the functions that numba compiles for
a kernel (numba_codegen.py), built line by line.

A call of the user's code (the kernel's function, `user`, and its `ranges`) can only be
added inside a `Source.guarded` block, a ``try`` whose ``except`` returns the
function's failure: `Source` refuses such a line anywhere else. So an exception in user
code never escapes from compiled code (where numba would print "Exception ignored" and
return garbage), by construction, and tests read the text without compiling it. (The
unpacking of a call stays outside the guard: it runs no user code, and numba compiles a
``try`` block around it several times more slowly.)
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

__all__ = ["USER_CODE", "Source"]

# The names under which generated source calls user code
USER_CODE = ("user", "ranges")
_USER_CALL = re.compile(r"\b(" + "|".join(USER_CODE) + r")\(")


class Source:
    """Lines of Python source, indented by the blocks they are in."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._depth = 0
        self._guards = 0

    def __call__(self, *lines: str) -> Source:
        """Add lines (each may hold several, separated by newlines) at this depth."""
        for line in lines:
            for part in line.split("\n"):
                if self._guards == 0 and _USER_CALL.search(part):
                    raise ValueError(f"generated source calls user code outside a guard: {part}")
                self.lines.append("    " * self._depth + part)
        return self

    @contextlib.contextmanager
    def block(self, header: str) -> Iterator[None]:
        """``header:`` and the lines added inside, one level deeper."""
        self(header)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    @contextlib.contextmanager
    def guarded(self, *on_error: str) -> Iterator[None]:
        """The lines added inside run in a ``try`` block; an exception runs `on_error`,
        which returns the function's failure."""
        self._guards += 1
        try:
            with self.block("try:"):
                yield
        finally:
            self._guards -= 1
        with self.block("except Exception:"):
            self(*on_error)

    @contextlib.contextmanager
    def function(self, name: str, params: str) -> Iterator[None]:
        """``def name(params)``, its body, and ``return 0`` (success) after it."""
        with self.block(f"def {name}({params}):"):
            yield
            self("return 0")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def define(self, env: dict, name: str):
        """Run the source in `env` (the names it uses), and return the function `name`."""
        exec(self.text(), env)
        return env[name]
