"""Planned NUFFTs: fixed, concrete points, preprocessed once by DUCC and reused.

::

    plan = jaxducc0.NufftPlan(2, (256, 256), x, y, iflag=-1, eps=1e-6)
    c = plan(f)                  # f (..., 256, 256) -> c (..., M), no point preprocessing

A solver that applies the same NUFFT hundreds of times (conjugate gradients, a
Newton-CG step) pays DUCC's point sorting and kernel setup once instead of in
every call. The op is linear in the values: ``grad``, ``linear_transpose``,
``jvp`` and ``vmap`` work, and the transpose (type 1 <-> type 2 with the same
sign, type 3 from the targets back to the points) uses the same plan. Leading
dimensions of the values are transforms sharing the points (one DUCC call);
``vmap`` calls DUCC once per element, each time on the same plan. The points are
not differentiable here: use `nufft1`/`nufft2`/`nufft3` for that.

The DUCC plan is the op's state (``@jaxbind.state``, see docs/state.md): the points
travel in the program as an array keyword argument, and the plan is made from them
when XLA instantiates the program, once for the function and its transpose, and
freed with the program. So programs that call a plan can be exported: the loading
process plans again from the points the program carries. The state's lock keeps two
XLA threads from running one DUCC plan at once.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ... import Reference, get_linear_call, load_kwargs, load_state, state
from ._accuracy import default_upsampfac, working_precision
from ._common import _MODE, _REAL, check_int, check_positive, ducc0
from .finufft import _check_upsampfac, _settings, _sign
from .reference import by_epsilon
from .reference import nufft as reference_nufft

__all__ = ["NufftPlan"]

NAME = "jaxducc0.nufft_plan"


@state  # concurrency="lock": a DUCC plan must not run twice at once
def _ducc_plan(*, nufft_type, coord, target, grid, epsilon, nthreads, modeord, sigma):
    """DUCC's plan for the points `coord` (M, d) (and type 3's `target`), in the
    precision of their dtype; None where there is nothing to sum (no points, an empty
    grid). `sigma` is the oversampling factor, pinned (sigma_min = sigma_max)."""
    pinned = dict(sigma_min=sigma, sigma_max=sigma)
    if nufft_type == 3:
        if coord.shape[0] == 0 or target.shape[0] == 0:
            return None
        return ducc0.nufft.experimental.plan3(
            coord_in=coord, coord_out=target, epsilon=epsilon, nthreads=nthreads, **pinned
        )
    if coord.shape[0] == 0 or 0 in grid:
        return None
    return ducc0.nufft.plan(
        nu2u=nufft_type == 1,
        coord=coord,
        grid_shape=grid,
        epsilon=epsilon,
        nthreads=nthreads,
        fft_order=bool(modeord),
        **pinned,
    )


def _run(out, args, kwargs_dump, transposed):
    kw = load_kwargs(kwargs_dump)
    (values,) = args
    _execute(load_state(kwargs_dump), kw, values, out[0], transposed)


def _apply(out, args, kwargs_dump):
    _run(out, args, kwargs_dump, False)


def _apply_T(out, args, kwargs_dump):
    _run(out, args, kwargs_dump, True)


def _execute(plan, kw, values, out, transposed):
    """DUCC on NumPy views: values (T, ...) into out (T, ...)."""
    if values.dtype != kw["dtype"]:  # e.g. traced where jax_enable_x64 was off
        raise TypeError(
            f"{NAME}: this plan was made for {kw['dtype']} values, got "
            f"{values.dtype} (was the program traced with jax_enable_x64 off?)"
        )
    if out.size == 0:
        return
    if plan is None:  # no points, or an empty grid: every sum is empty
        out[...] = 0
        return
    result = out
    planned = np.dtype(np.complex128 if kw["coord"].dtype == np.float64 else np.complex64)
    if planned != out.dtype:  # planned in double precision: convert, round back
        values, result = values.astype(planned), np.empty(out.shape, planned)
    forward = kw["sign"] < 0
    kind = kw["nufft_type"]
    if kind == 3:
        if transposed:  # exec_adjoint conjugates the sign; JAX's transposes do not
            plan.exec_adjoint(forward=not forward, points_in=values, points_out=result)
        else:
            plan.exec(forward=forward, points_in=values, points_out=result)
    elif (kind == 1) != transposed:
        plan.nu2u(forward=forward, points=values, out=result)
    else:
        plan.u2nu(forward=forward, grid=values, out=result)
    if result is not out:
        out[...] = result


def _cores(kw) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of the values and of the results, without leading dimensions."""
    m = kw["coord"].shape[0]
    if kw["nufft_type"] == 3:
        return (m,), (kw["target"].shape[0],)
    grid = tuple(kw["grid"])
    return ((m,), grid) if kw["nufft_type"] == 1 else (grid, (m,))


