"""Non-uniform FFTs of all three types, differentiable in the values and in the points.

This is the textbook nonlinear op that is linear in some of its arguments, built
on jaxbind's own machinery (``get_nonlinear_call`` with JAX functions as the JVP
and VJP). Writing ``e_jk = exp(i s k·x_j)`` (``s`` the sign, ``±1``):

- type 1 (points to grid): ``f[t, k] = sum_j c[t, j] e_jk``;
- type 2 (grid to points): ``c[t, j] = sum_k f[t, k] e_jk``;
- type 3 (points ``x`` to points ``q``): ``g[t, l] = sum_j c[t, j] exp(i s q_l·x_j)``.

Each is linear in the values; the derivative with respect to a coordinate
brings down ``i s k_a`` (the mode, or the other type-3 point), so every
derivative is again a NUFFT of k-weighted data, computed by DUCC:

==========  ==============================================================
JVP, type 2  ``T2(df) + sum_a dx_a * T2(i s k_a f)``
JVP, type 1  ``T1(dc) + sum_a i s k_a * T1(c dx_a)``
VJP, type 2  ``c: T1(ct)``, ``x_a: Re sum_t ct * T2(i s k_a f)``
VJP, type 1  ``c: T2(ct)``, ``x_a: Re sum_t c * T2(i s k_a ct)``
==========  ==============================================================

(type 3 alike, with both point sets differentiable). The derivatives call the
same op, so they are differentiable in turn: Hessians with respect to the
points work to any order. Stacked right-hand sides share one DUCC call (its
``ntrans``), and JAX's transposes do not conjugate, so no conjugates appear.

Shapes (``T`` transforms share the points; ``d`` in 1..3 dimensions):

- values: type 1 and 3 ``(T, M)``, type 2 ``(T, *grid)``; complex64 or complex128;
- ``xs``: ``(d, M)`` real coordinates of the same precision (periodic, 2 pi);
- ``qs`` (type 3 only): ``(d, K)`` target coordinates.

``vmap`` over any argument runs DUCC once per batch element (jaxbind's loop).
Types 1 and 2 run through a DUCC plan of the points, the op's state keyed on ``xs``
(see docs/state.md): made at the first call with those points and used again while
they stay the same (traced, loop-invariant points in a solver plan once; a plan serves
both types, so a type-2 op and its adjoint share it).
`.finufft` builds jax-finufft's calling convention on top of this op.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ... import Reference, get_nonlinear_call, jax_function, load_kwargs, load_state, state
from ._accuracy import default_upsampfac, finest_epsilon, working_precision
from ._common import (
    _MODE,
    _REAL,
    all_finite,
    check_int,
    check_nthreads,
    check_positive,
    ducc0,
)
from .reference import by_epsilon
from .reference import nufft as reference_nufft

_NAN = complex(np.nan, np.nan)  # what a non-finite point gives where it enters

__all__ = ["nufft_points", "best_epsilon", "mode_numbers"]

NAME = "jaxducc0.nufft_points"
OP = NAME.split(".", 1)[1]


def mode_numbers(n: int, modeord: int) -> np.ndarray:
    """The Fourier modes of a grid axis of length `n`, in FINUFFT's orders.

    ``modeord=0``: ``-(n//2) .. (n-1)//2`` (most negative first, DUCC's
    ``fft_order=False``); ``modeord=1``: FFT order, ``0 .. (n-1)//2`` then the
    negative ones.
    """
    k = np.arange(-(n // 2), (n + 1) // 2)
    return np.fft.ifftshift(k) if modeord else k


def best_epsilon(ndim: int, single: bool, nufft_type: int = 1) -> float:
    """The finest accuracy DUCC reaches for this NUFFT type in `ndim` dimensions."""
    return finest_epsilon("nufft3" if nufft_type == 3 else "nufft", ndim, single)


# --- the callable: DUCC on NumPy views ---------------------------------------------


def _finite_columns(coords):
    """None if every point (a column of the (d, M) coordinates) is finite, else the mask."""
    if coords is None or all_finite(coords):
        return None
    return np.isfinite(coords).all(axis=0)


class _Plan:
    """DUCC's plan of types 1 and 2 for one set of points (the op's state, see `_plan`),
    with what it was made for: the grid, and the coordinates' working precision."""

    __slots__ = ("ducc", "grid", "real")

    def __init__(self, ducc, grid: tuple[int, ...], real: np.dtype):
        self.ducc, self.grid, self.real = ducc, grid, real

    def fits(self, grid: tuple[int, ...], real: np.dtype) -> bool:
        return self.grid == grid and self.real == real


