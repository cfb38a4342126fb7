"""The radio-interferometric (w-)gridder: sky image to visibilities."""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from ... import Reference, get_linear_call, load_kwargs
from ._accuracy import working_precision
from ._common import (
    _MODE,
    _complex_of,
    _real_of,
    all_finite,
    check_int,
    check_kwargs,
    check_nthreads,
    check_positive,
    check_real,
    check_sigma,
    ducc0,
    sigma_range,
)
from .reference import by_epsilon
from .reference import wgridder as reference_wgridder

_NAN = complex(np.nan, np.nan)  # what a non-finite point gives where it enters
_FEW = 64  # channels checked in Python (below), not with NumPy

__all__ = ["get_wgridder"]

OP = "get_wgridder"
# Options passed to both ducc0.wgridder.experimental.dirty2vis and vis2dirty. Array
# options (wgt, mask) would be static kwargs, not data: they are refused (JAXbind 1.3
# refused them too: its keyword arguments had to be hashable).
_DUCC_OPTIONS = (
    "flip_u",
    "flip_w",
    "divide_by_n",
    "sigma_min",
    "sigma_max",
    "center_x",
    "center_y",
    "allow_nshift",
)
# Options of vis2dirty alone (JAXbind 1.3 passed them to both, so only its transpose ran).
_ADJOINT_OPTIONS = ("double_precision_accumulation",)
# DUCC's oversampling range when sigma_min or sigma_max is not given
_SIGMA_DEFAULTS = (1.1, 2.6)


# --- radio interferometry: the wgridder ----------------------------------------


def _geometry(uvw, freq):
    """What DUCC is given for the data's uvw and freq, and where they were changed.

    Returns ``(uvw, freq, order, rows_ok, chans_ok)``: float64 coordinates, non-finite
    ones replaced by harmless values (``rows_ok``/``chans_ok`` mark the others, None
    when all are finite), and the channels sorted by frequency as DUCC needs them
    (``order``: the original channel of each sorted one; None when already sorted).

    Every call runs this. When all is well (finite, sorted, positive) it costs one pass
    over uvw (all_finite; DUCC's own result for a non-finite coordinate is undefined
    behaviour in its index arithmetic) and, for up to _FEW channels, a look at them in
    Python: each NumPy call here costs DUCC's call that follows tens of microseconds
    (measured, benchmarks/results/drop_in.md), more than the work it does.
    """
    uvw, freq = np.asarray(uvw, np.float64), np.asarray(freq, np.float64)
    if freq.size <= _FEW:
        channels = freq.tolist()
        usual = all(0.0 < f < math.inf for f in channels) and all(
            a <= b for a, b in zip(channels, channels[1:])
        )
    else:
        usual = bool((freq > 0).all() and np.isfinite(freq).all() and (freq[1:] >= freq[:-1]).all())
    if usual and all_finite(uvw):
        return uvw, freq, None, None, None
    rows_ok = None
    if not all_finite(uvw):
        rows_ok = np.isfinite(uvw).all(axis=1)
        uvw = np.where(rows_ok[:, None], uvw, 0)
    chans_ok = np.isfinite(freq)
    if (freq[chans_ok] <= 0).any():
        i = int(np.flatnonzero(chans_ok & (freq <= 0))[0])
        raise ValueError(
            f"jaxducc0.{OP}: channel frequencies must be > 0, got {freq[i]} for channel {i}"
        )
    if chans_ok.all():
        chans_ok = None
    else:
        freq = np.where(chans_ok, freq, freq[chans_ok].max() if chans_ok.any() else 1.0)
    order = None
    if (np.diff(freq) < 0).any():
        order = np.argsort(freq, kind="stable")
        freq = freq[order]
    return uvw, freq, order, rows_ok, chans_ok


