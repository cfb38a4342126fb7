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

Both transforms are one JAX primitive (`nufft_p`, lowered to this module's jax.lax code:
no custom call) whose transpose in the values is the other type, and whose derivatives
in the points are NUFFTs of mode-weighted data (see "one primitive" below), so grad,
vjp and linear_transpose cost whole transforms, not JAX's transpose of the scatter loop
(which cost twice a transform). `.type3` builds type 3 on `_spread` and `_type2`.

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

import functools
import math
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...._compat import Primitive, ad, batching, mlir, not_mapped, output_aval, zero_tangent

__all__ = ["kernel_width", "oversampled", "type1", "type2", "Kernel", "nufft_p"]

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

    FIT_TOP = np.pi / 2 * 1.05
    """`fourier_fit` covers ``|kappa| <= FIT_TOP``: a twice-oversampled grid's modes, and
    type 3's targets (`.type3`), with room for rounding."""

    def _quadrature(self, kappa: np.ndarray) -> np.ndarray:
        """``phi_hat(kappa) = integral phi(z) cos(kappa z) dz`` by Gauss-Legendre, in
        blocks (a few MB at a time)."""
        nodes, weights = np.polynomial.legendre.leggauss(max(200, 8 * self.w))
        half = self.w / 2
        z = half * (nodes + 1) / 2  # [0, w/2]: phi is even
        wz = weights * half / 2 * self.phi(z)
        kappa = np.ravel(kappa)
        out = np.empty(kappa.shape)
        for i in range(0, kappa.size, 4096):
            out[i : i + 4096] = 2 * np.cos(np.outer(kappa[i : i + 4096], z)) @ wz
        return out

    @functools.cached_property
    def fourier_fit(self) -> np.ndarray:
        """Chebyshev coefficients of ``phi_hat(kappa)`` in ``kappa / FIT_TOP`` on [-1, 1]
        (degree 32: within 1e-14 of the quadrature for every width)."""
        degree = 32
        s = np.cos(np.pi * (np.arange(4 * degree) + 0.5) / (4 * degree))
        return np.polynomial.chebyshev.chebfit(s, self._quadrature(s * self.FIT_TOP), degree)

    def fourier(self, kappa) -> np.ndarray:
        """``phi_hat(kappa)`` (kappa in radians per cell), NumPy: the fit where it
        covers kappa, the quadrature elsewhere."""
        kappa = np.abs(np.asarray(kappa, np.float64))
        inside = kappa <= self.FIT_TOP
        out = np.polynomial.chebyshev.chebval(
            np.minimum(kappa, self.FIT_TOP) / self.FIT_TOP, self.fourier_fit
        )
        if not inside.all():
            out = np.where(inside, out, 0.0)
            out[~inside] = self._quadrature(kappa[~inside])
        return out

    def deconvolution(self, modes: np.ndarray, n_over: int) -> np.ndarray:
        """``1 / phi_hat(k)`` for the modes `k` on an oversampled axis of `n_over` cells:
        ``phi_hat(k) = integral phi(z) cos(2 pi k z / n_over) dz``."""
        return 1.0 / self.fourier(2 * np.pi * np.asarray(modes) / n_over)


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


def _spread(ch, xs, over, kern: Kernel, scale: float, real, chunk: int = CHUNK):
    """The real channels ch (M, C) of points xs (d, M) (finite, at `real` precision)
    spread onto the periodic grid `over` with the kernel: (*over, C)."""
    d = xs.shape[0]
    w = kern.w
    xb, cb, _ = _chunked(xs, ch, chunk)
    dims = lax.ScatterDimensionNumbers(
        update_window_dims=tuple(range(1, d + 2)),
        inserted_window_dims=(),
        scatter_dims_to_operand_dims=tuple(range(d)),
    )

    @jax.checkpoint
    def windows(x, c):
        starts, values = _windows(x, over, kern, scale, real)
        return starts, _outer(values, c)

    def step(g, block):
        starts, win = windows(*block)
        g = lax.scatter_add(g, starts, win, dims, mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
        return g, None

    padded = tuple(n + w - 1 for n in over) + (ch.shape[-1],)
    g, _ = lax.scan(step, jnp.zeros(padded, real), (xb, cb))
    for a, n in enumerate(over):  # fold the overhang back: periodic
        head = lax.slice_in_dim(g, 0, w - 1, axis=a)
        tail = lax.slice_in_dim(g, n, n + w - 1, axis=a)
        body = lax.slice_in_dim(g, w - 1, n, axis=a)
        g = jnp.concatenate([head + tail, body], axis=a)
    return g


def _interp(g, xs, over, kern: Kernel, scale: float, real, chunk: int = CHUNK):
    """The periodic grid's real channels g (*over, C) interpolated with the kernel at
    points xs (d, M) (finite, at `real` precision): (M, C). `_spread`'s transpose."""
    d, m = xs.shape
    w = kern.w
    c = g.shape[-1]
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
            g, starts, dims, (w,) * d + (c,), mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS
        )  # (B, w.., C)
        for a in range(d - 1, -1, -1):  # contract the last window axis with its values
            win = jnp.einsum("m...wc,mw->m...c", win, values[a], precision=_HIGHEST)
        return win  # (B, C)

    return lax.map(step, xb).reshape(total, c)[:m]


