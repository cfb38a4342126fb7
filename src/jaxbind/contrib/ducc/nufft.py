"""Non-uniform FFTs with fixed points (types 1 and 2)."""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np

from ... import Reference, get_linear_call, load_kwargs
from ._common import (
    _COMPLEX,
    _MODE,
    _real_of,
    check_choice,
    check_int,
    check_kwargs,
    check_nthreads,
    check_positive,
    check_sigma,
)
from .nufft_points import _transform
from .reference import by_epsilon
from .reference import nufft as reference_nufft

__all__ = ["get_nufft"]

# --- non-uniform FFTs ------------------------------------------------------------

OP = "get_nufft"
_DUCC_OPTIONS = ("verbosity", "sigma_min", "sigma_max")  # passed through to ducc0.nufft


def _nufft_apply(out, args, kwargs_dump, transposed):
    # Without conjugation, the transpose of the type-2 NUFFT with a given sign is the
    # type-1 NUFFT with the same sign, and the other way round.
    kw = load_kwargs(kwargs_dump)
    coord, values = args
    kind = 3 - kw["nufft_type"] if transposed else kw["nufft_type"]
    options = {k: kw[k] for k in _DUCC_OPTIONS if k in kw}
    options["periodicity"] = kw["periodicity"]
    _transform(
        out[0][None],
        values[None],
        coord.T,
        None,
        dict(
            nufft_type=kind,
            sign=-1 if kw["forward"] else 1,
            eps=kw["epsilon"],
            nthreads=kw["nthreads"],
            modeord=kw["fft_order"],
            ducc_options=options,
        ),
    )


def _nufft(out, args, kwargs_dump):
    _nufft_apply(out, args, kwargs_dump, False)


def _nufft_T(out, args, kwargs_dump):
    _nufft_apply(out, args, kwargs_dump, True)


def _nufft_shapes(coord, kind, kwargs):
    grid = tuple(kwargs["grid_shape"])
    if len(coord.shape) != 2 or coord.shape[1] != len(grid):
        raise ValueError(
            f"jaxducc0.{OP}: coord must be (npoints, {len(grid)}) for a "
            f"{len(grid)}-D grid, got {tuple(coord.shape)}"
        )
    if np.dtype(coord.dtype) not in _COMPLEX:
        raise TypeError(f"jaxducc0.{OP}: coord must be float32 or float64, got {coord.dtype}")
    return (grid, (coord.shape[0],)) if kind == 1 else ((coord.shape[0],), grid)


def _nufft_abstract(coord, values, **kwargs):
    shape_in, shape_out = _nufft_shapes(coord, kwargs["nufft_type"], kwargs)[::-1]
    if values.shape != shape_in:
        raise ValueError(
            f"jaxducc0.{OP} (type {kwargs['nufft_type']}): expected values of "
            f"shape {shape_in}, got {values.shape}"
        )
    _real_of(values.dtype, "nufft")
    return ((shape_out, values.dtype),)


def _nufft_abstract_T(coord, ct, **kwargs):
    shape_in, _ = _nufft_shapes(coord, kwargs["nufft_type"], kwargs)[::-1]
    return ((shape_in, ct.dtype),)


def _nufft_rule(*_shapes, nufft_type, grid_shape, **_):
    """Points m (coord (m, d)) split: type 1 (points to grid) sums each device's grid,
    type 2 (grid to points) computes each device's points from the whole grid."""
    grid = " ".join(f"g{k}" for k in range(len(grid_shape)))
    if nufft_type == 1:
        return f"m d, m -> {grid}", ("m",)
    return f"m d, {grid} -> m"


_nufft_op = get_linear_call(
    _nufft,
    _nufft_T,
    _nufft_abstract,
    _nufft_abstract_T,
    reference=Reference(reference_nufft.nufft, tolerance=by_epsilon),
    first_n_args_fixed=1,
    name="jaxducc0.nufft",
    platform_mode=_MODE,
    sharding=_nufft_rule,
)


def get_nufft(
    coord,
    grid_shape,
    *,
    nufft_type,
    forward=True,
    epsilon=1e-6,
    nthreads=1,
    periodicity=2 * np.pi,
    fft_order=False,
    **kwargs,
):
    """A non-uniform FFT (``ducc0.nufft``) with fixed points, linear in the values.

    Args:
      coord: (npoints, ndim) point coordinates (float32 or float64), ndim 1-3.
        Periodic with ``periodicity`` (default 2 pi) in every dimension.
      grid_shape: shape of the uniform grid (ndim entries).
      nufft_type: 1 (non-uniform values -> grid, ``ducc0.nufft.nu2u``) or
        2 (grid -> values at the points, ``ducc0.nufft.u2nu``).
      forward: exponent sign, -1 if True; epsilon: accuracy (> 0; see
        `nufft1` for the finest DUCC reaches); fft_order: grid
        starts at the zero mode instead of the most negative one.
      **kwargs: ``verbosity``, ``sigma_min`` and ``sigma_max``, passed to DUCC.

    Returns:
      ``op(values) -> [result]`` for complex64/complex128 values. Type 2
      computes ``c_j = sum_k f_k exp(∓ i k·x_j)``; type 1 the sum the other way.
      The transpose of one type is the other type with the same sign (JAX
      transposes do not conjugate). A non-finite point makes every output of
      type 1 NaN, and the output at that point of type 2. No points, or an
      empty grid, give zeros or an empty result.
    """
    check_choice(OP, "nufft_type", nufft_type, (1, 2))
    grid = tuple(check_int(OP, "each grid_shape length", n) for n in np.atleast_1d(grid_shape))
    if not 1 <= len(grid) <= 3:
        raise ValueError(f"jaxducc0.{OP}: grid_shape must have 1-3 dimensions, got {grid}")
    check_kwargs(OP, kwargs, _DUCC_OPTIONS)
    check_sigma(
        OP, kwargs, "1.2 <= sigma_min < sigma_max <= 2.5", lambda lo, hi: 1.2 <= lo < hi <= 2.5
    )
    if "verbosity" in kwargs:
        kwargs["verbosity"] = check_int(OP, "verbosity", kwargs["verbosity"])
    coord = jnp.asarray(coord)
    return partial(
        _nufft_op,
        coord,
        grid_shape=grid,
        nufft_type=nufft_type,
        forward=bool(forward),
        epsilon=check_positive(OP, "epsilon", epsilon),
        nthreads=check_nthreads(OP, nthreads),
        periodicity=check_positive(OP, "periodicity", periodicity),
        fft_order=bool(fft_order),
        **kwargs,
    )
