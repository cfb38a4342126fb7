"""DUCC's transform families as JAX ops, one module each (re-exported by ``jaxducc0``).

- `.fft`: ``c2c``, ``genuine_fht``, ``r2c``, ``c2r``;
- `.sht`: HEALPix spherical-harmonic synthesis and the real alm layout;
- `.wgridder`: the radio-interferometric (w-)gridder;
- `.nufft`: non-uniform FFTs.

`._common` holds what they share (dtype pairs, the GPU platform mode).
"""
