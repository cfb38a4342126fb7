"""Error messages: every one names the binding and says what to do."""

from __future__ import annotations

import traceback

__all__ = ["format_callback_error", "add_context"]


def format_callback_error(label, etype, value, tb) -> str:
    """Text of the error XLA raises when a callable fails (called from C++)."""
    name = getattr(etype, "__name__", str(etype))
    lines = traceback.format_exception(etype, value, tb)
    return (f"jaxbind: {label} raised {name}: {value}\n"
            "Traceback of the callable (most recent call last):\n" + "".join(lines[1:]))


def add_context(exc: BaseException, text: str) -> BaseException:
    """Attach a note naming the binding to an exception raised by user code."""
    exc.add_note(text)
    return exc
