"""Every JAX-internal name jaxbind uses, in one place.

jaxbind supports jax 0.7.0 up to the newest release it was tested with
(NEWEST_TESTED_JAX). Each import below notes the versions it was checked on;
when JAX moves one, the shim goes here and nowhere else.
"""

from __future__ import annotations

import os
import warnings

import jax
import jax.ffi as ffi  # public since jax 0.4.38
from jax._src import core as _core  # get_aval: jax 0.7 - 0.12
from jax._src import dispatch as _dispatch  # apply_primitive: jax 0.7 - 0.12
from jax._src.interpreters import mlir as _mlir_src  # lowering tables: jax 0.7 - 0.12
from jax.extend.core import Primitive  # jax 0.4.36 - 0.12
from jax.interpreters import ad, batching, mlir  # jax 0.7 - 0.12

__all__ = [
    "NEWEST_TESTED_JAX", "Primitive", "ShapedArray", "ad", "apply_primitive",
    "batching", "ffi", "instantiate_zeros", "is_undefined_primal", "mlir",
    "for_export", "not_mapped", "unregister_rules", "zero_tangent", "check_jax_version",
]

NEWEST_TESTED_JAX = "0.12.0.1"
OLDEST_SUPPORTED_JAX = "0.7.0"

ShapedArray = jax.core.ShapedArray
not_mapped = None  # batching.not_mapped is None in jax 0.7 - 0.12 (not exported in 0.12)
instantiate_zeros = ad.instantiate_zeros
is_undefined_primal = ad.is_undefined_primal


def apply_primitive(prim, *args, **params):
    """Eager evaluation: compile the single primitive and run it."""
    return _dispatch.apply_primitive(prim, *args, **params)


def unregister_rules(prim) -> None:
    """Remove every rule registered for `prim` (its binding is gone)."""
    ad.primitive_jvps.pop(prim, None)
    ad.primitive_transposes.pop(prim, None)
    # jax 0.7: primitive_batchers is a dict; jax 0.12: a proxy that writes into
    # fancy_primitive_batchers (a dict in both).
    for table in (batching.primitive_batchers, batching.fancy_primitive_batchers):
        if isinstance(table, dict):
            table.pop(prim, None)
    _mlir_src._lowerings.pop(prim, None)
    for table in _mlir_src._platform_specific_lowerings.values():
        table.pop(prim, None)


def for_export(ctx) -> bool:
    """Whether this lowering is for jax.export (LoweringParameters.for_export: jax 0.7 - 0.12)."""
    params = getattr(ctx.module_context, "lowering_parameters", None)
    return bool(getattr(params, "for_export", False))


def zero_tangent(primal) -> ad.Zero:
    """A symbolic zero tangent for `primal` (Zero.from_primal_value left in 0.12)."""
    return ad.Zero(_core.get_aval(primal).to_tangent_aval())


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_jax_version(installed: str = jax.__version__) -> str | None:
    """Warn when JAX is newer than the newest version jaxbind was tested with.

    Returns the warning text (or None). Set JAXBIND_SILENCE_JAX_VERSION_WARNING=1
    to silence it.
    """
    if _version_tuple(installed) < _version_tuple(OLDEST_SUPPORTED_JAX):
        raise ImportError(
            f"jaxbind needs jax>={OLDEST_SUPPORTED_JAX}, found jax {installed}; "
            f"run: pip install -U 'jax>={OLDEST_SUPPORTED_JAX}'")
    if _version_tuple(installed)[:3] <= _version_tuple(NEWEST_TESTED_JAX)[:3]:
        return None
    message = (
        f"jaxbind was tested with jax up to {NEWEST_TESTED_JAX}, found jax {installed}. "
        "It uses some JAX internals; if something breaks, pin "
        f"'pip install jax=={NEWEST_TESTED_JAX}' or upgrade jaxbind. "
        "Set JAXBIND_SILENCE_JAX_VERSION_WARNING=1 to hide this warning.")
    if os.environ.get("JAXBIND_SILENCE_JAX_VERSION_WARNING", "") not in ("", "0"):
        return message
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return message
