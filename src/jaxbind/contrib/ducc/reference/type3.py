"""NUFFT type 3 in pure JAX by rescaling (FINUFFT's algorithm): spread, type 2, deconvolve.

``g[t, l] = sum_j c[t, j] exp(i s q_l·x_j)`` for sources x (d, M) and targets q (d, K)
anywhere, to accuracy ``eps``, at ``(M + K) w^d + N log N`` instead of the direct sum's
``M K`` (``N`` the cells of a grid sized from the extents: ``n_a ≈ 4 X_a S_a / pi + w``
per axis, for sources within ``X_a`` of their centre ``C_a`` and targets within ``S_a``
of theirs, ``D_a``). Per axis, with ``x' = x - C``, ``q' = q - D``:

1. ``g(q) = exp(i s q·C) sum_j c'_j exp(i s q'·x'_j)`` with ``c'_j = c_j exp(i s D·x'_j)``;
2. the sources, scaled by ``1/gamma`` (``gamma = n / (4 S)``: they land within ``pi - w
   h / 2`` of 0, ``h = 2 pi / n``), are spread with the ES kernel (`.spreading`'s, of
   width ``w`` cells) onto a periodic grid of ``n`` cells: ``b_l = sum_j c'_j psi(l -
   x'_j / (gamma h))``;
3. the trapezoid rule on the spread function gives ``sum_j c'_j exp(i s q'·x'_j) =
   type2(b)(y) / prod_a psi_hat(y_a)`` at ``y = q' gamma h`` (``|y_a| <= pi / 2``: half
   the grid's band, where the kernel's aliasing is below eps), with `.spreading.type2`
   on the grid's modes (in FFT order: cell l is position l h) and ``psi_hat`` the
   kernel's Fourier transform (a Chebyshev fit in ``y``, fitted at trace time).

The grid's size must be static, and depends on the data (``X_a S_a``): concrete points
(NufftPlan's, or eager calls) get the exact size; traced ones a ladder of sizes (each
twice the last, the largest within `MAX_CELLS` and what the direct sum would cost),
one picked when the program runs (`lax.switch`); points that no size fits (or sizes
where the direct sum is cheaper) take the direct sum (`.nufft.direct_sum`), which is
exact. A non-finite source gives NaN everywhere, a non-finite target NaN at itself, as
the direct sum does.

The transform is one JAX primitive (`nufft3_p`, lowered to the code here, no custom
call): its transpose in the values is type 3 with sources and targets exchanged, its
derivatives in the sources ``sum_a i s q_a T3(c dx_a)`` and in the targets ``sum_a dq_a
T3(i s x_a c)``, type 3s again (to any order); a batch of values shares the points as
more transforms, batched points run one after another (`lax.map`: the size is picked
per element).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...._compat import Primitive, ad, batching, mlir, not_mapped, output_aval, zero_tangent
from . import spreading

__all__ = ["MAX_CELLS", "grid_size", "type3", "nufft3_p"]

MAX_CELLS = 1 << 22
"""The most cells of the type 2's oversampled grid (``prod 2 n_a``: 64 MiB complex in
double precision): larger problems take the direct sum."""

_LEVELS = 8  # the most grid sizes a traced call compiles
_SIGMA = 2.0  # the grid's oversampling of the band ``X S / pi`` (and the type 2's)
_SHARE = 0.25  # each of the two steps (spread, type 2) computes to this part of eps


def grid_size(x_half: float, q_half: float, w: int) -> int:
    """The cells of a grid axis for sources within `x_half` of their centre and targets
    within `q_half` of theirs, with a kernel `w` cells wide (FINUFFT's rule)."""
    x, s = _safe(float(x_half), float(q_half))
    need = 2 * _SIGMA / np.pi * x * s + w + 1
    return spreading._smooth(max(int(math.ceil(need)), 2 * w + 2))


def _safe(x, s):
    """Half-widths that leave no axis degenerate (one point, or all at one place)."""
    if x == 0:
        return (1.0, 1.0) if s == 0 else (max(x, 1 / s), s)
    return x, max(s, 1 / x)


def _chebval(s, coef):
    b1 = jnp.zeros_like(s)
    b2 = b1
    for k in range(len(coef) - 1, 0, -1):
        b1, b2 = coef[k] + 2 * s * b1 - b2, b1
    return coef[0] + s * b1 - b2


# --- the body -----------------------------------------------------------------------------


def _extent(p, finite):
    """Centre and half-width per axis of the finite points p (d, N): (d,), (d,)."""
    big = jnp.asarray(np.inf, p.dtype)
    lo = jnp.min(jnp.where(finite[None, :], p, big), axis=1)
    hi = jnp.max(jnp.where(finite[None, :], p, -big), axis=1)
    ok = lo <= hi  # some finite point
    centre = jnp.where(ok, (lo + hi) / 2, 0)
    return centre, jnp.where(ok, (hi - lo) / 2, 0)


def _safe_jnp(x, s):
    """`_safe` on arrays."""
    x_nz = jnp.where(x == 0, 1, x)
    s_nz = jnp.where(s == 0, 1, s)
    return jnp.where(x == 0, 1 / s_nz, x), jnp.where(x == 0, s_nz, jnp.maximum(s, 1 / x_nz))


def _fast(values, xs, qs, c, d_, xh, qh, nf, *, sign, eps, chunk, real):
    """The rescaled transform on grid `nf` (per axis), every point finite, the grid
    known to fit: (T, K)."""
    t = values.shape[0]
    single = real == jnp.float32
    w = spreading.kernel_width(eps * _SHARE, bool(single))
    kern = spreading._kernel(w)
    nfa = jnp.asarray(nf, real)
    gamma = nfa / (2 * _SIGMA * qh)  # (d,)
    h = 2 * np.pi / nfa
    xp = xs - c[:, None]  # (d, M)
    qp = qs - d_[:, None]  # (d, K)
    cplx = values.dtype
    pre = jnp.exp((1j * sign) * jnp.sum(d_[:, None] * xp, axis=0)).astype(cplx)
    scaled = xp / gamma[:, None]  # radians, within pi - w h / 2 of 0
    ch = spreading._to_channels(values * pre[None, :])
    rv = jnp.real(values).dtype  # the grid's precision: the values'
    b = spreading._spread(ch, scaled, tuple(nf), kern, 1.0, rv, chunk)  # (*nf, 2T)
    b = spreading._from_channels(b, t)  # (T, *nf), cell l at position l h: FFT order
    y = qp * (gamma * h)[:, None]  # (d, K), |y| <= pi / 2
    out = spreading._type2(b, y, sign=sign, modeord=1, scale=1.0, eps=eps * _SHARE, chunk=chunk)
    top, coef = kern.FIT_TOP, kern.fourier_fit.astype(np.dtype(real))
    decon = 1 / jnp.prod(_chebval(jnp.clip(y / top, -1, 1), coef), axis=0)
    post = jnp.exp((1j * sign) * jnp.sum(qs * c[:, None], axis=0)) * decon
    return out * post.astype(cplx)[None, :]


def _body(values, xs, qs, *, sign, eps, chunk, levels):
    t, m = values.shape
    k = qs.shape[1]
    if 0 in (t, m, k):
        return jnp.zeros((t, k), values.dtype)
    from .nufft import direct_sum  # (nufft imports this module)

    def direct(v, x, q):
        return direct_sum(v, x, q, nufft_type=3, sign=sign)

    if not levels:
        return direct(values, xs, qs)
    real = jnp.promote_types(jnp.real(values).dtype, xs.dtype)
    fx = jnp.all(jnp.isfinite(xs), axis=0)
    fq = jnp.all(jnp.isfinite(qs), axis=0)
    xs = jnp.where(fx[None, :], xs, 0).astype(real)
    qs = jnp.where(fq[None, :], qs, 0).astype(real)
    c, xh = _extent(xs, fx)
    d_, qh = _extent(qs, fq)
    xh, qh = _safe_jnp(xh, qh)
    w = spreading.kernel_width(eps * _SHARE, bool(real == jnp.float32))
    need = 2 * _SIGMA / np.pi * xh * qh + w + 1  # (d,)
    # the first level every axis fits; past the last: the direct sum
    index = sum(jnp.any(need > jnp.asarray(nf, real)).astype(jnp.int32) for nf in levels)
    opts = dict(sign=sign, eps=eps, chunk=chunk, real=real)
    branches = [
        (lambda v, x, q, nf=nf: _fast(v, x, q, c, d_, xh, qh, nf, **opts)) for nf in levels
    ] + [direct]
    out = lax.switch(index, branches, values, xs, qs)
    nan = jnp.asarray(np.nan, real) * (1 + 1j)
    out = jnp.where(fq[None, :] & jnp.all(fx), out, nan.astype(values.dtype))
    return out.astype(values.dtype)


def _abstract(values, xs, qs, **_):
    return output_aval((values.shape[0], qs.shape[1]), values.dtype, [values, xs, qs])


nufft3_p = Primitive("nufft3_reference")
"""``nufft3_p.bind(values, xs, qs, sign, eps, chunk, levels)``: `type3` (use that)."""

_STATIC = ("sign", "eps", "chunk", "levels")
nufft3_p.def_impl(jax.jit(_body, static_argnames=_STATIC))
nufft3_p.def_abstract_eval(_abstract)
mlir.register_lowering(nufft3_p, mlir.lower_fun(_body, multiple_results=False))


def _jvp(primals, tangents, **params):
    values, xs, qs = primals
    dv, dxs, dqs = tangents
    sign = params["sign"]
    d = xs.shape[0]
    real = jnp.real(values).dtype
    t = values.shape[0]
    if type(dqs) is ad.Zero:
        out = nufft3_p.bind(values, xs, qs, **params)
        tangent = None
    else:  # d/dq_a: type 3 of i s x_a c, computed with the primal
        weighted = [(1j * sign) * xs[a].astype(real)[None, :] * values for a in range(d)]
        both = nufft3_p.bind(jnp.concatenate([values, *weighted]), xs, qs, **params)
        out = both[:t]
        tangent = sum(
            dqs[a].astype(real)[None, :] * both[(a + 1) * t : (a + 2) * t] for a in range(d)
        )
    parts = [] if type(dv) is ad.Zero else [dv]
    if type(dxs) is not ad.Zero:  # d/dx_a: i s q_a times type 3 of c dx_a
        parts += [values * dxs[a].astype(real)[None, :] for a in range(d)]
    if parts:
        spread = nufft3_p.bind(jnp.concatenate(parts), xs, qs, **params)
        first = 0
        if type(dv) is not ad.Zero:
            tangent = spread[:t] if tangent is None else tangent + spread[:t]
            first = t
        if type(dxs) is not ad.Zero:
            for a in range(d):
                term = (1j * sign) * qs[a].astype(real)[None, :] * spread[first + a * t :][:t]
                tangent = term if tangent is None else tangent + term
    return out, zero_tangent(out) if tangent is None else tangent


def _transpose(ct, values, xs, qs, **params):
    if ad.is_undefined_primal(xs) or ad.is_undefined_primal(qs):
        raise ValueError(
            "the type-3 NUFFT reference is linear in its values, not in its points: it "
            "cannot be transposed in the points (differentiate it instead)"
        )
    if type(ct) is ad.Zero:
        return [ad.Zero(values.aval), None, None]
    return [nufft3_p.bind(ct, qs, xs, **params), None, None]  # sources and targets exchanged


def _batched(args, dims, **params):
    values, xs, qs = args
    bv, bx, bq = dims
    if bx is not_mapped and bq is not_mapped:  # shared points: more transforms
        v = jnp.moveaxis(values, bv, 0)
        b, t = v.shape[:2]
        out = nufft3_p.bind(v.reshape((b * t, v.shape[2])), xs, qs, **params)
        return out.reshape((b, t, out.shape[1])), 0
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not not_mapped)
    moved = [
        jnp.broadcast_to(a, (size, *a.shape)) if d is not_mapped else jnp.moveaxis(a, d, 0)
        for a, d in zip(args, dims)
    ]
    if bv is not_mapped:  # the values shared: not copied per element
        return lax.map(lambda p: nufft3_p.bind(values, *p, **params), moved[1:]), 0
    return lax.map(lambda p: nufft3_p.bind(*p, **params), moved), 0