def _abstract(values, *, transposed=False, **kw):
    core_in, core_out = _cores(kw)
    if transposed:
        core_in, core_out = core_out, core_in
    if len(values.shape) != 1 + len(core_in) or tuple(values.shape[1:]) != core_in:
        raise ValueError(
            f"{NAME}: this type-{kw['nufft_type']} plan takes values of shape "
            f"(ntrans, *{core_in}), got {tuple(values.shape)}"
        )
    if np.dtype(values.dtype) != kw["dtype"]:
        raise TypeError(f"{NAME}: this plan was made for {kw['dtype']} values, got {values.dtype}")
    return (((values.shape[0], *core_out), values.dtype),)


def _abstract_T(values, **kw):
    return _abstract(values, transposed=True, **kw)


_op = get_linear_call(
    _apply,
    _apply_T,
    _abstract,
    _abstract_T,
    reference=Reference(reference_nufft.nufft_plan, tolerance=by_epsilon),
    name=NAME,
    platform_mode=_MODE,
    state=_ducc_plan,
)


class NufftPlan:
    """A NUFFT of type 1, 2 or 3 with fixed points, planned once.

    Args:
      nufft_type: 1 (points to grid), 2 (grid to points) or 3 (points to points).
      n_modes: the grid's shape for types 1 and 2 (an int in 1-D); None for type 3.
      *points: concrete coordinates ``x, [y, [z]]``, each ``(M,)``; for type 3
        followed by as many target coordinates ``s, [t, [u]]``, each ``(K,)``.
      iflag: the sign of the exponent (default: +1 for type 1, -1 otherwise).
      eps: the requested accuracy, > 0: clamped to the finest DUCC reaches; in single
        precision, finer than single precision reaches plans in double precision (the
        values are converted at each call and the results rounded back).
      opts: jax-finufft's options (``modeord``, ``nthreads``, ``upsampfac``), as for
        `nufft1`.
      dtype: complex64 or complex128; by default the complex type of the points.

    Calling the plan on values ``(..., M)`` (types 1 and 3) or ``(..., *n_modes)``
    (type 2) gives ``(..., *n_modes)``, ``(..., M)`` or ``(..., K)``. Non-finite
    points are refused here; no points (or an empty grid) give zeros. DUCC plans
    when a program that calls it is compiled or loaded (an eager call compiles one),
    once per program, for the function and its transpose together.
    """

    in_core: tuple[int, ...]  # the shape of the values, without batch axes
    out_core: tuple[int, ...]  # the shape of the results, without batch axes

    def __init__(
        self,
        nufft_type: int,
        n_modes,
        *points,
        iflag: int | None = None,
        eps: float = 1e-6,
        opts=None,
        dtype=None,
    ):
        if nufft_type not in (1, 2, 3):
            raise ValueError(f"{NAME}: nufft_type must be 1, 2 or 3, got {nufft_type!r}")
        try:
            coords = [np.asarray(p) for p in points if p is not None]
        except Exception as exc:  # a tracer: the plan needs the points' values
            raise TypeError(
                f"{NAME}: the points must be concrete arrays (a plan is made "
                "once, outside jit); use nufft1/nufft2/nufft3 for traced or "
                "differentiated points"
            ) from exc
        d = len(coords) // 2 if nufft_type == 3 else len(coords)
        if not 1 <= d <= 3 or (nufft_type == 3 and len(coords) != 2 * d):
            raise ValueError(
                f"{NAME}: type {nufft_type} takes "
                f"{'1-3 source and as many target' if nufft_type == 3 else '1-3'}"
                f" coordinate arrays, got {len(coords)}"
            )
        if any(c.ndim != 1 for c in coords):
            raise ValueError(
                f"{NAME}: coordinates must be 1-D arrays, got shapes {[c.shape for c in coords]}"
            )
        for group in (coords[:d], coords[d:]):
            if len({c.shape for c in group}) > 1:
                raise ValueError(
                    f"{NAME}: the coordinate arrays of one point set must have "
                    f"one length, got shapes {[c.shape for c in group]}"
                )
        if dtype is not None and np.dtype(dtype) not in _REAL:
            raise TypeError(f"{NAME}: dtype must be complex64 or complex128, got {dtype}")
        real = np.dtype(_REAL[np.dtype(dtype)] if dtype is not None else coords[0].dtype)
        if real not in (np.float32, np.float64):
            raise TypeError(
                f"{NAME}: coordinates must be float32 or float64 (or give dtype), got {real}"
            )
        self.complex_dtype = np.dtype(np.complex64 if real == np.float32 else np.complex128)
        modeord, nthreads, upsampfac = _settings("NufftPlan", opts)
        self.nufft_type, self.ndim = int(nufft_type), d
        self.sign = _sign(1 if nufft_type == 1 else -1) if iflag is None else _sign(iflag)
        for c in coords:
            if not np.isfinite(c).all():
                raise ValueError(
                    f"{NAME}: the points must be finite; point "
                    f"{int(np.argmin(np.isfinite(c)))} is {c[~np.isfinite(c)][0]}"
                )
        grid = None
        if nufft_type != 3:
            if n_modes is None:
                raise TypeError(f"{NAME}: types 1 and 2 need n_modes, the grid's shape")
            grid = tuple(
                check_int("NufftPlan", "each n_modes length", n) for n in np.atleast_1d(n_modes)
            )
            if len(grid) != d:
                raise ValueError(f"{NAME}: n_modes {grid} for {d}-D points")
        eps = check_positive("NufftPlan", "eps", eps)
        _check_upsampfac("NufftPlan", self.nufft_type, d, eps, upsampfac)
        single = real == np.float32
        if not upsampfac:  # FINUFFT's choice, as in nufft1/nufft2/nufft3
            modes = math.prod(grid) if grid is not None else 0
            upsampfac = default_upsampfac(self.nufft_type, d, single, eps, modes)
        transform = "nufft3" if nufft_type == 3 else "nufft"
        sigma = (upsampfac, upsampfac)
        eps, in_double = working_precision(transform, d, single, eps, sigma)
        real = np.dtype(np.float64) if in_double else real
        src = np.ascontiguousarray(np.stack(coords[:d], axis=1), dtype=real)  # (M, d)
        target = None
        if nufft_type == 3:
            target = np.ascontiguousarray(np.stack(coords[d:], axis=1), dtype=real)
        # the op's keyword arguments: data, which programs (and exports) carry
        self._kw = dict(
            nufft_type=self.nufft_type,
            sign=self.sign,
            coord=src,
            target=target,
            grid=grid,
            epsilon=eps,
            nthreads=nthreads,
            modeord=modeord,
            sigma=float(upsampfac),
            dtype=self.complex_dtype.name,
        )
        self.in_core, self.out_core = _cores(self._kw)
        # jitted once: an eager call then encodes the points no more (a digest of them)
        kw = self._kw
        self._call = jax.jit(lambda flat: _op(flat, **kw)[0])

    def __call__(self, values):
        values = jnp.asarray(values)
        n = len(self.in_core)
        lead = values.shape[: values.ndim - n]
        if tuple(values.shape[values.ndim - n :]) != self.in_core:
            raise ValueError(
                f"{NAME}: this type-{self.nufft_type} plan takes values of shape "
                f"(..., *{self.in_core}), got {tuple(values.shape)}"
            )
        flat = values.reshape((math.prod(lead),) + self.in_core)
        return self._call(flat).reshape(lead + self.out_core)

    def __repr__(self):
        return (
            f"NufftPlan(type {self.nufft_type}, {self.in_core} -> {self.out_core}, "
            f"sign {self.sign:+d}, {self.complex_dtype})"
        )
