"""Pure-JAX references of the DUCC ops: one module per family (`.fft`, `.nufft`,
`.wgridder`, `.sht`), each function named after the op it stands for and called as that
op's callable is (its arrays, then its keyword arguments). They import neither ducc0 nor
jaxbind's native extension, so a program lowered with them runs anywhere JAX does.
"""