@state(key=("xs",))  # concurrency="lock": a DUCC plan must not run twice at once
def _plan(*, xs, grid=None, eps, nthreads, modeord, upsampfac=None, ducc_options=None):
    """The plan of a type-1 or type-2 call with points `xs` (d, M) on `grid` (one plan
    serves both types: a type-2 op and its VJP's type-1 calls share it); None where
    nothing is planned (type 3, no grid given, no points, an empty grid). Non-finite
    points are planned at 0, as `_transform` computes them, which marks their outputs."""
    if grid is None or xs.shape[-1] == 0 or 0 in grid:
        return None
    extra = _ducc_options(ducc_options, upsampfac)
    sigma = (extra["sigma_min"], extra["sigma_max"]) if "sigma_min" in extra else None
    single = xs.dtype == np.float32
    eps, in_double = working_precision("nufft", xs.shape[0], single, eps, sigma)
    ok = _finite_columns(xs)
    if ok is not None:
        xs = np.where(ok, xs, 0)
    real = np.dtype(np.float64 if in_double else xs.dtype)
    extra.pop("verbosity", None)  # a setting of each call
    ducc = ducc0.nufft.plan(
        nu2u=False,
        coord=np.ascontiguousarray(xs.T, dtype=real),
        grid_shape=tuple(grid),
        epsilon=eps,
        nthreads=nthreads,
        fft_order=bool(modeord),
        **extra,
    )
    return _Plan(ducc, tuple(grid), real)


def _ducc_options(ducc_options, upsampfac) -> dict:
    """DUCC's keyword arguments beyond the transform's own: get_nufft's options, or the
    oversampling factor `upsampfac` pinned (sigma_min = sigma_max: DUCC then picks its
    kernel from eps and sigma alone, whatever the points)."""
    extra = dict(ducc_options or {})
    if upsampfac:
        extra.update(sigma_min=float(upsampfac), sigma_max=float(upsampfac))
    return extra


def _transform(out, values, xs, qs, kw, plan=None):
    """One call: values (T, ...) and points sharing them, into out (T, ...), through
    `plan` (a `_Plan` of these points) where it fits the call.

    Non-finite coordinates give NaN wherever they enter the sum: type 1 (and type 3
    with a non-finite source) every output, type 2 (and type 3 with a non-finite
    target) the outputs at those points. DUCC itself is never given them.
    """
    kind, forward = kw["nufft_type"], kw["sign"] < 0
    if out.size == 0:
        return
    if values.size == 0 or xs.shape[-1] == 0 or (qs is not None and qs.shape[-1] == 0):
        out[...] = 0
        return
    src_ok, dst_ok = _finite_columns(xs), None
    if kind == 2:
        src_ok, dst_ok = None, src_ok
    elif kind == 3:
        dst_ok = _finite_columns(qs)
    if src_ok is not None:  # a non-finite source point reaches every output
        out[...] = _NAN
        return
    if dst_ok is not None:  # compute at a harmless place, then mark those outputs
        fixed = np.where(dst_ok, xs if kind == 2 else qs, 0)
        xs, qs = (fixed, qs) if kind == 2 else (xs, fixed)
    single = values.dtype == np.complex64
    # get_nufft's periodicity, sigma_min/max, verbosity; the drop-in's upsampfac
    extra = _ducc_options(kw.get("ducc_options"), kw.get("upsampfac"))
    sigma = (extra["sigma_min"], extra["sigma_max"]) if "sigma_min" in extra else None
    eps, in_double = working_precision(
        "nufft3" if kind == 3 else "nufft", xs.shape[0], single, kw["eps"], sigma
    )
    target = out
    if in_double:  # single precision cannot reach eps: compute in double, round back
        values, xs = values.astype(np.complex128), xs.astype(np.float64)
        qs = None if qs is None else qs.astype(np.float64)
        target = np.empty(out.shape, np.complex128)
    if kind != 3 and plan is not None:
        grid = tuple(values.shape[1:]) if kind == 2 else tuple(out.shape[1:])
        if plan.fits(grid, xs.dtype):
            verbosity = {k: v for k, v in extra.items() if k == "verbosity"}
            if kind == 1:
                plan.ducc.nu2u(forward=forward, points=values, out=target, **verbosity)
            else:
                plan.ducc.u2nu(forward=forward, grid=values, out=target, **verbosity)
            _finish(out, target, dst_ok)
            return
    common = dict(forward=forward, epsilon=eps, nthreads=kw["nthreads"], **extra)
    coord = xs.T  # (M, d), a strided view of the (d, M) buffer: no copy
    if kind == 1:
        ducc0.nufft.nu2u(
            points=values, coord=coord, out=target, fft_order=bool(kw["modeord"]), **common
        )
    elif kind == 2:
        ducc0.nufft.u2nu(
            grid=values, coord=coord, out=target, fft_order=bool(kw["modeord"]), **common
        )
    else:
        ducc0.nufft.experimental.nu2nu(
            points_in=values, coord_in=coord, coord_out=qs.T, points_out=target, **common
        )
    _finish(out, target, dst_ok)