ad.primitive_jvps[nufft3_p] = _jvp
ad.primitive_transposes[nufft3_p] = _transpose
batching.primitive_batchers[nufft3_p] = _batched


# --- the grid sizes -----------------------------------------------------------------------


def _concrete(a):
    if isinstance(a, jax.core.Tracer):
        return None
    return np.asarray(a, np.float64)


def _levels(values, xs, qs, eps, max_cells) -> tuple[tuple[int, ...], ...]:
    """The grid sizes the body may pick from (none: the direct sum)."""
    t, m = values.shape
    d, k = qs.shape
    real = np.dtype(jnp.promote_types(jnp.real(values).dtype, xs.dtype))
    w = spreading.kernel_width(eps * _SHARE, real == np.float32)
    budget = max_cells if max_cells is not None else min(MAX_CELLS, m * k * max(t, 1) // 4)
    x, q = _concrete(xs), _concrete(qs)
    if x is not None and q is not None:  # the exact size
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(q))) or m == 0 or k == 0:
            return ()
        xh = (x.max(axis=1) - x.min(axis=1)) / 2
        qh = (q.max(axis=1) - q.min(axis=1)) / 2
        nf = tuple(grid_size(a, b, w) for a, b in zip(xh, qh))
        return (nf,) if math.prod(2 * n for n in nf) <= budget else ()
    low = spreading._smooth(2 * w + 2)
    top = int((budget ** (1 / d)) // 2)
    if top < low:
        return ()
    # geometric from the smallest grid to the largest, each at most `ratio` times the last
    # (at least twice): a grid far larger than the points need costs rounding (about
    # 1e-16 times its cells, per axis), so the one picked is at most `ratio` times theirs
    ratio = max(2.0, (top / low) ** (1 / (_LEVELS - 1)))
    ladder = [low]
    while ladder[-1] * ratio <= top:
        ladder.append(spreading._smooth(math.ceil(ladder[-1] * ratio)))
    return tuple((n,) * d for n in ladder)


def type3(c, xs, qs, *, sign, eps=1e-6, chunk=spreading.CHUNK, max_cells=None):
    """``g[t, l] = sum_j c[t, j] exp(i sign q_l·x_j)`` to accuracy `eps`: c (T, M)
    complex, sources xs (d, M), targets qs (d, K) real; returns (T, K) in c's dtype.
    Differentiable in all three (to any order), batchable; its transpose in c is type 3
    from qs to xs. `max_cells` bounds the type 2's grid (default: `MAX_CELLS`, and
    where the direct sum would cost less, the direct sum)."""
    levels = _levels(c, xs, qs, float(eps), max_cells)
    params = dict(sign=1 if sign > 0 else -1, eps=float(eps), chunk=int(chunk), levels=levels)
    return nufft3_p.bind(c, xs, qs, **params)
