"""Error messages: every one names the binding and says what to do.

(The text of errors raised inside a running program is made by _runtime.)
"""

from __future__ import annotations

from ._roles import describe_role

__all__ = ["ExportedDefaultNameWarning", "add_context", "about"]


def about(name: str, role: str | None = None) -> str:
    """How every message about one binding starts: ``jaxbind: 'name'``, with the role when
    one is meant (``jaxbind: 'mymod.fft' (the transpose)``)."""
    if role is None:
        return f"jaxbind: '{name}'"
    return f"jaxbind: '{name}' ({describe_role(role)})"


def add_context(exc: BaseException, text: str) -> BaseException:
    """Attach a note naming the binding to an exception raised by user code."""
    exc.add_note(text)
    return exc


class ExportedDefaultNameWarning(UserWarning):
    """An exported program names a binding by a default name with a creation-order suffix
    (``f#2``), which a loading process may give to another binding."""
