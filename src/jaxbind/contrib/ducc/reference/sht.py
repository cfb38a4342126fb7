"""The pure-JAX reference of ``jaxducc0.healpix_sht`` (`get_healpix_sht`): HEALPix
synthesis from the real alm layout, as two matrix products built in NumPy at trace time.

This module owns the HEALPix RING geometry computed from ``nside`` alone (`healpix_rings`),
the Wigner-d recurrence that gives the spin-weighted harmonics at the ring colatitudes, and
the reference `healpix_sht` itself. It imports neither ducc0 nor the native op, so a program
lowered with it runs where neither is installed.

The synthesis is factored by ring, as DUCC's is, but with dense matrices in place of FFTs:

1. per ring, the Fourier coefficients of the map along the ring (cos and sin of m phi, for
   each m <= mmax) are ``Lambda @ (alm * S)``: ``Lambda`` (nrings, nreal) holds the
   spin-weighted Legendre functions of each alm entry at each ring's colatitude, ``S``
   (nreal, 2 (mmax + 1)) sends each entry to the Fourier term it feeds;
2. each pixel then sums its ring's terms against ``cos(m phi)`` and ``sin(m phi)`` at its
   own azimuth: a gather of the ring's row and a product with ``T`` (npix, 2 (mmax + 1)).

Work is ``ncomp**2 * nrings * nreal * 2 (mmax + 1) + ncomp * npix * 2 (mmax + 1)``
multiply-adds; the matrices take ``8 * (ncomp**2 * nrings * nreal + npix * 2 (mmax + 1))``
bytes in float64 (half in float32). For nside = 32, lmax = mmax = 64 (spin 0): Lambda is
127 x 4225 (4.3 MB), T is 12288 x 130 (12.8 MB); nside = 64, lmax = 128: 34 MB and 102 MB.
The seeds of the recurrence are computed in logarithms, so nothing overflows; they
underflow to zero (losing terms that matter) only beyond lmax of several hundred at small
nside, far past where this reference is worth its time.

Conventions (DUCC's, checked against ``ducc0.sht.synthesis`` in
tests/contrib/test_references_wgridder_sht.py): spherical harmonics with the Condon-Shortley
phase, ``_sY_lm = (-1)^s sqrt((2l+1)/(4 pi)) d^l_{m,-s}(theta) e^{i m phi}`` (for s = 0 the
usual ``Y_lm``; the factor (-1)^s was found against DUCC: without it odd spins come out
negated); for spin s > 0 the two components are Q, U = Re, Im of
``-sum (E_lm + i B_lm) _sY_lm`` over all m (the HEALPix / libsharp convention
``_{+-s}a_lm = -(E_lm +- i B_lm)``), with the entries of l < s unused.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np

__all__ = ["healpix_sht", "healpix_rings"]

OP = "healpix_sht"
# Options of the native op that do not change what it computes.
_IGNORED = frozenset({"nthreads"})


def healpix_rings(nside):
    """The HEALPix RING grid of `nside`: ``(z, phi0, nphi, ringstart)``, NumPy arrays
    over the ``4 nside - 1`` rings from north to south.

    ``z`` is the cosine of each ring's colatitude (float64; exact rationals, so that the
    polar rings keep their accuracy), ``phi0`` the azimuth of its first pixel, ``nphi``
    its number of pixels and ``ringstart`` the index of its first pixel in the map.
    """
    n = int(nside)
    i = np.arange(1, 4 * n, dtype=np.int64)  # ring number, 1-based
    north = np.minimum(i, 4 * n - i)  # the mirrored ring in the northern half
    polar = north < n
    z = np.where(polar, 1.0 - north**2 / (3.0 * n * n), (2 * n - i) * (2.0 / (3.0 * n)))
    z = np.where(polar & (i > 2 * n), -z, z)
    nphi = np.where(polar, 4 * north, 4 * n)
    # polar rings and every other equatorial ring start half a pixel east of phi = 0
    shifted = polar | ((i - n) % 2 == 0)
    phi0 = np.where(shifted, np.pi / nphi, 0.0)
    ringstart = np.concatenate([[0], np.cumsum(nphi)[:-1]])
    return z, phi0, nphi, ringstart


def _wigner_d(lmax, a, b, z):
    """``d^l_{ab}(theta)`` for l = 0 .. lmax (rows; zero where l < max(|a|, |b|)) at the
    colatitudes of cosine `z` (columns), by the three-term recurrence in l, upward from
    its closed form at ``l = max(|a|, |b|)``."""
    out = np.zeros((lmax + 1, z.size))
    j = max(abs(a), abs(b))
    if j > lmax:
        return out
    half_c, half_s = np.sqrt((1.0 + z) / 2.0), np.sqrt((1.0 - z) / 2.0)

    def top(k):  # d^j_{j k} = sqrt((2j)! / ((j+k)! (j-k)!)) cos^{j+k} (-sin)^{j-k} (theta/2)
        log = 0.5 * (math.lgamma(2 * j + 1) - math.lgamma(j + k + 1) - math.lgamma(j - k + 1))
        value = np.exp(log + (j + k) * np.log(half_c) + (j - k) * np.log(half_s))
        return value if (j - k) % 2 == 0 else -value

    # d^l_{ab} = (-1)^(a-b) d^l_{ba} = d^l_{-b,-a}: bring the index equal to j first
    if a == j:
        out[j] = top(b)
    elif a == -j:
        out[j] = top(-b) * (-1) ** ((j + b) % 2)
    elif b == j:
        out[j] = top(a) * (-1) ** ((j - a) % 2)
    else:  # b == -j
        out[j] = top(-a)
    for ell in range(j, lmax):
        if ell == 0:  # a = b = 0: d^1_00 = cos theta
            out[1] = z
            continue
        up = ell * math.sqrt(((ell + 1) ** 2 - a * a) * ((ell + 1) ** 2 - b * b))
        here = (2 * ell + 1) * (ell * (ell + 1) * z - a * b)
        below = (ell + 1) * math.sqrt((ell * ell - a * a) * (ell * ell - b * b))
        out[ell + 1] = (here * out[ell] - below * out[ell - 1]) / up
    return out


def _layout(lmax, mmax):
    """For each entry of the real alm layout: its l, its m and whether it is an
    imaginary part (the layout of `get_healpix_sht`: m = 0 first, then (re, im) pairs)."""
    ell = [np.arange(lmax + 1)]
    m = [np.zeros(lmax + 1, np.int64)]
    imag = [np.zeros(lmax + 1, bool)]
    for mm in range(1, mmax + 1):
        ls = np.arange(mm, lmax + 1)
        ell.append(np.repeat(ls, 2))
        m.append(np.full(2 * ls.size, mm))
        imag.append(np.tile([False, True], ls.size))
    return np.concatenate(ell), np.concatenate(m), np.concatenate(imag)


@functools.lru_cache(maxsize=16)
def _matrices(nside, lmax, mmax, spin):
    """The static float64 factors of the synthesis: ``(lam, sel, ring_of_pixel, trig)``.

    ``lam[o, c]`` (nrings, nreal) and ``sel[o, c]`` (nreal, 2 (mmax + 1)) take input
    component c (E, B for spin > 0) to output component o (Q, U): the map's Fourier
    coefficients on ring r are ``sum_c lam[o, c][r] @ (x[c][:, None] * sel[o, c])``,
    columns m for cos(m phi) and mmax + 1 + m for sin(m phi); ``trig`` (npix, 2 (mmax+1))
    holds those functions at every pixel.
    """
    z, phi0, nphi, _ = healpix_rings(nside)
    ell, m, imag = _layout(lmax, mmax)
    nreal, ncol = ell.size, 2 * (mmax + 1)
    norm = np.sqrt((2 * ell + 1) / (4 * np.pi))[:, None]
    if spin == 0:
        lam_m = np.zeros((nreal, z.size))  # Y_lm(theta, 0) of each entry's (l, m)
        for mm in range(mmax + 1):
            rows = m == mm
            lam_m[rows] = _wigner_d(lmax, mm, 0, z)[ell[rows]]
        lam_m *= norm
        # map = sum_l a_l0 Y_l0 + 2 Re(a_lm e^{i m phi}) Y_lm(theta, 0), and the layout
        # holds sqrt(2) Re a_lm, sqrt(2) Im a_lm: weights 1, sqrt(2) cos, -sqrt(2) sin
        weight = np.where(m == 0, 1.0, np.where(imag, -np.sqrt(2.0), np.sqrt(2.0)))
        col = np.where(imag, mmax + 1 + m, m)
        lam = lam_m.T[None, None]
        sel = np.zeros((1, 1, nreal, ncol))
        sel[0, 0, np.arange(nreal), col] = weight
    else:
        # lambda_+ = _sY_lm(theta, 0), lambda_- = (-1)^s _{-s}Y_lm(theta, 0); with
        # F1 = lambda_+ + lambda_-, F2 = lambda_+ - lambda_-, a term m > 0 of
        # -(E + iB) _sY_lm plus its m -> -m partner gives, for E = e1 + i e2, B = b1 + i b2:
        #   Q = -F1 (e1 cos - e2 sin) + F2 (b2 cos + b1 sin)
        #   U = -F2 (e1 sin + e2 cos) - F1 (b1 cos - b2 sin)
        # and at m = 0 (F2 = 0, F1 = 2 lambda_+) half of that.
        f1 = np.zeros((nreal, z.size))
        f2 = np.zeros((nreal, z.size))
        for mm in range(mmax + 1):
            rows = m == mm
            # _sY_lm(theta, 0) = (-1)^s sqrt((2l+1)/(4 pi)) d^l_{m,-s}(theta)
            plus = (-1) ** spin * _wigner_d(lmax, mm, -spin, z)[ell[rows]]
            minus = _wigner_d(lmax, mm, spin, z)[ell[rows]]
            f1[rows], f2[rows] = plus + minus, plus - minus
        scale = np.where(m == 0, 0.5, 1.0 / np.sqrt(2.0))[:, None]
        f1 *= norm * scale
        f2 *= norm * scale
        lam = np.stack([np.stack([f1.T, f2.T]), np.stack([f2.T, f1.T])])  # [o, c]
        sel = np.zeros((2, 2, nreal, ncol))
        k = np.arange(nreal)
        cos, sin = m, mmax + 1 + m
        re, im = ~imag, imag
        # (o, c, entries, column, sign): Q from E with F1, Q from B with F2, U from E
        # with F2, U from B with F1, per the two lines above
        for o, c, rows, column, sign in (
            (0, 0, re, cos, -1.0),
            (0, 0, im, sin, 1.0),
            (0, 1, re, sin, 1.0),
            (0, 1, im, cos, 1.0),
            (1, 0, re, sin, -1.0),
            (1, 0, im, cos, -1.0),
            (1, 1, re, cos, -1.0),
            (1, 1, im, sin, 1.0),
        ):
            sel[o, c, k[rows], column[rows]] = sign
    ring_of_pixel = np.repeat(np.arange(z.size), nphi)
    phi = phi0[ring_of_pixel] + (
        np.arange(ring_of_pixel.size) - np.repeat(np.cumsum(nphi) - nphi, nphi)
    ) * (2 * np.pi / nphi[ring_of_pixel])
    ms = np.arange(mmax + 1)
    trig = np.concatenate([np.cos(np.outer(phi, ms)), np.sin(np.outer(phi, ms))], axis=1)
    return lam, sel, ring_of_pixel, trig


def healpix_sht(alm, *, nside, lmax, mmax, spin, **options):
    """The reference of ``jaxducc0.healpix_sht``: real alm layout -> HEALPix RING map.

    Called as the op's callable is: ``alm`` (ncomp, realalm_size(lmax, mmax)), float32 or
    float64, and the keyword arguments `get_healpix_sht` gives the op (``nside``, ``lmax``,
    ``mmax``, ``spin``; ``nthreads`` is read and ignored). Returns ``[map]``, shape
    ``(ncomp, 12 nside**2)`` in the dtype of ``alm``. Linear in ``alm``; JAX derives its
    transpose (the adjoint synthesis). The matrices are built in float64 NumPy at trace
    time (cached per geometry) and applied in ``alm``'s precision; see the module
    docstring for their sizes.
    """
    unknown = set(options) - _IGNORED
    if unknown:
        raise TypeError(
            f"jaxducc0.{OP} reference: unexpected keyword arguments {sorted(unknown)}; "
            f"it takes nside, lmax, mmax, spin and {sorted(_IGNORED)}"
        )
    lam, sel, ring_of_pixel, trig = _matrices(int(nside), int(lmax), int(mmax), int(spin))
    ncomp = lam.shape[0]
    if alm.ndim != 2 or alm.shape != (ncomp, sel.shape[2]):
        raise ValueError(
            f"jaxducc0.{OP} reference: expected alm of shape {(ncomp, sel.shape[2])} "
            f"for lmax={lmax}, mmax={mmax}, spin={spin}, got {tuple(alm.shape)}"
        )
    dtype = alm.dtype
    trig = jnp.asarray(trig, dtype)
    rows = jnp.asarray(ring_of_pixel)
    maps = []
    for o in range(ncomp):
        coeff = sum(
            jnp.asarray(lam[o, c], dtype) @ (alm[c][:, None] * jnp.asarray(sel[o, c], dtype))
            for c in range(ncomp)
        )  # (nrings, 2 (mmax + 1)): the Fourier terms of each ring
        maps.append(jnp.sum(coeff[rows] * trig, axis=1))
    return [jnp.stack(maps)]
