"""Abstract evaluation: ask the user's abstract function for output shapes and check them."""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.export  # a submodule: not loaded by "import jax"
import numpy as np

from .._avals import check_result, check_supported
from .._compat import InconclusiveDimensionOperation, ShapedArray, output_aval
from .._errors import about, add_context
from .._roles import describe_role
from .._spec import CallSpec
from .effects import effects_of
from .jaxfn import eval_shapes

__all__ = ["abstract_eval", "call_abstract"]


def call_abstract(spec: CallSpec, avals, batch_axes=None):
    """Run the abstract function of `spec`'s role; return [(shape, dtype, out_batch_axis|None)]."""
    binding, role = spec.binding, spec.role
    if binding.jax_function_for(role) is not None:  # batched by jaxbind's loop, never natively
        assert batch_axes is None
        unbatched = replace(spec, batch_axes=None, out_batch_axes=None)
        outs = [(tuple(o.shape), np.dtype(o.dtype), None) for o in eval_shapes(unbatched, avals)]
        _check_jax_function(spec, avals, outs)
        return outs
    if spec.out_hint is not None and not binding.has_abstract(role):
        binding.callable_for(role)  # a role without a callable is reported as such
        return _from_hint(spec, avals, batch_axes)
    fn = binding.abstract_for(role)
    if role == "jvp":  # the JVP's outputs are shaped like the function's, at the primals
        avals = avals[: spec.n_fixed]
        if batch_axes is not None:
            batch_axes = batch_axes[: spec.n_fixed]
    kwargs = spec.kwargs.to_dict()
    if binding.options.vectorized:
        kwargs["batch_axes"] = batch_axes
    where = f"jaxbind: abstract function of '{binding.name}' ({describe_role(role)})"
    try:
        result = fn(*avals, **kwargs)
    except InconclusiveDimensionOperation as exc:
        shapes = ", ".join(a.str_short() for a in avals)
        add_context(
            exc,
            f"{where} failed for arguments ({shapes}): it got symbolic "
            "dimensions (jax.export shape polymorphism) and needed their "
            "values. Compute output shapes with them as with integers "
            "(2 * n, n // 2 + 1, n - k), without int() or comparisons that "
            "depend on their values",
        )
        raise
    except Exception as exc:
        shapes = ", ".join(a.str_short() for a in avals)
        add_context(exc, f"{where} failed for arguments ({shapes})")
        raise
    return check_result(result, where, batched=batch_axes is not None)


def _check_jax_function(spec: CallSpec, avals, outs) -> None:
    """What a JVP or VJP given as a JAX function returned, against what it must return.

    A JVP returns the tangents of the op's outputs: shaped as the abstract function
    declares the outputs at the primals. A VJP returns the cotangents of the primals
    that are not fixed: shaped as those primals. (jax.custom_jvp checks the same.)
    """
    binding, n = spec.binding, spec.n_fixed  # for these roles: the number of primals
    if spec.role == "jvp":
        if not binding.has_abstract("f"):
            return
        what = "the tangents of the op's outputs (its abstract function at the primals)"
        want = [
            (shape, dtype)
            for shape, dtype, _ in call_abstract(
                spec.derive("f", binding.options.fixed, None, None), avals[:n]
            )
        ]
    else:
        what = "the cotangents of its inputs that are not fixed"
        want = [(tuple(a.shape), np.dtype(a.dtype)) for a in avals[binding.options.fixed : n]]
    got = [(shape, dtype) for shape, dtype, _ in outs]

    def same(a, b):  # integer and boolean values have float0 tangents: shape only
        return a[0] == b[0] and (a[1] == b[1] or not jax.dtypes.issubdtype(b[1], np.inexact))

    if len(got) != len(want) or not all(same(g, w) for g, w in zip(got, want)):

        def text(items):
            return "[" + ", ".join(f"{d.name}{list(s)}" for s, d in items) + "]"

        raise TypeError(
            f"jaxbind: {describe_role(spec.role)} of '{binding.name}' is a JAX function "
            f"and returned {text(got)}, but it must return {what}: {text(want)}"
        )


