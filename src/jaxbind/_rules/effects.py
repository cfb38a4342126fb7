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

The lowering (_rules.lowering) marks the custom call ``has_side_effect`` and, for
ordered calls, passes the token through it; the trampoline skips the token
buffers. In a program partitioned over several devices a call runs once, on one
device; under Shardy it becomes JAX's host callback, which runs the call as a
``hosted`` CallSpec: no effect of its own, the callback carries it. Programs with
effects cannot be exported (JAX cannot load them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .._compat import FFI_SIDE_EFFECT, ORDERED_IO_EFFECT, no_effects
from .._spec import CallSpec

__all__ = ["ORDERED", "SIDE_EFFECT", "effects_of", "explain_checkpoint"]

SIDE_EFFECT = FFI_SIDE_EFFECT
ORDERED = ORDERED_IO_EFFECT


def effects_of(spec: CallSpec) -> set[Any]:
    """The effects of one call: every role of a binding has the binding's effect."""
    effect = spec.binding.options.effect
    if effect is None or spec.hosted:
        return no_effects
    return {ORDERED} if effect == "ordered" else {SIDE_EFFECT}


def explain_checkpoint(jaxpr: Any) -> str | None:
    """Why jax.checkpoint cannot differentiate `jaxpr`, if jaxbind calls with effects in it
    are the reason; None otherwise."""
    from .._primitive import PRIMITIVE

    names: dict[str, str] = {}
    for eqn in _equations(jaxpr):
        if eqn.primitive is PRIMITIVE and eqn.params["spec"].binding.options.effect is not None:
            binding = eqn.params["spec"].binding
            names[binding.name] = binding.options.effect
    if not names:
        return None
    listed = ", ".join(
        f"'{n}' ({'ordered=True' if e == 'ordered' else 'has_side_effect=True'})"
        for n, e in names.items()
    )
    return (
        f"jaxbind: {listed} has side effects, and jax.checkpoint (remat) cannot "
        "differentiate through calls with side effects: it would run them again when it "
        "recomputes the forward pass. Call the op outside the checkpointed function, or "
        "use a binding without has_side_effect/ordered there"
    )


def _equations(jaxpr: Any) -> Iterator[Any]:
    """The equations of `jaxpr` and of the jaxprs nested in it."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, ClosedJaxpr):
                    yield from _equations(sub.jaxpr)
                elif isinstance(sub, Jaxpr):
                    yield from _equations(sub)
