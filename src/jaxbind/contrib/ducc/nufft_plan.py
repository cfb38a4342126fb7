"""Planned NUFFTs: fixed, concrete points, preprocessed once by DUCC and reused.

::

    plan = jaxducc0.NufftPlan(2, (256, 256), x, y, iflag=-1, eps=1e-6)
    c = plan(f)                  # f (..., 256, 256) -> c (..., M), no point preprocessing

A solver that applies the same NUFFT hundreds of times (conjugate gradients, a
Newton-CG step) pays DUCC's point sorting and kernel setup once, in the
constructor, instead of in every call. The op is linear in the values:
``grad``, ``linear_transpose``, ``jvp`` and ``vmap`` work, and the transpose
(type 1 <-> type 2 with the same sign, type 3 from the targets back to the
points) uses the same plan. Leading dimensions of the values are transforms
sharing the points (one DUCC call); ``vmap`` calls DUCC once per element, each
time on the same plan. The points are not differentiable here: use
`nufft1`/`nufft2`/`nufft3` for that.

The plan lives in this process and travels to the callables as a keyword
argument that is not data: compiled programs that call it keep it alive, and
``jax.export`` refuses them, saying why.
"""

from __future__ import annotations

import itertools
import math
import threading

import jax.numpy as jnp
import numpy as np

from ... import get_linear_call, load_kwargs
from ._accuracy import working_precision
from ._common import _MODE, _REAL, check_int, check_positive, ducc0
from .finufft import _settings, _sign

__all__ = ["NufftPlan"]

NAME = "jaxducc0.nufft_plan"
_ids = itertools.count(1)


def _plan_named(number):  # pragma: no cover - plans are pickled for their digest only
    raise RuntimeError(f"{NAME}: plan {number} exists only in the process that made it")


def _run(out, args, kwargs_dump, transposed):
    plan = load_kwargs(kwargs_dump)["plan"]
    (values,) = args
    with plan._lock:  # a DUCC plan must not run twice at once
        plan._execute(values, out[0], transposed)


def _apply(out, args, kwargs_dump):
    _run(out, args, kwargs_dump, False)


def _apply_T(out, args, kwargs_dump):
    _run(out, args, kwargs_dump, True)


def _abstract(values, *, plan, transposed=False, **_):
    p = plan
    core_in, core_out = (p.out_core, p.in_core) if transposed else (p.in_core, p.out_core)
    if len(values.shape) != 1 + len(core_in) or tuple(values.shape[1:]) != core_in:
        raise ValueError(
            f"{NAME}: this type-{p.nufft_type} plan takes values of shape "
            f"(ntrans, *{core_in}), got {tuple(values.shape)}"
        )
    if np.dtype(values.dtype) != p.complex_dtype:
        raise TypeError(
            f"{NAME}: this plan was made for {p.complex_dtype} values, got {values.dtype}"
        )
    return (((values.shape[0], *core_out), values.dtype),)


def _abstract_T(values, **kw):
    return _abstract(values, transposed=True, **kw)


_op = get_linear_call(_apply, _apply_T, _abstract, _abstract_T, name=NAME, platform_mode=_MODE)


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
      opts: an object with ``modeord`` and ``nthreads``, as for `nufft1`.
      dtype: complex64 or complex128; by default the complex type of the points.

    Calling the plan on values ``(..., M)`` (types 1 and 3) or ``(..., *n_modes)``
    (type 2) gives ``(..., *n_modes)``, ``(..., M)`` or ``(..., K)``. Non-finite
    points are refused here, when the plan is made; no points (or an empty grid)
    give zeros.
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
        modeord, nthreads = _settings("NufftPlan", opts)
        self.nufft_type, self.ndim = nufft_type, d
        self.sign = _sign(1 if nufft_type == 1 else -1) if iflag is None else _sign(iflag)
        for c in coords:
            if not np.isfinite(c).all():
                raise ValueError(
                    f"{NAME}: the points must be finite; point "
                    f"{int(np.argmin(np.isfinite(c)))} is {c[~np.isfinite(c)][0]}"
                )
        eps, in_double = working_precision(
            "nufft3" if nufft_type == 3 else "nufft",
            d,
            real == np.float32,
            check_positive("NufftPlan", "eps", eps),
        )
        self._dtype = np.dtype(np.complex128) if in_double else self.complex_dtype
        real = np.dtype(np.float64) if in_double else real
        src = np.ascontiguousarray(np.stack(coords[:d], axis=1), dtype=real)  # (M, d)
        m = src.shape[0]
        if nufft_type == 3:
            dst = np.ascontiguousarray(np.stack(coords[d:], axis=1), dtype=real)
            self.in_core, self.out_core = (m,), (dst.shape[0],)
            empty = m == 0 or dst.shape[0] == 0
            self._plan = (
                None
                if empty
                else ducc0.nufft.experimental.plan3(
                    coord_in=src, coord_out=dst, epsilon=eps, nthreads=nthreads
                )
            )
        else:
            if n_modes is None:
                raise TypeError(f"{NAME}: types 1 and 2 need n_modes, the grid's shape")
            grid = tuple(
                check_int("NufftPlan", "each n_modes length", n) for n in np.atleast_1d(n_modes)
            )
            if len(grid) != d:
                raise ValueError(f"{NAME}: n_modes {grid} for {d}-D points")
            self.in_core, self.out_core = ((m,), grid) if nufft_type == 1 else (grid, (m,))
            empty = m == 0 or 0 in grid
            self._plan = (
                None
                if empty
                else ducc0.nufft.plan(
                    nu2u=nufft_type == 1,
                    coord=src,
                    grid_shape=grid,
                    epsilon=eps,
                    nthreads=nthreads,
                    fft_order=bool(modeord),
                )
            )
        self._lock = threading.Lock()
        self.id = next(_ids)

    def __reduce__(self):  # jaxbind digests keyword arguments that are not data by pickling
        return _plan_named, (self.id,)

    def _execute(self, values, out, transposed):
        """DUCC on NumPy views: values (T, ...) into out (T, ...)."""
        if values.dtype != self.complex_dtype:  # e.g. traced where jax_enable_x64 was off
            raise TypeError(
                f"{NAME}: this plan was made for {self.complex_dtype} values, got "
                f"{values.dtype} (was the program traced with jax_enable_x64 off?)"
            )
        if out.size == 0:
            return
        if self._plan is None:  # no points, or an empty grid: every sum is empty
            out[...] = 0
            return
        result = out
        if self._dtype != out.dtype:  # planned in double precision: convert, round back
            values, result = values.astype(self._dtype), np.empty(out.shape, self._dtype)
        self._run_plan(values, result, transposed)
        if result is not out:
            out[...] = result

    def _run_plan(self, values, out, transposed):
        forward = self.sign < 0
        p, kind = self._plan, self.nufft_type
        assert p is not None  # see _execute
        if kind == 3:
            if transposed:  # exec_adjoint conjugates the sign; JAX's transposes do not
                p.exec_adjoint(forward=not forward, points_in=values, points_out=out)
            else:
                p.exec(forward=forward, points_in=values, points_out=out)
        elif (kind == 1) != transposed:
            p.nu2u(forward=forward, points=values, out=out)
        else:
            p.u2nu(forward=forward, grid=values, out=out)

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
        (out,) = _op(flat, plan=self)
        return out.reshape(lead + self.out_core)

    def __repr__(self):
        return (
            f"NufftPlan(type {self.nufft_type}, {self.in_core} -> {self.out_core}, "
            f"sign {self.sign:+d}, {self.complex_dtype})"
        )
