"""Roles computed by JAX functions: a nonlinear op's JVP or VJP given as JAX code.

``get_nonlinear_call(f, (f_jvp, f_vjp), ...)`` accepts, for either derivative,
a JAX function (a jaxbind op, or any function marked with
``jaxbind.jax_function``) instead of a callable. The role stays a jaxbind
primitive application, so JAX still knows that it is linear in its tangents (or
cotangents) and how it transposes (JVP <-> VJP). But it is computed by tracing
the JAX function: its abstract evaluation is the function's ``eval_shape``, its
lowering inlines the function (no trampoline call), and its derivative with
respect to the primals, which a second derivative needs, is the function's own
JVP. That is what makes Hessians of nonlinear ops possible: each order comes
from the ops inside the derivatives.

Batched calls of such roles carry batch axes like any other (see _spec); the
function is vmapped over them here.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax.numpy import moveaxis

from .._spec import CallSpec

__all__ = ["batched_function", "eval_shapes"]


def _call(spec: CallSpec) -> Callable:
    binding = spec.binding
    fn = binding.jax_function_for(spec.role)
    kwargs = spec.kwargs.to_dict()

    def call(*args):
        out = fn(*args, **kwargs)
        if not isinstance(out, (tuple, list)) or not all(hasattr(o, "shape") for o in out):
            raise TypeError(
                f"jaxbind: the {spec.role.upper()} of '{binding.name}' is a JAX function and "
                f"must return a list or tuple of arrays, one per output; it returned {out!r}"
            )
        return list(out)

    return call


def batched_function(spec: CallSpec) -> Callable:
    """The role of `spec` as a JAX function of arrays batched as the spec says."""
    call = _call(spec)
    if spec.batch_axes is None:
        return call
    in_axes, out_axes = spec.batch_axes, spec.out_batch_axes
    levels = max(len(ax) for ax in in_axes)

    def run(*args):
        # batch levels to the front, outermost first; then one vmap per level
        front = [
            moveaxis(a, list(reversed(ax)), list(range(len(ax)))) if ax else a
            for a, ax in zip(args, in_axes)
        ]
        fn = call
        for _ in range(levels):
            fn = jax.vmap(fn, in_axes=tuple(0 if ax else None for ax in in_axes))
        outs = fn(*front)
        if out_axes is None:
            return outs
        return [
            moveaxis(o, list(range(len(ax))), list(reversed(ax))) if ax else o
            for o, ax in zip(outs, out_axes)
        ]

    return run


def eval_shapes(spec: CallSpec, avals) -> list:
    """Output shapes and dtypes of the role of `spec` for the arguments `avals`."""
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    return list(jax.eval_shape(batched_function(spec), *args))