def _type1(c, xs, grid, *, sign, modeord=0, scale=1.0, eps=1e-6, chunk=CHUNK):
    """``f[t, k] = sum_j c[t, j] exp(i sign scale k·x_j)`` to accuracy `eps`: c (T, M)
    complex, xs (d, M) real; returns (T, *grid) in c's dtype."""
    grid = tuple(int(n) for n in grid)
    t = c.shape[0]
    d = xs.shape[0]
    real = jnp.real(c).dtype
    single = real == jnp.float32
    kern, over, decon = _settings(grid, float(eps), bool(single), int(modeord))
    finite, xs = _points(xs, real)
    g = _spread(_to_channels(c), xs, over, kern, scale, real, chunk)
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
    real = jnp.real(f).dtype
    single = real == jnp.float32
    kern, over, decon = _settings(grid, float(eps), bool(single), int(modeord))
    finite, xs = _points(xs, real)
    spectrum = _place_modes(_deconvolve(f, decon, real), grid, over, modeord)
    g = _to_channels(_fft(spectrum, sign, tuple(range(1, d + 1))))  # (*over, 2T)
    out = _from_channels(_interp(g, xs, over, kern, scale, real, chunk), t)  # (T, M)
    nan = jnp.asarray(np.nan, real) * (1 + 1j)
    return jnp.where(finite[None, :], out, nan).astype(f.dtype)


# --- one primitive: the derivatives and transposes as NUFFTs ------------------------------
#
# Types 1 and 2 are one JAX primitive (`nufft_p`, lowered to the code above: no custom
# call), so that every rule is a NUFFT again, to any order:
#
# - transpose in the values: type 1's is type 2 at the same points with the same sign
#   (JAX's transpose does not conjugate), and type 2's is type 1: grad, vjp and
#   jax.linear_transpose cost one transform of the other type, where JAX's transpose of
#   the scan of scatters above cost twice that;
# - derivative in the points: d/dx_a of exp(i s scale k·x) is i s scale k_a times it, so
#   type 2's tangent is ``T2(df) + sum_a dx_a T2(i s scale k_a f)`` (the weighted
#   transforms computed with the primal, in one gather), type 1's ``T1(dc) + sum_a i s
#   scale k_a T1(c dx_a)`` (one scatter of every tangent's channels), both linear in the
#   tangents, so their transposes are again the other type;
# - batching: a batch of values shares the points as more transforms (one scatter or
#   gather moves them all); batched points run one after another (`lax.map`).

nufft_p = Primitive("nufft_reference")
"""``nufft_p.bind(values, xs, kind=1|2, grid, sign, modeord, scale, eps, chunk)``:
`type1` or `type2` (use those)."""


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


def _body(values, xs, *, kind, grid, sign, modeord, scale, eps, chunk):
    opts = dict(sign=sign, modeord=modeord, scale=scale, eps=eps, chunk=chunk)
    shape = (values.shape[0], *grid) if kind == 1 else (values.shape[0], xs.shape[1])
    if 0 in shape or 0 in values.shape:  # empty: a sum over nothing
        return jnp.zeros(shape, values.dtype)
    if kind == 1:
        return _type1(values, xs, grid, **opts)
    return _type2(values, xs, **opts)


def _abstract(values, xs, *, kind, grid, **_):
    shape = (values.shape[0], *grid) if kind == 1 else (values.shape[0], xs.shape[1])
    return output_aval(shape, values.dtype, [values, xs])


_STATIC = ("kind", "grid", "sign", "modeord", "scale", "eps", "chunk")
nufft_p.def_impl(jax.jit(_body, static_argnames=_STATIC))
nufft_p.def_abstract_eval(_abstract)
mlir.register_lowering(nufft_p, mlir.lower_fun(_body, multiple_results=False))


