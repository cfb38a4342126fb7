"""The one JAX primitive every jaxbind op binds, and `bind`.

All bindings share the primitive ``jaxbind``. Its one parameter, a CallSpec,
names the binding, so a jaxpr reads ``jaxbind[spec=<name>:<role> ...]``.
`bind` also opens a named scope with the binding's name: JAX keeps it in the
HLO metadata (``op_name``, e.g. ``jit(f)/my.fft/jaxbind``), which profilers
show. The primitive's rules are registered once, at import (see _rules); no
binding adds or removes anything in JAX's tables.
"""

from __future__ import annotations

import jax

from ._compat import Primitive

__all__ = ["PRIMITIVE", "bind"]

PRIMITIVE = Primitive("jaxbind")
PRIMITIVE.multiple_results = True


def bind(spec, *args):
    """Bind the jaxbind primitive for `spec` (a CallSpec) to `args`."""
    with jax.named_scope(spec.binding.name):
        return PRIMITIVE.bind(*args, spec=spec)
