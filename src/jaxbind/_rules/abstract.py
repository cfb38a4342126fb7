"""Abstract evaluation: the checks every call gets, and the output shapes of roles whose
body is a callable, from the user's abstract function (JAX-function roles: .jaxfn)."""

from __future__ import annotations

import jax.export  # noqa: F401  (a submodule: not loaded by "import jax")

from .._avals import check_result, check_supported
from .._compat import InconclusiveDimensionOperation, ShapedArray, output_aval
from .._errors import about, add_context, refused_arguments, words
from .._spec import BatchAxes, CallSpec

__all__ = ["check_aliases", "check_arguments", "declared_outputs", "output_avals"]


def declared_outputs(spec: CallSpec, avals, batch_axes: BatchAxes | None = None):
    """What the abstract function of a callable role declares for arguments `avals`:
    [(shape, dtype, out_batch_axis|None)]. `batch_axes`: the arguments' batch axes, for
    an op that is vectorized (its abstract function receives them)."""
    binding, entry = spec.binding, spec.entry
    if entry.abstract is None:  # shaped as the primals, which the transpose rule knows
        binding.body(entry.role)  # a role without a callable is reported as such
        if spec.out_hint is None:
            raise NotImplementedError(
                f"{about(binding.name)} has no {words(binding.options).shapes.removeprefix('the ')}"
                f" for {entry.role.describe()}"
            )
        return _from_hint(spec.out_hint, avals, batch_axes)
    kwargs = spec.kwargs.to_dict()
    if binding.options.vectorized:
        kwargs["batch_axes"] = None if batch_axes is None else batch_axes.axes
    where = f"jaxbind: {words(binding.options).shapes_of(binding.name, spec.role)}"
    try:
        result = entry.declared(avals, kwargs, spec.n_fixed, spec.trees)
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
        if isinstance(exc, TypeError) and spec.trees is None:  # the pytree API: see _pytree_api
            refused = refused_arguments(
                entry.abstract, *entry.abstract_arguments(avals, kwargs, spec.n_fixed)
            )
            if refused is not None:
                problem, fix, keywords = refused
                gets = (
                    "It gets every keyword argument of the call"
                    if keywords
                    else f"It gets {entry.args.value[0]} ({shapes})"
                )
                raise TypeError(f"{where} {problem}. {gets}: {fix}") from None
        add_context(exc, f"{where} failed for arguments ({shapes})")
        raise
    outs = check_result(result, where, batched=batch_axes is not None)
    if not outs and spec.role == "f" and binding.options.effect is None:
        raise TypeError(
            f"{where} declares no outputs, and the op is not marked has_side_effect=True, "
            "so nothing would ever call it: declare its outputs, or pass "
            "has_side_effect=True if the callable does something besides writing outputs"
        )
    return outs


def _from_hint(hint: tuple, avals, batch_axes: BatchAxes | None):
    """Outputs of a transpose from the shapes jaxbind knows (CallSpec.out_hint: `hint`).

    Vectorized, every batch level goes in front of each output, outermost
    first, as the pytree API's callables write them (see _pytree_api).
    """
    if batch_axes is None:
        return [(shape, dtype, None) for shape, dtype in hint]
    levels = batch_axes.sizes([a.shape for a in avals])
    return [(levels + tuple(shape), dtype, 0) for shape, dtype in hint]


def output_avals(spec: CallSpec, avals) -> tuple:
    """Output avals of a call of a role whose body is a callable."""
    check_keywords = getattr(spec.entry.body, "check_keywords", None)  # the pytree API's
    if check_keywords is not None:
        check_keywords(spec.kwargs.to_dict())
    ba = spec.batch_axes
    if ba is not None and not spec.binding.options.vectorized:
        # batched by jaxbind's loop: batch axes lead every batched input and output
        shapes = [a.shape for a in avals]
        levels = ba.sizes(shapes)
        core = [ShapedArray(ba.core_shape(a.shape, i), a.dtype) for i, a in enumerate(avals)]
        outs = declared_outputs(spec, core)
        return tuple(output_aval(levels + shape, dtype, avals) for shape, dtype, _ in outs)
    outs = declared_outputs(spec, avals, ba)
    return tuple(output_aval(shape, dtype, avals) for shape, dtype, _ in outs)


def check_aliases(spec: CallSpec, avals, outs) -> None:
    """input_output_aliases against the shapes of a call of "f"."""
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
                    f" (when vectorized, {words(spec.binding.options).shapes} must "
                    "put the output's batch axes where the input has them)"
                    if spec.batch_axes is not None
                    else ""
                )
            )


def check_arguments(spec: CallSpec, avals) -> None:
    """What every call's arguments must be, whatever computes the role."""
    where = f"{about(spec.name, spec.role)}"
    if len(avals) <= spec.n_fixed and spec.role == "f":
        raise TypeError(
            f"{where} got {len(avals)} arguments, but "
            f"{words(spec.binding.options).fixed}={spec.n_fixed}; at least one argument "
            "must not be fixed"
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
