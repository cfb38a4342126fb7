"""The pure-JAX reference of ``jaxducc0.wgridder`` (`get_wgridder`): the radio
interferometric measurement equation in DUCC's conventions.

This module owns the conventions, the options and the direct sum; `.wstacking` the fast
path. No ducc0, no native op, so a program lowered with it runs where neither is
installed. DUCC's ``dirty2vis`` computes, for row r (uvw in
metres) and channel c (frequency in Hz),

    vis[r, c] = sum_{i, j} dirty[i, j] / n(l_i, m_j)
                * exp(-2 pi i f_c / C (u_r l_i + v_r m_j - w_r (n(l_i, m_j) - 1)))

with ``C = 299792458`` m/s (DUCC's speed of light), pixel coordinates
``l_i = (i - npix_x / 2) pixsize_x + center_x`` and ``m_j = (j - npix_y / 2) pixsize_y +
center_y`` (absolute, not relative to the image centre, also in the w-term), and
``n = sqrt(1 - l^2 - m^2)``, its ``n - 1`` computed as ``-r2 / (sqrt(1 - r2) + 1)``.
``flip_w`` negates w. ``flip_u`` and ``flip_v`` are not quite "negate u, v", as DUCC's
docstring says: they mirror the pixel grid about the image centre, which stays at
``center_x``, ``center_y`` (``l_i = -(i - npix_x / 2) pixsize_x + center_x``); the two
agree only for an image centred on the phase centre. ``divide_by_n=False`` drops the
``1 / n``. Without ``do_wgridding`` both the w-term and the ``1 / n`` are gone, whatever
``divide_by_n`` says (DUCC's behaviour, checked in
tests/contrib/test_references_wgridder_sht.py).

How: with the op's ``epsilon`` (as the op always calls it), by w-stacking on the NUFFT
references' spreading kernel (`.wstacking`), to that accuracy (0.1 to 0.4 epsilon from
the exact sum, DUCC up to 0.83: the checker allows 3 epsilon): about 2 to 4.5 times DUCC's
time at one thread for a 1024 x 1024 image and 10^6 visibilities
(benchmarks/results/reference_wgridder_sizes.md). Without ``epsilon``, and where the w
range needs more planes than w-stacking schedules (thousands), and on JAX before 0.10
(which cannot transpose the w-stacking's scan), by `direct_sum`: the sum
over every pixel, exact, ``nrows * nchan * npix_x * npix_y`` complex exponentials (with
the w-term; multiply-adds without it, the phase then factoring into x and y), in blocks
of about `_BLOCK_ELEMENTS` complex values (64 MiB in complex128), practical up to a
128 x 128 image and 10^4 visibilities (seconds).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...._compat import TRANSPOSES_SCANS_OF_CONDITIONALS
from . import blocks, options, wstacking

__all__ = ["wgridder", "direct_sum"]

OP = "wgridder"
SPEED_OF_LIGHT = 299792458.0  # m/s, DUCC's value
# Options of the native op that change how DUCC computes, not what (epsilon is read).
_TUNING = (
    "nthreads",
    "verbosity",
    "sigma_min",
    "sigma_max",
    "allow_nshift",
    "double_precision_accumulation",
)
_BLOCK_ELEMENTS = 1 << 22  # complex values per block of rows


def _pixel_coordinates(npix, pixsize, center, flip):
    """Direction cosines of the pixels along one axis; `flip` mirrors them about the
    image centre (DUCC's flip_u, flip_v), the centre itself stays."""
    return (-1.0 if flip else 1.0) * (np.arange(npix) - npix / 2) * pixsize + center


@options(tuning=_TUNING)
def wgridder(
    uvw,
    freq,
    dirty,
    *,
    pixsize_x,
    pixsize_y,
    npix_x,
    npix_y,
    do_wgridding,
    flip_u=False,
    flip_v=False,
    flip_w=False,
    divide_by_n=True,
    center_x=0.0,
    center_y=0.0,
    epsilon=None,
):
    """The reference of ``jaxducc0.wgridder``: dirty image -> visibilities.

    Called as the op's callable is: ``uvw`` (nrows, 3) in metres, ``freq`` (nchan,) in
    Hz, ``dirty`` (npix_x, npix_y) float32 or float64, and the keyword arguments
    `get_wgridder` gives the op. It reads ``pixsize_x``, ``pixsize_y``, ``npix_x``,
    ``npix_y``, ``do_wgridding``, ``flip_u``, ``flip_v``, ``flip_w``, ``divide_by_n``,
    ``center_x`` and ``center_y`` (DUCC's defaults where absent) and ``epsilon`` (the
    accuracy, as the op's; absent: the exact `direct_sum`), and ignores ``nthreads``,
    ``verbosity``, ``sigma_min``, ``sigma_max``, ``allow_nshift`` and
    ``double_precision_accumulation``. Returns ``[vis]``, (nrows, nchan), complex64 or
    complex128 as ``dirty``; the phases are computed in the widest precision of the
    three arrays. Linear in ``dirty``; JAX derives the transpose (DUCC's ``vis2dirty``
    of the conjugated cotangent). A non-finite coordinate gives NaN where it enters, as
    the op does; a frequency <= 0, which the op refuses when it runs, is computed here.
    """
    if tuple(dirty.shape) != (npix_x, npix_y):
        raise ValueError(
            f"jaxducc0.{OP} reference: image must be {(npix_x, npix_y)}, got {tuple(dirty.shape)}"
        )
    nrows, nchan = uvw.shape[0], freq.shape[0]
    out = jnp.result_type(dirty.dtype, jnp.complex64)
    if nrows == 0 or nchan == 0:
        return [jnp.zeros((nrows, nchan), out)]
    geometry = dict(
        pixsize_x=pixsize_x,
        pixsize_y=pixsize_y,
        npix_x=npix_x,
        npix_y=npix_y,
        do_wgridding=do_wgridding,
        flip_u=flip_u,
        flip_v=flip_v,
        flip_w=flip_w,
        divide_by_n=divide_by_n,
        center_x=center_x,
        center_y=center_y,
    )
    if epsilon is None or not TRANSPOSES_SCANS_OF_CONDITIONALS:  # exact (see _compat)
        vis = direct_sum(uvw, freq, dirty, **geometry)
    else:
        signs = jnp.asarray([1.0, 1.0, -1.0 if flip_w else 1.0], uvw.dtype)
        vis = wstacking.dirty2vis(
            uvw * signs,
            freq,
            dirty,
            npix=(npix_x, npix_y),
            pixsize=(pixsize_x, pixsize_y),
            center=(center_x, center_y),
            flips=(flip_u, flip_v),
            wgridding=do_wgridding,
            divide_by_n=divide_by_n,
            eps=epsilon,
            fallback=lambda d: direct_sum(uvw, freq, d, **geometry),
        )
    return [vis.astype(out)]


def direct_sum(
    uvw,
    freq,
    dirty,
    *,
    pixsize_x,
    pixsize_y,
    npix_x,
    npix_y,
    do_wgridding,
    flip_u=False,
    flip_v=False,
    flip_w=False,
    divide_by_n=True,
    center_x=0.0,
    center_y=0.0,
):
    """The measurement equation summed over every pixel for every visibility: exact (up
    to rounding), ``nrows * nchan * npix_x * npix_y`` complex exponentials, in blocks of
    rows. `wgridder` runs it when no ``epsilon`` is given, or when the w range needs more
    planes than its w-stacking schedules; the tests compare with it. (nrows, nchan),
    complex in the widest precision of the three arrays."""
    nrows, nchan = uvw.shape[0], freq.shape[0]
    real = jnp.result_type(uvw.dtype, freq.dtype, dirty.dtype)
    cplx = jnp.result_type(real, jnp.complex64)

    x = _pixel_coordinates(npix_x, pixsize_x, center_x, flip_u)
    y = _pixel_coordinates(npix_y, pixsize_y, center_y, flip_v)
    signs = np.array([1.0, 1.0, -1.0 if flip_w else 1.0])
    # coordinates in wavelengths, (nrows, nchan, 3)
    scaled = (uvw.astype(real) * jnp.asarray(signs, real))[:, None, :] * (
        freq.astype(real) / SPEED_OF_LIGHT
    )[None, :, None]
    image = dirty.astype(real)

    def rotation(turns):  # exp(-2 pi i turns), the turns first reduced to [-1/2, 1/2]
        angle = (2 * np.pi) * (turns - jnp.round(turns))
        return jax.lax.complex(jnp.cos(angle), -jnp.sin(angle)).astype(cplx)

    if do_wgridding:
        r2 = x[:, None] ** 2 + y[None, :] ** 2
        nm1 = -r2 / (np.sqrt(1.0 - r2) + 1.0)  # n - 1, without the cancellation
        if divide_by_n:
            image = image / jnp.asarray(nm1 + 1.0, real)
        lmn = jnp.asarray(
            np.stack(
                [np.broadcast_to(x[:, None], r2.shape), np.broadcast_to(y, r2.shape), -nm1]
            ).reshape(3, -1),
            real,
        )  # (3, npix): the phase of a visibility is its (u, v, w) . lmn
        image = image.reshape(-1).astype(cplx)

        def block(coords, image):  # (rows, nchan, 3) -> (rows, nchan)
            return rotation(coords @ lmn) @ image

        per_row = nchan * npix_x * npix_y
    else:
        xs, ys = jnp.asarray(x, real), jnp.asarray(y, real)
        image = image.astype(cplx)

        def block(coords, image):  # the phase factors: exp(-2 pi i u l) exp(-2 pi i v m)
            ex, ey = rotation(coords[..., 0:1] * xs), rotation(coords[..., 1:2] * ys)
            return jnp.sum((ex @ image) * ey, axis=-1)

        per_row = nchan * (npix_x + 2 * npix_y)
    size, count = blocks(nrows, per_row, _BLOCK_ELEMENTS)
    if count == 1:
        vis = block(scaled, image)
    else:
        padded = jnp.pad(scaled, ((0, size * count - nrows), (0, 0), (0, 0)))
        # The image goes through the loop as its carry, unchanged, not as a constant the
        # loop closes over: jax 0.7 transposes only that form. Each block's phases are
        # recomputed, not stored, under grad (checkpoint).
        step = jax.checkpoint(lambda image, coords: (image, block(coords, image)))
        _, vis = jax.lax.scan(step, image, padded.reshape(count, size, nchan, 3))
        vis = vis.reshape(size * count, nchan)[:nrows]
    return vis
