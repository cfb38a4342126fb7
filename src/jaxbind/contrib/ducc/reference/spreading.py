"""NUFFT types 1 and 2 in pure JAX at the native algorithm's cost: spread, FFT, deconvolve.

The direct sum (`.nufft.direct_sum`) costs ``M · N`` (points times modes); this module
costs ``M · w^d + N log N``, as DUCC and FINUFFT do, to a requested accuracy ``eps``:

- the kernel is the "exponential of semicircle" ``phi(z) = exp(beta (sqrt(1 - (2z/w)^2)
  - 1))`` of width ``w`` grid cells, on a grid oversampled twice (``sigma = 2``; each
  axis the smallest 2-3-5-smooth even length ``>= 2 n`` and ``>= 2 w``), with ``w`` and
  ``beta`` from `kernel_width` (the published rule ``w = ceil(log10(1/eps)) + 1``,
  ``beta = 2.30 w``, one cell wider: the rule alone lands at 1 to 3 times eps, and the
  checker allows DUCC's own error besides, so the reference keeps below eps);
- the kernel's ``w`` values at a point are piecewise Chebyshev polynomials of the
  point's offset from the grid (fitted at trace time with NumPy, evaluated by
  Clenshaw's recurrence: a few multiply-adds per value, where ``exp`` and ``sqrt``
  cost ten times that on XLA's CPU), so they are differentiable in the point;
- type 1 adds each point's ``w^d`` window (the outer product of its per-axis kernel
  values times its values) into the oversampled grid with one windowed scatter-add
  (`lax.scatter_add`, windows of ``w^d x channels``), the grid padded by ``w - 1`` cells
  and the overhang folded back (periodicity); type 2 gathers the same windows
  (`lax.gather`) and contracts them with the kernel values: the transpose;
- the FFT is `jnp.fft` on the oversampled grid, and the deconvolution divides each mode
  by the kernel's Fourier transform, computed at trace time by Gauss-Legendre
  quadrature of the exact kernel (static shapes only).

Complex values travel as real (re, im) channels beside the transforms, so one scatter
or gather moves every transform's data for a point. Coordinates are wrapped into the
period (any real coordinate works); a non-finite coordinate is computed at 0 and marked
NaN where it enters (every output of type 1, its own output of type 2), as the ops do.

Why this design (measured on a 2-core CPU, float64, XLA 0.10, 10^6 points on a 512²
grid, ``w = 7``): XLA's CPU scatter-add and gather cost about 2-4 ns per real element
whatever the layout (a windowed scatter 0.10 s for 49·10^6 elements, per-element
indices the same; gather 1.5-2 times the scatter), so windows of the kernel's support
are the least data to move. The alternative of points sorted into tiles, each tile's
grid a dense product ``Phi_x^T diag(c) Phi_y`` (cuFINUFFT's subproblems), pays a sort
(0.08 s for 10^6 packed int64 keys; 0.26-0.5 s for a key-and-index pair; int64 keys do
not exist without x64) plus the kernel at every cell of a tile (``T + w - 1`` per axis
instead of ``w``) before its matrix products: no faster here, and more code.
"""

from __future__ import annotations

import math
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["kernel_width", "oversampled", "type1", "type2", "Kernel"]

_HIGHEST = lax.Precision.HIGHEST
_WIDEST = 16  # the widest kernel: about 1e-15, as fine as double precision holds


def kernel_width(eps: float, single: bool) -> int:
    """The kernel's width in grid cells for accuracy `eps` (sigma = 2): one more than the
    published ES rule ``ceil(log10(1/eps)) + 1``, at least 3, at most 16 (10 in single
    precision, whose rounding caps the accuracy near 1e-7 anyway)."""
    eps = max(float(eps), 1e-16)
    w = math.ceil(math.log10(1.0 / eps)) + 2
    return int(min(max(w, 3), 10 if single else _WIDEST))


def _smooth(n: int) -> int:
    """The smallest even 2-3-5-smooth integer >= n."""
    m = max(2, n + (n % 2))
    while True:
        k = m
        for p in (2, 3, 5):
            while k % p == 0:
                k //= p
        if k == 1:
            return m
        m += 2


