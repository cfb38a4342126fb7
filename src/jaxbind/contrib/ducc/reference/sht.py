"""The pure-JAX reference of ``jaxducc0.healpix_sht`` (`get_healpix_sht`): HEALPix
synthesis from the real alm layout, as two matrix products built in NumPy at trace time.

This module owns the HEALPix RING geometry computed from ``nside`` alone (`healpix_rings`),
the Wigner-d recurrence that gives the spin-weighted harmonics at the ring colatitudes, and
the reference `healpix_sht` itself. It imports neither ducc0 nor the native op, so a program
lowered with it runs where neither is installed.

The synthesis is factored by ring, as DUCC's is, with dense products in place of FFTs:

1. per ring, the Fourier coefficients of the map along the ring (cos and sin of m phi, for
   each m <= mmax) are, for each m, the spin-weighted Legendre functions at the ring's
   colatitude (``Lambda``, (mmax + 1, nrings, lmax + 1)) times the alm of that m: one
   batched matrix product per m;
2. each pixel then sums its ring's terms against ``cos(m phi)`` and ``sin(m phi)`` at its
   own azimuth: a gather of the ring's row and a product with ``T`` (npix, 2 (mmax + 1)).

Work is about ``2 ncomp**2 (mmax + 1) nrings (lmax + 1) + 2 ncomp npix (mmax + 1)``
multiply-adds; the matrices take ``8 (2 (mmax + 1) nrings (lmax + 1) + 2 npix (mmax + 1))``
bytes in float64 (half in float32; nrings = 4 nside - 1, npix = 12 nside**2). For
nside = 32, lmax = mmax = 64: Lambda 2 x 4.3 MB, T 12.8 MB; nside = 64, lmax = 128:
2 x 34 MB and 102 MB; nside = 128, lmax = 256: T alone is 0.8 GB, the practical end.
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

from . import options

__all__ = ["healpix_sht", "healpix_rings"]

OP = "healpix_sht"


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


def _layout_index(lmax, mmax):
    """Where (l, m) sits in the real alm layout of `get_healpix_sht` (m = 0 first, then
    the (re, im) pairs of each m > 0): ``index[part, m, l]`` for part 0 (real) and 1
    (imaginary), and ``present[part, m, l]``, 0.0 where there is no such entry (l < m, or
    the imaginary part of m = 0; there index is 0)."""
    index = np.zeros((2, mmax + 1, lmax + 1), np.int64)
    present = np.zeros((2, mmax + 1, lmax + 1))
    index[0, 0] = np.arange(lmax + 1)
    present[0, 0] = 1.0
    start = lmax + 1
    for m in range(1, mmax + 1):
        ls = np.arange(m, lmax + 1)
        index[0, m, ls] = start + 2 * (ls - m)
        index[1, m, ls] = start + 2 * (ls - m) + 1
        present[:, m, ls] = 1.0
        start += 2 * ls.size
    return index, present


# How a spin > 0 synthesis is assembled (see _matrices): (output component, 0 for the
# cos(m phi) terms or 1 for sin(m phi), the function, input component, part, sign).
_SPIN_TERMS = (
    (0, 0, "f1", 0, 0, -1.0),
    (0, 1, "f1", 0, 1, 1.0),
    (0, 1, "f2", 1, 0, 1.0),
    (0, 0, "f2", 1, 1, 1.0),
    (1, 1, "f2", 0, 0, -1.0),
    (1, 0, "f2", 0, 1, -1.0),
    (1, 0, "f1", 1, 0, -1.0),
    (1, 1, "f1", 1, 1, 1.0),
)


@functools.lru_cache(maxsize=16)
def _matrices(nside, lmax, mmax, spin):
    """The static float64 factors of the synthesis: ``(index, present, funcs, terms,
    ring_of_pixel, trig)``.

    The Fourier coefficients of output component o on ring r are, for each term
    ``(o, t, name, c, part, sign)`` of `terms`, ``sign * funcs[name][m, r, :] @ A[c, part,
    m, :]`` summed into column m (t = 0: the cos(m phi) terms) or mmax + 1 + m (t = 1: the
    sin(m phi) terms), where ``A[c, part, m, l]`` is input component c's entry
    ``x[c, index[part, m, l]] * present[part, m, l]``; ``funcs`` (mmax + 1, nrings,
    lmax + 1) carry the spin-weighted Legendre functions with the layout's weights, and
    ``trig`` (npix, 2 (mmax + 1)) holds cos(m phi), sin(m phi) at every pixel.
    """
    z, phi0, nphi, _ = healpix_rings(nside)
    index, present = _layout_index(lmax, mmax)
    norm = np.sqrt((2 * np.arange(lmax + 1) + 1) / (4 * np.pi))
    ms = np.arange(mmax + 1)
    if spin == 0:
        # Y_lm(theta, 0) = sqrt((2l+1)/(4 pi)) d^l_{m0}(theta); map = sum_l a_l0 Y_l0 +
        # 2 Re(a_lm e^{i m phi}) Y_lm(theta, 0), and the layout holds sqrt(2) Re a_lm,
        # sqrt(2) Im a_lm: weights 1 (m = 0), sqrt(2) cos and -sqrt(2) sin (m > 0)
        lam = np.stack([_wigner_d(lmax, m, 0, z).T * norm for m in ms])
        weight = np.where(ms == 0, 1.0, np.sqrt(2.0))[:, None, None]
        funcs = {"cos": lam * weight, "sin": -np.sqrt(2.0) * lam}
        terms: tuple[tuple[int, int, str, int, int, float], ...] = (
            (0, 0, "cos", 0, 0, 1.0),
            (0, 1, "sin", 0, 1, 1.0),
        )
    else:
        # lambda_+ = _sY_lm(theta, 0) = (-1)^s sqrt((2l+1)/(4 pi)) d^l_{m,-s}(theta),
        # lambda_- = (-1)^s _{-s}Y_lm(theta, 0); with F1 = lambda_+ + lambda_-,
        # F2 = lambda_+ - lambda_-, a term m > 0 of -(E + iB) _sY_lm plus its m -> -m
        # partner gives, for E = e1 + i e2, B = b1 + i b2 (the _SPIN_TERMS):
        #   Q = -F1 (e1 cos - e2 sin) + F2 (b2 cos + b1 sin)
        #   U = -F2 (e1 sin + e2 cos) - F1 (b1 cos - b2 sin)
        # and at m = 0 (F2 = 0, F1 = 2 lambda_+) half of that; the layout holds
        # sqrt(2) e1 ... for m > 0.
        plus = np.stack([(-1) ** spin * _wigner_d(lmax, m, -spin, z).T * norm for m in ms])
        minus = np.stack([_wigner_d(lmax, m, spin, z).T * norm for m in ms])
        scale = np.where(ms == 0, 0.5, 1.0 / np.sqrt(2.0))[:, None, None]
        funcs = {"f1": (plus + minus) * scale, "f2": (plus - minus) * scale}
        terms = _SPIN_TERMS
    ring_of_pixel = np.repeat(np.arange(z.size), nphi)
    first = np.repeat(np.cumsum(nphi) - nphi, nphi)
    phi = phi0[ring_of_pixel] + (np.arange(ring_of_pixel.size) - first) * (
        2 * np.pi / nphi[ring_of_pixel]
    )
    trig = np.concatenate([np.cos(np.outer(phi, ms)), np.sin(np.outer(phi, ms))], axis=1)
    return index, present, funcs, terms, ring_of_pixel, trig


@options(tuning=("nthreads",))  # (DUCC's threads: how it computes, not what)
def healpix_sht(alm, *, nside, lmax, mmax, spin):
    """The reference of ``jaxducc0.healpix_sht``: real alm layout -> HEALPix RING map.

    Called as the op's callable is: ``alm`` (ncomp, realalm_size(lmax, mmax)), float32 or
    float64, and the keyword arguments `get_healpix_sht` gives the op (``nside``, ``lmax``,
    ``mmax``, ``spin``; ``nthreads`` is read and ignored). Returns ``[map]``, shape
    ``(ncomp, 12 nside**2)`` in the dtype of ``alm``. Linear in ``alm``; JAX derives its
    transpose (the adjoint synthesis). The matrices are built in float64 NumPy at trace
    time (cached per geometry) and applied in ``alm``'s precision; see the module
    docstring for their sizes.
    """
    index, present, funcs, terms, ring_of_pixel, trig = _matrices(
        int(nside), int(lmax), int(mmax), int(spin)
    )
    ncomp = 1 if spin == 0 else 2
    nreal = int(index.max()) + 1
    if alm.ndim != 2 or alm.shape != (ncomp, nreal):
        raise ValueError(
            f"jaxducc0.{OP} reference: expected alm of shape {(ncomp, nreal)} "
            f"for lmax={lmax}, mmax={mmax}, spin={spin}, got {tuple(alm.shape)}"
        )
    dtype = alm.dtype
    coeffs = alm[:, index] * jnp.asarray(present, dtype)  # (ncomp, part, m, l)
    funcs = {name: jnp.asarray(f, dtype) for name, f in funcs.items()}
    maps = []
    for o in range(ncomp):
        fourier = [0.0, 0.0]  # (m, nrings) for cos(m phi) and sin(m phi)
        for out, t, name, c, part, sign in terms:
            if out == o:
                fourier[t] = fourier[t] + sign * jnp.einsum(
                    "mrl,ml->mr", funcs[name], coeffs[c, part]
                )
        ring = jnp.concatenate(fourier, axis=0).T  # (nrings, 2 (mmax + 1))
        # each pixel takes its ring's row (sorted indices: a faster gather on the CPU)
        rows = jnp.take(ring, ring_of_pixel, axis=0, indices_are_sorted=True, mode="clip")
        maps.append(jnp.sum(rows * jnp.asarray(trig, dtype), axis=1))
    return [jnp.stack(maps)]
