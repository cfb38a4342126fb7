"""Side effects of bindings made with has_side_effect=True or ordered=True.

JAX keeps a primitive application whose abstract evaluation reports an effect:
it is never removed as dead code, and (being effectful) never merged with an
identical one. jaxbind's calls share JAX's own effects, which JAX already allows
in every place they need to go, so nothing is added to JAX's tables:

- ``SIDE_EFFECT``, the effect of ``ffi_call(has_side_effect=True)``: kept,
  allowed in ``scan``, ``while_loop`` and ``cond``, no order;
- ``ORDERED``, the effect of ``io_callback(ordered=True)``: also ordered. JAX
  threads one token through every call that has it, within a program and from
  one program to the next, so ordered jaxbind calls and ordered io_callbacks run
  in program order.

The lowering (_lowering) marks the custom call ``has_side_effect`` and, for
ordered calls, passes the token through it; the trampoline skips the token
buffers. Programs with effects cannot be exported (JAX cannot load them).
"""

from __future__ import annotations

from ._compat import FFI_SIDE_EFFECT, ORDERED_IO_EFFECT, no_effects

__all__ = ["ORDERED", "SIDE_EFFECT", "effects_of"]

SIDE_EFFECT = FFI_SIDE_EFFECT
ORDERED = ORDERED_IO_EFFECT


def effects_of(spec) -> set:
    """The effects of one call: every role of a binding has the binding's effect."""
    effect = spec.binding.effect
    if effect is None:
        return no_effects
    return {ORDERED} if effect == "ordered" else {SIDE_EFFECT}
