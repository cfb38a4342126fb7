"""How fine an accuracy DUCC's kernels reach, asked of DUCC itself once and cached.

DUCC picks a spreading kernel for the requested accuracy, dimension and precision,
and refuses an ``epsilon`` finer than any of its kernels reaches ("No appropriate
kernel found"). The limit differs between its transforms: type-3 NUFFTs run two
stages and reach half the accuracy of types 1 and 2, and the gridder has its own.
Rather than a table that the next DUCC release would make wrong, the finest
accuracy of each (transform, dimension, precision) is found by running DUCC on a
tiny problem, bisecting the accuracy between what fails and what works.

The policy every DUCC op with an accuracy follows (`working_precision`):

- an accuracy finer than DUCC reaches in the data's precision is clamped to the
  finest it reaches, as FINUFFT does;
- in single precision, an accuracy finer than single precision's kernels reach is
  computed in double precision (the operands converted, the result rounded back),
  so the result is as accurate as single precision can hold.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from functools import cache

import numpy as np

from ._common import ducc0

__all__ = ["finest_epsilon", "working_precision"]

_lock = threading.Lock()


def _runs(
    transform: str, ndim: int, single: bool, eps: float, sigma: tuple[float, float] | None
) -> bool:
    """Whether DUCC accepts `eps` for a tiny problem of this kind."""
    extra = {} if sigma is None else dict(sigma_min=sigma[0], sigma_max=sigma[1])
    real = np.float32 if single else np.float64
    cplx = np.complex64 if single else np.complex128
    pts = np.linspace(-1.0, 1.0, 2 * ndim, dtype=real).reshape(2, ndim)
    values = np.ones(2, cplx)
    try:
        if transform == "nufft":
            ducc0.nufft.nu2u(
                points=values,
                coord=pts,
                forward=True,
                epsilon=eps,
                out=np.empty((16,) * ndim, cplx),
                **extra,
            )
        elif transform == "nufft3":
            ducc0.nufft.experimental.nu2nu(
                points_in=values, coord_in=pts, coord_out=pts, forward=True, epsilon=eps, **extra
            )
        elif transform in ("wgridder", "wgridder_w"):
            uvw = np.array([[10.0, 20.0, 1.0], [-30.0, 5.0, -2.0]])
            ducc0.wgridder.experimental.dirty2vis(
                uvw=uvw,
                freq=np.array([1e9]),
                dirty=np.ones((32, 32), real),
                pixsize_x=1e-5,
                pixsize_y=1e-5,
                epsilon=eps,
                do_wgridding=transform == "wgridder_w",
                **extra,
            )
        else:  # pragma: no cover - internal misuse
            raise ValueError(transform)
    except RuntimeError:
        return False
    return True


@cache
def _finest(transform: str, ndim: int, single: bool, sigma: tuple[float, float] | None) -> float:
    hi = 1e-1
    if not _runs(transform, ndim, single, hi, sigma):  # pragma: no cover - a DUCC we do not know
        raise RuntimeError(f"jaxducc0: DUCC refuses epsilon={hi} for {transform} in {ndim}-D")
    lo = 1e-17
    if _runs(transform, ndim, single, lo, sigma):  # pragma: no cover - no limit at all
        return lo
    for _ in range(40):  # in log space: hi/lo shrinks to within a factor 1 + 1e-10
        mid = math.sqrt(lo * hi)
        if _runs(transform, ndim, single, mid, sigma):
            hi = mid
        else:
            lo = mid
    return hi * (1 + 1e-6)


def finest_epsilon(
    transform: str, ndim: int, single: bool, sigma: Sequence[float] | None = None
) -> float:
    """The finest accuracy DUCC reaches for `transform` ("nufft" for types 1 and 2,
    "nufft3", "wgridder", "wgridder_w" with the w-term) in `ndim` dimensions, with
    DUCC's oversampling range `sigma` (``(sigma_min, sigma_max)``; None: its default)."""
    pair = None if sigma is None else (float(sigma[0]), float(sigma[1]))
    with _lock:
        return _finest(transform, int(ndim), bool(single), pair)


def working_precision(
    transform: str, ndim: int, single: bool, eps: float, sigma: Sequence[float] | None = None
) -> tuple[float, bool]:
    """``(epsilon for DUCC, compute in double precision?)`` for a requested accuracy."""
    if single and eps < finest_epsilon(transform, ndim, True, sigma):
        return max(eps, finest_epsilon(transform, ndim, False, sigma)), True
    return max(eps, finest_epsilon(transform, ndim, single, sigma)), False


# --- the oversampling factor of the jax-finufft drop-in ------------------------------

# FINUFFT's grids above which its classic rule takes sigma = 1.25 for types 1 and 2, by
# dimension (counted in modes); its type 3 always does. Below 1e-9, sigma = 2.0.
_LARGE_GRID = {1: 10_000_000, 2: 300_000, 3: 3_000_000}
_DUCC_FACTORS = tuple(i / 100 for i in range(101, 301))  # where DUCC's kernels are sought


def has_kernels(transform: str, ndim: int, sigma: float) -> bool:
    """Whether DUCC has kernels for the oversampling factor `sigma` exactly."""
    with _lock:
        return _runs(transform, ndim, False, 1e-1, (sigma, sigma))


def default_upsampfac(nufft_type: int, ndim: int, single: bool, eps: float, modes: int) -> float:
    """The oversampling factor of a NUFFT whose caller leaves it to FINUFFT (upsampfac 0):
    FINUFFT's rule on the transform, the grid's `modes` and `eps` (never the points): 2.0,
    or 1.25 for type 3 and for large grids where ``eps >= 1e-9``. A factor whose kernels
    fall short of `eps` in the data's precision gives way: 1.25 to 2.0, and 2.0 to the
    smallest larger factor that reaches it (if any does)."""
    transform = "nufft3" if nufft_type == 3 else "nufft"
    if (nufft_type == 3 or modes > _LARGE_GRID[ndim]) and eps >= 1e-9:
        if eps >= finest_epsilon(transform, ndim, single, (1.25, 1.25)):
            return 1.25
    if eps >= finest_epsilon(transform, ndim, single, (2.0, 2.0)):
        return 2.0
    for sigma in _DUCC_FACTORS:
        if sigma > 2.0 and has_kernels(transform, ndim, sigma):
            if eps >= finest_epsilon(transform, ndim, single, (sigma, sigma)):
                return sigma
    return 2.0
