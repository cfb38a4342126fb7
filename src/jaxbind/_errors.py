"""Error messages: every one names the binding and says what to do.

(The text of errors raised inside a running program is made by _runtime.)
"""

from __future__ import annotations

__all__ = ["add_context"]


def add_context(exc: BaseException, text: str) -> BaseException:
    """Attach a note naming the binding to an exception raised by user code."""
    exc.add_note(text)
    return exc
