"""The HEALPix RING grid: its geometry (`healpix_rings`), and the ring stage of
`.sht_rings`' SHT: Fourier coefficients along each ring <-> its pixels. The equatorial
rings (4 nside pixels each) take one batched real FFT; the polar-cap rings (4, 8, ...,
4 (nside - 1) pixels, in both caps) Bluestein's chirp-z transform, all at once at one
common FFT length (their coefficients need no folding: the chirp-z sums over every
m <= mmax whatever the ring's length). `rings_adjoint` is the transpose of
`rings_synthesis`; their `plan` is the SHT's (`.sht_rings._Plan`). Only jax.numpy runs
in the program; NumPy makes the chirps at trace time.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

__all__ = ["complex_dtype", "flip", "healpix_rings", "rings_adjoint", "rings_synthesis"]


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


def complex_dtype(dtype):
    """The complex dtype of `dtype`'s precision."""
    return np.result_type(np.dtype(jnp.finfo(dtype).dtype), np.complex64)


def flip(a):
    """`a` reversed along its last axis."""
    return a[..., ::-1]


def _polar_lengths(plan) -> np.ndarray:
    """The pixels of each polar ring pair t = 0 .. nside - 2: 4 (t + 1)."""
    return 4 * (np.arange(plan.nside - 1) + 1)


def _unit(q, n2):
    """exp(2 pi i q / n2), for integers q and n2 (NumPy, broadcast; q reduced exactly)."""
    angle = (np.asarray(q, np.int64) % n2) * (2 * np.pi / n2)
    return np.cos(angle) + 1j * np.sin(angle)


