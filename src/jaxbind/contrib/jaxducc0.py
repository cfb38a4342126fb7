"""DUCC's transforms as differentiable, batchable JAX ops.

Drop-in compatible with JAXbind 1.3's ``jaxbind.contrib.jaxducc0``:

- `c2c`, `genuine_fht`: complex FFT and Hartley transform (ops).
- `r2c`, `c2r`: the real FFT pair (ops).
- `get_healpix_sht`, `nalm`: spherical-harmonic synthesis on HEALPix;
  `realalm_to_alm`, `alm_to_realalm`, `realalm_size`,
  `realalm_ell`: its real coefficient layout (NumPy and JAX).
- `get_wgridder`: the radio-interferometric (w-)gridder, image to visibilities.
- `get_nufft`: type-1 and type-2 non-uniform FFTs with fixed points (the fast path).
- `nufft1`, `nufft2`, `nufft3`, `Opts`: jax-finufft's calls,
  differentiable in the values and in the points; `nufft_points`, the op beneath.
- `NufftPlan`: a NUFFT of any type with fixed, concrete points, planned once.

Every op returns a list with one array, as JAXbind ops do, and follows JAX's
convention for transposes: no complex conjugation (the transpose of ``x -> A x``
is ``y -> A^T y``). Keyword arguments go to the corresponding ducc0 function.
The FFT ops are vectorized: ``vmap`` becomes extra, untransformed axes of one
DUCC call. The others map over the batch, one DUCC call per element.

DUCC runs on the CPU; the ops also work inside GPU programs (``platform_mode="host"``):
each call copies its operands to the host and its results back to the GPU.
"""

from __future__ import annotations

# Re-exports (hence noqa: F401): __all__ below names them through their modules' __all__.
from . import ducc
from .ducc._common import _COMPLEX, _REAL  # noqa: F401  (ducc0 is imported here)
from .ducc.fft import c2c, c2r, genuine_fht, r2c  # noqa: F401
from .ducc.finufft import Opts, nufft1, nufft2, nufft3  # noqa: F401
from .ducc.nufft import get_nufft  # noqa: F401
from .ducc.nufft_plan import NufftPlan  # noqa: F401
from .ducc.nufft_points import nufft_points
from .ducc.sht import (  # noqa: F401  (and two private names for JAXbind 1.3's tests)
    _healpix_geometry,
    _realalm_to_alm,
    alm_to_realalm,
    get_healpix_sht,
    nalm,
    realalm_ell,
    realalm_size,
    realalm_to_alm,
)
from .ducc.wgridder import get_wgridder  # noqa: F401

# jaxducc0's names: those of each family, and the op beneath jax-finufft's calls (not
# the helpers that nufft_points.__all__ lists besides).
__all__ = [
    *ducc.fft.__all__,
    *ducc.sht.__all__,
    *ducc.wgridder.__all__,
    *ducc.nufft.__all__,
    *ducc.finufft.__all__,
    "nufft_points",
    *ducc.nufft_plan.__all__,
]
