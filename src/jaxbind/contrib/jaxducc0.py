"""DUCC's transforms as differentiable, batchable JAX ops.

Drop-in compatible with JAXbind 1.3's ``jaxbind.contrib.jaxducc0``:

- :data:`c2c`, :data:`genuine_fht`: complex FFT and Hartley transform (ops).
- :data:`r2c`, :data:`c2r`: the real FFT pair (ops).
- :func:`get_healpix_sht`, :func:`nalm`: spherical-harmonic synthesis on HEALPix;
  :func:`realalm_to_alm`, :func:`alm_to_realalm`, :func:`realalm_size`,
  :func:`realalm_ell`: its real coefficient layout (NumPy and JAX).
- :func:`get_wgridder`: the radio-interferometric (w-)gridder, image to visibilities.
- :func:`get_nufft`: type-1 and type-2 non-uniform FFTs with fixed points.

Every op returns a list with one array, as JAXbind ops do, and follows JAX's
convention for transposes: no complex conjugation (the transpose of ``x -> A x``
is ``y -> A^T y``). Keyword arguments go to the corresponding ducc0 function.
The FFT ops batch natively: ``vmap`` becomes extra, untransformed axes of one
DUCC call. The others map over the batch, one DUCC call per element.

DUCC runs on the CPU; the ops also work inside GPU programs (``platform_mode="host"``):
each call copies its operands to the host and its results back to the GPU.
"""

from __future__ import annotations

import functools
from functools import partial

import numpy as np

try:
    import ducc0
except ImportError as exc:  # pragma: no cover - exercised only without ducc0
    raise ImportError(
        "jaxbind.contrib.jaxducc0 needs the ducc0 package; install it with "
        "pip install 'jaxbind[ducc]'") from exc

import jax
import jax.numpy as jnp
from jax.export import is_symbolic_dim

from .. import get_linear_call, load_kwargs

__all__ = ["c2c", "genuine_fht", "r2c", "c2r", "get_healpix_sht", "nalm", "realalm_size",
           "realalm_ell", "realalm_to_alm", "alm_to_realalm", "get_wgridder", "get_nufft"]

# DUCC runs on the CPU: inside GPU programs, jaxbind copies the operands to the host
# and the results back (see "GPU buffers" in the README).
_MODE = "host"

_COMPLEX = {np.dtype(np.float32): np.dtype(np.complex64),
            np.dtype(np.float64): np.dtype(np.complex128)}
_REAL = {c: r for r, c in _COMPLEX.items()}


def _complex_of(dtype, what):
    try:
        return _COMPLEX[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"jaxducc0.{what}: expected float32 or float64 input, got {dtype}") from None


def _real_of(dtype, what):
    try:
        return _REAL[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"jaxducc0.{what}: expected complex64 or complex128 input, "
                        f"got {dtype}") from None


# --- FFT-like transforms: batch axes become untransformed DUCC axes ------------

def _fft_axes(ndim, kwargs):
    """The array axes to transform: the caller's `axes`, counted among the non-batch axes."""
    batch = kwargs.pop("batch_axes", None)
    batch = batch[0] if batch else ()
    core = [i for i in range(ndim) if i not in batch]
    axes = kwargs.pop("axes", None)
    if axes is None:
        return core
    axes = [axes] if isinstance(axes, (int, np.integer)) else list(axes)
    try:
        return [core[a] for a in axes]  # negative axes count from the last core axis
    except IndexError:
        raise ValueError(f"jaxducc0: axes {axes} out of range for an array with "
                         f"{len(core)} dimensions") from None


def _core_axes(shape, kwargs):
    """(transformed axes, batch axes of the input) for abstract evaluation."""
    kwargs = dict(kwargs)
    batch = kwargs.get("batch_axes")
    return _fft_axes(len(shape), kwargs), (batch[0] if batch else ())


def _same_shape_abstract(x, **kwargs):
    batch = kwargs.get("batch_axes")
    _core_axes(x.shape, kwargs)  # validates `axes`
    return ((x.shape, x.dtype, batch[0][-1] if batch else None),)


def _c2c(out, args, kwargs_dump):
    (x,) = args
    kwargs = load_kwargs(kwargs_dump)
    axes = _fft_axes(x.ndim, kwargs)
    ducc0.fft.c2c(x, axes=axes, out=out[0], **kwargs)


def _fht(out, args, kwargs_dump):
    (x,) = args
    kwargs = load_kwargs(kwargs_dump)
    axes = _fft_axes(x.ndim, kwargs)
    ducc0.fft.genuine_fht(x, axes=axes, out=out[0], **kwargs)


