"""vmap rule of the jaxbind primitive.

With func_can_batch=True, the JAXbind 1.3 protocol: each input's batch axes
are passed to the callables and abstract functions as `batch_axes` (a tuple
per input, outermost vmap last), and the abstract function reports each
output's new batch axis as a third entry. Otherwise jaxbind batches the op
itself: one custom call receives the whole batch and calls the callable once
per batch element (the trampoline loops; CallSpec.loop describes the loop). Inputs are aligned
first in both cases (_align).
"""

from __future__ import annotations

from dataclasses import replace

import jax

from .._compat import ShapedArray, not_mapped
from .._errors import about
from .._primitive import bind
from .._spec import CallSpec
from .abstract import call_abstract

__all__ = ["batch_rule"]


def _shift(axes: tuple[int, ...], new: int) -> tuple[int, ...]:
    """Existing batch axes after a new axis is inserted at `new`, then the new one."""
    return tuple(a + 1 if a >= new else a for a in axes) + (new,)


def batch_rule(args, dims, *, spec: CallSpec):
    # A role computed by a JAX function (_rules.jaxfn) is vmapped by jaxbind, like the loop.
    if spec.binding.options.vectorized and spec.binding.jax_function_for(spec.role) is None:
        return _batch_native(args, dims, spec)
    return _batch_looped(args, dims, spec)


def _batch_native(args, dims, spec: CallSpec):
    binding = spec.binding
    args, new_axes = _align(list(args), dims, spec)
    avals = [ShapedArray(a.shape, a.dtype) for a in args]
    outs = call_abstract(spec, avals, new_axes)
    out_dims = []
    for k, (_, _, axis) in enumerate(outs):
        if axis is None:
            raise TypeError(
                f"{about(binding.name)} has func_can_batch=True, so its abstract function "
                f"must return (shape, dtype, out_batch_axis) for each output when batch_axes is "
                f"set; output {k} has no out_batch_axis"
            )
        out_dims.append(axis)
    old_out = spec.out_batch_axes if spec.out_batch_axes is not None else ((),) * len(outs)
    new_out = tuple(_shift(axes, d) for axes, d in zip(old_out, out_dims))
    new_spec = replace(spec, batch_axes=new_axes, out_batch_axes=new_out)
    return bind(new_spec, *args), out_dims


def _align(args, dims, spec: CallSpec):
    """Give every input the batch levels it needs; return (args, batch_axes).

    After this, every batched input carries every vmap level so far, in the same
    order, so callables can line inputs up level by level. Inputs that were never
    batched keep no batch axes if they are fixed (parameters shared by the whole
    batch); non-fixed inputs are broadcast, because the transpose must give each
    of them a cotangent per batch element.
    """
    old = spec.batch_axes if spec.batch_axes is not None else ((),) * len(args)
    # sizes of the earlier levels; `axes` count positions without the new axis at `d`
    levels = next(
        (
            tuple(a.shape[ax + (d is not not_mapped and ax >= d)] for ax in axes)
            for a, axes, d in zip(args, old, dims)
            if axes
        ),
        (),
    )
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not not_mapped)
    new_axes = []
    for i, (x, axes, d) in enumerate(zip(args, old, dims)):
        batch_it = d is not not_mapped or axes or i >= spec.n_fixed
        if batch_it and not axes and levels:  # add the earlier levels, outermost first
            x = jax.lax.broadcast(x, tuple(reversed(levels)))
            axes = tuple(reversed(range(len(levels))))
            d = d if d is not_mapped else d + len(levels)
        if d is not_mapped and batch_it:
            x, d = jax.lax.broadcast(x, (size,)), 0
        args[i] = x
        new_axes.append(axes if d is not_mapped else _shift(axes, d))
    return args, tuple(new_axes)


def _batch_looped(args, dims, spec: CallSpec):
    """Fallback: one custom call for the whole batch; the trampoline loops over it.

    Batch axes go to the front, outermost level first, so that every slice the
    user's callable sees is C-contiguous; outputs get their batch axes there too.
    """
    args, axes = _align(list(args), dims, spec)
    front = []
    for i, (x, ax) in enumerate(zip(args, axes)):
        if ax:
            args[i] = jax.numpy.moveaxis(x, list(reversed(ax)), list(range(len(ax))))
        front.append(tuple(reversed(range(len(ax)))))
    levels = max(len(ax) for ax in front)
    core = [ShapedArray(a.shape[len(ax) :], a.dtype) for a, ax in zip(args, front)]
    n_out = len(call_abstract(replace(spec, batch_axes=None), core))
    out_axes = (tuple(reversed(range(levels))),) * n_out
    new_spec = replace(spec, batch_axes=tuple(front), out_batch_axes=out_axes)
    return bind(new_spec, *args), [0] * n_out