def _finish(out, target, dst_ok):
    """The result in `out` (rounded back from double precision), NaN at the outputs of
    non-finite points."""
    if target is not out:
        out[...] = target
    if dst_ok is not None:
        out[:, ~dst_ok] = _NAN


def _call(out, args, kwargs_dump):
    kw = load_kwargs(kwargs_dump)
    values, xs, *rest = args
    _transform(out[0], values, xs, rest[0] if rest else None, kw, load_state(kwargs_dump))


# --- shapes ----------------------------------------------------------------------


def _abstract(values, xs, *rest, nufft_type, grid=None, **_):
    """Output shape of one call; every inconsistency is an error naming the op."""
    what = f"{NAME} (type {nufft_type})"
    real = _REAL.get(np.dtype(values.dtype))
    if real is None:
        raise TypeError(f"{what}: values must be complex64 or complex128, got {values.dtype}")
    if len(xs.shape) != 2 or not 1 <= xs.shape[0] <= 3:
        raise ValueError(
            f"{what}: points must be (ndim, npoints) with ndim 1-3, got {tuple(xs.shape)}"
        )
    if np.dtype(xs.dtype) != real:
        raise TypeError(f"{what}: points must be {real} for {values.dtype} values, got {xs.dtype}")
    d, m = xs.shape
    if nufft_type == 2:
        if len(values.shape) != 1 + d:
            raise ValueError(
                f"{what}: values must be (ntrans, *grid) with a {d}-D grid, got "
                f"{tuple(values.shape)}"
            )
        if grid is not None and tuple(grid) != tuple(values.shape[1:]):
            raise ValueError(
                f"{what}: grid {tuple(grid)} is not the values' grid {tuple(values.shape[1:])}; "
                "for type 2 pass the values' grid shape (what DUCC plans for) or None"
            )
        return (((values.shape[0], m), values.dtype),)
    if len(values.shape) != 2 or values.shape[1] != m:
        raise ValueError(
            f"{what}: values must be (ntrans, {m}) for {m} points, got {tuple(values.shape)}"
        )
    if nufft_type == 1:
        grid = tuple(grid)
        if len(grid) != d:
            raise ValueError(f"{what}: a grid of {len(grid)} dimensions for {d}-D points")
        return (((values.shape[0], *grid), values.dtype),)
    (qs,) = rest
    if len(qs.shape) != 2 or qs.shape[0] != d or np.dtype(qs.dtype) != real:
        raise ValueError(
            f"{what}: target points must be {real} ({d}, npoints), got {qs.dtype}{list(qs.shape)}"
        )
    return (((values.shape[0], qs.shape[1]), values.dtype),)


# --- derivatives: NUFFTs of k-weighted data (JAX functions, so differentiable again) --


def _apply(values, xs, qs, kw, kind=None, grid=None):
    """The op itself, as called from its derivatives (possibly another type)."""
    kind = kw["nufft_type"] if kind is None else kind
    kw = dict(kw, nufft_type=kind)
    if kind == 1:
        kw["grid"] = tuple(grid if grid is not None else kw["grid"])
    else:
        kw["grid"] = tuple(values.shape[1:]) if kind == 2 else None
    args = (values, xs) if kind != 3 else (values, xs, qs)
    return nufft_points(*args, **kw)[0]