# Both transforms have symmetric matrices, so each is its own transpose.
c2c = get_linear_call(_c2c, _c2c, _same_shape_abstract, _same_shape_abstract,
                      func_can_batch=True, name="jaxducc0.c2c",
                      platform_mode=_MODE)
c2c.__doc__ = """Complex FFT, ``c2c(x, *, axes=None, forward=True, inorm=0, nthreads=1)``.

x: complex64 or complex128 array; returns ``[y]`` of the same shape and dtype.
``axes`` (default all) are the transformed axes; ``forward=True`` uses the
exponent -1; ``inorm`` 0/1/2 divides by 1, sqrt(N), N. Other keyword arguments
go to ``ducc0.fft.c2c``. The transpose of the DFT is itself (the matrix is symmetric).
"""

genuine_fht = get_linear_call(_fht, _fht, _same_shape_abstract, _same_shape_abstract,
                              func_can_batch=True, name="jaxducc0.genuine_fht",
                              platform_mode=_MODE)
genuine_fht.__doc__ = """Hartley transform, ``genuine_fht(x, *, axes=None, inorm=0, nthreads=1)``.

x: float32 or float64 array; returns ``[y]`` of the same shape and dtype. The
transform is ``ducc0.fft.genuine_fht`` (a true multidimensional Hartley
transform); it is symmetric and so its own transpose.
"""


def _hermitian_weights(n, length, axis, ndim, dtype):
    """Weights along the half-spectrum axis: 1 at k=0 (and k=n/2 for even n), 2 elsewhere."""
    w = np.full(length, 2.0, dtype=dtype)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    shape = [1] * ndim
    shape[axis] = length
    return w.reshape(shape)


def _r2c(out, args, kwargs_dump):
    (x,) = args
    kwargs = load_kwargs(kwargs_dump)
    axes = _fft_axes(x.ndim, kwargs)
    del kwargs["n"]
    ducc0.fft.r2c(x, axes=axes, out=out[0], **kwargs)


def _r2c_T(out, args, kwargs_dump):
    # r2c is real-to-complex: JAX's transpose is Re(A^T ct), i.e. the sum over the
    # half spectrum without the Hermitian doubling that c2r applies: halve the
    # weights of the modes that c2r doubles.
    (ct,) = args
    kwargs = load_kwargs(kwargs_dump)
    axes = _fft_axes(ct.ndim, kwargs)
    n = kwargs.pop("n")
    w = _hermitian_weights(n, ct.shape[axes[-1]], axes[-1], ct.ndim, _REAL[ct.dtype])
    ducc0.fft.c2r(ct / w, axes=axes, lastsize=n, out=out[0], **kwargs)


def _r2c_abstract(x, **kwargs):
    axes, batch = _core_axes(x.shape, kwargs)
    shape = list(x.shape)
    shape[axes[-1]] = shape[axes[-1]] // 2 + 1
    return ((tuple(shape), _complex_of(x.dtype, "r2c"), batch[-1] if batch else None),)


def _r2c_abstract_T(ct, **kwargs):
    axes, batch = _core_axes(ct.shape, kwargs)
    shape = list(ct.shape)
    shape[axes[-1]] = kwargs["n"]
    return ((tuple(shape), _real_of(ct.dtype, "r2c"), batch[-1] if batch else None),)


_r2c_op = get_linear_call(_r2c, _r2c_T, _r2c_abstract, _r2c_abstract_T, func_can_batch=True,
                          name="jaxducc0.r2c",
                          platform_mode=_MODE)


def _c2r(out, args, kwargs_dump):
    (x,) = args
    kwargs = load_kwargs(kwargs_dump)
    axes = _fft_axes(x.ndim, kwargs)
    ducc0.fft.c2r(x, axes=axes, lastsize=kwargs.pop("n"), out=out[0], **kwargs)


def _c2r_T(out, args, kwargs_dump):
    # c2r(c) = Re(B c) with B doubling the modes 0 < k < n/2, so its transpose is
    # B^T ct: the r2c of ct with those modes doubled.
    (ct,) = args
    kwargs = load_kwargs(kwargs_dump)
    axes = _fft_axes(ct.ndim, kwargs)
    n = kwargs.pop("n")
    res = ducc0.fft.r2c(ct, axes=axes, out=out[0], **kwargs)
    res *= _hermitian_weights(n, res.shape[axes[-1]], axes[-1], ct.ndim, ct.dtype)


