"""Pure-JAX references of the DUCC ops: the slow, portable twin of each native body.

One module per family (`.fft`, `.nufft`, `.wgridder`, `.sht`), each function named
after the op it stands in for and called as that op's callable is: the op's arrays
(fixed ones included, in order) and the keyword arguments its callable reads; it
returns the op's outputs as a list. Written in jax.numpy and jax.lax only, so JAX
can jit, differentiate, vmap and lower them anywhere; nothing here imports ducc0.
Each op passes its function as ``reference=`` (see docs/portable.md). The references of
approximate ops (the NUFFTs, the gridder) carry ``tolerance(**kwargs)``, how far DUCC may be
from them at the call's ``epsilon``, which jaxbind.testing.check reads (`by_epsilon`).
"""


def by_epsilon(**kwargs) -> float:
    """The tolerance of a reference of an op that computes to the relative accuracy
    ``epsilon`` (or ``eps``) in the L2 norm: 100 times it, as the checker compares the
    largest elementwise difference relative to the largest element."""
    eps = kwargs.get("epsilon", kwargs.get("eps"))
    return 0.0 if eps is None else 100.0 * float(eps)
