"""HEALPix spherical-harmonic synthesis, and the real alm layout it takes."""

from __future__ import annotations

import functools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ... import get_linear_call, load_kwargs
from ._common import _COMPLEX, _MODE, check_int, check_nthreads, ducc0
from .reference import sht as reference_sht

__all__ = [
    "get_healpix_sht",
    "nalm",
    "realalm_size",
    "realalm_ell",
    "realalm_to_alm",
    "alm_to_realalm",
]

# --- HEALPix spherical-harmonic synthesis ---------------------------------------


def nalm(lmax, mmax):
    """Number of complex a_lm coefficients for maximum moments ``lmax``, ``mmax``."""
    return ((mmax + 1) * (mmax + 2)) // 2 + (mmax + 1) * (lmax - mmax)


def realalm_size(lmax, mmax):
    """Length of the real alm layout that `get_healpix_sht` takes: ``2 nalm - lmax - 1``."""
    return 2 * nalm(lmax, mmax) - lmax - 1


def realalm_ell(lmax, mmax):
    """The degree l of every entry of the real alm layout (a NumPy int array).

    Useful for power spectra: ``S = C_ell[realalm_ell(lmax, mmax)]``.
    """
    return np.concatenate(
        [np.arange(lmax + 1)] + [np.repeat(np.arange(m, lmax + 1), 2) for m in range(1, mmax + 1)]
    )


def _xp(x):
    return jnp if isinstance(x, jax.Array) else np


def realalm_to_alm(x, lmax):
    """Real alm layout -> complex alm in DUCC's order (m-major), along the last axis.

    The inverse of `alm_to_realalm`. Works on NumPy arrays (returns NumPy) and
    on JAX arrays, also under ``jit``, ``grad`` and ``vmap`` (returns JAX).
    ``x[..., :lmax + 1]`` are the m = 0 coefficients; then come the real and
    imaginary parts of each m > 0 coefficient, times sqrt(2).
    """
    xp = _xp(x)
    x = xp.asarray(x)
    m0 = x[..., : lmax + 1]
    rest = (x[..., lmax + 1 :: 2] + 1j * x[..., lmax + 2 :: 2]) / np.sqrt(2.0)
    return xp.concatenate([m0.astype(rest.dtype), rest], axis=-1)


def alm_to_realalm(alm, lmax):
    """Complex alm (DUCC's order, last axis) -> the real layout of `get_healpix_sht`.

    The m = 0 coefficients keep their real part (their imaginary part must be 0 for
    a real map). Works on NumPy and JAX arrays (traceable), like `realalm_to_alm`.
    """
    xp = _xp(alm)
    alm = xp.asarray(alm)
    rest = alm[..., lmax + 1 :] * np.sqrt(2.0)
    pairs = xp.stack([rest.real, rest.imag], axis=-1).reshape(*rest.shape[:-1], -1)
    return xp.concatenate([alm[..., : lmax + 1].real, pairs], axis=-1)


@functools.lru_cache(maxsize=32)
def _healpix_geometry(nside):
    info = ducc0.healpix.Healpix_Base(nside, "RING").sht_info()
    return {k: np.ascontiguousarray(v) for k, v in info.items()}