def oversampled(n: int, w: int) -> int:
    """The oversampled length of a grid axis of `n` modes for a kernel of width `w`."""
    return _smooth(max(2 * n, 2 * w))


class Kernel:
    """The ES kernel of width `w` (``beta = 2.30 w``) for one accuracy: its piecewise
    Chebyshev coefficients (``coef[k, i]``: degree k of the piece at cell i of the
    window) and its Fourier transform at given modes (`deconvolution`)."""

    def __init__(self, w: int):
        self.w = w
        self.beta = 2.30 * w
        self.degree = w + 4
        # piece i covers z = i + t - w/2, t in [0, 1); fitted in s = 2t - 1 in [-1, 1]
        s = np.cos(np.pi * (np.arange(4 * self.degree) + 0.5) / (4 * self.degree))
        t = (s + 1) / 2
        z = np.arange(w)[None, :] + t[:, None] - w / 2  # (nodes, w)
        values = self.phi(z)
        self.coef = np.polynomial.chebyshev.chebfit(s, values, self.degree)  # (deg+1, w)

    def phi(self, z):
        """The kernel at offsets `z` (cells), NumPy, exact."""
        x = 2.0 * np.asarray(z, np.float64) / self.w
        inside = np.abs(x) < 1
        root = np.sqrt(np.where(inside, 1 - x * x, 0.0))
        return np.where(inside, np.exp(self.beta * (root - 1)), 0.0)

    def deconvolution(self, modes: np.ndarray, n_over: int) -> np.ndarray:
        """``1 / phi_hat(k)`` for the modes `k` on an oversampled axis of `n_over` cells:
        ``phi_hat(k) = integral phi(z) cos(2 pi k z / n_over) dz`` by Gauss-Legendre."""
        nodes, weights = np.polynomial.legendre.leggauss(max(200, 8 * self.w))
        half = self.w / 2
        z = half * (nodes + 1) / 2  # [0, w/2]: phi is even
        wz = weights * half / 2
        ft = 2 * np.cos(2 * np.pi * np.outer(modes, z) / n_over) @ (wz * self.phi(z))
        return 1.0 / ft


@cache
def _kernel(w: int) -> Kernel:
    return Kernel(w)


