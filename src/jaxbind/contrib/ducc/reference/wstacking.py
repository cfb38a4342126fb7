"""The gridder's fast path in pure JAX: w-stacking on `.spreading`'s kernel.

`dirty2vis` computes `.wgridder`'s measurement equation (DUCC's conventions, see there) to
a requested accuracy ``eps`` at the native algorithm's cost, as DUCC does:

- the u, v part is a 2-D type-2 NUFFT (`.spreading`: the ES kernel of width ``w``, a
  twice-oversampled grid, deconvolution by the kernel's transform); the pixel grid's
  centre offset and the middle ``eta0`` of ``n - 1`` over the image are one phase per
  visibility;
- the w-term ``exp(2 pi i w (n - 1 - eta0))`` is sampled on planes ``w_p = p dw`` with the
  same kernel along w: ``sum_p psi(w / dw - p) exp(2 pi i p dw eta) / psi_hat(dw eta)``,
  exact to ``eps`` when ``|dw eta| <= 1/4`` (the spreading's band on its twice-oversampled
  grid), so ``dw = 1 / (2 (max - min of n - 1))``. Each plane is the image times its
  w-screen and the corrections, transformed (one FFT); each visibility gathers a
  ``w x w x w`` window from the ``w`` planes around its w and the grid cells around its
  u, v (a 3-D windowed gather, the third axis the planes): ``w^3`` per visibility, as
  DUCC's ``supp^3``.

How many planes a call needs depends on its w values, which a traced program does not
know; array shapes must be static. So the planes are made while the visibilities are
visited: they are sorted by group (``w`` planes per group) and, within a group, by tiles
of the grid (32 x 32 cells: sorted, consecutive windows share cache lines; unsorted, the
gathers were 7 times slower at 1024²); one `lax.scan` over chunks of 256 sorted
visibilities (a chunk never spans two groups) holds ``2 w - 1`` planes in its carry, and
loads a group's planes in the step where the group begins (``w`` new ones after the
previous group, which shares ``w - 1``; all of them after a gap). The scan has one step
per chunk plus spare steps for the chunks that groups leave partly empty; a w range with
more groups than spare steps is summed directly instead (`fallback`: `lax.cond`, exact).

What XLA and JAX make of the forms here (measured, 2-core CPU, jax 0.10): a conditional
that replaces the carried planes by a new array, or a three-way one (`lax.switch`), makes
XLA copy the whole carry at every step (a gigabyte at 1024²), so the loads are two-way
conditionals that update the carry in place, all planes of a load in one update (one per
plane made the transpose copy the carry once per plane); NumPy arrays the loads use would
be kept once per step by JAX's partial evaluation for the transpose, so the w-screen is
computed in the program from the pixel indices; the image travels through the loop and
the conditionals with the planes, so that the transpose adds into its cotangent only
where planes load. JAX derives the transpose (DUCC's ``vis2dirty``): the gathers become
scatter-adds into the carried cotangent of the planes (XLA adds in place), the loads
become FFTs of the cotangent planes added into the image's.

Cost, against DUCC at one thread (benchmarks/results/reference_wgridder_sizes.md, 1024²
image, 10^6 visibilities, eps 1e-6): without the w-term 2.3 times forward, 2.5 times the
transpose; with it (a 4-degree field, w up to the image's highest frequency: about 30
planes of 2048², each an FFT) 2.4 and 4.5 times. Memory: ``2 w - 1`` oversampled planes
(1 GB at 1024² and eps 1e-6; the transpose holds a second set for their cotangent).
"""

from __future__ import annotations

import dataclasses
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .spreading import _clenshaw, _kernel, _windows, kernel_width, oversampled

__all__ = ["dirty2vis", "SPEED_OF_LIGHT"]

SPEED_OF_LIGHT = 299792458.0  # m/s, DUCC's value
_HIGHEST = lax.Precision.HIGHEST
CHUNK = 256
"""Visibilities per step of the gather loop (their windows, 8 KB each at eps 1e-6, stay in
cache)."""
SPARE_STEPS = 64
"""Steps beyond one per chunk of visibilities (at least these, or a sixteenth more): a
group of planes that is not a whole number of chunks takes one step more. More groups
than that (thousands of planes, hours for DUCC) are summed directly (`fallback`)."""


@dataclasses.dataclass(frozen=True, eq=False)
class _Setup:
    """What a call's static options make (NumPy, at trace time)."""

    w: int  # the kernel's width, in cells and in planes
    coef: np.ndarray  # its piecewise Chebyshev coefficients (spreading.Kernel)
    over: tuple[int, int]  # the oversampled grid
    base: np.ndarray  # (npix_x, npix_y): 1/n (or 1), the grid's and the w kernel's corrections
    signs: tuple[float, float]  # flip_u, flip_v: -1 mirrors the pixel axis
    pixsize: tuple[float, float]
    center: tuple[float, float]
    wgridding: bool
    eta0: float = 0.0  # the middle of n - 1 over the image
    dw: float = 1.0  # the planes' spacing in w (wavelengths)
    dturn_range: tuple[float, float] = (0.0, 0.0)  # dw (n - 1 - eta0) over the image
    spacing: int = 1  # planes between consecutive groups
    planes: int = 1  # planes held at once: spacing + w - 1