def _stacked(parts, xs, qs, kw, kind=None, grid=None):
    """One call for several right-hand sides, each (T, ...): result (len(parts), T, ...)."""
    t = parts[0].shape[0]
    out = _apply(jnp.concatenate(parts, axis=0), xs, qs, kw, kind, grid)
    return out.reshape((len(parts), t) + out.shape[1:])


def _weighted(f, kw, a, d):
    """i s k_a f for a grid f (T, *grid): the modes of axis a broadcast along it."""
    n = f.shape[1 + a]
    k = mode_numbers(n, kw["modeord"]).reshape([n if b == a else 1 for b in range(d)])
    return f * jnp.asarray(1j * kw["sign"] * k, f.dtype)


def _isx(v, x, kw):
    """i s x v for values v (T, M) and a coordinate row x (M,)."""
    return v * (1j * kw["sign"] * x).astype(v.dtype)[None, :]


def _re_dot(a, b, real):
    """Re sum_t a[t] b[t]: the cotangent of a real coordinate row."""
    return jnp.real(jnp.sum(a * b, axis=0)).astype(real)


@jax_function
def _jvp(values, xs, *rest, **kw):
    kind, d = kw["nufft_type"], xs.shape[0]
    if kind == 3:
        qs, dvalues, dxs, dqs = rest
    else:
        qs, dqs = None, None
        dvalues, dxs = rest
    if kind == 2:
        r = _stacked([dvalues] + [_weighted(values, kw, a, d) for a in range(d)], xs, qs, kw)
        out = r[0]
        for a in range(d):
            out = out + dxs[a].astype(out.dtype)[None, :] * r[1 + a]
        return [out]
    parts = [dvalues] + [values * dxs[a].astype(values.dtype)[None, :] for a in range(d)]
    if kind == 3:
        parts += [_isx(values, xs[a], kw) for a in range(d)]
    r = _stacked(parts, xs, qs, kw)
    out = r[0]
    for a in range(d):
        if kind == 1:
            out = out + _weighted(r[1 + a], kw, a, d)
        else:
            out = out + _isx(r[1 + a], qs[a], kw) + dqs[a].astype(out.dtype)[None, :] * r[1 + d + a]
    return [out]


@jax_function
def _vjp(values, xs, *rest, **kw):
    kind, d, real = kw["nufft_type"], xs.shape[0], xs.dtype
    ct = rest[-1]
    if kind == 2:  # c = T2(f): f_bar = T1(ct), x_bar_a = Re sum_t ct T2(i s k_a f)
        grid = values.shape[1:]
        v_bar = _apply(ct, xs, None, kw, kind=1, grid=grid)
        r = _stacked([_weighted(values, kw, a, d) for a in range(d)], xs, None, kw)
        return [v_bar, jnp.stack([_re_dot(ct, r[a], real) for a in range(d)])]
    if kind == 1:  # f = T1(c): c_bar = T2(ct), x_bar_a = Re sum_t c T2(i s k_a ct)
        v_bar = _apply(ct, xs, None, kw, kind=2)
        r = _stacked([_weighted(ct, kw, a, d) for a in range(d)], xs, None, kw, kind=2)
        return [v_bar, jnp.stack([_re_dot(values, r[a], real) for a in range(d)])]
    # g = T3(c; x -> q): c_bar = T3(ct; q -> x), x_bar_a = Re sum_t c T3(i s q_a ct; q -> x),
    # q_bar_a = Re sum_t ct T3(i s x_a c; x -> q)
    qs = rest[0]
    v_bar = _apply(ct, qs, xs, kw)
    rx = _stacked([_isx(ct, qs[a], kw) for a in range(d)], qs, xs, kw)
    rq = _stacked([_isx(values, xs[a], kw) for a in range(d)], xs, qs, kw)
    return [
        v_bar,
        jnp.stack([_re_dot(values, rx[a], real) for a in range(d)]),
        jnp.stack([_re_dot(ct, rq[a], real) for a in range(d)]),
    ]


def _rule(values, xs, *qs, nufft_type, **_):
    """Points m split: type 1 (and 3) sums each device's grid (targets) over its points,
    type 2 computes each device's points from the whole grid; transforms t split too."""
    if nufft_type == 3:
        return "t m, d m, d k -> t k", ("m",)
    grid = " ".join(f"g{a}" for a in range(xs[0]))
    if nufft_type == 1:
        return f"t m, d m -> t {grid}", ("m",)
    return f"t {grid}, d m -> t m"