def _settings(kwargs, single, adjoint):
    """DUCC's keyword arguments for dirty2vis (or, `adjoint`, vis2dirty), with the
    accuracy it can reach; whether to go double."""
    kwargs = dict(kwargs)
    del kwargs["npix_x"], kwargs["npix_y"]
    if not adjoint:
        for name in _ADJOINT_OPTIONS:
            kwargs.pop(name, None)
    sigma = sigma_range(kwargs, _SIGMA_DEFAULTS)
    kwargs["epsilon"], in_double = working_precision(
        "wgridder_w" if kwargs["do_wgridding"] else "wgridder", 2, single, kwargs["epsilon"], sigma
    )
    return kwargs, in_double


def _dirty2vis(out, args, kwargs_dump):
    uvw, freq, dirty = args
    vis = out[0]
    if vis.size == 0:
        return
    uvw, freq, order, rows_ok, chans_ok = _geometry(uvw, freq)
    kwargs, in_double = _settings(load_kwargs(kwargs_dump), dirty.dtype == np.float32, False)
    target = vis
    if in_double or order is not None:  # compute elsewhere, then convert or reorder
        target = np.empty(vis.shape, np.complex128 if in_double else vis.dtype)
        dirty = dirty.astype(np.float64) if in_double else dirty
    ducc0.wgridder.experimental.dirty2vis(uvw=uvw, freq=freq, dirty=dirty, vis=target, **kwargs)
    if order is not None:
        vis[:, order] = target
    elif target is not vis:
        vis[...] = target
    if rows_ok is not None:  # a non-finite coordinate: NaN where it enters
        vis[~rows_ok, :] = _NAN
    if chans_ok is not None:
        vis[:, ~chans_ok] = _NAN


def _vis2dirty(out, args, kwargs_dump):
    # image -> vis is real-to-complex, so JAX's transpose is Re(A^T ct) =
    # A^H(conj(ct)): the adjoint gridder applied to the conjugated cotangent.
    uvw, freq, vis = args
    dirty = out[0]
    if vis.size == 0:  # no visibilities: the image is zero (DUCC crashes on no channels)
        dirty[...] = 0
        return
    uvw, freq, order, rows_ok, chans_ok = _geometry(uvw, freq)
    if rows_ok is not None or chans_ok is not None:  # every visibility reaches every pixel
        dirty[...] = np.nan
        return
    kwargs, in_double = _settings(load_kwargs(kwargs_dump), dirty.dtype == np.float32, True)
    vis = vis.conj() if order is None else vis[:, order].conj()
    target = np.empty(dirty.shape, np.float64) if in_double else dirty
    ducc0.wgridder.experimental.vis2dirty(
        uvw=uvw,
        freq=freq,
        vis=vis.astype(np.complex128) if in_double else vis,
        dirty=target,
        **kwargs,
    )
    if in_double:
        dirty[...] = target


def _check_geometry(uvw, freq):
    if len(uvw.shape) != 2 or uvw.shape[1] != 3 or len(freq.shape) != 1:
        raise ValueError(
            f"jaxducc0.{OP}: uvw must be (nrows, 3) and freq (nchan,), got "
            f"{tuple(uvw.shape)} and {tuple(freq.shape)}"
        )
    for name, a in (("uvw", uvw), ("freq", freq)):
        if not np.issubdtype(np.dtype(a.dtype), np.floating):
            raise TypeError(f"jaxducc0.{OP}: {name} must be real (float), got {a.dtype}")


def _dirty2vis_abstract(uvw, freq, dirty, **kwargs):
    _check_geometry(uvw, freq)
    if tuple(dirty.shape) != (kwargs["npix_x"], kwargs["npix_y"]):
        raise ValueError(
            f"jaxducc0.{OP}: image must be {(kwargs['npix_x'], kwargs['npix_y'])}, "
            f"got {tuple(dirty.shape)}: npix_x and npix_y are the image's shape, which the "
            "transpose (and so every gradient) makes"
        )
    return (((uvw.shape[0], freq.shape[0]), _complex_of(dirty.dtype, OP)),)


def _vis2dirty_abstract(uvw, freq, vis, **kwargs):
    _check_geometry(uvw, freq)
    return (((kwargs["npix_x"], kwargs["npix_y"]), _real_of(vis.dtype, OP)),)


