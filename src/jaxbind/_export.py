"""Saving and loading programs that contain jaxbind ops (jax.export)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.export  # a submodule: not loaded by "import jax"

from ._references import use_reference
from ._rules.targets import target_names

__all__ = ["export", "export_safety_checks"]


def export_safety_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The `disabled_checks` that jax.export needs for programs with jaxbind ops.

    JAX refuses to export custom calls that are not on its allow-list; jaxbind's
    targets (every row of the target table, _rules.targets: CPU, CUDA and CUDA kernels,
    and the partitioned targets of ops with a declared sharding rule) keep a versioned
    call format (see the README), so they can be allowed.
    """
    return [jax.export.DisabledSafetyCheck.custom_call(target) for target in target_names()]


def export(
    fun: Callable[..., Any],
    *,
    portable: bool = False,
    disabled_checks: Iterable[jax.export.DisabledSafetyCheck] = (),
    **kwargs: Any,
) -> Callable[..., jax.export.Exported]:
    """`jax.export.export` for functions that use jaxbind ops.

    Args:
      fun: the function to export; wrapped in `jax.jit` if it is not jitted yet.
      portable: lower every jaxbind op to its JAX reference (``reference=``), on every
        platform: the artifact has no custom call, and runs with plain
        ``jax.export.deserialize`` where jaxbind and the ops' libraries are not
        installed (any platform JAX runs on). An op without a reference is refused,
        naming it. Otherwise (the default) ops lower to their native bodies on CPU and
        CUDA, and to their references on the other platforms of ``platforms``.
      disabled_checks: further checks to disable; jaxbind's own are added (not for a
        portable export, which has no custom call to allow).
      kwargs: passed to `jax.export.export` (e.g. ``platforms``).

    Returns:
      The function that `jax.export.export` returns: call it with example
      arguments (or ShapeDtypeStructs) to get a `jax.export.Exported`, whose
      ``.serialize()`` bytes load with ``jax.export.deserialize`` in any process
      that has created the same bindings (same names), or in any process at all
      (``portable=True``).

    Example:
      >>> exp = jaxbind.export(lambda x: op(x)[0])(jnp.ones(3))  # doctest: +SKIP
      >>> blob = exp.serialize()  # doctest: +SKIP
    """
    if not isinstance(portable, bool):
        raise TypeError(f"jaxbind.export: portable must be a bool, got {portable!r}")
    if not hasattr(fun, "lower"):
        fun = jax.jit(fun)
    if not portable:
        return jax.export.export(
            fun, disabled_checks=[*export_safety_checks(), *disabled_checks], **kwargs
        )
    exporter = jax.export.export(fun, disabled_checks=list(disabled_checks), **kwargs)

    def export_portable(*args: Any, **call_kwargs: Any) -> jax.export.Exported:
        with use_reference(strict=True):  # traced and lowered anew: the switch keys jit
            return exporter(*args, **call_kwargs)

    return export_portable
