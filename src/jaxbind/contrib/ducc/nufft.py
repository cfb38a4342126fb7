"""Non-uniform FFTs with fixed points (types 1 and 2)."""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np

from ... import get_linear_call, load_kwargs
from ._common import ducc0, _MODE, _real_of

__all__ = ["get_nufft"]

# --- non-uniform FFTs ------------------------------------------------------------

def _nufft_apply(out, args, kwargs, kind):
    coord, values = args
    if kind == 1:
        ducc0.nufft.nu2u(points=values, coord=coord, out=out[0], **kwargs)
    else:
        ducc0.nufft.u2nu(grid=values, coord=coord, out=out[0], **kwargs)


def _nufft(out, args, kwargs_dump):
    kwargs = load_kwargs(kwargs_dump)
    del kwargs["grid_shape"]
    _nufft_apply(out, args, kwargs, kwargs.pop("nufft_type"))


def _nufft_T(out, args, kwargs_dump):
    # Without conjugation, the transpose of the type-2 NUFFT with a given sign is the
    # type-1 NUFFT with the same sign, and the other way round.
    kwargs = load_kwargs(kwargs_dump)
    del kwargs["grid_shape"]
    _nufft_apply(out, args, kwargs, 3 - kwargs.pop("nufft_type"))


def _nufft_shapes(coord, kind, kwargs):
    grid = tuple(kwargs["grid_shape"])
    if coord.ndim != 2 or coord.shape[1] != len(grid):
        raise ValueError(f"jaxducc0 nufft: coord must be (npoints, {len(grid)}), got {coord.shape}")
    return (grid, (coord.shape[0],)) if kind == 1 else ((coord.shape[0],), grid)


def _nufft_abstract(coord, values, **kwargs):
    shape_in, shape_out = _nufft_shapes(coord, kwargs["nufft_type"], kwargs)[::-1]
    if values.shape != shape_in:
        raise ValueError(f"jaxducc0 nufft type {kwargs['nufft_type']}: expected values of "
                         f"shape {shape_in}, got {values.shape}")
    _real_of(values.dtype, "nufft")
    return ((shape_out, values.dtype),)


def _nufft_abstract_T(coord, ct, **kwargs):
    shape_in, _ = _nufft_shapes(coord, kwargs["nufft_type"], kwargs)[::-1]
    return ((shape_in, ct.dtype),)


_nufft_op = get_linear_call(_nufft, _nufft_T, _nufft_abstract, _nufft_abstract_T,
                            first_n_args_fixed=1, name="jaxducc0.nufft",
                            platform_mode=_MODE)


def get_nufft(coord, grid_shape, *, nufft_type, forward=True, epsilon=1e-6, nthreads=1,
              periodicity=2 * np.pi, fft_order=False, **kwargs):
    """A non-uniform FFT (``ducc0.nufft``) with fixed points, linear in the values.

    Args:
      coord: (npoints, ndim) point coordinates (float32 or float64), ndim 1-3.
        Periodic with ``periodicity`` (default 2 pi) in every dimension.
      grid_shape: shape of the uniform grid (ndim entries).
      nufft_type: 1 (non-uniform values -> grid, ``ducc0.nufft.nu2u``) or
        2 (grid -> values at the points, ``ducc0.nufft.u2nu``).
      forward: exponent sign, -1 if True; epsilon: accuracy; fft_order: grid
        starts at the zero mode instead of the most negative one.

    Returns:
      ``op(values) -> [result]`` for complex64/complex128 values. Type 2
      computes ``c_j = sum_k f_k exp(∓ i k·x_j)``; type 1 the sum the other way.
      The transpose of one type is the other type with the same sign (JAX
      transposes do not conjugate).
    """
    if nufft_type not in (1, 2):
        raise ValueError(f"jaxducc0.get_nufft: nufft_type must be 1 or 2, got {nufft_type!r}")
    coord = jnp.asarray(coord)
    return partial(_nufft_op, coord, grid_shape=tuple(int(n) for n in grid_shape),
                   nufft_type=nufft_type, forward=bool(forward), epsilon=float(epsilon),
                   nthreads=int(nthreads), periodicity=periodicity, fft_order=bool(fft_order),
                   **kwargs)