_wgridder = get_linear_call(
    _dirty2vis,
    _vis2dirty,
    _dirty2vis_abstract,
    _vis2dirty_abstract,
    reference=Reference(reference_wgridder.wgridder, tolerance=by_epsilon),
    first_n_args_fixed=2,
    name="jaxducc0.wgridder",
    platform_mode=_MODE,
    # uvw (rows, 3), freq (chans,), image (x, y) -> vis (rows, chans): each device predicts
    # its own rows and channels from the whole image; the transpose (vis2dirty) is then
    # "r u, c, r c -> x y", each device's image a partial sum over its visibilities
    sharding="r u, c, x y -> r c",
)


def get_wgridder(
    *,
    pixsize_x,
    pixsize_y,
    npix_x,
    npix_y,
    epsilon,
    do_wgridding,
    nthreads=1,
    flip_v=False,
    verbosity=0,
    **kwargs,
):
    """The DUCC (w-)gridder as a linear JAX op from sky image to visibilities.

    Args:
      pixsize_x: pixel size along x, in radian (> 0).
      pixsize_y: pixel size along y, in radian (> 0).
      npix_x: image size along x (even, > 0).
      npix_y: image size along y (even, > 0).
      epsilon: requested accuracy (> 0). Finer than DUCC reaches is clamped to the
        finest; in single precision, finer than single precision reaches is computed
        in double precision and rounded back.
      do_wgridding: whether to apply the w-term correction.
      nthreads: DUCC threads (0: all hardware threads).
      flip_v: passed to ``ducc0.wgridder.experimental.dirty2vis`` / ``vis2dirty``.
      verbosity: passed to DUCC, as ``flip_v``.
      **kwargs: passed to DUCC, as ``flip_v``: ``flip_u``, ``flip_w``,
        ``divide_by_n``, ``sigma_min`` and ``sigma_max`` (one alone: DUCC's default
        for the other), ``center_x``, ``center_y``, ``allow_nshift``; and
        ``double_precision_accumulation``, to ``vis2dirty`` only (the transpose).

    Returns:
      ``op(uvw, freq, image) -> [vis]``: ``uvw`` (nrows, 3) in metres and
      ``freq`` (nchan,) in Hz are fixed (not differentiable); ``image``
      (npix_x, npix_y), float32 or float64, in Jy/sr; ``vis`` (nrows, nchan),
      complex64 or complex128. Linear in ``image``, with its transpose. The
      channels may come in any order (DUCC's order is made at each call). A row
      or channel with a non-finite coordinate gives NaN visibilities there, and
      a NaN image from the transpose; a frequency <= 0 is an error when the
      program runs; no rows or channels give an empty result (and a zero image).
    """
    check_kwargs(OP, kwargs, _DUCC_OPTIONS + _ADJOINT_OPTIONS)
    for name, value in kwargs.items():  # in DUCC's types, as the parameters below
        if name in ("center_x", "center_y"):
            kwargs[name] = check_real(OP, name, value)
        elif name not in ("sigma_min", "sigma_max"):  # the flags: DUCC reads None as False
            kwargs[name] = bool(value)
    check_sigma(
        OP, kwargs, "1 < sigma_min < sigma_max", lambda lo, hi: 1.0 < lo < hi, _SIGMA_DEFAULTS
    )
    npix = []
    for name, n in (("npix_x", npix_x), ("npix_y", npix_y)):
        n = check_int(OP, name, n, 2)
        if n % 2:
            raise ValueError(f"jaxducc0.{OP}: {name} must be even (DUCC's gridder), got {n}")
        npix.append(n)
    return partial(
        _wgridder,
        pixsize_x=check_positive(OP, "pixsize_x", pixsize_x),
        pixsize_y=check_positive(OP, "pixsize_y", pixsize_y),
        npix_x=npix[0],
        npix_y=npix[1],
        epsilon=check_positive(OP, "epsilon", epsilon),
        do_wgridding=bool(do_wgridding),
        nthreads=check_nthreads(OP, nthreads),
        flip_v=bool(flip_v),
        verbosity=check_int(OP, "verbosity", verbosity),
        **kwargs,
    )
