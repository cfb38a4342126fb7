"""The one JAX primitive every jaxbind op binds, `bind`, and its eager evaluation.

All bindings share the primitive ``jaxbind``. Its one parameter, a CallSpec,
names the binding, so a jaxpr reads ``jaxbind[spec=<name>:<role> ...]``.
`bind` also opens a named scope with the binding's name: JAX keeps it in the
HLO metadata (``op_name``, e.g. ``jit(f)/my.fft/jaxbind``), which profilers
show. The primitive's rules are registered once, at import (see _rules); no
binding adds or removes anything in JAX's tables.

Eager evaluation runs a jitted bind per call site, named after the binding (`eager`):
ops call it for concrete arrays, and it is the primitive's impl rule (`eager_impl`).
"""

from __future__ import annotations

import jax

from ._compat import Primitive
from ._errors import about
from ._spec import CallSpec

__all__ = ["IMPL_CALLS", "PRIMITIVE", "bind", "eager", "eager_impl", "nested"]

PRIMITIVE = Primitive("jaxbind")
PRIMITIVE.multiple_results = True


def bind(spec, *args):
    """Bind the jaxbind primitive for `spec` (a CallSpec) to `args` (refused inside a
    setup of the state this call would use: see _state.StateDef.refuse_reentry)."""
    sdef = spec.binding.options.state
    if sdef is not None:
        sdef.refuse_reentry(spec.kwargs, f"'{spec.binding.name}'")
    with jax.named_scope(spec.binding.name):
        return PRIMITIVE.bind(*args, spec=spec)


def eager(cache: dict, spec: CallSpec, level: int = 0):
    """A jitted bind per call site, so repeated eager calls take JAX's fast C++
    dispatch path instead of re-dispatching the primitive. `level` > 0: the program of
    a call nested that deep in calls of the same site (see `nested`)."""
    key = (spec, level) if level else spec
    fn = cache.get(key)
    if fn is None:
        if len(cache) >= 64:
            cache.clear()
        fn = cache[key] = jax.jit(_binder(spec))
    return fn


def nested(cache: dict, spec: CallSpec, exc: RecursionError, args):
    """An eager call made by a callable of the same op, while the outer call's program
    runs for the first time: JAX refuses to enter a jitted function again before its
    first call returns, so each level of nesting gets a program of its own."""
    if not str(exc).startswith("Recursively calling jit"):
        raise exc
    for level in range(1, 1000):
        try:
            return eager(cache, spec, level)(*args)
        except RecursionError as again:
            if not str(again).startswith("Recursively calling jit"):
                raise
    raise RecursionError(
        f"{about(spec.binding.name)} called itself eagerly more than 1000 levels deep"
    ) from exc


def _binder(spec: CallSpec):
    # A closure named after the binding, so eager programs say which op they run.
    def binder(*args):
        return bind(spec, *args)

    binder.__name__ = binder.__qualname__ = spec.binding.name
    # JAX's mark for a program of one primitive: under jax_debug_nans, a NaN in its
    # outputs is reported as "encountered in <the binding's name>"
    binder._apply_primitive = True  # type: ignore[attr-defined]  # a function attribute
    return binder


IMPL_CALLS: dict = {}


def eager_impl(*args, spec: CallSpec):
    """The primitive applied to concrete arrays outside Op.__call__ (a jaxpr evaluated
    eagerly, a transpose run eagerly): a jitted bind named after the binding."""
    with jax.disable_jit(False):
        return eager(IMPL_CALLS, spec)(*args)
