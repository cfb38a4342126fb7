"""The rules for roles whose body is a JAX function (see _roles.Body.JAX).

``get_nonlinear_call(f, (f_jvp, f_vjp), ...)`` (or ``def_jvp``/``def_vjp``) accepts,
for either derivative, a JAX function (a jaxbind op, or any function marked with
``jaxbind.jax_function``) instead of a callable. The role stays a jaxbind primitive
application, so JAX still knows that it is linear in its tangents (or cotangents)
and how it transposes (JVP <-> VJP). But it is computed by tracing the JAX
function: its abstract evaluation is the function's ``eval_shape``, its lowering
inlines the function (no trampoline call), its batching vmaps it, and its
derivative with respect to the primals, which a second derivative needs, is the
function's own JVP (see .ad). That is what makes Hessians of nonlinear ops
possible: each order comes from the ops inside the derivatives.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from jax.numpy import moveaxis

from .._compat import ShapedArray, host_callbacks, mlir, output_aval
from .._errors import about, words
from .._references import mode
from .._roles import ReferenceRole, for_call
from .._spec import CallSpec
from .abstract import declared_outputs
from .batching import batch_looped
from .reference import checked, named_failures, not_reentered, role_function

__all__ = ["batch", "batched_function", "lower", "lower_by_reference", "output_avals"]


def _call(spec: CallSpec) -> Callable:
    body = spec.binding.body(spec.role)
    if isinstance(body, ReferenceRole):  # a rule derived from the op's reference
        return role_function(body, spec)
    fn = for_call(body, spec.trees)
    kwargs = spec.kwargs.to_dict()

    def call(*args):
        out = fn(*args, **kwargs)
        if not isinstance(out, (tuple, list)) or not all(hasattr(o, "shape") for o in out):
            raise TypeError(
                f"jaxbind: the {spec.role.upper()} of '{spec.name}' is a JAX function and "
                f"must return a list or tuple of arrays, one per output; it returned {out!r}"
            )
        return list(out)

    return call


def batched_function(spec: CallSpec, call: Callable | None = None) -> Callable:
    """The role of `spec` as a JAX function of arrays batched as the spec says: the
    batch levels go to the front (outermost first), then one vmap per level. `call`: the
    role's function of one batch element (default: the role's body)."""
    call = _call(spec) if call is None else call
    if spec.batch_axes is None:
        return call
    ins, outs = spec.batch_axes, spec.out_batch_axes
    fn = call
    for _ in range(ins.levels):
        fn = jax.vmap(fn, in_axes=tuple(0 if b else None for b in ins.batched))

    def run(*args):
        results = fn(*ins.to_front(args, moveaxis))
        return results if outs is None else outs.from_front(results, moveaxis)

    return run


def output_avals(spec: CallSpec, avals) -> tuple:
    """The function's output shapes (eval_shape), checked against what the role must
    return (unbatched: a vmapped function returns what it does for one element)."""
    ba, unbatched = spec.batch_axes, spec.unbatched()
    core = avals
    if ba is not None:
        core = [ShapedArray(ba.core_shape(a.shape, i), a.dtype) for i, a in enumerate(avals)]
    outs = _eval_shapes(unbatched, core)
    if not spec.entry.derived:  # (a derived rule returns what JAX's derivative does)
        _check(unbatched, core, outs)
    if ba is not None:
        outs = _eval_shapes(spec, avals)
    return tuple(output_aval(o.shape, o.dtype, avals) for o in outs)


def _eval_shapes(spec: CallSpec, avals) -> list:
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    return list(jax.eval_shape(batched_function(spec), *args))


def _check(spec: CallSpec, avals, outs) -> None:
    """What a JVP or VJP given as a JAX function returned, against what it must return.

    A JVP returns the tangents of the op's outputs: shaped as the abstract function
    declares the outputs at the primals. A transpose returns what its own abstract
    function declares (or the primals' shapes). A VJP returns the cotangents of the primals
    that are not fixed: shaped as those primals. (jax.custom_jvp checks the same.)
    """
    binding, n = spec.binding, spec.n_fixed  # for these roles: the number of primals
    if spec.entry.args.shaped_like_f:
        if binding.roles["f"].abstract is None:
            return
        what = f"the tangents of the op's outputs ({words(binding.options).shapes} at the primals)"
        f_spec = spec.derive("f", binding.options.fixed, None, None)
        want = [(shape, dtype) for shape, dtype, _ in declared_outputs(f_spec, avals[:n])]
    elif spec.entry.role.base == "T":  # a transpose: shaped as its declaration says
        what = "the cotangents of the op's inputs that are not fixed"
        want = [(shape, dtype) for shape, dtype, _ in declared_outputs(spec, avals)]
    else:
        what = "the cotangents of its inputs that are not fixed"
        want = [(tuple(a.shape), np.dtype(a.dtype)) for a in avals[binding.options.fixed : n]]
    got = [(tuple(o.shape), np.dtype(o.dtype)) for o in outs]

    def same(a, b):  # integer and boolean values have float0 tangents: shape only
        return a[0] == b[0] and (a[1] == b[1] or not jax.dtypes.issubdtype(b[1], np.inexact))

    if len(got) != len(want) or not all(same(g, w) for g, w in zip(got, want)):

        def text(items):
            return "[" + ", ".join(f"{d.name}{list(s)}" for s, d in items) + "]"

        raise TypeError(
            f"jaxbind: {spec.entry.role.describe()} of '{binding.name}' is a JAX function "
            f"and returned {text(got)}, but it must return {what}: {text(want)}"
        )


def batch(args, dims, *, spec: CallSpec):
    """Batched like jaxbind's loop: batch axes to the front; `batched_function` vmaps."""
    return batch_looped(args, dims, spec, output_avals)


def lower(platform: str, ctx, *args, spec: CallSpec):
    """Inlined: the function is lowered into the program; there is no custom call."""
    return mlir.lower_fun(batched_function(spec), multiple_results=True)(ctx, *args)


def lower_by_reference(ctx, *args, spec: CallSpec):
    """A call of a role with a native body, computed by its reference instead (the
    reference row of the target table; see .reference): inlined as `lower` inlines."""
    entry = spec.entry
    assert entry.reference is not None
    call = checked(spec, role_function(entry.reference, spec), ctx.avals_out)
    before = host_callbacks(ctx)
    with not_reentered(spec.binding, entry.role, "lowered"):
        with named_failures(spec.binding, entry.role):
            outs = mlir.lower_fun(batched_function(spec, call), multiple_results=True)(ctx, *args)
    if host_callbacks(ctx) > before and mode() == "strict":
        raise TypeError(
            f"{about(spec.name, spec.role)}: its JAX reference calls back into Python "
            "(jax.pure_callback or io_callback: a custom call), and references only were "
            "asked for (jaxbind.export(..., portable=True), use_reference(strict=True) or "
            "JAXBIND_USE_REFERENCE=strict): a program without custom calls cannot contain "
            "it. Write the reference in JAX (jax.numpy, lax)"
        )
    return outs
