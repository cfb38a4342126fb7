"""Pure-JAX references of the DUCC ops: the slow, portable twin of each native body.

One module per family (`.fft`, `.nufft`, `.wgridder`, `.sht`), each function named
after the op it stands in for and called as that op's callable is: the op's arrays
(fixed ones included, in order) and the keyword arguments its callable reads; it
returns the op's outputs as a list. Written in jax.numpy and jax.lax, so JAX can jit,
differentiate, vmap and lower them anywhere (the fast NUFFTs are JAX primitives whose
rules are NUFFTs again, lowered to jax.lax: no custom call); nothing here imports ducc0.
Each op passes its function as ``reference=`` (see docs/portable.md). The references of
approximate ops (the NUFFTs, the gridder) carry ``tolerance(**kwargs)``, how far DUCC may be
from them at the call's ``epsilon``, which jaxbind.testing.check reads (`by_epsilon`).
"""

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