def _psi_hat_inverse(kern, a):
    """``1 / psi_hat(a)``, psi_hat the kernel's Fourier transform at `a` cycles per cell,
    for an array of |a| <= 1/4: a Chebyshev interpolant of the exact quadrature (which
    would cost 200 cosines per pixel), checked against it."""
    lo, hi = float(a.min()), float(a.max())
    if hi - lo < 1e-300:
        return np.full(a.shape, kern.deconvolution(np.array([lo]), 1.0)[0])
    fit = np.polynomial.chebyshev.Chebyshev.interpolate(
        lambda x: kern.deconvolution(x, 1.0), 60, domain=[lo, hi]
    )
    probe = np.linspace(lo, hi, 97)
    exact = kern.deconvolution(probe, 1.0)
    assert np.max(np.abs(fit(probe) / exact - 1)) < 1e-13
    return fit(a)


@cache
def _setup(npix, pixsize, center, flips, wgridding, divide_by_n, eps, single) -> _Setup:
    w = kernel_width(eps, single)
    kern = _kernel(w)
    over = tuple(oversampled(n, w) for n in npix)
    modes = [np.arange(n) - n / 2 for n in npix]
    decon = [kern.deconvolution(k, m) for k, m in zip(modes, over)]
    base = decon[0][:, None] * decon[1][None, :]
    signs = tuple(-1.0 if f else 1.0 for f in flips)
    common = dict(w=w, coef=kern.coef, over=over, signs=signs, pixsize=pixsize, center=center)
    if not wgridding:
        return _Setup(base=base, wgridding=False, **common)
    x, y = (s * k * d + c for s, k, d, c in zip(signs, modes, pixsize, center))
    r2 = x[:, None] ** 2 + y[None, :] ** 2
    nm1 = -r2 / (np.sqrt(1.0 - r2) + 1.0)  # n - 1, without the cancellation
    if divide_by_n:
        base = base / (nm1 + 1.0)
    if not np.isfinite(nm1).all():
        return _Setup(base=base * np.nan, wgridding=True, **common)
    lo, hi = float(nm1.min()), float(nm1.max())
    eta0, half = (lo + hi) / 2, (hi - lo) / 2
    dw = 1.0 / (4 * half) if half > 0 else 1.0  # |dw (n - 1 - eta0)| <= 1/4: sigma = 2
    dturn = dw * (nm1 - eta0)
    base = base * _psi_hat_inverse(kern, dturn)
    spacing = w
    return _Setup(
        base=base,
        wgridding=True,
        eta0=eta0,
        dw=dw,
        spacing=spacing,
        planes=spacing + w - 1,
        **common,
    )


def _rotation(turns, cplx):
    """exp(2 pi i turns), the turns first reduced to [-1/2, 1/2]."""
    angle = (2 * np.pi) * (turns - jnp.round(turns))
    return lax.complex(jnp.cos(angle), jnp.sin(angle)).astype(cplx)


