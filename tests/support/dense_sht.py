"""The HEALPix SHT as dense matrices, for small sizes: the oracle the JAX reference
(jaxbind.contrib.ducc.reference.sht_rings) is tested against, independent of its
recurrences' tiles, rescaling and ring FFTs.

`synthesis_matrix(nside, lmax, mmax, spin)` is the real matrix of ``get_healpix_sht``
((ncomp * npix, ncomp * nreal), float64): built from the Wigner-d functions at the ring
colatitudes by their recurrence in l (seeds in logarithms), one column per entry of the
real alm layout, and the ring's cos(m phi), sin(m phi) at every pixel. Memory
8 (ncomp npix)(ncomp nreal) bytes: nside 8, lmax 16 is 0.5 MB.
"""

import functools
import math

import numpy as np

from jaxbind.contrib.ducc.reference.sht_rings import healpix_rings

__all__ = ["synthesis_matrix"]


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


@functools.lru_cache(maxsize=16)
def synthesis_matrix(nside, lmax, mmax, spin):
    """The real matrix of the synthesis: map.ravel() = S @ alm.ravel() (float64)."""
    index, present, funcs, terms, ring_of_pixel, trig = _matrices(nside, lmax, mmax, spin)
    ncomp = 1 if spin == 0 else 2
    nreal = int(index.max()) + 1
    npix = ring_of_pixel.size
    nm = mmax + 1
    out = np.zeros((ncomp, npix, ncomp, nreal))
    for o, t, name, c, part, sign in terms:
        # pixel <- sign * funcs[name][m, ring(pixel), l] * trig[pixel, t * nm + m], into
        # column index[part, m, l] of component c (where present)
        f = funcs[name][:, ring_of_pixel, :] * trig[:, t * nm : (t + 1) * nm].T[:, :, None]
        f = sign * f * present[part][:, None, :]
        for m in range(nm):
            np.add.at(out[o, :, c], (slice(None), index[part, m]), f[m])
    return out.reshape(ncomp * npix, ncomp * nreal)
