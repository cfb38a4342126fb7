"""Pure-JAX references of the DUCC ops: the slow, portable twin of each native body.

One module per family (`.fft`, `.nufft`, `.wgridder`, `.sht`; their fast paths
`.spreading`, `.type3`, `.wstacking`, `.sht_rings`), each function named after the op it
stands in for and called as that op's callable is: the op's arrays (fixed ones included,
in order) and the keyword arguments its callable reads; it returns the op's outputs as a
list. Written in jax.numpy and jax.lax, so JAX can jit, differentiate, vmap and lower
them anywhere (the fast NUFFTs are JAX primitives whose rules are NUFFTs again, lowered
to jax.lax: no custom call); nothing here imports ducc0. Each op passes its function as
``reference=`` (see docs/portable.md); the approximate ops (the NUFFTs, the gridder) as
``jaxbind.Reference(function, tolerance=by_epsilon)``: how far DUCC may be from them at
the call's ``epsilon``, which jaxbind.testing.check reads.

One convention for keyword arguments (`options`): each reference takes the options of its
op by name (``epsilon``/``eps``: the accuracy the approximate ones compute to); those
that only tune the native computation (``nthreads``, ``upsampfac``, ``sigma``...) are
named as accepted and ignored; any other is refused, naming the op and what it takes.
Helpers the families share: `options`, `blocks`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable

# How far DUCC's results may be from the exact ones, in multiples of the call's epsilon, by
# the checker's measure (the largest elementwise difference relative to the largest
# element). Measured over epsilon 1e-3 to 1e-12 in single and double precision (types 1-3
# in 1-D and 2-D, get_nufft, the gridder with and without the w-term): at most 0.83 times
# epsilon above rounding, so 3 leaves room while a 10-fold loss of accuracy fails.
EPSILON_FACTOR = 3.0


def by_epsilon(**kwargs) -> float:
    """The tolerance of a reference of an op that computes to the relative accuracy
    ``epsilon`` (or ``eps``): EPSILON_FACTOR times it. (jaxbind.testing.check allows
    rounding besides: an epsilon finer than the precision holds is not asked of it.)"""
    eps = kwargs.get("epsilon", kwargs.get("eps"))
    return 0.0 if eps is None else EPSILON_FACTOR * float(eps)


def options(*, tuning: Iterable[str] = ()) -> Callable[[Callable], Callable]:
    """Decorator: the reference of the op its function is named after, which refuses a
    keyword argument it does not take (a TypeError naming ``jaxducc0.<op>`` and what it
    takes) and accepts the op's `tuning` options (how DUCC computes, not what) by name,
    without passing them on."""

    def decorate(fn: Callable) -> Callable:
        taken = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        ignored = frozenset(tuning)
        accepted = ", ".join([*taken, *sorted(ignored)])

        @functools.wraps(fn)
        def reference(*args, **kwargs):
            unknown = sorted(k for k in kwargs if k not in ignored and k not in taken)
            if unknown:
                raise TypeError(
                    f"jaxducc0.{fn.__name__} reference: unexpected keyword arguments "
                    f"{unknown}; it takes {accepted}"
                )
            return fn(*args, **{k: v for k, v in kwargs.items() if k not in ignored})

        return reference

    return decorate


def blocks(count: int, per_item: int, elements: int, size: int | None = None) -> tuple[int, int]:
    """(items per block, number of blocks) for `count` items (points, rows) each needing
    `per_item` values in a block of about `elements` values; `size`: items per block
    asked for instead (at least 1, at most `count`)."""
    size = size or max(1, elements // max(1, per_item))
    size = max(1, min(size, count))
    return size, -(-count // size)