def _place_centred(f, over):
    """The modes f (k = -len/2 .. len/2 - 1 per axis) zero-padded onto the grid `over`,
    mode k at index k mod n, for ``sum_k f_k exp(-2 pi i k l / n)`` by an FFT."""
    for axis, n in enumerate(over):
        m = f.shape[axis]
        pad = [(0, n - m) if a == axis else (0, 0) for a in range(f.ndim)]
        f = jnp.roll(jnp.pad(f, pad), -(m // 2), axis=axis)
    return f


def _screen_turns(s: _Setup, real):
    """``dw (n - 1 - eta0)`` at every pixel, computed in the program from the pixel
    indices (a NumPy array here would be a constant that JAX's partial evaluation keeps
    once per step of the loop for the transpose)."""
    ax = [
        (sg * (lax.iota(real, n) - n / 2) * d + c)
        for sg, n, d, c in zip(s.signs, s.base.shape, s.pixsize, s.center)
    ]
    r2 = ax[0][:, None] ** 2 + ax[1][None, :] ** 2
    nm1 = -r2 / (jnp.sqrt(1.0 - r2) + 1.0)
    return s.dw * (nm1 - s.eta0)


def _plane(a, p, s: _Setup, real, cplx):
    """The oversampled grid of plane p (w = p dw): the image a (real, corrected) times
    its w-screen exp(2 pi i p dw (n - 1 - eta0)), transformed; as real (re, im)
    channels, padded periodically by w - 1 cells: (nx + w - 1, ny + w - 1, 2)."""
    if p is None:
        f = a.astype(cplx)
    else:
        f = a * _rotation(p * _screen_turns(s, real), cplx)
    g = jnp.fft.fft2(_place_centred(f, s.over))
    g = jnp.stack([jnp.real(g), jnp.imag(g)], axis=-1)
    for axis in (0, 1):
        g = jnp.concatenate([g, lax.slice_in_dim(g, 0, s.w - 1, axis=axis)], axis=axis)
    return g


TILE = 32
"""Grid cells per side of the tiles that the visibilities are sorted by within a group
of planes, so that consecutive windows share cache lines."""


def dirty2vis(
    uvw, freq, dirty, *, npix, pixsize, center, flips, wgridding, divide_by_n, eps, fallback
):
    """``vis[r, c] = sum_ij dirty[i, j] / n_ij exp(-2 pi i f_c / C (u_r l_i + v_r m_j -
    w_r (n_ij - 1)))`` to accuracy `eps` (flip_w already applied to uvw). (nrows, nchan)."""
    real = jnp.result_type(uvw.dtype, freq.dtype, dirty.dtype)
    cplx = jnp.result_type(real, jnp.complex64)
    s = _setup(
        tuple(npix),
        tuple(map(float, pixsize)),
        tuple(map(float, center)),
        tuple(map(bool, flips)),
        bool(wgridding),
        bool(divide_by_n),
        float(eps),
        bool(real == jnp.float32),
    )
    if not np.isfinite(s.base).all():  # pixels beyond the horizon (l^2 + m^2 > 1)
        return fallback(dirty).astype(cplx)
    nrows, nchan = uvw.shape[0], freq.shape[0]
    m = nrows * nchan
    kw = s.w
    scaled = uvw.astype(real)[:, None, :] * (freq.astype(real) / SPEED_OF_LIGHT)[None, :, None]
    scaled = scaled.reshape(m, 3)
    finite = jnp.all(jnp.isfinite(scaled), axis=1)
    scaled = jnp.where(finite[:, None], scaled, 0)
    u, v, w = scaled[:, 0], scaled[:, 1], scaled[:, 2]
    # the pixel grid's offset and the middle of the w-screen: a phase per visibility
    phase = _rotation(-(u * s.center[0] + v * s.center[1]) + w * s.eta0, cplx)
    nan = jnp.where(finite, jnp.asarray(1.0, real), jnp.asarray(np.nan, real))
    turns = jnp.stack([u * (s.signs[0] * s.pixsize[0]), v * (s.signs[1] * s.pixsize[1])])
    chunk = max(1, min(CHUNK, m))

    # --- each visibility's group of planes, and its tile of the grid
    tiles = [-(-n // TILE) for n in s.over]
    cell = [
        jnp.clip(((t - jnp.floor(t)) * n).astype(jnp.int32) // TILE, 0, k - 1)
        for t, n, k in zip(turns, s.over, tiles)
    ]
    key = cell[0] * tiles[1] + cell[1]
    groups_max = (2**31 - 1) // (tiles[0] * tiles[1]) - 1
    if s.wgridding:
        t = w / s.dw
        first = jnp.ceil(t - kw / 2)
        t_w = first - t + kw / 2  # in [0, 1): the w kernel's offset
        low = jnp.min(first)
        cap = float(min(s.spacing * groups_max, 2**24))  # exact in float32 too
        beyond = jnp.max(first - low) > cap  # a w range that no schedule here holds
        rel = jnp.clip(first - low, 0, cap).astype(jnp.int32)
        group = rel // s.spacing
        slot = rel - group * s.spacing
        key = key + group * (tiles[0] * tiles[1])
        steps = -(-m // chunk)
        steps += max(SPARE_STEPS, steps // 16)
    else:
        low = jnp.zeros((), real)
        beyond = False
        t_w = jnp.zeros(m, real)
        group = slot = jnp.zeros(m, jnp.int32)
        steps = -(-m // chunk)
    order = jnp.argsort(key)

    # --- the schedule: each step takes up to `chunk` visibilities of one group, in order
    j = jnp.arange(m, dtype=jnp.int32)
    sorted_group = group[order]
    new_group = jnp.concatenate([jnp.ones(1, bool), sorted_group[1:] != sorted_group[:-1]])
    rank = j - lax.cummax(jnp.where(new_group, j, 0))
    new_step = new_group | (rank % chunk == 0)
    it = jnp.cumsum(new_step.astype(jnp.int32)) - 1
    fits = (it[-1] < steps) & ~beyond  # else: more groups than the spare steps allow
    start = jnp.full(steps, m, jnp.int32).at[jnp.where(new_step, it, steps)].set(j, mode="drop")
    pos = jnp.zeros(m, jnp.int32).at[order].set(it * chunk + rank % chunk)
    idx = jnp.clip(start[:, None] + jnp.arange(chunk, dtype=jnp.int32)[None, :], 0, m - 1)
    valid = (start[:, None] + jnp.arange(chunk)[None, :] < m) & (
        it[idx] == jnp.arange(steps)[:, None]
    )
    src = order[idx]  # (steps, chunk): the visibility each step's places take
    step_group = sorted_group[jnp.clip(start, 0, m - 1)]
    prev = jnp.concatenate([jnp.full(1, -2, jnp.int32), step_group[:-1]])
    kind = jnp.where(
        (start >= m) | (step_group == prev), 0, jnp.where(step_group == prev + 1, 1, 2)
    )
    xs = (
        kind,
        step_group,
        jnp.moveaxis(turns[:, src], 0, 1),  # (steps, 2, chunk)
        jnp.where(valid, slot[src], 0),
        t_w[src],
        valid.astype(real),
    )

    nplanes = s.planes

    @jax.checkpoint  # the w-screen is recomputed, not kept per step, for the transpose
    def planes(a, qs, g):
        """Planes qs of group g, stacked (one batched FFT)."""
        p = low + (g * s.spacing + qs).astype(real)
        return jax.vmap(lambda p: _plane(a, p, s, real, cplx))(p)

    def load(buf, a, g):
        """All planes of group g, written over the buffer with one update in place (XLA
        copies a buffer that a conditional replaces by a new array at every step, and
        the transpose of one update per plane copies the buffer once per plane)."""
        new = planes(a, jnp.arange(nplanes), g)
        return lax.dynamic_update_slice_in_dim(buf, new, 0, axis=0), a

    def advance(buf, a, g):
        """From group g - 1 to g: the last w - 1 planes of g - 1 are the first of g."""
        kept = lax.slice_in_dim(buf, s.spacing, nplanes, axis=0)
        new = planes(a, jnp.arange(nplanes - s.spacing, nplanes), g)
        new = jnp.concatenate([kept, new])
        return lax.dynamic_update_slice_in_dim(buf, new, 0, axis=0), a

    dims = lax.GatherDimensionNumbers(
        offset_dims=(1, 2, 3, 4), collapsed_slice_dims=(), start_index_map=(0, 1, 2)
    )
    ww = kw if s.wgridding else 1
    coef = s.coef.astype(np.dtype(real))

    @jax.checkpoint
    def windows(bturns, bslot, btw, bmask):
        starts, (vx, vy) = _windows(bturns * (2 * np.pi), s.over, _kernel(kw), 1.0, real)
        if s.wgridding:
            vw = _clenshaw(2 * btw - 1, coef).astype(real)
        else:
            vw = jnp.ones((btw.shape[0], 1), real)
        starts = jnp.concatenate([bslot[:, None], starts], axis=1)
        return starts, vw * bmask[:, None], vx, vy

    def body(carry, x):
        buf, a = carry
        kind_i, g_i, bturns, bslot, btw, bmask = x
        if s.wgridding:
            # the image travels with the buffer through the loop and these conditionals
            # (two-way: XLA copies the buffer at every step through a three-way one), so
            # that the transpose adds into the image's cotangent only where planes load
            def change(buf, a):
                return lax.cond(
                    kind_i == 1,
                    lambda b, a: advance(b, a, g_i),
                    lambda b, a: load(b, a, g_i),
                    buf,
                    a,
                )

            buf, a = lax.cond(kind_i > 0, change, lambda b, a: (b, a), buf, a)
        starts, vw, vx, vy = windows(bturns, bslot, btw, bmask)
        win = lax.gather(
            buf, starts, dims, (ww, kw, kw, 2), mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS
        )  # (chunk, ww, w, w, 2)
        win = jnp.einsum("cabdz,cd->cabz", win, vy, precision=_HIGHEST)
        win = jnp.einsum("cabz,cb->caz", win, vx, precision=_HIGHEST)
        win = jnp.einsum("caz,ca->cz", win, vw, precision=_HIGHEST)
        return (buf, a), win

    def stacked(dirty):
        a = dirty.astype(real) * jnp.asarray(s.base, real)
        padded = tuple(n + kw - 1 for n in s.over)
        if s.wgridding:
            buf0 = jnp.zeros((nplanes, *padded, 2), real)
        else:
            buf0 = _plane(a, None, s, real, cplx)[None]
        _, out = lax.scan(body, (buf0, a), xs)  # (steps, chunk, 2)
        out = lax.complex(out[..., 0], out[..., 1]).reshape(-1)
        return (out[pos] * (phase * nan)).reshape(nrows, nchan)

    if not s.wgridding:
        return stacked(dirty)
    return lax.cond(fits, stacked, lambda d: fallback(d).astype(cplx), dirty)
