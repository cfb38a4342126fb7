"""DUCC's transform families as JAX ops, one module each (re-exported by ``jaxducc0``).

- :mod:`.fft`: ``c2c``, ``genuine_fht``, ``r2c``, ``c2r``;
- :mod:`.sht`: HEALPix spherical-harmonic synthesis and the real alm layout;
- :mod:`.wgridder`: the radio-interferometric (w-)gridder;
- :mod:`.nufft`: non-uniform FFTs.

:mod:`._common` holds what they share (dtype pairs, the GPU platform mode).
"""
