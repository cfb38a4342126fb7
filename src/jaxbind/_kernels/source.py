"""Generated Python source as a value: the text of the functions that numba compiles for
a kernel (numba_codegen.py), built line by line.

Every function comes from `Source.function`, whose body runs inside a ``try`` block: an
exception anywhere in it (the user's function, the user's `ranges`, an allocation)
returns the function's failure instead of escaping from compiled code (where numba
would print "Exception ignored" and return garbage). So no user function runs outside
the error guard, by construction, and tests read the text without compiling it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["Source"]


class Source:
    """Lines of Python source, indented by the blocks they are in."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._depth = 0

    def __call__(self, *lines: str) -> Source:
        """Add lines (each may hold several, separated by newlines) at this depth."""
        for line in lines:
            for part in line.split("\n"):
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
        """The lines added inside run in a ``try`` block; an exception runs `on_error`
        (which returns the failure)."""
        with self.block("try:"):
            yield
        with self.block("except Exception:"):
            self(*on_error)

    @contextlib.contextmanager
    def function(self, name: str, params: str, *on_error: str) -> Iterator[None]:
        """``def name(params)``, its body guarded (`on_error` returns the failure), and
        ``return 0`` (success) after it."""
        with self.block(f"def {name}({params}):"):
            with self.guarded(*on_error):
                yield
            self("return 0")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def define(self, env: dict, name: str):
        """Run the source in `env` (the names it uses), and return the function `name`."""
        exec(self.text(), env)
        return env[name]
