"""vmap rule of the jaxbind primitive.

With func_can_batch=True, the JAXbind 1.3 protocol: each input's batch axes
are passed to the callables and abstract functions as `batch_axes` (a tuple
per input, outermost vmap last), and the abstract function reports each
output's new batch axis as a third entry. Otherwise jaxbind batches the op
itself: one custom call receives the whole batch and calls the callable once
per batch element (the trampoline loops; CallSpec.loop describes the loop). Inputs
are aligned first in both cases (_align). Roles whose body is a JAX function are
batched as by the loop, and vmapped (see .jaxfn).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import jax

from .._compat import ShapedArray, not_mapped
from .._errors import about, words
from .._primitive import bind
from .._spec import BatchAxes, CallSpec
from .abstract import declared_outputs

__all__ = ["batch_looped", "batch_rule"]


def _shift(axes: tuple[int, ...], new: int) -> tuple[int, ...]:
    """Existing batch axes after a new axis is inserted at `new`, then the new one."""
    return tuple(a + 1 if a >= new else a for a in axes) + (new,)


def batch_rule(args, dims, *, spec: CallSpec):
    """The vmap rule for roles whose body is a callable: natively or by jaxbind's loop."""
    if spec.binding.options.vectorized:
        return _batch_vectorized(args, dims, spec)
    return batch_looped(args, dims, spec, declared_outputs)


def _batch_vectorized(args, dims, spec: CallSpec):
    binding = spec.binding
    args, new_axes = _align(list(args), dims, spec)
    _check_key_unbatched(spec, new_axes)
    avals = [ShapedArray(a.shape, a.dtype) for a in args]
    outs = declared_outputs(spec, avals, new_axes)
    out_dims = []
    for k, (_, _, axis) in enumerate(outs):
        if axis is None:
            raise TypeError(
                f"{about(binding.name)} has {words(binding.options).vectorized}=True, so "
                f"{words(binding.options).shapes} "
                f"must return (shape, dtype, out_batch_axis) for each output when batch_axes is "
                f"set; output {k} has no out_batch_axis"
            )
        out_dims.append(axis)
    old_out = spec.out_batch_axes or BatchAxes.none(len(outs))
    new_out = BatchAxes(tuple(_shift(axes, d) for axes, d in zip(old_out, out_dims)))
    new_spec = replace(spec, batch_axes=new_axes, out_batch_axes=new_out)
    return bind(new_spec, *args), out_dims


def _check_key_unbatched(spec: CallSpec, axes: BatchAxes) -> None:
    """A vectorized op's state key inputs stay out of vmap: its body gets the
    whole batch, and so would the setup (one object for values that differ per
    element). jaxbind's loop has no such limit: it hands the body one element."""
    options = spec.binding.options
    if not options.state_key:
        return
    at = spec.binding.role(spec.role).positions(options.state_key, options.fixed)
    for name, p in zip(options.state.key, at):
        if p is not None and axes[p]:
            w = words(options)
            raise ValueError(
                f"{about(spec.binding.name, spec.role)}: its state's key input {name!r} is "
                f"batched under vmap, and the op is vectorized ({w.vectorized}=True): "
                f"one setup would get the whole batch of {name!r} as if it were one value. "
                f"Keep {name!r} out of the vmap (in_axes=None), or drop {w.vectorized}=True "
                "(jaxbind's batch loop gives the setup one element at a time)"
            )


def _align(args, dims, spec: CallSpec):
    """Give every input the batch levels it needs; return (args, BatchAxes).

    After this, every batched input carries every vmap level so far, in the same
    order, so callables can line inputs up level by level. Inputs that were never
    batched keep no batch axes if they are fixed (parameters shared by the whole
    batch); non-fixed inputs are broadcast, because the transpose must give each
    of them a cotangent per batch element, and so are a JVP's primals, at which its
    outputs are declared.
    """
    old = spec.batch_axes or BatchAxes.none(len(args))
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
    # the JVP's outputs are declared at the primals alone (f's abstract function): they carry
    # the batch of its tangents only if the primals do (jacfwd batches tangents alone)
    every = spec.entry.args.shaped_like_f
    new_axes = []
    for i, (x, axes, d) in enumerate(zip(args, old, dims)):
        batch_it = d is not not_mapped or axes or i >= spec.n_fixed or every
        if batch_it and not axes and levels:  # add the earlier levels, outermost first
            x = jax.lax.broadcast(x, tuple(reversed(levels)))
            axes = tuple(reversed(range(len(levels))))
            d = d if d is not_mapped else d + len(levels)
        if d is not_mapped and batch_it:
            x, d = jax.lax.broadcast(x, (size,)), 0
        args[i] = x
        new_axes.append(axes if d is not_mapped else _shift(axes, d))
    return args, BatchAxes(tuple(new_axes))


def batch_looped(args, dims, spec: CallSpec, outputs: Callable):
    """One call for the whole batch, laid out as BatchAxes.front(): batch axes first,
    outermost level first, so that every batch element the trampoline's loop hands a
    callable is C-contiguous (and a JAX function is vmapped level by level).
    ``outputs(spec, avals)`` lists the outputs of one unbatched call."""
    args, axes = _align(list(args), dims, spec)
    args = axes.to_front(args, jax.numpy.moveaxis)
    front = axes.front()
    core = [ShapedArray(front.core_shape(a.shape, i), a.dtype) for i, a in enumerate(args)]
    n_out = len(outputs(spec.unbatched(), core))
    new_spec = replace(
        spec, batch_axes=front, out_batch_axes=BatchAxes.leading(front.levels, n_out)
    )
    return bind(new_spec, *args), [0] * n_out
