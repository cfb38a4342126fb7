"""Pure-JAX references of the DUCC ops: the slow, portable twin of each native body.

One module per family (`.fft`, `.nufft`, `.wgridder`, `.sht`), each function named
after the op it stands in for and called as that op's callable is: the op's arrays
(fixed ones included, in order) and the keyword arguments its callable reads; it
returns the op's outputs as a list. Written in jax.numpy and jax.lax only, so JAX
can jit, differentiate, vmap and lower them anywhere; nothing here imports ducc0.
Each op passes its function as ``reference=`` (see docs/portable.md).
"""