def _realalm_to_alm(x, lmax):
    """Real alm layout -> complex: [a_l0 (real), then (re, im) of m > 0, times sqrt(2)]."""
    alm = np.empty((x.shape[0], (x.shape[1] + lmax + 1) // 2), dtype=_COMPLEX[x.dtype])
    alm[:, : lmax + 1] = x[:, : lmax + 1]
    alm[:, lmax + 1 :] = x[:, lmax + 1 :].view(alm.dtype) * (np.sqrt(2.0) / 2)
    return alm


def _alm_to_realalm(alm, lmax, out):
    out[:, : lmax + 1] = alm[:, : lmax + 1].real
    out[:, lmax + 1 :] = alm[:, lmax + 1 :].view(out.dtype) * np.sqrt(2.0)


def _sht_args(kwargs):
    geometry = _healpix_geometry(kwargs["nside"])
    return dict(
        spin=kwargs["spin"],
        lmax=kwargs["lmax"],
        mmax=kwargs["mmax"],
        nthreads=kwargs["nthreads"],
        **geometry,
    )


def _sht(out, args, kwargs_dump):
    (x,) = args
    kwargs = load_kwargs(kwargs_dump)
    alm = _realalm_to_alm(x, kwargs["lmax"])
    ducc0.sht.synthesis(alm=alm, map=out[0], **_sht_args(kwargs))


def _sht_T(out, args, kwargs_dump):
    (m,) = args
    kwargs = load_kwargs(kwargs_dump)
    alm = ducc0.sht.adjoint_synthesis(map=m, **_sht_args(kwargs))
    _alm_to_realalm(alm, kwargs["lmax"], out[0])


def _ncomp(spin):
    return 1 if spin == 0 else 2


def _sht_abstract(x, **kwargs):
    ncomp, n = _ncomp(kwargs["spin"]), 2 * nalm(kwargs["lmax"], kwargs["mmax"]) - kwargs["lmax"] - 1
    if x.shape != (ncomp, n) or x.dtype not in _COMPLEX:
        raise ValueError(
            f"jaxducc0.get_healpix_sht: expected real alm of shape {(ncomp, n)} "
            f"and dtype float32/float64, got {x.shape} {x.dtype}"
        )
    return (((ncomp, 12 * kwargs["nside"] ** 2), x.dtype),)


def _sht_abstract_T(m, **kwargs):
    ncomp, n = _ncomp(kwargs["spin"]), 2 * nalm(kwargs["lmax"], kwargs["mmax"]) - kwargs["lmax"] - 1
    return (((ncomp, n), m.dtype),)


_healpix_sht = get_linear_call(
    _sht,
    _sht_T,
    _sht_abstract,
    _sht_abstract_T,
    reference=reference_sht.healpix_sht,
    name="jaxducc0.healpix_sht",
    platform_mode=_MODE,
)


def get_healpix_sht(nside, lmax, mmax, spin, nthreads=1):
    """Spherical-harmonic synthesis on a HEALPix (RING) grid, as a linear JAX op.

    Args:
      nside: HEALPix resolution (>= 1); the map has ``12 * nside**2`` pixels.
      lmax: maximum l (inclusive, >= spin).
      mmax: maximum m (inclusive, 0 <= mmax <= lmax).
      spin: 0 for scalar maps (1 component), otherwise (> 0) 2 components.
      nthreads: DUCC threads (0: all hardware threads).

    Returns:
      ``op(alm) -> [map]``. ``alm`` is real-valued, shape
      ``(ncomp, 2 * nalm(lmax, mmax) - lmax - 1)``: the ``lmax + 1`` real
      coefficients with m = 0 first, then the real and imaginary parts of each
      m > 0 coefficient (in DUCC's order), multiplied by sqrt(2), so that the
      op is an orthogonal-friendly real-linear map. ``map`` has shape
      ``(ncomp, 12 * nside**2)`` and the dtype of ``alm``.
    """
    op = "get_healpix_sht"
    nside = check_int(op, "nside", nside, 1)
    lmax = check_int(op, "lmax", lmax, 0)
    mmax = check_int(op, "mmax", mmax, 0)
    spin = check_int(op, "spin", spin, 0)
    if mmax > lmax:
        raise ValueError(f"jaxducc0.{op}: mmax must be <= lmax, got mmax={mmax}, lmax={lmax}")
    if lmax < spin:
        raise ValueError(f"jaxducc0.{op}: lmax must be >= spin, got lmax={lmax}, spin={spin}")
    return partial(
        _healpix_sht,
        nside=nside,
        lmax=lmax,
        mmax=mmax,
        spin=spin,
        nthreads=check_nthreads(op, nthreads),
    )
