"""jaxbind's own batching for callables that cannot batch: loop inside one custom call."""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["looped"]


def looped(fn, batch_axes, kwargs_dump):
    """A callable that applies `fn` to every batch element of leading batch axes.

    `batch_axes` gives, per input, its batch axes (all leading, as the batching
    rule arranges); outputs carry every level at the front. `fn` sees each
    element's C-contiguous views and the call's own keyword arguments.
    """
    batched = [bool(ax) for ax in batch_axes]

    def call(out, args, _):
        levels = next(a.shape[:len(ax)] for a, ax in zip(args, batch_axes) if ax)
        n = int(np.prod(levels))
        # Every batched array carries all levels in front: flatten them to one
        # axis (a free reshape of C-contiguous views) and loop over it.
        # Iterating an array yields its sub-array views at C speed.
        iters = [iter(o.reshape((n,) + o.shape[len(levels):])) for o in out]
        iters += [iter(a.reshape((n,) + a.shape[len(levels):])) if b else itertools.repeat(a, n)
                  for a, b in zip(args, batched)]
        n_out = len(out)
        for views in zip(*iters):
            fn(views[:n_out], views[n_out:], kwargs_dump)
    return call
