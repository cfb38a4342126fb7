"""The radio-interferometric (w-)gridder: sky image to visibilities."""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import get_linear_call, load_kwargs
from ._common import ducc0, _MODE, _complex_of, _real_of

__all__ = ["get_wgridder"]

# --- radio interferometry: the wgridder ----------------------------------------

def _dirty2vis(out, args, kwargs_dump):
    uvw, freq, dirty = args
    kwargs = load_kwargs(kwargs_dump)
    del kwargs["npix_x"], kwargs["npix_y"]
    ducc0.wgridder.experimental.dirty2vis(
        uvw=np.asarray(uvw, np.float64), freq=np.asarray(freq, np.float64), dirty=dirty,
        vis=out[0], **kwargs)


def _vis2dirty(out, args, kwargs_dump):
    # image -> vis is real-to-complex, so JAX's transpose is Re(A^T ct) =
    # A^H(conj(ct)): the adjoint gridder applied to the conjugated cotangent.
    uvw, freq, vis = args
    kwargs = load_kwargs(kwargs_dump)
    ducc0.wgridder.experimental.vis2dirty(
        uvw=np.asarray(uvw, np.float64), freq=np.asarray(freq, np.float64), vis=vis.conj(),
        dirty=out[0], **kwargs)


def _dirty2vis_abstract(uvw, freq, dirty, **kwargs):
    if uvw.ndim != 2 or uvw.shape[1] != 3 or freq.ndim != 1:
        raise ValueError(f"jaxducc0 wgridder: uvw must be (nrows, 3) and freq (nchan,), got "
                         f"{uvw.shape} and {freq.shape}")
    if dirty.shape != (kwargs["npix_x"], kwargs["npix_y"]):
        raise ValueError(f"jaxducc0 wgridder: image must be {(kwargs['npix_x'], kwargs['npix_y'])}, "
                         f"got {dirty.shape}")
    return (((uvw.shape[0], freq.shape[0]), _complex_of(dirty.dtype, "wgridder")),)


def _vis2dirty_abstract(uvw, freq, vis, **kwargs):
    return (((kwargs["npix_x"], kwargs["npix_y"]), _real_of(vis.dtype, "wgridder")),)


_wgridder = get_linear_call(_dirty2vis, _vis2dirty, _dirty2vis_abstract, _vis2dirty_abstract,
                            first_n_args_fixed=2, name="jaxducc0.wgridder",
                            platform_mode=_MODE)


def get_wgridder(*, pixsize_x, pixsize_y, npix_x, npix_y, epsilon, do_wgridding, nthreads=1,
                 flip_v=False, verbosity=0, **kwargs):
    """The DUCC (w-)gridder as a linear JAX op from sky image to visibilities.

    Args:
      pixsize_x: pixel size along x, in radian.
      pixsize_y: pixel size along y, in radian.
      npix_x: image size along x (even, at least 32).
      npix_y: image size along y (even, at least 32).
      epsilon: requested accuracy.
      do_wgridding: whether to apply the w-term correction.
      nthreads: DUCC threads.
      flip_v: passed to ``ducc0.wgridder.experimental.dirty2vis`` / ``vis2dirty``.
      verbosity: passed to DUCC, as ``flip_v``.
      **kwargs: passed to DUCC, as ``flip_v``.

    Returns:
      ``op(uvw, freq, image) -> [vis]``: ``uvw`` (nrows, 3) in metres and
      ``freq`` (nchan,) in Hz are fixed (not differentiable); ``image``
      (npix_x, npix_y), float32 or float64, in Jy/sr; ``vis`` (nrows, nchan),
      complex64 or complex128. Linear in ``image``, with its transpose.
    """
    return partial(_wgridder, pixsize_x=pixsize_x, pixsize_y=pixsize_y, npix_x=int(npix_x),
                   npix_y=int(npix_y), epsilon=epsilon, do_wgridding=do_wgridding,
                   nthreads=nthreads, flip_v=flip_v, verbosity=verbosity, **kwargs)
