"""References of the NUFFT ops: types 1 and 2 by spreading (`.spreading`), type 3 by
rescaling (`.type3`), and the exact check by a non-uniform DFT summed directly, in blocks
of points.

The ops and their references (each named after its op, called as the op's callable is):

- `nufft` for `..nufft.get_nufft`'s op ``jaxducc0.nufft``: ``(coord, values)``,
  coordinates ``(M, d)`` (one row per point), no transform axis;
- `nufft_points` for ``jaxducc0.nufft_points`` (beneath jax-finufft's calls): ``(values,
  xs[, qs])``, values ``(T, ...)``, coordinates ``(d, M)`` (one row per dimension);
- `nufft_plan` for `..nufft_plan.NufftPlan`'s op: ``(values,)``, the points in the
  keyword arguments ``coord`` ``(M, d)`` and ``target`` ``(K, d)``;
- `nufft1`, `nufft2`, `nufft3`: jax-finufft's calls (its broadcasting of leading
  dimensions), in pure JAX.

Every flavour goes through `transform`, which runs DUCC's algorithms in JAX, to the
call's accuracy ``eps``/``epsilon`` (within 0.1 to 0.8 times it of the exact sum, so
within the checker's 3 eps of DUCC): types 1 and 2 (`.spreading`: an
exponential-of-semicircle kernel spread onto a twice-oversampled grid, an FFT, a
deconvolution) at ``M w^d + N log N``; type 3 (`.type3`: the sources spread onto a grid
sized from the sources' and targets' extents, a type 2 at the scaled targets, a
deconvolution) at ``(M + K) w^d + N log N``, or by the direct sum where its grid would
be too large (see `.type3`). Each is a JAX primitive whose transpose in the values is
the other type (type 3's: type 3 from the targets to the sources) and whose derivatives
in the points are NUFFTs again, so grad, vjp, linear_transpose and vmap of every entry
point run transforms (10^6 points on 256² at eps 1e-6: see
benchmarks/results/reference_sizes.md). `direct_sum` (the tests' exact sum) sums
``exp(i s k·x_j)`` directly, through the points in blocks (``lax.scan``, each block
rematerialized under differentiation): ``M · N`` per transform (``N`` modes or target
points). Grid modes run from ``-(n // 2)`` to ``(n - 1) // 2`` (``modeord=0``, DUCC's
``fft_order=False``), or in FFT order. Types 1 and 2 are periodic in the coordinates:
period 2 pi, or ``get_nufft``'s ``periodicity`` (the phase is ``2 pi k·x /
periodicity``); type 3 is not scaled. A non-finite coordinate gives NaN where it enters
the sum, as in the ops. Options that only tune the native computation (``nthreads``,
``upsampfac``, ``sigma``, ``sigma_min``/``sigma_max``, ``verbosity``) are
accepted by name and ignored; any other is refused (`.options`).

The direct sum's sizes (two cores, double precision, 2-D: see
benchmarks/results/reference_ducc.md): ``M · N`` complex multiply-adds in matrix
products (about 10^9 a second): 10^4 points on 64² 50-100 ms. Type 3's costs an
exponential per (source, target) pair, about 10^7 a second: 10^4 sources to 10^3
targets take ~0.8 s. Memory is one block of `BLOCK_ELEMENTS` complex numbers whatever
the size (and, under ``grad``, the inputs of each block).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import blocks, options, spreading, type3

__all__ = ["direct_sum", "mode_numbers", "nufft", "nufft_points", "nufft_plan", "transform"]
__all__ += ["nufft1", "nufft2", "nufft3"]

BLOCK_ELEMENTS = 1 << 20
"""The complex numbers one block of points may hold in its partial sums (16 MiB in
double precision): the number of points per block is this over what each point needs."""

_HIGHEST = lax.Precision.HIGHEST  # no reduced-precision products (TPUs' default)


def mode_numbers(n: int, modeord: int) -> np.ndarray:
    """The Fourier modes of a grid axis of length `n`: ``-(n//2) .. (n-1)//2`` for
    ``modeord=0``, in FFT order (``0 .. (n-1)//2``, then the negative ones) for 1."""
    k = np.arange(-(n // 2), (n + 1) // 2)
    return np.fft.ifftshift(k) if modeord else k


def _phases(x, k, sign: int, scale: float, dtype):
    """``exp(i s scale k x_j)`` for a coordinate row `x` (B,) and modes `k` (n,): (B, n)."""
    phase = (scale * x)[:, None] * jnp.asarray(k, x.dtype)[None, :]
    return jnp.exp((1j * sign) * phase).astype(dtype)


def _padded(a, total: int, blocks: int):
    """`a` (..., M) padded with zeros to (..., total), then split: (blocks, ..., total/blocks)."""
    a = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, total - a.shape[-1])])
    a = a.reshape(a.shape[:-1] + (blocks, total // blocks))
    return jnp.moveaxis(a, -2, 0)


def _type2_block(f, xs, modes, sign, scale):
    """``c[t, j] = sum_k f[t, k] e_jk`` for one block of points xs (d, B): (T, B)."""
    d = xs.shape[0]
    g = jnp.einsum(
        "...l,bl->...b",
        f,
        _phases(xs[d - 1], modes[d - 1], sign, scale, f.dtype),
        precision=_HIGHEST,
    )
    for a in range(d - 2, -1, -1):  # (T, n_0..n_a, B) -> (T, n_0..n_{a-1}, B)
        g = jnp.einsum(
            "...kb,bk->...b", g, _phases(xs[a], modes[a], sign, scale, f.dtype), precision=_HIGHEST
        )
    return g


def _type1_block(c, xs, modes, sign, scale):
    """``f[t, k] = sum_j c[t, j] e_jk`` over one block of points xs (d, B): (T, *grid)."""
    d = xs.shape[0]
    h = c
    for a in range(d - 1):  # (T, n_0..n_{a-1}, B) -> (T, n_0..n_a, B)
        h = jnp.einsum(
            "...b,bk->...kb", h, _phases(xs[a], modes[a], sign, scale, c.dtype), precision=_HIGHEST
        )
    return jnp.einsum(
        "...b,bl->...l",
        h,
        _phases(xs[d - 1], modes[d - 1], sign, scale, c.dtype),
        precision=_HIGHEST,
    )


def _type3_block(c, xs, qs, sign):
    """``g[t, l] = sum_j c[t, j] exp(i s q_l·x_j)`` over one block of sources: (T, K)."""
    phase = sum(qs[a][:, None] * xs[a][None, :] for a in range(xs.shape[0]))  # (K, B)
    e = jnp.exp((1j * sign) * phase).astype(c.dtype)
    return jnp.einsum("tb,lb->tl", c, e, precision=_HIGHEST)


def direct_sum(
    values,
    xs,
    qs=None,
    *,
    nufft_type: int,
    sign: int,
    grid=None,
    modeord: int = 0,
    scale: float = 1.0,
    block: int | None = None,
):
    """The non-uniform DFT of every type, in the layout of ``nufft_points``.

    Args:
      values: type 1 and 3 ``(T, M)``, type 2 ``(T, *grid)``; complex.
      xs: ``(d, M)`` real coordinates, d in 1..3.
      qs: type 3 only: ``(d, K)`` target coordinates.
      nufft_type: 1 (``f[t, k] = sum_j c[t, j] e_jk``), 2 (``c[t, j] = sum_k f[t, k]
        e_jk``) or 3 (``g[t, l] = sum_j c[t, j] exp(i s q_l·x_j)``), where ``e_jk =
        exp(i s scale k·x_j)``.
      sign: the sign ``s`` of the exponent, +1 or -1.
      grid: type 1 only: the grid's shape (type 2 reads it from the values).
      modeord: 0: grids from the most negative mode; 1: FFT order.
      scale: the factor of the phase of types 1 and 2 (2 pi over the period).
      block: points per block (default: from `BLOCK_ELEMENTS`).

    Returns:
      type 1 ``(T, *grid)``, type 2 ``(T, M)``, type 3 ``(T, K)``, in the values' dtype.
    """
    d, m = xs.shape
    t = values.shape[0]
    sign = 1 if sign > 0 else -1
    if nufft_type == 2:
        grid = tuple(values.shape[1:])
    out_shape = (t, *grid) if nufft_type == 1 else (t, m if nufft_type == 2 else qs.shape[1])
    if 0 in out_shape or m == 0 or (nufft_type != 3 and 0 in grid):
        return jnp.zeros(out_shape, values.dtype)
    real = jnp.promote_types(xs.dtype, jnp.real(values).dtype)  # phases at the finer one
    xs, qs = xs.astype(real), None if qs is None else qs.astype(real)
    if nufft_type == 3:
        per_point = t + qs.shape[1]
    else:
        modes = [mode_numbers(n, modeord) for n in grid]
        per_point = t * math.prod(grid[:-1]) + sum(grid)
    size, count = blocks(m, per_point, BLOCK_ELEMENTS, block)
    if count == 1:  # one block: no loop
        if nufft_type == 2:
            return _type2_block(values, xs, modes, sign, scale)
        if nufft_type == 1:
            return _type1_block(values, xs, modes, sign, scale)
        return _type3_block(values, xs, qs, sign)
    total = size * count
    xb = _padded(xs, total, count)  # (count, d, size); padded points are 0 ...
    if nufft_type == 2:

        @jax.checkpoint
        def points(x):
            return _type2_block(values, x, modes, sign, scale)

        out = lax.map(points, xb)  # (count, T, size)
        return jnp.moveaxis(out, 0, 1).reshape(t, total)[:, :m]
    cb = _padded(values, total, count)  # ... with value 0, so they add nothing

    if nufft_type == 1:

        @jax.checkpoint
        def part(c, x):
            return _type1_block(c, x, modes, sign, scale)

    else:

        @jax.checkpoint
        def part(c, x):
            return _type3_block(c, x, qs, sign)

    def step(acc, block_):
        return acc + part(*block_), None

    out, _ = lax.scan(step, jnp.zeros(out_shape, values.dtype), (cb, xb))
    return out


def transform(values, xs, qs=None, *, nufft_type, sign, grid=None, modeord=0, scale=1.0, eps):
    """`direct_sum`'s transforms at the native algorithm's cost, to accuracy `eps`: types 1
    and 2 by spreading, FFT and deconvolution (`.spreading`); type 3 by rescaling
    (`.type3`, which takes the direct sum where its grid would be too large)."""
    kind = int(nufft_type)
    shape = tuple(values.shape[1:]) if kind == 2 else (() if grid is None else tuple(grid))
    m = xs.shape[-1]
    sign = 1 if sign > 0 else -1
    if kind == 3:
        return type3.type3(values, xs, qs, sign=sign, eps=eps)
    if m == 0 or 0 in shape or values.shape[0] == 0:
        return direct_sum(
            values, xs, qs, nufft_type=kind, sign=sign, grid=grid, modeord=modeord, scale=scale
        )
    if kind == 1:
        return spreading.type1(
            values, xs, shape, sign=sign, modeord=int(modeord), scale=scale, eps=eps
        )
    return spreading.type2(values, xs, sign=sign, modeord=int(modeord), scale=scale, eps=eps)


# --- the ops ------------------------------------------------------------------------


@options(tuning=("nthreads", "verbosity", "sigma_min", "sigma_max"))
def nufft(
    coord,
    values,
    *,
    grid_shape,
    nufft_type,
    forward=True,
    periodicity=2 * np.pi,
    fft_order=False,
    epsilon=1e-6,
):
    """Reference of ``jaxducc0.nufft`` (`..nufft.get_nufft`): ``[result]``.

    `coord` ``(M, d)``, a row per point; `values` ``(M,)`` (type 1) or ``grid_shape``
    (type 2); ``forward`` is the sign -1; the phase is ``2 pi k·x / periodicity``;
    ``fft_order`` puts the zero mode first; ``epsilon`` is the accuracy. ``nthreads``,
    ``verbosity``, ``sigma_min`` and ``sigma_max`` are ignored.
    """
    out = transform(
        values[None],
        coord.T,
        nufft_type=int(nufft_type),
        sign=-1 if forward else 1,
        grid=tuple(grid_shape),
        modeord=int(bool(fft_order)),
        scale=2 * np.pi / float(periodicity),
        eps=epsilon,
    )
    return [out[0]]


@options(tuning=("nthreads", "upsampfac"))
def nufft_points(values, xs, *qs, nufft_type, sign, modeord=0, grid=None, eps=1e-6):
    """Reference of ``jaxducc0.nufft_points``: ``[result]``.

    `values` ``(T, M)`` (types 1, 3) or ``(T, *grid)`` (type 2); `xs` ``(d, M)``; type
    3's targets `qs` ``(d, K)``; period 2 pi; ``eps`` is the accuracy. ``nthreads`` and
    ``upsampfac`` are ignored.
    """
    return [
        transform(
            values,
            xs,
            qs[0] if qs else None,
            nufft_type=int(nufft_type),
            sign=int(sign),
            grid=None if grid is None else tuple(grid),
            modeord=int(modeord),
            eps=eps,
        )
    ]


@options(tuning=("nthreads", "sigma", "dtype"))
def nufft_plan(values, *, nufft_type, sign, coord, target=None, grid=None, modeord=0, epsilon=1e-6):
    """Reference of ``jaxducc0.nufft_plan`` (`..nufft_plan.NufftPlan`): ``[result]``.

    `values` ``(T, ...)``; the plan's points arrive as keyword arguments: `coord`
    ``(M, d)`` and, for type 3, `target` ``(K, d)`` (NumPy arrays, possibly in double
    precision for single-precision values: they are used at the values' precision).
    ``epsilon`` is the accuracy; ``nthreads``, ``sigma`` and ``dtype`` are ignored.
    """
    real = jnp.real(values).dtype
    xs = jnp.asarray(np.asarray(coord).T, real)
    qs = None if target is None else jnp.asarray(np.asarray(target).T, real)
    return [
        transform(
            values,
            xs,
            qs,
            nufft_type=int(nufft_type),
            sign=int(sign),
            grid=None if grid is None else tuple(grid),
            modeord=int(modeord),
            eps=epsilon,
        )
    ]


# --- jax-finufft's calls --------------------------------------------------------------


def _finufft(kind, values, points, targets, *, sign, modeord, grid=None, eps=1e-6):
    """One of jax-finufft's calls: broadcast the leading dimensions as it does (values
    with one leading dimension more than the points share them), then one transform of
    every set of values where the points are shared, else one per point set (vmap)."""
    values = jnp.asarray(values)
    points = jnp.broadcast_arrays(*[jnp.asarray(p) for p in points])
    targets = jnp.broadcast_arrays(*[jnp.asarray(q) for q in targets]) if targets else []
    d = len(points)
    lead = points[0].shape[:-1]
    if targets:
        lead = np.broadcast_shapes(lead, targets[0].shape[:-1])
    core = values.shape[values.ndim - d :] if kind == 2 else values.shape[-1:]
    vlead = values.shape[: values.ndim - len(core)]
    if len(vlead) == len(lead) + 1:  # transforms sharing the points
        points = [p[..., None, :] for p in points]
        targets = [q[..., None, :] for q in targets]
        lead = lead + (1,)
    shared = math.prod(lead) == 1  # one point set for every transform
    lead = np.broadcast_shapes(vlead, lead)
    values = jnp.broadcast_to(values, lead + tuple(core)).reshape((-1, *core))
    if shared:  # the transforms of one call: one scatter or gather moves them all
        xs = jnp.stack([p.reshape(p.shape[-1]) for p in points])
        qs = [jnp.stack([q.reshape(q.shape[-1]) for q in targets])] if targets else []
        out = transform(
            values, xs, *qs, nufft_type=kind, sign=sign, grid=grid, modeord=modeord, eps=eps
        )
        return out.reshape(lead + out.shape[1:])
    xs = jnp.stack([jnp.broadcast_to(p, lead + p.shape[-1:]) for p in points], axis=-2)
    xs = xs.reshape((-1, *xs.shape[-2:]))
    args = [values[:, None], xs]
    if targets:
        qs = jnp.stack([jnp.broadcast_to(q, lead + q.shape[-1:]) for q in targets], axis=-2)
        args.append(qs.reshape((-1, *qs.shape[-2:])))

    def one(v, x, *q):
        return transform(v, x, *q, nufft_type=kind, sign=sign, grid=grid, modeord=modeord, eps=eps)[
            0
        ]

    out = jax.vmap(one)(*args)
    return out.reshape(lead + out.shape[1:])


def _opts(opts) -> int:
    return int(getattr(opts, "modeord", 0) or 0)


@options()
def nufft1(output_shape, source, *points, iflag=1, eps=1e-6, opts=None):
    """jax-finufft's ``nufft1`` in pure JAX: ``f[k] = sum_j c[j] exp(i sign(iflag) k·x_j)``,
    ``(..., *output_shape)``, to accuracy `eps`; ``opts.modeord`` is honoured, the rest
    ignored."""
    grid = tuple(int(n) for n in np.atleast_1d(output_shape))
    given = [p for p in points if p is not None]
    sign = 1 if iflag >= 0 else -1
    return _finufft(1, source, given, [], sign=sign, modeord=_opts(opts), grid=grid, eps=eps)


@options()
def nufft2(source, *points, iflag=-1, eps=1e-6, opts=None):
    """jax-finufft's ``nufft2`` in pure JAX: ``c[j] = sum_k f[k] exp(i sign(iflag) k·x_j)``,
    ``(..., M)``."""
    given = [p for p in points if p is not None]
    sign = 1 if iflag >= 0 else -1
    return _finufft(2, source, given, [], sign=sign, modeord=_opts(opts), eps=eps)


@options()
def nufft3(source, *points, iflag=-1, eps=1e-6, opts=None):
    """jax-finufft's ``nufft3`` in pure JAX: sources ``x[, y[, z]]`` then as many targets
    ``s[, t[, u]]``; ``g[l] = sum_j c[j] exp(i sign(iflag) s_l·x_j)``, ``(..., K)``, to
    accuracy `eps`."""
    del opts
    given = [p for p in points if p is not None]
    d = len(given) // 2
    sign = 1 if iflag >= 0 else -1
    return _finufft(3, source, given[:d], given[d:], sign=sign, modeord=0, eps=eps)