def _jvp(primals, tangents, **params):
    values, xs = primals
    dv, dxs = tangents
    kind, grid, sign, modeord, scale = (params[k] for k in _STATIC[:5])
    moving = type(dxs) is not ad.Zero
    real = jnp.real(values).dtype
    t = values.shape[0]
    if kind == 1:
        out = nufft_p.bind(values, xs, **params)
        parts = [] if type(dv) is ad.Zero else [dv]
        if moving:
            parts += [values * dxs[a].astype(real)[None, :] for a in range(len(grid))]
        if not parts:
            return out, zero_tangent(out)
        spread = nufft_p.bind(jnp.concatenate(parts), xs, **params)
        tangent = spread[:t] if type(dv) is not ad.Zero else jnp.zeros_like(out)
        if moving:
            first = t if type(dv) is not ad.Zero else 0
            for a, k in enumerate(_weights(grid, modeord, sign, scale, values.dtype)):
                tangent = tangent + k * spread[first + a * t : first + (a + 1) * t]
        return out, tangent
    if moving:
        weights = _weights(grid, modeord, sign, scale, values.dtype)
        both = nufft_p.bind(jnp.concatenate([values] + [k * values for k in weights]), xs, **params)
        out = both[:t]
        tangent = sum(
            dxs[a].astype(real)[None, :] * both[(a + 1) * t : (a + 2) * t] for a in range(len(grid))
        )
    else:
        out = nufft_p.bind(values, xs, **params)
        tangent = None
    if type(dv) is not ad.Zero:
        dout = nufft_p.bind(dv, xs, **params)
        tangent = dout if tangent is None else tangent + dout
    return out, zero_tangent(out) if tangent is None else tangent


def _transpose(ct, values, xs, **params):
    if ad.is_undefined_primal(xs):
        raise ValueError(
            "the NUFFT reference is linear in its values, not in its points: it cannot be "
            "transposed in the points (differentiate it instead)"
        )
    if type(ct) is ad.Zero:
        return [ad.Zero(values.aval), None]
    other = dict(params, kind=3 - params["kind"])
    return [nufft_p.bind(ct, xs, **other), None]


def _batched(args, dims, **params):
    values, xs = args
    bv, bx = dims
    if bx is not_mapped:  # shared points: the batch is more transforms
        v = jnp.moveaxis(values, bv, 0)
        b, t = v.shape[:2]
        out = nufft_p.bind(v.reshape((b * t, *v.shape[2:])), xs, **params)
        return out.reshape((b, t, *out.shape[1:])), 0
    xs = jnp.moveaxis(xs, bx, 0)
    if bv is not_mapped:
        return lax.map(lambda x: nufft_p.bind(values, x, **params), xs), 0
    v = jnp.moveaxis(values, bv, 0)
    return lax.map(lambda a: nufft_p.bind(*a, **params), (v, xs)), 0


ad.primitive_jvps[nufft_p] = _jvp
ad.primitive_transposes[nufft_p] = _transpose
batching.primitive_batchers[nufft_p] = _batched


def _params(kind, grid, sign, modeord, scale, eps, chunk):
    return dict(
        kind=kind,
        grid=tuple(int(n) for n in grid),
        sign=1 if sign > 0 else -1,
        modeord=int(modeord),
        scale=float(scale),
        eps=float(eps),
        chunk=int(chunk),
    )


def type1(c, xs, grid, *, sign, modeord=0, scale=1.0, eps=1e-6, chunk=CHUNK):
    """``f[t, k] = sum_j c[t, j] exp(i sign scale k·x_j)`` to accuracy `eps`: c (T, M)
    complex, xs (d, M) real; returns (T, *grid) in c's dtype. Differentiable in both
    (in the points by NUFFTs of mode-weighted data), to any order; its transpose in c is
    `type2`."""
    return nufft_p.bind(c, xs, **_params(1, grid, sign, modeord, scale, eps, chunk))


def type2(f, xs, *, sign, modeord=0, scale=1.0, eps=1e-6, chunk=CHUNK):
    """``c[t, j] = sum_k f[t, k] exp(i sign scale k·x_j)`` to accuracy `eps`: f (T, *grid)
    complex, xs (d, M) real; returns (T, M) in f's dtype. Differentiable in both; its
    transpose in f is `type1`."""
    return nufft_p.bind(f, xs, **_params(2, f.shape[1:], sign, modeord, scale, eps, chunk))
