"""The HEALPix SHT of the reference of ``jaxducc0.healpix_sht``, at any size: Legendre
recurrences evaluated on the fly, FFTs along the rings.

`synthesis` (real alm layout -> map) and `adjoint_synthesis` (its transpose, map -> real
alm layout) are written apart, each its own pass, and `tied_synthesis` joins them into one
linear function whose JAX transpose, VJP and JVP are those two (see there). Memory is
O(npix + lmax^2): nothing of size lmax x npix is ever held, not even by JAX's autodiff.
Only jax.numpy and jax.lax run in the program; NumPy computes constants of the geometry
at trace time (per ring and m; the chirp-z transforms' chirps, about 3 (nside - 1)
(4 nside + mmax) complex numbers).

The synthesis, as DUCC factors it:

1. Legendre: for each m and each ring, the Fourier coefficient of the map along the ring
   is a sum over l of the spin-weighted Legendre functions at the ring's colatitude times
   the alm. The functions come from their three-term recurrence in l, run upward from
   l = max(m, |s|), with z = cos(theta) as pole - t (t exact: near a pole z itself has lost
   theta's digits). The (m, ring) plane is cut into tiles that stay in a core's cache
   (``lax.map`` over tiles); each tile runs its steps 8 at a time (``fori_loop``; XLA
   fuses the 8 into one pass) up to the lmax of its first m (the triangle l >= m, to a
   tile). The seeds (the values at l = max(m, |s|)) are products over m (a ``lax.scan``).
   Values are kept as a mantissa and an exponent in units of 2**K: a value far below the
   dtype's range, near the poles at large m, has exponent < 0 and counts as 0 until the
   recurrence has grown it back to significance (libsharp's rescaling). Spin 0 runs on the
   northern rings only: the southern ones follow by the parity (-1)^(l+m), the sums over
   even and odd l+m kept apart (even and odd steps). Spin s != 0 runs one function,
   ``d^l_{m,s}``, on every ring; its partner ``d^l_{m,-s}`` on a ring is (-1)^(l+m) times
   it on the mirrored ring, by the same split. The work is about
   ``(lmax + 1)(mmax + 1) nrings / 2`` updates, times 2 for spin != 0.
2. Rings (`.healpix_grid`): a batched real FFT for the equatorial rings, Bluestein's
   chirp-z transform for the polar-cap rings.

The adjoint runs the same stages backwards: real FFTs and chirp-z transforms per ring,
then the same recurrences (recomputed, not stored), summing over rings at each step.

Conventions are DUCC's (those of `.sht`'s docstring).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .healpix_grid import complex_dtype, flip, healpix_rings, rings_adjoint, rings_synthesis

__all__ = [
    "adjoint_synthesis",
    "healpix_rings",
    "realalm_size",
    "synthesis",
    "tied_synthesis",
]


def realalm_size(lmax: int, mmax: int) -> int:
    """Length of the real alm layout: 2 nalm - lmax - 1."""
    nalm = ((mmax + 1) * (mmax + 2)) // 2 + (mmax + 1) * (lmax - mmax)
    return 2 * nalm - lmax - 1


# --- the plan: what the geometry and the sizes fix ---------------------------------

# The rescaling of the recurrences, per precision: a value is mant * 2**(K * scale); a
# mantissa that grows past 2**(K - T) is divided by 2**K; a value with scale < 0 is below
# 2**-T, negligible (and counted as 0).
_RANGE = {np.dtype(np.float64): (600, 70), np.dtype(np.float32): (96, 36)}
# The recurrences run tile by tile: up to _TILE elements (m x rings; the state and the sums
# of a tile stay in the core's cache), _UNROLL steps per loop iteration (XLA fuses them
# into one pass over the tile).
_TILE = 16384
_TILE_M = 128
_UNROLL = 8
# The synthesis materializes each step's values (an optimization barrier), so that the
# passes computing its sums read them instead of each running the steps again (15% faster
# for spin 2; the adjoint's one reduction gains nothing).
_MATERIALIZE = True


@dataclasses.dataclass(frozen=True)
class _Plan:
    nside: int
    lmax: int
    mmax: int
    spin: int

    @property
    def ncomp(self) -> int:
        return 1 if self.spin == 0 else 2

    @property
    def nm(self) -> int:
        return self.mmax + 1

    @property
    def npix(self) -> int:
        return 12 * self.nside**2

    @property
    def nreal(self) -> int:
        return realalm_size(self.lmax, self.mmax)

    @functools.cached_property
    def start(self) -> np.ndarray:
        """l = start[m] at the recurrence's first step: max(m, |s|)."""
        return np.maximum(np.arange(self.nm), self.spin)

    @property
    def steps(self) -> int:
        """Steps of the recurrence (k = 0 .. steps - 1, l = start + k), rounded up to a
        whole number of loop iterations."""
        k = self.lmax - self.spin + 1
        return -(-k // _UNROLL) * _UNROLL

    @property
    def nrings(self) -> int:
        """Rings the recurrence runs on: the northern ones and the equator for spin 0,
        all of them otherwise."""
        return 2 * self.nside if self.spin == 0 else 4 * self.nside - 1

    @functools.cached_property
    def tiles(self) -> tuple[int, int, int, int]:
        """(m per tile, rings per tile, tiles along m, tiles along the rings)."""
        n_m = -(-self.nm // _TILE_M)
        tile_m = -(-self.nm // n_m)
        n_r = -(-self.nrings * tile_m // _TILE)
        tile_r = -(-self.nrings // n_r)
        return tile_m, tile_r, n_m, n_r

    @functools.cached_property
    def iterations(self) -> np.ndarray:
        """Loop iterations per tile along m: until its first m (the most steps) passes
        lmax (the triangle l >= m, up to a tile)."""
        tile_m, _, n_m, _ = self.tiles
        first = np.minimum(np.arange(n_m) * tile_m, self.mmax)
        k = self.lmax - self.start[first] + 1
        return -(-k // _UNROLL)

    @functools.cached_property
    def base(self) -> np.ndarray:
        """Index of (l = m, real part) of each m in the real alm layout."""
        m = np.arange(self.nm)
        lm = self.lmax + 1
        return np.where(m == 0, 0, lm + 2 * (m - 1) * lm - (m - 1) * m)

    @functools.cached_property
    def parity(self) -> np.ndarray:
        """(l + m + s) mod 2 at the first step, per m (the parity of the even steps)."""
        return (self.start + np.arange(self.nm) + self.spin) % 2

    @functools.cached_property
    def weight(self) -> np.ndarray:
        """Per m, the factor between the layout's numbers and the sums' coefficients."""
        m = np.arange(self.nm)
        if self.spin == 0:  # 2 Re(a e^{i m phi}), and the layout holds sqrt(2) a
            return np.where(m == 0, 1.0, np.sqrt(2.0))
        return np.where(m == 0, 0.5, 1.0 / np.sqrt(2.0))

    @functools.cached_property
    def rings(self) -> dict[str, np.ndarray]:
        """Per ring the recurrence runs on (northern rings and the equator for spin 0,
        every ring otherwise): z = cos(theta), cos(theta / 2), sin(theta / 2) (float64)."""
        n = self.nside
        i = np.arange(1, 4 * n, dtype=np.int64)
        north = np.minimum(i, 4 * n - i)
        # 1 - z and 1 + z exactly (rational), so that the polar rings keep their digits
        one_minus = np.where(north < n, north**2 / (3.0 * n * n), 1.0 - (2 * n - i) * 2.0 / (3 * n))
        one_plus = np.where(
            north < n, 2.0 - north**2 / (3.0 * n * n), 1.0 + (2 * n - i) * 2.0 / (3 * n)
        )
        south = (north < n) & (i > 2 * n)
        one_minus, one_plus = (
            np.where(south, one_plus, one_minus),
            np.where(south, one_minus, one_plus),
        )
        z = (one_plus - one_minus) / 2
        # z as pole - t, t exact to rounding: near a pole z itself has lost the digits of
        # theta (one rounding of z moves the functions by l^2 / 2 units there)
        pole = np.where(north < n, np.where(south, -1.0, 1.0), 0.0)
        t = np.where(north < n, np.where(south, -one_plus, one_minus), -z)
        keep = slice(0, 2 * n if self.spin == 0 else 4 * n - 1)
        return dict(
            z=z[keep],
            pole=pole[keep],
            t=t[keep],
            cos=np.sqrt(one_plus / 2)[keep],
            sin=np.sqrt(one_minus / 2)[keep],
        )

    @functools.cached_property
    def chirp_length(self) -> int:
        """The chirp-z transforms' FFT length: >= nm + the longest polar ring - 1, with
        factors 2, 3, 5 only."""
        need = self.nm + 4 * (self.nside - 1) - 1
        best = 1 << max(0, (need - 1).bit_length())
        for p3 in (1, 3, 9, 27, 81):
            for p5 in (1, 5, 25, 125):
                f = p3 * p5
                if f > best:
                    continue
                n = f
                while n < need:
                    n *= 2
                best = min(best, n)
        return best


@functools.lru_cache(maxsize=32)
def _plan(nside: int, lmax: int, mmax: int, spin: int) -> _Plan:
    return _Plan(nside, lmax, mmax, spin)


def _real_dtype(dtype):
    return np.dtype(jnp.finfo(dtype).dtype)


# --- the recurrences ----------------------------------------------------------------


def _renormalize(mant, scale, dtype):
    """One step of keeping mant in the window (2**-T, 2**(K - T)] when scale < 0."""
    big, tail = _RANGE[dtype]
    up = (jnp.abs(mant) > 2.0 ** (big - tail)) & (scale < 0)
    down = (jnp.abs(mant) < 2.0**-tail) & (mant != 0)
    mant = jnp.where(up, mant * 2.0**-big, jnp.where(down, mant * 2.0**big, mant))
    return mant, scale + up.astype(dtype) - down.astype(dtype)


def _seeds(plan: _Plan, dtype):
    """The recurrence's values at its first step, l = max(m, s), for every m and ring:
    ``sqrt((2l+1)/(4 pi)) d^l_{m,s}(theta)`` as (mantissa, scale), each (nm, rings)."""
    s = plan.spin
    c = jnp.asarray(plan.rings["cos"], dtype)
    sn = jnp.asarray(plan.rings["sin"], dtype)
    # m = 0: sqrt((2s+1)/(4 pi)) sqrt(binom(2s, s)) (cos sin)^s of theta / 2
    log_binom = math.lgamma(2 * s + 1) - 2 * math.lgamma(s + 1)
    first = math.sqrt((2 * s + 1) / (4 * math.pi)) * math.exp(0.5 * log_binom)
    mant, scale = jnp.full(c.shape, first, dtype), jnp.zeros(c.shape, dtype)
    for _ in range(s):
        mant, scale = _renormalize(mant * (c * sn), scale, dtype)

    def step(carry, m):
        mant, scale = carry
        mf = m.astype(dtype)
        # m <= s: d^s_{m,s} grows by sqrt((s-m+1)/(s+m)) cos/sin; m > s: d^m_{m,s} by
        # -cos sin sqrt(2m(2m+1)/((m+s)(m-s))), the norm's ratio included
        below = jnp.sqrt(jnp.maximum(s - mf + 1, 0) / (s + mf)) * (c / sn)
        above = -(c * sn) * jnp.sqrt(2 * mf * (2 * mf + 1) / jnp.maximum((mf + s) * (mf - s), 1))
        mant = mant * jnp.where(m <= s, below, above)
        mant, scale = _renormalize(mant, scale, dtype)
        return (mant, scale), (mant, scale)

    if plan.nm == 1:
        return mant[None], scale[None]
    _, (mants, scales) = lax.scan(step, (mant, scale), jnp.arange(1, plan.nm))
    return jnp.concatenate([mant[None], mants]), jnp.concatenate([scale[None], scales])


def _recurrence_tables(plan: _Plan, nm: int, dtype):
    """(A, G, B), each (steps, nm): ``next = (A z - G) now - B before`` at step k, where
    now is the function at l = start + k, normalized (``sqrt((2l+1)/(4 pi)) d^l_{m,s}``).
    Zero for the m >= plan.nm that pad a tile (their functions stay 0)."""
    k = jnp.arange(plan.steps, dtype=dtype)[:, None]
    m = jnp.arange(nm, dtype=dtype)[None, :]
    s = float(plan.spin)
    start = np.zeros(nm)
    start[: plan.nm] = plan.start
    ell = jnp.asarray(start, dtype)[None, :] + k
    if plan.spin == 0:
        a = jnp.sqrt((4 * (ell + 1) ** 2 - 1) / ((ell + 1) ** 2 - m * m))
        b = a * jnp.sqrt(jnp.maximum(ell * ell - m * m, 0) / (4 * ell * ell - 1))
        g = jnp.zeros_like(a)
    else:
        d_next = jnp.sqrt(((ell + 1) ** 2 - m * m) * ((ell + 1) ** 2 - s * s))
        d_now = jnp.sqrt(jnp.maximum((ell * ell - m * m) * (ell * ell - s * s), 0))
        root = jnp.sqrt((2 * ell + 3) * (2 * ell + 1))
        a = root * (ell + 1) / d_next
        g = root * m * s / (ell * d_next)
        b = jnp.sqrt((2 * ell + 3) / (2 * ell - 1)) * (ell + 1) * d_now / (ell * d_next)
    real = jnp.asarray(np.arange(nm) < plan.nm)[None, :]
    return tuple(jnp.where(real, t, 0) for t in (a, g, b))


def _tile_inputs(plan: _Plan, dtype):
    """What every tile slices: the rings' (pole, t) (z = pole - t), the seeds (mantissa,
    scale) and the recurrence's tables, padded to whole tiles."""
    tile_m, tile_r, n_m, n_r = plan.tiles
    nm, nr = tile_m * n_m, tile_r * n_r
    rings = jnp.stack(
        [jnp.pad(jnp.asarray(plan.rings[k], dtype), (0, nr - plan.nrings)) for k in ("pole", "t")]
    )
    pad = ((0, nm - plan.nm), (0, nr - plan.nrings))
    mant, scale = (jnp.pad(a, pad) for a in _seeds(plan, dtype))
    return rings, mant, scale, _recurrence_tables(plan, nm, dtype)


def _chain(p, q, tables, u, rings, materialize=False):
    """The function one step on: ``(A z - G) q - B p`` with row u of the tiles' tables, z
    as pole - t (rings: (pole, t), each (1, rings))."""
    a, g, b = (t[u][:, None] for t in tables)
    pole, t = rings
    new = a * (pole * q - t * q) - g * q - b * p
    return lax.optimization_barrier(new) if materialize else new


def _finish(p, q, scale, dtype):
    """After an iteration: values grown past 2**(K - T) (below the range when it began)
    divided by 2**K, their exponent raised."""
    big, tail = _RANGE[dtype]
    grown = jnp.abs(q) > 2.0 ** (big - tail)
    f = jnp.where(grown, dtype.type(2.0**-big), dtype.type(1.0))
    return p * f, q * f, scale + grown.astype(dtype)


def _factor(scale, dtype):
    """2**(K scale) for this iteration's terms: 1, 2**-K, or 0 (scale <= -2: below
    2**(2 T - 2 K) of the largest values, far below rounding)."""
    big, _ = _RANGE[dtype]
    return jnp.where(scale == 0, 1.0, jnp.where(scale == -1, 2.0**-big, 0.0)).astype(dtype)


def _legendre_sums(plan: _Plan, coeffs, dtype):
    """Per m and ring of the recurrence, the sums over l of the function times each of
    `coeffs` (complex (steps, nm) arrays, coefficient [k, m] at l = start[m] + k, zero
    beyond lmax), over the even steps and over the odd ones: two lists of complex
    (nm, nrings) arrays."""
    tile_m, tile_r, n_m, n_r = plan.tiles
    rings, mant, scale, tables = _tile_inputs(plan, dtype)
    coeffs = [jnp.pad(c, ((0, 0), (0, tile_m * n_m - plan.nm))) for c in coeffs]
    iterations = jnp.asarray(plan.iterations, jnp.int32)
    cdtype = complex_dtype(dtype)

    def tile(index):
        i, j = index // n_r, index % n_r
        m0, r0 = i * tile_m, j * tile_r
        zc = lax.dynamic_slice(rings, (jnp.int32(0), r0), (2, tile_r))[:, None, :]

        def iteration(it, carry):
            before, now, scale, even, odd = carry
            k0 = it * _UNROLL
            rows = [lax.dynamic_slice(t, (k0, m0), (_UNROLL, tile_m)) for t in tables]
            cs = [lax.dynamic_slice(c, (k0, m0), (_UNROLL, tile_m)) for c in coeffs]
            sums: list[list] = [[0.0, 0.0] for _ in cs]
            p, q = before, now
            for u in range(_UNROLL):
                for n, c in enumerate(cs):
                    sums[n][u % 2] = sums[n][u % 2] + q * c[u][:, None]
                p, q = q, _chain(p, q, rows, u, zc, _MATERIALIZE)
            f = _factor(scale, dtype)
            even = [e + f * t[0] for e, t in zip(even, sums)]
            odd = [o + f * t[1] for o, t in zip(odd, sums)]
            return (*_finish(p, q, scale, dtype), even, odd)

        start = [lax.dynamic_slice(a, (m0, r0), (tile_m, tile_r)) for a in (mant, scale)]
        zeros = jnp.zeros((tile_m, tile_r), cdtype)
        carry = (jnp.zeros_like(start[0]), *start, [zeros] * len(coeffs), [zeros] * len(coeffs))
        out = lax.fori_loop(jnp.int32(0), iterations[i], iteration, carry)
        return out[3], out[4]

    even, odd = lax.map(tile, jnp.arange(n_m * n_r, dtype=jnp.int32))

    def whole(t):  # (tiles, tile_m, tile_r) -> (nm, nrings)
        t = t.reshape(n_m, n_r, tile_m, tile_r).transpose(0, 2, 1, 3)
        return t.reshape(n_m * tile_m, n_r * tile_r)[: plan.nm, : plan.nrings]

    return [whole(e) for e in even], [whole(o) for o in odd]


def _legendre_adjoint_sums(plan: _Plan, weights_even, weights_odd, dtype):
    """The adjoint of `_legendre_sums`, for real weights: per step k and m, the sum over
    rings of the function times each of ``weights_even`` (k even) or ``weights_odd`` (k
    odd), real (nm, nrings) arrays: a list of real (steps, nm) arrays."""
    tile_m, tile_r, n_m, n_r = plan.tiles
    rings, mant, scale, tables = _tile_inputs(plan, dtype)
    pad = ((0, tile_m * n_m - plan.nm), (0, tile_r * n_r - plan.nrings))
    w_even = [jnp.pad(w, pad) for w in weights_even]
    w_odd = [jnp.pad(w, pad) for w in weights_odd]
    n = len(w_even)
    iterations = jnp.asarray(plan.iterations, jnp.int32)

    def m_tile(i):
        m0 = i * tile_m

        def ring_tile(j, outs):
            r0 = j * tile_r
            zc = lax.dynamic_slice(rings, (jnp.int32(0), r0), (2, tile_r))[:, None, :]
            cut = [lax.dynamic_slice(a, (m0, r0), (tile_m, tile_r)) for a in (mant, scale)]
            we = [lax.dynamic_slice(w, (m0, r0), (tile_m, tile_r)) for w in w_even]
            wo = [lax.dynamic_slice(w, (m0, r0), (tile_m, tile_r)) for w in w_odd]

            def iteration(it, carry):
                before, now, scale, outs = carry
                k0 = it * _UNROLL
                rows = [lax.dynamic_slice(t, (k0, m0), (_UNROLL, tile_m)) for t in tables]
                f = _factor(scale, dtype)
                terms = []
                p, q = before, now
                for u in range(_UNROLL):
                    v = q * f
                    terms += [v * w for w in (we if u % 2 == 0 else wo)]
                    p, q = q, _chain(p, q, rows, u, zc)
                # one pass over the tile for every step's sums (a variadic reduction)
                zero = jnp.zeros((), dtype)
                ys = lax.reduce(
                    tuple(terms),
                    (zero,) * len(terms),
                    lambda a, b: tuple(x + y for x, y in zip(a, b)),
                    (1,),
                )
                y = jnp.stack(ys).reshape(_UNROLL, n, tile_m)
                zero_i = jnp.zeros((), jnp.int32)
                old = lax.dynamic_slice(outs, (k0, zero_i, zero_i), (_UNROLL, n, tile_m))
                outs = lax.dynamic_update_slice(outs, old + y, (k0, zero_i, zero_i))
                return (*_finish(p, q, scale, dtype), outs)

            carry = (jnp.zeros_like(cut[0]), *cut, outs)
            return lax.fori_loop(jnp.int32(0), iterations[i], iteration, carry)[3]

        return lax.fori_loop(
            jnp.int32(0), jnp.int32(n_r), ring_tile, jnp.zeros((plan.steps, n, tile_m), dtype)
        )

    outs = lax.map(m_tile, jnp.arange(n_m, dtype=jnp.int32))  # (n_m, steps, n, tile_m)
    outs = outs.transpose(2, 1, 0, 3).reshape(n, plan.steps, n_m * tile_m)[..., : plan.nm]
    return list(outs)


# --- the real alm layout, per step and m --------------------------------------------


def _layout_indices(plan: _Plan):
    """(index of the real part, of the imaginary part, present) per step k and m, (steps,
    nm) each (traced: built from iotas)."""
    k = jnp.arange(plan.steps, dtype=jnp.int32)[:, None]
    m = jnp.arange(plan.nm, dtype=jnp.int32)[None, :]
    ell = jnp.asarray(plan.start, jnp.int32)[None, :] + k
    present = ell <= plan.lmax
    base = jnp.asarray(plan.base, jnp.int32)[None, :]
    re = jnp.where(m == 0, ell, base + 2 * (ell - m))
    re = jnp.where(present, re, 0)
    im = jnp.where(present & (m > 0), base + 2 * (ell - m) + 1, 0)
    return re, im, present, present & (m > 0)


def _coefficients_of(plan: _Plan, x, dtype):
    """x (ncomp, nreal) -> per component (real, imag) parts of the sums' coefficients,
    each (steps, nm), weighted."""
    re, im, has_re, has_im = _layout_indices(plan)
    w = jnp.asarray(plan.weight, dtype)[None, :]
    out = []
    for c in range(plan.ncomp):
        xr = jnp.where(has_re, x[c][re], 0) * w
        xi = jnp.where(has_im, x[c][im], 0) * w
        out.append((xr, xi))
    return out


def _layout_of(plan: _Plan, parts, dtype):
    """The adjoint of `_coefficients_of`: per component (real, imag) parts (steps, nm)
    -> the real alm layout (ncomp, nreal)."""
    p = jnp.arange(plan.nreal, dtype=jnp.int32)
    lm = plan.lmax + 1
    upper = jnp.asarray(plan.base[1:], jnp.int32)  # ascending: the start of each m >= 1
    m = jnp.where(p < lm, 0, jnp.searchsorted(upper, p, side="right"))
    offset = p - jnp.asarray(plan.base, jnp.int32)[m]
    ell = jnp.where(m == 0, p, m + offset // 2)
    imag = (m > 0) & (offset % 2 == 1)
    k = ell - jnp.asarray(plan.start, jnp.int32)[m]
    # l < |s|: no function, the entry is unused (0 in the transpose)
    w = jnp.where(k >= 0, jnp.asarray(plan.weight, dtype)[m], 0)
    k = jnp.maximum(k, 0)
    rows = []
    for xr, xi in parts:
        rows.append(jnp.where(imag, xi[k, m], xr[k, m]) * w)
    return jnp.stack(rows)


# --- Legendre stage: coefficients <-> Fourier coefficients on every ring -------------


def _pick(plan, even, odd):
    """Per m, the sums over even l+m+s and over odd ones, from the even and odd steps."""
    first = jnp.asarray(plan.parity == 0)[:, None]
    return jnp.where(first, even, odd), jnp.where(first, odd, even)


def _fourier_of(plan: _Plan, x, dtype):
    """Legendre stage of the synthesis: (ncomp, nreal) -> (ncomp, nm, 4 nside - 1) complex
    Fourier coefficients G, the map on ring r being Re sum_m G[m, r] e^{i m phi}."""
    coeffs = [re + 1j * im for re, im in _coefficients_of(plan, x, dtype)]
    cdtype = complex_dtype(dtype)
    n = plan.nside
    if plan.spin == 0:
        (even,), (odd,) = _legendre_sums(plan, coeffs, dtype)
        north, south = even + odd, even - odd
        g = jnp.concatenate([north, flip(south[:, : 2 * n - 1])], axis=1)
        return g.astype(cdtype)[None]
    even, odd = _legendre_sums(plan, coeffs, dtype)
    f1, f2 = [], []
    for e, o in zip(even, odd):
        pe, po = _pick(plan, e, o)
        minus = pe + po  # sum of d^l_{m,s} times the coefficient, on each ring
        plus = flip(pe - po)  # sum of (-1)^s d^l_{m,-s} times it
        f1.append(plus + minus)
        f2.append(plus - minus)
    q = -f1[0] - 1j * f2[1]
    u = 1j * f2[0] - f1[1]
    return jnp.stack([q, u]).astype(cdtype)


def _fourier_adjoint(plan: _Plan, g, dtype):
    """The adjoint of `_fourier_of`: (ncomp, nm, 4 nside - 1) complex -> (ncomp, nreal)."""
    n = plan.nside
    if plan.spin == 0:
        north = g[0][:, : 2 * n]
        south = jnp.pad(flip(g[0][:, 2 * n :]), ((0, 0), (0, 1)))
        plus, minus = north + south, north - south
        w_even = [plus.real, plus.imag]
        w_odd = [minus.real, minus.imag]
        yr, yi = _legendre_adjoint_sums(plan, w_even, w_odd, dtype)
        return _layout_of(plan, [(yr, yi)], dtype)
    q, u = g[0], g[1]
    qf, uf = flip(q), flip(u)
    per_sign = {}
    for eps in (1, -1):
        ve = -(q + eps * qf) - 1j * (eps * uf - u)
        vb = 1j * (eps * qf - q) - (u + eps * uf)
        per_sign[eps] = [ve.real, ve.imag, vb.real, vb.imag]
    first = jnp.asarray(plan.parity == 0)[:, None]
    w_even = [jnp.where(first, a, b) for a, b in zip(per_sign[1], per_sign[-1])]
    w_odd = [jnp.where(first, b, a) for a, b in zip(per_sign[1], per_sign[-1])]
    er, ei, br, bi = _legendre_adjoint_sums(plan, w_even, w_odd, dtype)
    return _layout_of(plan, [(er, ei), (br, bi)], dtype)


# --- the transforms -------------------------------------------------------------------


def _working_dtype(dtype):
    """The precision the transforms compute in: double whenever JAX has it (x64 on), so
    that single-precision maps keep single-precision accuracy (a recurrence in float32
    loses up to l^2 / 2 units near the poles: 4e-4 at lmax 512); float32 without x64."""
    if jax.dtypes.canonicalize_dtype(np.float64) == np.float64:
        return np.dtype(np.float64)
    return _real_dtype(dtype)


def synthesis(x, nside: int, lmax: int, mmax: int, spin: int):
    """Real alm layout (ncomp, nreal) -> map (ncomp, 12 nside**2), in x's dtype."""
    plan = _plan(int(nside), int(lmax), int(mmax), int(spin))
    dtype = _working_dtype(x.dtype)
    g = _fourier_of(plan, x.astype(dtype), dtype)
    return rings_synthesis(plan, g, dtype).astype(x.dtype)


def adjoint_synthesis(maps, nside: int, lmax: int, mmax: int, spin: int):
    """The transpose of `synthesis`: map (ncomp, 12 nside**2) -> real alm layout."""
    plan = _plan(int(nside), int(lmax), int(mmax), int(spin))
    dtype = _working_dtype(maps.dtype)
    g = rings_adjoint(plan, maps.astype(dtype), dtype)
    return _fourier_adjoint(plan, g, dtype).astype(maps.dtype)


def tied_synthesis(x, nside: int, lmax: int, mmax: int, spin: int):
    """`synthesis`, whose transpose (``jax.linear_transpose``, the VJP) is
    `adjoint_synthesis` and whose JVP is itself, to any order, under ``vmap`` too.

    JAX would transpose the recurrence's scan by storing every step's values (lmax times
    the map's memory). ``lax.custom_linear_solve`` is JAX's linear function with a given
    transpose: it returns ``solve(b)`` and transposes to ``transpose_solve``, neither
    differentiated through. Its solution has b's shape, so both sides are flattened and
    padded to one length; the "matrix" it would invert is the identity, never used (no
    derivative with respect to it is taken).
    """
    plan = _plan(int(nside), int(lmax), int(mmax), int(spin))
    n_in, n_out = plan.ncomp * plan.nreal, plan.ncomp * plan.npix
    size = max(n_in, n_out)
    args = dict(nside=nside, lmax=lmax, mmax=mmax, spin=spin)

    def forward(_, v):
        y = synthesis(v[:n_in].reshape(plan.ncomp, plan.nreal), **args)
        return jnp.pad(y.reshape(-1), (0, size - n_out))

    def backward(_, v):
        a = adjoint_synthesis(v[:n_out].reshape(plan.ncomp, plan.npix), **args)
        return jnp.pad(a.reshape(-1), (0, size - n_in))

    b = jnp.pad(x.reshape(-1), (0, size - n_in))
    y = lax.custom_linear_solve(lambda v: v, b, forward, backward)
    return y[:n_out].reshape(plan.ncomp, plan.npix)
