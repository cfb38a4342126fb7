"""Programs of call formats 1 and 2, read in the terms of the current format. Quarantined:
deleting this module takes dropping formats 1 and 2 (programs written before jaxbind's
call format 3; tests/data holds golden artifacts of both).

Formats 1 and 2 kept a pytree-API op's pytree structure among the keyword arguments
(``jaxbind_in``, ``jaxbind_out``), and format 1 jaxbind's own batch loop too
(``batch_axes``, unless the binding is vectorized: then they are the callable's).
"""

from __future__ import annotations

from .._callformat import MAX_LEVELS, CallAttributes, Loop
from .._kwargs import decode_kwargs, encode_kwargs

__all__ = ["upgraded"]

_FORMAT2_TREES = ("jaxbind_in", "jaxbind_out")


def upgraded(call: CallAttributes, vectorized: bool) -> CallAttributes:
    """`call` in the current format's terms (itself, for format 3 and later); `vectorized`:
    the binding is vectorized. `n_fixed` stays None for format 1, and `format` is the
    call's own (the definition check reads it)."""
    if call.format >= 3:
        return call
    values, trees, loop = decode_kwargs(call.kwargs).to_dict(), b"", call.loop
    given = len(values)
    if _FORMAT2_TREES[0] in values:
        pytrees = {
            "in": values.pop(_FORMAT2_TREES[0]),
            "out": values.pop(_FORMAT2_TREES[1], None),
        }
        trees = encode_kwargs(pytrees).blob
    if call.format == 1 and not vectorized and "batch_axes" in values:
        loop = _format1_loop(values.pop("batch_axes"))
    kwargs = encode_kwargs(values).blob if len(values) < given else call.kwargs
    flags = loop.flags(len(loop.batched))
    return CallAttributes(
        call.binding, call.role, kwargs, loop.levels, flags, call.n_fixed, trees, format=call.format
    )


def _format1_loop(batch_axes: object) -> Loop:
    """Format 1 kept jaxbind's loop in the keyword arguments, as "batch_axes": one tuple of
    leading axes per input (see _rules.batching)."""
    if not isinstance(batch_axes, tuple) or not all(
        isinstance(ax, tuple) and all(type(a) is int for a in ax) for ax in batch_axes
    ):
        raise ValueError("the call's batch axes are not a tuple of tuples of integers")
    levels = max((len(ax) for ax in batch_axes), default=0)
    if not 0 < levels <= MAX_LEVELS:
        raise ValueError(f"the call's batch levels ({levels}) are out of range")
    return Loop(levels, tuple(bool(ax) for ax in batch_axes))