def _c2r_abstract(x, **kwargs):
    axes, batch = _core_axes(x.shape, kwargs)
    shape = list(x.shape)
    n = kwargs["n"]
    if n // 2 + 1 != shape[axes[-1]]:
        raise ValueError(f"jaxducc0.c2r: lastsize={n} needs {n // 2 + 1} input elements along "
                         f"the last transformed axis, got {shape[axes[-1]]}")
    shape[axes[-1]] = n
    return ((tuple(shape), _real_of(x.dtype, "c2r"), batch[-1] if batch else None),)


def _c2r_abstract_T(ct, **kwargs):
    axes, batch = _core_axes(ct.shape, kwargs)
    shape = list(ct.shape)
    shape[axes[-1]] = kwargs["n"] // 2 + 1
    return ((tuple(shape), _complex_of(ct.dtype, "c2r"), batch[-1] if batch else None),)


_c2r_op = get_linear_call(_c2r, _c2r_T, _c2r_abstract, _c2r_abstract_T, func_can_batch=True,
                          name="jaxducc0.c2r",
                          platform_mode=_MODE)


def r2c(x, *, axes=None, forward=True, inorm=0, nthreads=1, **kwargs):
    """Real-to-complex FFT (``ducc0.fft.r2c``).

    x: float32 or float64. The last of ``axes`` (default: all axes) is
    transformed real-to-complex and shrinks from n to n//2 + 1; the others are
    complex FFTs. Returns ``[y]`` (complex64 or complex128). The transpose is
    *not* the inverse: it is c2r with the non-self-conjugate modes halved.
    """
    n = x.shape[_fft_axes(np.ndim(x), {"axes": axes})[-1]]
    if is_symbolic_dim(n):
        raise TypeError(f"jaxducc0.r2c: the last transformed axis has the symbolic length {n}; "
                        "its length is a parameter of the transform, so under jax.export "
                        "only the other (batch) axes may be symbolic")
    return _r2c_op(x, axes=axes, forward=forward, inorm=inorm, nthreads=nthreads, n=n, **kwargs)


def c2r(x, *, lastsize, axes=None, forward=True, inorm=0, nthreads=1, **kwargs):
    """Complex-to-real FFT (``ducc0.fft.c2r``) of a half spectrum.

    x: complex64 or complex128 with ``lastsize // 2 + 1`` elements along the last
    of ``axes``; returns ``[y]`` (float32 or float64) with ``lastsize`` there.
    ``c2r(r2c(x)[0], lastsize=n, forward=False, inorm=2)`` inverts ``r2c``.
    """
    if is_symbolic_dim(lastsize):
        raise TypeError(f"jaxducc0.c2r: lastsize is the symbolic dimension {lastsize}; it is a "
                        "parameter of the transform, so under jax.export only the batch axes "
                        "may be symbolic")
    return _c2r_op(x, axes=axes, forward=forward, inorm=inorm, nthreads=nthreads, n=lastsize,
                   **kwargs)


# --- HEALPix spherical-harmonic synthesis ---------------------------------------

def nalm(lmax, mmax):
    """Number of complex a_lm coefficients for maximum moments ``lmax``, ``mmax``."""
    return ((mmax + 1) * (mmax + 2)) // 2 + (mmax + 1) * (lmax - mmax)


def realalm_size(lmax, mmax):
    """Length of the real alm layout that :func:`get_healpix_sht` takes: ``2 nalm - lmax - 1``."""
    return 2 * nalm(lmax, mmax) - lmax - 1


def realalm_ell(lmax, mmax):
    """The degree l of every entry of the real alm layout (a NumPy int array).

    Useful for power spectra: ``S = C_ell[realalm_ell(lmax, mmax)]``.
    """
    return np.concatenate([np.arange(lmax + 1)] +
                          [np.repeat(np.arange(m, lmax + 1), 2) for m in range(1, mmax + 1)])


def _xp(x):
    return jnp if isinstance(x, jax.Array) else np


def realalm_to_alm(x, lmax):
    """Real alm layout -> complex alm in DUCC's order (m-major), along the last axis.

    The inverse of :func:`alm_to_realalm`. Works on NumPy arrays (returns NumPy) and
    on JAX arrays, also under ``jit``, ``grad`` and ``vmap`` (returns JAX).
    ``x[..., :lmax + 1]`` are the m = 0 coefficients; then come the real and
    imaginary parts of each m > 0 coefficient, times sqrt(2).
    """
    xp = _xp(x)
    x = xp.asarray(x)
    m0 = x[..., :lmax + 1]
    rest = (x[..., lmax + 1::2] + 1j * x[..., lmax + 2::2]) / np.sqrt(2.0)
    return xp.concatenate([m0.astype(rest.dtype), rest], axis=-1)