def _from_hint(spec: CallSpec, avals, batch_axes):
    """Outputs of a transpose from the shapes jaxbind knows (CallSpec.out_hint).

    Batched natively, every batch level goes in front of each output, outermost
    first, as the JAX-native API's callables write them (see _native).
    """
    if batch_axes is None:
        return [(shape, dtype, None) for shape, dtype in spec.out_hint]
    levels = next(tuple(a.shape[k] for k in reversed(ax)) for a, ax in zip(avals, batch_axes) if ax)
    return [(levels + tuple(shape), dtype, 0) for shape, dtype in spec.out_hint]


def abstract_eval(*avals, spec: CallSpec):
    """Effectful abstract evaluation of the jaxbind primitive: (output avals, effects)."""
    outs = _output_avals(avals, spec)
    if spec.binding.options.aliases and spec.role == "f":
        _check_aliases(spec, avals, outs)
    return outs, effects_of(spec)


def _check_aliases(spec: CallSpec, avals, outs):
    where = f"{about(spec.name)} input_output_aliases"
    for i, k in spec.binding.options.aliases:
        if i >= len(avals) or k >= len(outs):
            raise ValueError(
                f"{where}: the call has {len(avals)} inputs and {len(outs)} "
                f"outputs, so input {i} cannot share memory with output {k}"
            )
        a, o = avals[i], outs[k]
        if a.shape != o.shape or a.dtype != o.dtype:
            raise TypeError(
                f"{where}: input {i} ({a.str_short()}) and output {k} "
                f"({o.str_short()}) must have the same shape and dtype to share "
                "memory"
                + (
                    " (when batched natively, the abstract function must "
                    "put the output's batch axes where the input has them)"
                    if spec.batch_axes is not None
                    else ""
                )
            )


def _output_avals(avals, spec: CallSpec):
    where = f"{about(spec.name, spec.role)}"
    if len(avals) <= spec.n_fixed and spec.role == "f":
        raise TypeError(
            f"{where} got {len(avals)} arguments, but first_n_args_fixed="
            f"{spec.n_fixed}; at least one argument must not be fixed"
        )
    for i, aval in enumerate(avals):
        if not isinstance(aval, ShapedArray):
            raise TypeError(f"{where}: argument {i} is {aval}, not an array")
        check_supported(aval.dtype, f"{where}: argument {i}")
    linear_in = spec.binding.options.linear_in
    if spec.role == "f" and linear_in and max(linear_in) >= len(avals):
        raise TypeError(
            f"{where}: linear_in={list(linear_in)} names argument "
            f"{max(linear_in)}, but the op was called with {len(avals)} arguments"
        )
    if spec.binding.jax_function_for(spec.role) is not None:  # a JVP or VJP in JAX code
        if spec.batch_axes is None:  # evaluated and checked against the op's shapes
            return tuple(
                output_aval(shape, dtype, avals) for shape, dtype, _ in call_abstract(spec, avals)
            )
        core = [
            ShapedArray(tuple(np.delete(np.asarray(a.shape, dtype=object), list(ax))), a.dtype)
            for a, ax in zip(avals, spec.batch_axes)
        ]
        call_abstract(replace(spec, batch_axes=None, out_batch_axes=None), core)  # checks
        outs = eval_shapes(spec, avals)
        return tuple(output_aval(o.shape, o.dtype, avals) for o in outs)
    if spec.batch_axes is not None and not spec.binding.options.vectorized:
        # batched by jaxbind's loop: batch axes lead every batched input and output
        levels = next(a.shape[: len(ax)] for a, ax in zip(avals, spec.batch_axes) if ax)
        core = [ShapedArray(a.shape[len(ax) :], a.dtype) for a, ax in zip(avals, spec.batch_axes)]
        outs = call_abstract(spec, core)
        return tuple(output_aval(levels + shape, dtype, avals) for shape, dtype, _ in outs)
    outs = call_abstract(spec, avals, spec.batch_axes)
    return tuple(output_aval(shape, dtype, avals) for shape, dtype, _ in outs)