@functools.lru_cache(maxsize=8)
def _chirps(plan, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chirp-z transforms' constants per polar ring length N (NumPy, computed once at
    trace time; together about 3 x (nside - 1) x (4 nside + nm) numbers):

    - the FFT (length L) of exp(-i pi n^2 / N) on n in [-(nm - 1), N - 1] (at n mod L),
      (nside - 1, L);
    - exp(i pi j^2 / N) for j < 4 (nside - 1), (nside - 1, 4 (nside - 1));
    - exp(i pi (m^2 + m) / N) for m < nm (the ring's half-pixel shift included),
      (nside - 1, nm).
    """
    L = plan.chirp_length
    twice = 2 * _polar_lengths(plan)[:, None].astype(np.int64)
    pos = np.arange(L, dtype=np.int64)
    n = np.where(pos >= L - (plan.nm - 1), pos - L, pos)[None, :]
    keep = (n <= twice // 2 - 1) & (n >= -(plan.nm - 1))
    spectrum = np.fft.fft(np.where(keep, np.conj(_unit(n * n, twice)), 0), axis=-1)
    j = np.arange(4 * (plan.nside - 1), dtype=np.int64)[None, :]
    m = np.arange(plan.nm, dtype=np.int64)[None, :]
    cdtype = complex_dtype(dtype)
    return (
        spectrum.astype(cdtype),
        _unit(j * j, twice).astype(cdtype),
        _unit(m * m + m, twice).astype(cdtype),
    )


def _equator_shift(plan, c, sign: int, dtype):
    """c (..., rings, nm) on the equatorial rings, times exp(sign i m pi / (4 nside)) on
    the rings that start half a pixel east."""
    n = plan.nside
    row = _unit(sign * np.arange(plan.nm), 8 * n).astype(complex_dtype(dtype))
    shifted = (np.arange(n - 1, 3 * n) + 1 - n) % 2 == 0
    return jnp.where(jnp.asarray(shifted)[:, None], c * row, c)


def _ring_of(p):
    """For pixel p of a polar cap counted from its pole: its ring t (4 (t + 1) pixels,
    starting at 2 t (t + 1))."""
    t = jnp.floor((jnp.sqrt(1.0 + 2.0 * p.astype(jnp.float32)) - 1) / 2).astype(jnp.int32)
    t = jnp.where(2 * t * (t + 1) > p, t - 1, t)
    t = jnp.where(2 * (t + 1) * (t + 2) <= p, t + 1, t)
    return t


def _cap_indices(plan):
    """For the north cap's pixels in map order, and the south cap's: the (t, j) position
    in the (nside - 1, 4 (nside - 1)) array of polar rings, flattened."""
    n = plan.nside
    cap = 2 * n * (n - 1)
    width = 4 * (n - 1)
    p = jnp.arange(cap, dtype=jnp.int32)
    t = _ring_of(p)
    north = t * width + (p - 2 * t * (t + 1))
    q = cap - 1 - p  # the south cap, counted from its pole
    t = _ring_of(q)
    south = t * width + (4 * (t + 1) - 1 - (q - 2 * t * (t + 1)))
    return north, south


def _cap_positions(plan):
    """The inverse of `_cap_indices`: per (t, j) of the (nside - 1, 4 (nside - 1)) array of
    polar rings, the pixel of the north cap and of the south cap (2 nside (nside - 1):
    none, j >= 4 (t + 1))."""
    n = plan.nside
    cap = 2 * n * (n - 1)
    t = jnp.arange(n - 1, dtype=jnp.int32)[:, None]
    j = jnp.arange(4 * (n - 1), dtype=jnp.int32)[None, :]
    inside = j < 4 * (t + 1)
    north = jnp.where(inside, 2 * t * (t + 1) + j, cap)
    south = jnp.where(inside, cap - 1 - (2 * t * (t + 1) + 4 * (t + 1) - 1 - j), cap)
    return north, south


def rings_synthesis(plan, g, dtype):
    """(ncomp, nm, 4 nside - 1) complex Fourier coefficients -> (ncomp, npix) map."""
    n, nm = plan.nside, plan.nm
    # equatorial rings nside - 1 .. 3 nside - 1: fold m mod N, Hermitian half, irfft
    big = 4 * n
    eq = g[:, :, n - 1 : 3 * n]  # (ncomp, nm, 2n + 1)
    c = _equator_shift(plan, jnp.swapaxes(eq, 1, 2), 1, dtype)  # (ncomp, rings, nm)
    folds = -(-nm // big)
    c = jnp.pad(c, ((0, 0), (0, 0), (0, folds * big - nm)))
    b = c.reshape(c.shape[:2] + (folds, big)).sum(axis=2)  # (ncomp, rings, N)
    k = np.arange(big // 2 + 1)
    h = (b[..., k] + jnp.conj(b[..., (-k) % big])) / 2
    equator = jnp.fft.irfft(h, n=big, axis=-1) * big  # (ncomp, rings, N)
    equator = equator.reshape(g.shape[0], -1).astype(dtype)
    if n == 1:
        return equator
    # polar rings: chirp-z, y_j = sum_m c_m exp(i pi m (2j + 1) / N)
    L = plan.chirp_length
    width = 4 * (n - 1)
    spec, pj, pm = _chirps(plan, dtype)  # (n - 1, L), (n - 1, width), (n - 1, nm)
    north = jnp.swapaxes(g[:, :, : n - 1], 1, 2)  # (ncomp, n - 1, nm)
    south = flip(g[:, :, 3 * n :]).swapaxes(1, 2)
    caps = jnp.stack([north, south], axis=1) * pm  # (ncomp, 2, n - 1, nm)
    a = jnp.fft.fft(caps, n=L, axis=-1)
    y = jnp.fft.ifft(a * spec, axis=-1)[..., :width] * pj
    y = y.real.astype(dtype).reshape(g.shape[0], 2, -1)
    ni, si = _cap_indices(plan)
    return jnp.concatenate([y[:, 0][:, ni], equator, y[:, 1][:, si]], axis=1)


def rings_adjoint(plan, maps, dtype):
    """The adjoint of `_rings_synthesis`: (ncomp, npix) -> (ncomp, nm, 4 nside - 1)."""
    n, nm = plan.nside, plan.nm
    cdtype = complex_dtype(dtype)
    big = 4 * n
    cap = 2 * n * (n - 1)
    ncomp = maps.shape[0]
    eq = maps[:, cap : cap + (2 * n + 1) * big].reshape(ncomp, 2 * n + 1, big)
    f = jnp.fft.rfft(eq, axis=-1)  # (ncomp, rings, N/2 + 1)
    m = np.arange(nm)
    k = m % big
    mirrored = k > big // 2
    vals = f[..., np.where(mirrored, big - k, k)]
    vals = jnp.where(jnp.asarray(mirrored), jnp.conj(vals), vals)
    equator = jnp.swapaxes(_equator_shift(plan, vals, -1, dtype), 1, 2)  # (ncomp, nm, rings)
    if n == 1:
        return equator
    L = plan.chirp_length
    spec, pj, pm = _chirps(plan, dtype)
    ni, si = _cap_positions(plan)
    north = jnp.take(maps[:, :cap], ni, axis=1, mode="fill", fill_value=0)
    south = jnp.take(maps[:, cap + (2 * n + 1) * big :], si, axis=1, mode="fill", fill_value=0)
    y = jnp.stack([north, south], axis=1)  # (ncomp, 2, n - 1, width)
    a = jnp.fft.fft(y * jnp.conj(pj), n=L, axis=-1)
    conv = jnp.fft.ifft(a * jnp.conj(spec), axis=-1)[..., :nm] * jnp.conj(pm)
    north_g = jnp.swapaxes(conv[:, 0], 1, 2)
    south_g = flip(jnp.swapaxes(conv[:, 1], 1, 2))
    return jnp.concatenate([north_g, equator, south_g], axis=2).astype(cdtype)