_op = get_nonlinear_call(
    _call,
    (_jvp, _vjp),
    _abstract,
    None,
    reference=Reference(reference_nufft.nufft_points, tolerance=by_epsilon),
    name=NAME,
    platform_mode=_MODE,
    linear_in=(0,),
    state=_plan,  # keyed on the points: planned once while they stay the same
    sharding=_rule,
)


def nufft_points(
    values,
    xs,
    *qs,
    nufft_type: int,
    sign: int,
    eps: float,
    modeord: int = 0,
    nthreads: int = 1,
    grid=None,
    upsampfac: float | None = None,
):
    """A NUFFT of type 1, 2 or 3, differentiable in the values and in the points.

    Args:
      values: type 1 and 3: ``(T, M)``; type 2: ``(T, *grid)``; complex.
      xs: ``(d, M)`` coordinates (real, the values' precision), period 2 pi.
      *qs: type 3 only: the ``(d, K)`` target coordinates.
      nufft_type: 1, 2 or 3.
      sign: the sign of the exponent, +1 or -1.
      eps: the requested accuracy (> 0). Finer than DUCC reaches is clamped to the finest
        it reaches; in single precision, finer than single precision's kernels reach is
        computed in double precision and rounded back (see `._accuracy`).
      modeord: 0: grids run from the most negative mode; 1: FFT order.
      nthreads: DUCC threads (0: all).
      grid: type 1 only: the output grid's shape (type 2 plans for the values' grid).
      upsampfac: DUCC's oversampling factor, fixed (one it has kernels for, e.g. 2.0 or
        1.25); None or 0: FINUFFT's choice from the type, the grid and eps
        (`._accuracy.default_upsampfac`). Never chosen from the points, so a point's value
        does not depend on the other points (type 3: only through their extent).

    Returns:
      ``[result]``: type 1 ``(T, *grid)``, type 2 ``(T, M)``, type 3 ``(T, K)``.

    ``nufft_points.op`` is the jaxbind op beneath, called with the same arguments
    (``grid`` a tuple: the values' grid for type 2, or None to compute it unplanned;
    None for type 3); ``jaxbind.testing.check`` takes it.

    Types 1 and 2 run through a DUCC plan of the points, the op's state (keyed on
    ``xs``: see docs/state.md): set up at the first call with these points, and used
    again while they stay the same, e.g. traced but loop-invariant points in a solver.
    Type 3 is computed unplanned.
    """
    if nufft_type not in (1, 2, 3):
        raise ValueError(f"{NAME}: nufft_type must be 1, 2 or 3, got {nufft_type!r}")
    if len(qs) != (nufft_type == 3):
        raise TypeError(
            f"{NAME}: type {nufft_type} takes "
            f"{'values, xs and qs' if nufft_type == 3 else 'values and xs'}"
        )
    if sign not in (1, -1):
        raise ValueError(f"{NAME}: sign must be +1 or -1, got {sign!r}")
    if modeord not in (0, 1):
        raise ValueError(f"{NAME}: modeord must be 0 or 1, got {modeord!r}")
    if nufft_type == 1:
        if grid is None:
            raise TypeError(f"{NAME}: type 1 needs the grid shape")
        grid = tuple(check_int(OP, "each grid length", n) for n in np.atleast_1d(grid))
    elif nufft_type == 2:  # the values' grid, which DUCC's plan is made for
        grid = tuple(int(n) for n in np.shape(values)[1:])
    else:
        grid = None
    eps = check_positive(OP, "eps", eps)
    if not upsampfac:  # FINUFFT's choice, made once here: the derivatives reuse it
        single = np.dtype(getattr(values, "dtype", np.complex128)) == np.complex64
        modes = math.prod(grid) if grid is not None else 0
        upsampfac = default_upsampfac(nufft_type, int(np.shape(xs)[0]), single, eps, modes)
    return _op(
        values,
        xs,
        *qs,
        nufft_type=int(nufft_type),
        sign=int(sign),
        eps=eps,
        modeord=int(modeord),
        nthreads=check_nthreads(OP, nthreads),
        grid=grid,
        upsampfac=check_positive(OP, "upsampfac", upsampfac),
    )


# the jaxbind op itself, e.g. for jaxbind.testing.check
nufft_points.op = _op  # type: ignore[attr-defined]  # a function attribute
