"""jaxbind's own batching for callables that cannot batch: loop inside one custom call."""

from __future__ import annotations

import numpy as np

__all__ = ["looped"]


def looped(fn, batch_axes, kwargs_dump):
    """A callable that applies `fn` to every batch element of leading batch axes.

    `batch_axes` gives, per input, its batch axes (all leading, as the batching
    rule arranges); outputs carry every level at the front. `fn` sees each
    element's C-contiguous views and the call's own keyword arguments.
    """
    def call(out, args, _):
        levels = next(a.shape[:len(ax)] for a, ax in zip(args, batch_axes) if ax)
        for idx in np.ndindex(*levels):
            fn(tuple(o[idx] for o in out),
               tuple(a[idx[len(idx) - len(ax):]] if ax else a for a, ax in zip(args, batch_axes)),
               kwargs_dump)
    return call
