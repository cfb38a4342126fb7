"""jax-finufft's calling convention on DUCC: ``nufft1``, ``nufft2``, ``nufft3``.

Code written for jax-finufft 1.3 runs after changing its import::

    from jaxbind.contrib.jaxducc0 import nufft1, nufft2, nufft3   # was: from jax_finufft import ...

- ``nufft1(output_shape, c, x, y=None, z=None, *, iflag=1, eps=1e-6, opts=None)``:
  points to grid, ``f[k] = sum_j c[j] exp(i iflag k·x_j)``;
- ``nufft2(f, x, y=None, z=None, *, iflag=-1, eps=1e-6, opts=None)``: grid to points;
- ``nufft3(c, x, [y, [z]], s, [t, [u]], *, iflag=-1, eps=1e-6, opts=None)``: points
  ``(x, y, z)`` to points ``(s, t, u)``.

Shapes follow jax-finufft: coordinates ``(..., M)``, broadcast together; values
``(..., M)`` (types 1 and 3) or ``(..., *grid)`` (type 2) with the same leading
dimensions, which broadcast against the points' ones; values with one leading
dimension more than the points share them (several transforms, one DUCC call).
Every leading dimension in which the points have size 1 is shared the same way.
Single precision is complex64 with float32 points, double precision complex128
with float64 points.

``opts`` is any object with jax-finufft's option names: ``modeord`` (0: the
grid runs from the most negative mode, 1: FFT order), ``nthreads`` (0: all) and
``upsampfac`` (DUCC's oversampling factor, pinned; 0: FINUFFT's choice from the type,
the grid and eps) are honoured; the options that tune FINUFFT's speed or messages are
accepted and have no effect; ``gpu_spreadinterponly=True`` is refused. Since the
oversampling factor, and with it DUCC's kernel, never depends on the points, a point's
value does not depend on the other points of the call (type 3: only through their
extent). An ``eps`` finer than DUCC can reach is clamped to the finest it can; in
single precision, one finer than single precision's kernels reach is computed in
double precision and rounded back. Non-finite coordinates give NaN where they enter
the sum (every output of a type-1 transform, the outputs at those points of a type 2).
Everything is differentiable in the values and in the points (see `.nufft_points`), to
any order, and batches under ``vmap``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._accuracy import finest_epsilon, has_kernels
from ._common import _REAL, check_int, check_positive, check_real
from .nufft_points import nufft_points

__all__ = ["Opts", "nufft1", "nufft2", "nufft3"]


# jax-finufft's options (its ``Opts`` fields) at their defaults there: the drop-in accepts
# each at this value. `_HONOURED` ones change the numbers and are followed; the others only
# tune FINUFFT's or cuFINUFFT's speed or messages (the results agree to eps whatever they
# are), so every value is accepted and has no effect under DUCC (`_NO_EFFECT`), silently:
# clients run with warnings as errors. `_REFUSED` ones would change the numbers in a way
# DUCC cannot follow: refused at any value but the default.
FINUFFT_DEFAULTS: dict[str, Any] = dict(
    modeord=False,
    nthreads=0,
    upsampfac=0.0,
    debug=0,
    spread_debug=0,
    showwarn=False,
    fftw=64,  # FFTW_ESTIMATE
    spread_sort=2,
    spread_kerevalmeth=True,
    spread_kerpad=True,
    spread_thread=0,
    maxbatchsize=0,
    spread_nthr_atomic=-1,
    spread_max_sp_size=0,
    gpu_upsampfac=2.0,
    gpu_method=0,
    gpu_sort=True,
    gpu_binsizex=0,
    gpu_binsizey=0,
    gpu_binsizez=0,
    gpu_obinsizex=0,
    gpu_obinsizey=0,
    gpu_obinsizez=0,
    gpu_maxsubprobsize=1024,
    gpu_kerevalmeth=True,
    gpu_spreadinterponly=False,
    gpu_maxbatchsize=0,
    gpu_debug=0,
)
_HONOURED = ("modeord", "nthreads", "upsampfac")
_REFUSED = {
    # cuFINUFFT then only spreads or interpolates (no FFT, no deconvolution): another map
    "gpu_spreadinterponly": "it makes cuFINUFFT spread or interpolate only, which is not "
    "a NUFFT and which DUCC does not offer; remove it",
}
# FINUFFT's messages (debug, spread_debug, showwarn), its spreader's and FFTW's tuning
# (fftw, spread_*, maxbatchsize: spread_kerevalmeth picks how the same kernel is evaluated),
# and cuFINUFFT's options (gpu_*: jax-finufft reads them only on GPUs, where the drop-in runs
# DUCC on the host; gpu_upsampfac is the GPU's oversampling factor, as jax-finufft's CPU
# path ignores it).
_NO_EFFECT = tuple(k for k in FINUFFT_DEFAULTS if k not in _HONOURED and k not in _REFUSED)


class Opts:
    """Options with jax-finufft's names (its ``Opts`` fields, at its defaults).

    ``modeord``, ``nthreads`` and ``upsampfac`` are honoured. The options that only tune
    FINUFFT's or cuFINUFFT's speed or messages (``fftw``, ``spread_*``, ``maxbatchsize``,
    ``debug``, ``showwarn``, the ``gpu_*`` ones) are accepted at any value and have no
    effect under DUCC, without a warning. ``gpu_spreadinterponly=True``, which would
    change the map, is refused when a transform is called, naming the option. An unknown
    name is a TypeError here.
    """

    def __init__(self, **options: Any):
        unknown = sorted(set(options) - set(FINUFFT_DEFAULTS))
        if unknown:
            raise TypeError(
                f"jaxducc0.Opts: unknown option(s) {unknown}; jax-finufft's options are "
                f"{sorted(FINUFFT_DEFAULTS)}"
            )
        for k, v in {**FINUFFT_DEFAULTS, **options}.items():
            setattr(self, k, v)

    def __repr__(self):
        changed = {k: v for k, v in vars(self).items() if v != FINUFFT_DEFAULTS.get(k)}
        return f"Opts({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


def _same(value, default) -> bool:
    """Whether an option's value is jax-finufft's default (an enum, a bool or a number)."""
    try:
        return bool(value == default) or float(value) == float(default)
    except (TypeError, ValueError):
        return False


def _settings(fn: str, opts) -> tuple[int, int, float]:
    """``(modeord, nthreads, upsampfac)`` of `opts` (None: FINUFFT's defaults); the
    options that would change the numbers otherwise must be at their defaults, those
    that tune speed or messages are ignored (`_NO_EFFECT`)."""
    if opts is not None and any(hasattr(opts, k) for k in ("forward", "backward", "type1")):
        raise ValueError(
            f"jaxducc0.{fn}: opts is a jax-finufft NestedOpts (options per type and direction); "
            "the drop-in applies one set of options to a transform and its derivatives: "
            "pass one Opts"
        )
    for name, why in _REFUSED.items():
        value = getattr(opts, name, FINUFFT_DEFAULTS[name])
        if not _same(value, FINUFFT_DEFAULTS[name]):
            raise ValueError(
                f"jaxducc0.{fn}: opts.{name}={value!r} is not supported: {why} "
                f"(or leave it at jax-finufft's default {FINUFFT_DEFAULTS[name]!r})"
            )
    modeord = int(getattr(opts, "modeord", 0) or 0)
    if modeord not in (0, 1):
        raise ValueError(f"jaxducc0.{fn}: opts.modeord must be 0 or 1, got {modeord}")
    nthreads = check_int(
        fn, "opts.nthreads (0: all hardware threads)", getattr(opts, "nthreads", 0) or 0
    )
    upsampfac = check_real(fn, "opts.upsampfac", getattr(opts, "upsampfac", 0.0) or 0.0)
    if upsampfac != 0 and not (math.isfinite(upsampfac) and upsampfac > 1):
        raise ValueError(
            f"jaxducc0.{fn}: opts.upsampfac must be > 1 (2.0 or 1.25 as in FINUFFT), or 0 "
            f"for FINUFFT's choice; got {upsampfac}"
        )
    return modeord, nthreads, upsampfac


def _check_upsampfac(fn: str, kind: int, ndim: int, eps: float, upsampfac: float) -> None:
    """A given oversampling factor must be one DUCC has kernels for, and reach `eps` where
    FINUFFT's standard 2.0 would."""
    if upsampfac == 0:
        return
    transform = "nufft3" if kind == 3 else "nufft"
    if not has_kernels(transform, ndim, upsampfac):
        near = sorted(
            (s for s in (i / 100 for i in range(101, 301)) if abs(s - upsampfac) < 0.1),
            key=lambda s: abs(s - upsampfac),
        )
        near = sorted(s for s in near[:4] if has_kernels(transform, ndim, s))
        raise ValueError(
            f"jaxducc0.{fn}: opts.upsampfac={upsampfac} has no DUCC kernel (DUCC has "
            f"{near} near it); use 2.0 or 1.25 as in FINUFFT, or 0 for FINUFFT's choice"
        )
    reach = finest_epsilon(transform, ndim, False, (upsampfac, upsampfac))
    if eps < reach and reach > finest_epsilon(transform, ndim, False, (2.0, 2.0)) * 1.001:
        raise ValueError(
            f"jaxducc0.{fn}: eps={eps:g} is finer than DUCC's kernels reach with "
            f"opts.upsampfac={upsampfac} ({reach:.2g}); use upsampfac=2.0 (or 0 for "
            "FINUFFT's choice), or a larger eps"
        )


def _coords(fn: str, coords, what: str):
    coords = [jnp.asarray(c) for c in coords]
    for c in coords:
        if c.ndim < 1:
            raise ValueError(f"jaxducc0.{fn}: {what} must have shape (..., npoints), got a scalar")
    try:
        return jnp.broadcast_arrays(*coords)
    except ValueError as exc:
        raise ValueError(
            f"jaxducc0.{fn}: the {what} do not broadcast together: "
            f"{[tuple(c.shape) for c in coords]}"
        ) from exc


@partial(
    jax.jit,
    static_argnames=("fn", "kind", "sign", "eps", "modeord", "nthreads", "upsampfac", "grid"),
)
def _run(fn, kind, values, points, targets, *, sign, eps, modeord, nthreads, upsampfac, grid):
    """Broadcast as jax-finufft does, group shared points, call the core op, unflatten."""
    values = jnp.asarray(values)
    real = _REAL.get(np.dtype(values.dtype))
    if real is None:
        raise TypeError(
            f"jaxducc0.{fn}: the values must be complex64 or complex128, got {values.dtype}"
        )
    d = len(points)
    points = _coords(fn, points, "point coordinates")
    pshape, m = points[0].shape[:-1], points[0].shape[-1]
    if kind == 3:
        targets = _coords(fn, targets, "target coordinates")
        tshape, k = targets[0].shape[:-1], targets[0].shape[-1]
        try:
            pshape = tuple(np.broadcast_shapes(pshape, tshape))
        except ValueError as exc:
            raise ValueError(
                f"jaxducc0.{fn}: the leading dimensions of the points {pshape} "
                f"and of the targets {tshape} do not broadcast"
            ) from exc
        points = [jnp.broadcast_to(p, pshape + (m,)) for p in points]
        targets = [jnp.broadcast_to(q, pshape + (k,)) for q in targets]
    for c in (*points, *targets):
        if np.dtype(c.dtype) != real:
            raise TypeError(
                f"jaxducc0.{fn}: coordinates must be {real} for {values.dtype} "
                f"values, got {c.dtype}"
            )

    n_core = d if kind == 2 else 1
    nb = values.ndim - n_core
    if nb == len(pshape) + 1:  # one more leading dimension: transforms sharing the points
        pshape = pshape + (1,)
        points = [p[..., None, :] for p in points]
        targets = [q[..., None, :] for q in targets]
    elif nb != len(pshape):
        want = "(..., *grid)" if kind == 2 else "(..., npoints)"
        raise ValueError(
            f"jaxducc0.{fn}: values of shape {tuple(values.shape)} do not match "
            f"{d}-D points with leading dimensions {pshape}: values must be "
            f"{want} with as many leading dimensions as the points, or one more"
        )
    core = tuple(values.shape[nb:])
    if kind != 2 and core != (m,):
        raise ValueError(
            f"jaxducc0.{fn}: values of shape {tuple(values.shape)} for {m} "
            "points: the last dimension must be the number of points"
        )
    try:
        bshape = tuple(np.broadcast_shapes(tuple(values.shape[:nb]), pshape))
    except ValueError as exc:
        raise ValueError(
            f"jaxducc0.{fn}: the leading dimensions of the values "
            f"{tuple(values.shape[:nb])} and of the points {pshape} do not "
            "broadcast"
        ) from exc
    values = jnp.broadcast_to(values, bshape + core)

    own = [i for i in range(nb) if pshape[i] != 1]  # the points differ along these
    shared = [i for i in range(nb) if pshape[i] == 1]  # ... and are shared along these
    n_own = math.prod(bshape[i] for i in own)
    n_shared = math.prod(bshape[i] for i in shared)
    tail = list(range(nb, values.ndim))
    v = jnp.transpose(values, own + shared + tail).reshape((n_own, n_shared) + core)

    def rows(cs, n):  # coordinates (..., n) -> (n_own, d, n)
        flat = [
            jnp.transpose(
                jnp.broadcast_to(c, tuple(bshape[i] if i in own else 1 for i in range(nb)) + (n,)),
                own + shared + [nb],
            ).reshape(n_own, n)
            for c in cs
        ]
        return jnp.stack(flat, axis=1)

    xs = rows(points, m)
    args = (v, xs) + ((rows(targets, k),) if kind == 3 else ())
    settings = dict(
        sign=sign, eps=eps, modeord=modeord, nthreads=nthreads, upsampfac=upsampfac, grid=grid
    )
    call = partial(nufft_points, nufft_type=kind, **settings)
    if n_own == 1:
        out = call(*(a[0] for a in args))[0][None]
    else:
        out = jax.vmap(lambda *a: call(*a)[0])(*args)
    out_core = tuple(out.shape[2:])
    out = out.reshape(tuple(bshape[i] for i in own) + tuple(bshape[i] for i in shared) + out_core)
    inverse = np.argsort(own + shared).tolist() + list(range(nb, nb + len(out_core)))
    return jnp.transpose(out, inverse)


def _sign(iflag) -> int:
    return 1 if int(iflag) >= 0 else -1


def _split(fn, points, n):
    points = [p for p in points if p is not None]
    if not n[0] <= len(points) <= n[1]:
        raise ValueError(f"jaxducc0.{fn}: takes {n[0]}-{n[1]} coordinate arrays, got {len(points)}")
    return points


def _transform(kind, source, points, targets=(), *, iflag, eps, opts, grid=None):
    """The rest of ``nufft<kind>`` once its coordinate arrays are checked: check the
    options and the accuracy, then run the jitted transform."""
    fn = f"nufft{kind}"
    modeord, nthreads, upsampfac = _settings(fn, opts)
    eps = check_positive(fn, "eps", eps)
    _check_upsampfac(fn, kind, len(points), eps, upsampfac)
    return _run(
        fn,
        kind,
        source,
        tuple(points),
        tuple(targets),
        sign=_sign(iflag),
        eps=eps,
        modeord=modeord,
        nthreads=nthreads,
        upsampfac=upsampfac,
        grid=grid,
    )


def nufft1(output_shape, source, *points, iflag: int = 1, eps: float = 1e-6, opts=None):
    """Type 1, non-uniform points to a grid: ``f[k] = sum_j c[j] exp(i sign(iflag) k·x_j)``.

    Args:
      output_shape: the grid's shape, an int in 1-D.
      source: complex values, ``(..., M)``.
      *points: ``x``, ``y``, ``z``: 1-3 real arrays ``(..., M)`` (period 2 pi).
      iflag: the sign of the exponent.
      eps: the requested accuracy, > 0 (see the module's docstring for the finest).
      opts: an object with ``modeord`` and ``nthreads`` (jax-finufft's ``Opts``).

    Returns:
      ``(..., *output_shape)``.
    """
    points = _split("nufft1", points, (1, 3))
    grid = tuple(
        check_int("nufft1", "each output_shape length", n) for n in np.atleast_1d(output_shape)
    )
    if len(grid) != len(points):
        raise ValueError(
            f"jaxducc0.nufft1: output_shape {tuple(grid)} has {len(grid)} "
            f"dimensions, but {len(points)} coordinate arrays were given"
        )
    return _transform(1, source, points, iflag=iflag, eps=eps, opts=opts, grid=grid)


def nufft2(source, *points, iflag: int = -1, eps: float = 1e-6, opts=None):
    """Type 2, a grid to non-uniform points: ``c[j] = sum_k f[k] exp(i sign(iflag) k·x_j)``.

    Args:
      source: complex grid values, ``(..., *grid)``.
      *points: ``x``, ``y``, ``z``: 1-3 real arrays ``(..., M)``.
      iflag: the sign of the exponent.
      eps: the requested accuracy, as for `nufft1`.
      opts: the options, as for `nufft1`.

    Returns:
      ``(..., M)``.
    """
    points = _split("nufft2", points, (1, 3))
    return _transform(2, source, points, iflag=iflag, eps=eps, opts=opts)


def nufft3(source, *points, iflag: int = -1, eps: float = 1e-6, opts=None):
    """Type 3, points to points: ``g[l] = sum_j c[j] exp(i sign(iflag) s_l·x_j)``.

    Args:
      source: complex values, ``(..., M)``.
      *points: the source coordinates, then as many target coordinates:
        ``x, s`` (1-D), ``x, y, s, t`` (2-D) or ``x, y, z, s, t, u`` (3-D);
        sources ``(..., M)``, targets ``(..., K)``.
      iflag: the sign of the exponent.
      eps: the requested accuracy, as for `nufft1`.
      opts: the options, as for `nufft1`.

    Returns:
      ``(..., K)``.
    """
    points = _split("nufft3", points, (2, 6))
    if len(points) % 2:
        raise ValueError(
            "jaxducc0.nufft3: takes as many target as source coordinate arrays, "
            f"got {len(points)} arrays in all"
        )
    d = len(points) // 2
    return _transform(3, source, points[:d], points[d:], iflag=iflag, eps=eps, opts=opts)