@cache
def _settings(grid: tuple[int, ...], eps: float, single: bool, modeord: int):
    """Static setup: the kernel, the oversampled grid, each axis's deconvolution factors
    in the output's mode order."""
    w = kernel_width(eps, single)
    kern = _kernel(w)
    over = tuple(oversampled(n, w) for n in grid)
    decon = []
    for n, big in zip(grid, over):
        k = np.arange(-(n // 2), (n + 1) // 2)
        k = np.fft.ifftshift(k) if modeord else k
        decon.append(kern.deconvolution(k, big))
    return kern, over, tuple(decon)


# --- points: wrapped coordinates, window starts, kernel values --------------------------


def _windows(xs, over, kern: Kernel, scale: float, real):
    """For finite coordinates xs (d, M): the first cell of each point's window per axis
    (M, d) int32, and the kernel's w values per axis (a list of (M, w))."""
    w = kern.w
    starts, values = [], []
    for a, n in enumerate(over):
        turns = xs[a] * (scale / (2 * np.pi))  # periods
        u = (turns - lax.stop_gradient(jnp.floor(turns))) * n  # cells in [0, n]
        first = lax.stop_gradient(jnp.ceil(u - w / 2))  # the window's first cell
        t = first - u + w / 2  # in [0, 1)
        starts.append(jnp.mod(first.astype(jnp.int32), n))
        values.append(_clenshaw(2 * t - 1, kern.coef.astype(np.dtype(xs.dtype))).astype(real))
    return jnp.stack(starts, axis=1), values


def _clenshaw(s, coef):
    """``sum_k coef[k, i] T_k(s)`` for every point and piece: (M, w)."""
    s = s[:, None]
    b1 = jnp.zeros((1, coef.shape[1]), s.dtype)
    b2 = b1
    for k in range(coef.shape[0] - 1, 0, -1):
        b1, b2 = coef[k][None, :] + 2 * s * b1 - b2, b1
    return coef[0][None, :] + s * b1 - b2


def _outer(values, c):
    """Each point's window: the outer product of its per-axis kernel values, times its
    channels c (M, C): (M, w, ..., w, C)."""
    d = len(values)
    win = values[0]
    for a in range(1, d):
        win = win[..., None] * values[a].reshape((values[a].shape[0],) + (1,) * a + (-1,))
    return win[..., None] * c.reshape((c.shape[0],) + (1,) * d + (c.shape[1],))


def _to_channels(v):
    """complex (T, ...) -> real (..., 2T) channels (re of each transform, then im)."""
    parts = jnp.concatenate([jnp.real(v), jnp.imag(v)], axis=0)
    return jnp.moveaxis(parts, 0, -1)


def _from_channels(r, t):
    """real (..., 2T) -> complex (T, ...)."""
    r = jnp.moveaxis(r, -1, 0)
    return lax.complex(r[:t], r[t:])


# --- FFT and modes -----------------------------------------------------------------------


def _fft(g, sign, axes):
    """``sum_l g_l exp(i sign 2 pi k l / n)`` over `axes`, unnormalized."""
    if sign < 0:
        return jnp.fft.fftn(g, axes=axes)
    return jnp.fft.ifftn(g, axes=axes, norm="forward")


def _take_modes(big, grid, over, modeord):
    """The modes of `grid` from the oversampled spectrum (T, *over), each axis's modes
    in the output order."""
    for a, (n, m) in enumerate(zip(grid, over)):
        ax = a + 1
        neg = lax.slice_in_dim(big, m - n // 2, m, axis=ax)
        pos = lax.slice_in_dim(big, 0, (n + 1) // 2, axis=ax)
        big = jnp.concatenate([pos, neg] if modeord else [neg, pos], axis=ax)
    return big


def _place_modes(f, grid, over, modeord):
    """The spectrum f (T, *grid) zero-padded onto the oversampled grid (T, *over)."""
    for a, (n, m) in enumerate(zip(grid, over)):
        ax = a + 1
        split = (n + 1) // 2 if modeord else n // 2
        first = lax.slice_in_dim(f, 0, split, axis=ax)
        second = lax.slice_in_dim(f, split, n, axis=ax)
        pos, neg = (first, second) if modeord else (second, first)
        zshape = list(f.shape)
        zshape[ax] = m - n
        f = jnp.concatenate([pos, jnp.zeros(zshape, f.dtype), neg], axis=ax)
    return f


def _deconvolve(f, decon, real):
    for a, factor in enumerate(decon):
        shape = [1] * f.ndim
        shape[a + 1] = -1
        f = f * jnp.asarray(factor, real).reshape(shape)
    return f


# --- the transforms ----------------------------------------------------------------------

CHUNK = 512
"""Points per step of the scatter or gather loop: each step's windows (``CHUNK · w^d``
channels) stay in cache instead of one array of every point's window (a gigabyte at
10^6 points in 2-D), which made the whole transform memory-bound, 5 times slower."""


def _chunked(xs, c, chunk):
    """Points (d, M) and their channels (M, C) padded to whole chunks (padding: point 0,
    value 0) and split: (n, d, B), (n, B, C)."""
    d, m = xs.shape
    size = max(1, min(chunk, m))
    count = -(-m // size)
    total = size * count
    xs = jnp.pad(xs, ((0, 0), (0, total - m)))
    xs = jnp.moveaxis(xs.reshape(d, count, size), 1, 0)
    if c is not None:
        c = jnp.pad(c, ((0, total - m), (0, 0))).reshape(count, size, c.shape[-1])
    return xs, c, count * size


def _points(xs, real):
    """The finite mask of points xs (d, M), and the points with non-finite ones at 0, in
    the finer of their precision and the values' (wrapped into the period there)."""
    finite = jnp.all(jnp.isfinite(xs), axis=0)
    return finite, jnp.where(finite[None, :], xs, 0).astype(jnp.promote_types(xs.dtype, real))


def _type1(c, xs, grid, *, sign, modeord=0, scale=1.0, eps=1e-6, chunk=CHUNK):
    """``f[t, k] = sum_j c[t, j] exp(i sign scale k·x_j)`` to accuracy `eps`: c (T, M)
    complex, xs (d, M) real; returns (T, *grid) in c's dtype."""
    grid = tuple(int(n) for n in grid)
    t, m = c.shape
    d = xs.shape[0]
    real = jnp.real(c).dtype
    single = real == jnp.float32
    kern, over, decon = _settings(grid, float(eps), bool(single), int(modeord))
    w = kern.w
    finite, xs = _points(xs, real)
    xb, cb, _ = _chunked(xs, _to_channels(c), chunk)
    dims = lax.ScatterDimensionNumbers(
        update_window_dims=tuple(range(1, d + 2)),
        inserted_window_dims=(),
        scatter_dims_to_operand_dims=tuple(range(d)),
    )

    @jax.checkpoint
    def windows(x, ch):
        starts, values = _windows(x, over, kern, scale, real)
        return starts, _outer(values, ch)

    def step(g, block):
        starts, win = windows(*block)
        g = lax.scatter_add(g, starts, win, dims, mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
        return g, None

    padded = tuple(n + w - 1 for n in over) + (2 * t,)
    g, _ = lax.scan(step, jnp.zeros(padded, real), (xb, cb))
    for a, n in enumerate(over):  # fold the overhang back: periodic
        head = lax.slice_in_dim(g, 0, w - 1, axis=a)
        tail = lax.slice_in_dim(g, n, n + w - 1, axis=a)
        body = lax.slice_in_dim(g, w - 1, n, axis=a)
        g = jnp.concatenate([head + tail, body], axis=a)
    big = _fft(_from_channels(g, t), sign, tuple(range(1, d + 1)))
    out = _deconvolve(_take_modes(big, grid, over, modeord), decon, real)
    nan = jnp.asarray(np.nan, real) * (1 + 1j)
    return jnp.where(jnp.all(finite), out, nan).astype(c.dtype)


def _type2(f, xs, *, sign, modeord=0, scale=1.0, eps=1e-6, chunk=CHUNK):
    """``c[t, j] = sum_k f[t, k] exp(i sign scale k·x_j)`` to accuracy `eps`: f (T, *grid)
    complex, xs (d, M) real; returns (T, M) in f's dtype."""
    t = f.shape[0]
    grid = tuple(f.shape[1:])
    d = len(grid)
    m = xs.shape[1]
    real = jnp.real(f).dtype
    single = real == jnp.float32
    kern, over, decon = _settings(grid, float(eps), bool(single), int(modeord))
    w = kern.w
    finite, xs = _points(xs, real)
    spectrum = _place_modes(_deconvolve(f, decon, real), grid, over, modeord)
    g = _to_channels(_fft(spectrum, sign, tuple(range(1, d + 1))))  # (*over, 2T)
    for a in range(d):  # periodic padding: the windows' overhang
        g = jnp.concatenate([g, lax.slice_in_dim(g, 0, w - 1, axis=a)], axis=a)
    dims = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(1, d + 2)),
        collapsed_slice_dims=(),
        start_index_map=tuple(range(d)),
    )
    xb, _, total = _chunked(xs, None, chunk)

    @jax.checkpoint
    def step(x):
        starts, values = _windows(x, over, kern, scale, real)
        win = lax.gather(
            g, starts, dims, (w,) * d + (2 * t,), mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS
        )  # (B, w.., 2T)
        for a in range(d - 1, -1, -1):  # contract the last window axis with its values
            win = jnp.einsum("m...wc,mw->m...c", win, values[a], precision=_HIGHEST)
        return win  # (B, 2T)

    out = lax.map(step, xb).reshape(total, 2 * t)[:m]
    out = _from_channels(out, t)  # (T, M)
    nan = jnp.asarray(np.nan, real) * (1 + 1j)
    return jnp.where(finite[None, :], out, nan).astype(f.dtype)


# --- the derivatives in the points: NUFFTs of mode-weighted data ---------------------------
#
# d/dx_a of exp(i s scale k·x) is i s scale k_a times it, so (as the native ops do) the
# derivative in the points is a NUFFT of k-weighted data: type 2's tangent is
# ``T2(df) + sum_a dx_a T2(i s scale k_a f)`` (the weighted transforms computed with the
# primal, in one gather), type 1's ``T1(dc) + sum_a i s scale k_a T1(c dx_a)`` (one
# scatter of every tangent's channels). JAX transposes these for grad: the points'
# cotangent of type 1 is then a gather (type 2's cost), not the derivative of the
# scatter's windows, which costs several scatters.


def _zero(t) -> bool:
    return isinstance(t, jax.custom_derivatives.SymbolicZero)


def _weights(grid, modeord, sign, scale, dtype):
    """``i s scale k_a`` per axis a, shaped to broadcast over (T, *grid)."""
    out = []
    for a, n in enumerate(grid):
        k = np.arange(-(n // 2), (n + 1) // 2)
        k = np.fft.ifftshift(k) if modeord else k
        shape = [1] * (len(grid) + 1)
        shape[a + 1] = n
        out.append(jnp.asarray((1j * sign * scale) * k.reshape(shape), dtype))
    return out


@cache
def _type1_fn(grid, sign, modeord, scale, eps, chunk):
    opts = dict(sign=sign, modeord=modeord, scale=scale, eps=eps, chunk=chunk)

    @jax.custom_jvp
    def fn(c, xs):
        return _type1(c, xs, grid, **opts)

    def jvp(primals, tangents):
        c, xs = primals
        dc, dxs = tangents
        out = fn(c, xs)
        parts = [] if _zero(dc) else [dc]
        if not _zero(dxs):
            real = jnp.real(c).dtype
            parts += [c * dxs[a].astype(real)[None, :] for a in range(len(grid))]
        if not parts:
            return out, jnp.zeros_like(out)
        spread = fn(jnp.concatenate(parts), xs)
        t = c.shape[0]
        tangent = jnp.zeros_like(out) if _zero(dc) else spread[:t]
        if not _zero(dxs):
            first = 0 if _zero(dc) else t
            for a, k in enumerate(_weights(grid, modeord, sign, scale, c.dtype)):
                tangent = tangent + k * spread[first + a * t : first + (a + 1) * t]
        return out, tangent

    fn.defjvp(jvp, symbolic_zeros=True)
    return fn


@cache
def _type2_fn(grid, sign, modeord, scale, eps, chunk):
    opts = dict(sign=sign, modeord=modeord, scale=scale, eps=eps, chunk=chunk)

    @jax.custom_jvp
    def fn(f, xs):
        return _type2(f, xs, **opts)

    def jvp(primals, tangents):
        f, xs = primals
        df, dxs = tangents
        t = f.shape[0]
        if _zero(dxs):
            out = fn(f, xs)
            tangent = jnp.zeros_like(out)
        else:
            weights = _weights(grid, modeord, sign, scale, f.dtype)
            both = fn(jnp.concatenate([f] + [k * f for k in weights]), xs)
            out = both[:t]
            real = jnp.real(f).dtype
            tangent = sum(
                dxs[a].astype(real)[None, :] * both[(a + 1) * t : (a + 2) * t]
                for a in range(len(grid))
            )
        if not _zero(df):
            tangent = tangent + fn(df, xs)
        return out, tangent

    fn.defjvp(jvp, symbolic_zeros=True)
    return fn


def type1(c, xs, grid, *, sign, modeord=0, scale=1.0, eps=1e-6, chunk=CHUNK):
    """``f[t, k] = sum_j c[t, j] exp(i sign scale k·x_j)`` to accuracy `eps`: c (T, M)
    complex, xs (d, M) real; returns (T, *grid) in c's dtype. Differentiable in both
    (in the points by NUFFTs of mode-weighted data), to any order."""
    grid = tuple(int(n) for n in grid)
    fn = _type1_fn(grid, int(sign), int(modeord), float(scale), float(eps), int(chunk))
    return fn(c, xs)


def type2(f, xs, *, sign, modeord=0, scale=1.0, eps=1e-6, chunk=CHUNK):
    """``c[t, j] = sum_k f[t, k] exp(i sign scale k·x_j)`` to accuracy `eps`: f (T, *grid)
    complex, xs (d, M) real; returns (T, M) in f's dtype. Differentiable in both."""
    grid = tuple(int(n) for n in f.shape[1:])
    fn = _type2_fn(grid, int(sign), int(modeord), float(scale), float(eps), int(chunk))
    return fn(f, xs)