def alm_to_realalm(alm, lmax):
    """Complex alm (DUCC's order, last axis) -> the real layout of :func:`get_healpix_sht`.

    The m = 0 coefficients keep their real part (their imaginary part must be 0 for
    a real map). Works on NumPy and JAX arrays (traceable), like :func:`realalm_to_alm`.
    """
    xp = _xp(alm)
    alm = xp.asarray(alm)
    rest = alm[..., lmax + 1:] * np.sqrt(2.0)
    pairs = xp.stack([rest.real, rest.imag], axis=-1).reshape(*rest.shape[:-1], -1)
    return xp.concatenate([alm[..., :lmax + 1].real, pairs], axis=-1)


@functools.lru_cache(maxsize=32)
def _healpix_geometry(nside):
    info = ducc0.healpix.Healpix_Base(nside, "RING").sht_info()
    return {k: np.ascontiguousarray(v) for k, v in info.items()}


def _realalm_to_alm(x, lmax):
    """Real alm layout -> complex: [a_l0 (real), then (re, im) of m > 0, times sqrt(2)]."""
    alm = np.empty((x.shape[0], (x.shape[1] + lmax + 1) // 2), dtype=_COMPLEX[x.dtype])
    alm[:, :lmax + 1] = x[:, :lmax + 1]
    alm[:, lmax + 1:] = x[:, lmax + 1:].view(alm.dtype) * (np.sqrt(2.0) / 2)
    return alm


def _alm_to_realalm(alm, lmax, out):
    out[:, :lmax + 1] = alm[:, :lmax + 1].real
    out[:, lmax + 1:] = alm[:, lmax + 1:].view(out.dtype) * np.sqrt(2.0)


def _sht_args(kwargs):
    geometry = _healpix_geometry(kwargs["nside"])
    return dict(spin=kwargs["spin"], lmax=kwargs["lmax"], mmax=kwargs["mmax"],
                nthreads=kwargs["nthreads"], **geometry)


def _sht(out, args, kwargs_dump):
    (x,) = args
    kwargs = load_kwargs(kwargs_dump)
    alm = _realalm_to_alm(x, kwargs["lmax"])
    ducc0.sht.synthesis(alm=alm, map=out[0], **_sht_args(kwargs))


def _sht_T(out, args, kwargs_dump):
    (m,) = args
    kwargs = load_kwargs(kwargs_dump)
    alm = ducc0.sht.adjoint_synthesis(map=m, **_sht_args(kwargs))
    _alm_to_realalm(alm, kwargs["lmax"], out[0])


def _ncomp(spin):
    return 1 if spin == 0 else 2


def _sht_abstract(x, **kwargs):
    ncomp, n = _ncomp(kwargs["spin"]), 2 * nalm(kwargs["lmax"], kwargs["mmax"]) - kwargs["lmax"] - 1
    if x.shape != (ncomp, n) or x.dtype not in _COMPLEX:
        raise ValueError(f"jaxducc0 healpix SHT: expected real alm of shape {(ncomp, n)} and "
                         f"dtype float32/float64, got {x.shape} {x.dtype}")
    return (((ncomp, 12 * kwargs["nside"] ** 2), x.dtype),)


def _sht_abstract_T(m, **kwargs):
    ncomp, n = _ncomp(kwargs["spin"]), 2 * nalm(kwargs["lmax"], kwargs["mmax"]) - kwargs["lmax"] - 1
    return (((ncomp, n), m.dtype),)


_healpix_sht = get_linear_call(_sht, _sht_T, _sht_abstract, _sht_abstract_T,
                               name="jaxducc0.healpix_sht",
                               platform_mode=_MODE)


def get_healpix_sht(nside, lmax, mmax, spin, nthreads=1):
    """Spherical-harmonic synthesis on a HEALPix (RING) grid, as a linear JAX op.

    Args:
      nside: HEALPix resolution; the map has ``12 * nside**2`` pixels.
      lmax: maximum l (inclusive).
      mmax: maximum m (inclusive).
      spin: 0 for scalar maps (1 component), otherwise 2 components.
      nthreads: DUCC threads (0: all hardware threads).

    Returns:
      ``op(alm) -> [map]``. ``alm`` is real-valued, shape
      ``(ncomp, 2 * nalm(lmax, mmax) - lmax - 1)``: the ``lmax + 1`` real
      coefficients with m = 0 first, then the real and imaginary parts of each
      m > 0 coefficient (in DUCC's order), multiplied by sqrt(2), so that the
      op is an orthogonal-friendly real-linear map. ``map`` has shape
      ``(ncomp, 12 * nside**2)`` and the dtype of ``alm``.
    """
    return partial(_healpix_sht, nside=int(nside), lmax=int(lmax), mmax=int(mmax),
                   spin=int(spin), nthreads=int(nthreads))


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


# --- non-uniform FFTs ------------------------------------------------------------

def _nufft_apply(out, args, kwargs, kind):
    coord, values = args
    if kind == 1:
        ducc0.nufft.nu2u(points=values, coord=coord, out=out[0], **kwargs)
    else:
        ducc0.nufft.u2nu(grid=values, coord=coord, out=out[0], **kwargs)


def _nufft(out, args, kwargs_dump):
    kwargs = load_kwargs(kwargs_dump)
    del kwargs["grid_shape"]
    _nufft_apply(out, args, kwargs, kwargs.pop("nufft_type"))


def _nufft_T(out, args, kwargs_dump):
    # Without conjugation, the transpose of the type-2 NUFFT with a given sign is the
    # type-1 NUFFT with the same sign, and the other way round.
    kwargs = load_kwargs(kwargs_dump)
    del kwargs["grid_shape"]
    _nufft_apply(out, args, kwargs, 3 - kwargs.pop("nufft_type"))


def _nufft_shapes(coord, kind, kwargs):
    grid = tuple(kwargs["grid_shape"])
    if coord.ndim != 2 or coord.shape[1] != len(grid):
        raise ValueError(f"jaxducc0 nufft: coord must be (npoints, {len(grid)}), got {coord.shape}")
    return (grid, (coord.shape[0],)) if kind == 1 else ((coord.shape[0],), grid)


def _nufft_abstract(coord, values, **kwargs):
    shape_in, shape_out = _nufft_shapes(coord, kwargs["nufft_type"], kwargs)[::-1]
    if values.shape != shape_in:
        raise ValueError(f"jaxducc0 nufft type {kwargs['nufft_type']}: expected values of "
                         f"shape {shape_in}, got {values.shape}")
    _real_of(values.dtype, "nufft")
    return ((shape_out, values.dtype),)


def _nufft_abstract_T(coord, ct, **kwargs):
    shape_in, _ = _nufft_shapes(coord, kwargs["nufft_type"], kwargs)[::-1]
    return ((shape_in, ct.dtype),)


_nufft_op = get_linear_call(_nufft, _nufft_T, _nufft_abstract, _nufft_abstract_T,
                            first_n_args_fixed=1, name="jaxducc0.nufft",
                            platform_mode=_MODE)


def get_nufft(coord, grid_shape, *, nufft_type, forward=True, epsilon=1e-6, nthreads=1,
              periodicity=2 * np.pi, fft_order=False, **kwargs):
    """A non-uniform FFT (``ducc0.nufft``) with fixed points, linear in the values.

    Args:
      coord: (npoints, ndim) point coordinates (float32 or float64), ndim 1-3.
        Periodic with ``periodicity`` (default 2 pi) in every dimension.
      grid_shape: shape of the uniform grid (ndim entries).
      nufft_type: 1 (non-uniform values -> grid, ``ducc0.nufft.nu2u``) or
        2 (grid -> values at the points, ``ducc0.nufft.u2nu``).
      forward: exponent sign, -1 if True; epsilon: accuracy; fft_order: grid
        starts at the zero mode instead of the most negative one.

    Returns:
      ``op(values) -> [result]`` for complex64/complex128 values. Type 2
      computes ``c_j = sum_k f_k exp(∓ i k·x_j)``; type 1 the sum the other way.
      The transpose of one type is the other type with the same sign (JAX
      transposes do not conjugate).
    """
    if nufft_type not in (1, 2):
        raise ValueError(f"jaxducc0.get_nufft: nufft_type must be 1 or 2, got {nufft_type!r}")
    coord = jnp.asarray(coord)
    return partial(_nufft_op, coord, grid_shape=tuple(int(n) for n in grid_shape),
                   nufft_type=nufft_type, forward=bool(forward), epsilon=float(epsilon),
                   nthreads=int(nthreads), periodicity=periodicity, fft_order=bool(fft_order),
                   **kwargs)
