"""The pure-JAX reference of ``jaxducc0.healpix_sht`` (`get_healpix_sht`): HEALPix
synthesis from the real alm layout, at any size the map fits in memory.

The transform itself is in `.sht_rings` (Legendre recurrences evaluated on the fly per
ring, FFTs and chirp-z transforms along the rings; the adjoint its own pass; memory
O(npix + lmax^2)); this module is the op's entry, `healpix_sht`, and re-exports the
HEALPix RING geometry, `healpix_rings`. Neither imports ducc0 nor the native op, so a
program lowered with it runs where neither is installed.

Conventions (DUCC's, checked against ``ducc0.sht.synthesis`` in
tests/contrib/test_references_wgridder_sht.py): spherical harmonics with the Condon-Shortley
phase, ``_sY_lm = (-1)^s sqrt((2l+1)/(4 pi)) d^l_{m,-s}(theta) e^{i m phi}`` (for s = 0 the
usual ``Y_lm``; the factor (-1)^s was found against DUCC: without it odd spins come out
negated); for spin s > 0 the two components are Q, U = Re, Im of
``-sum (E_lm + i B_lm) _sY_lm`` over all m (the HEALPix / libsharp convention
``_{+-s}a_lm = -(E_lm +- i B_lm)``), with the entries of l < s unused.
"""

from __future__ import annotations

from . import options
from .sht_rings import healpix_rings, realalm_size, tied_synthesis

__all__ = ["healpix_sht", "healpix_rings"]

OP = "healpix_sht"


@options(tuning=("nthreads",))  # (DUCC's threads: how it computes, not what)
def healpix_sht(alm, *, nside, lmax, mmax, spin):
    """The reference of ``jaxducc0.healpix_sht``: real alm layout -> HEALPix RING map.

    Called as the op's callable is: ``alm`` (ncomp, realalm_size(lmax, mmax)), float32 or
    float64, and the keyword arguments `get_healpix_sht` gives the op (``nside``, ``lmax``,
    ``mmax``, ``spin``; ``nthreads`` is read and ignored). Returns ``[map]``, shape
    ``(ncomp, 12 nside**2)`` in the dtype of ``alm``. Linear in ``alm``: its transpose
    (``jax.linear_transpose``, the VJP) is the adjoint synthesis, a pass of its own
    (`.sht_rings.tied_synthesis`); it differentiates, transposes and vmaps to any order.
    """
    ncomp = 1 if spin == 0 else 2
    nreal = realalm_size(int(lmax), int(mmax))
    if alm.ndim != 2 or alm.shape != (ncomp, nreal):
        raise ValueError(
            f"jaxducc0.{OP} reference: expected alm of shape {(ncomp, nreal)} "
            f"for lmax={lmax}, mmax={mmax}, spin={spin}, got {tuple(alm.shape)}"
        )
    return [tied_synthesis(alm, int(nside), int(lmax), int(mmax), int(spin))]
