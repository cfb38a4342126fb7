"""FFT-like transforms: complex FFT, Hartley, real FFT pair.

Batch axes become untransformed DUCC axes."""

from __future__ import annotations

from functools import partial, wraps

import numpy as np
from jax.export import is_symbolic_dim

from ... import get_linear_call, load_kwargs
from ._common import (
    _COMPLEX,
    _MODE,
    _REAL,
    _complex_of,
    _real_of,
    check_choice,
    check_int,
    check_kwargs,
    check_nthreads,
    ducc0,
)
from .reference import fft as reference_fft
from .reference.fft import fft_axes

__all__ = ["c2c", "genuine_fht", "r2c", "c2r"]

# --- which axes, which options: checked when the program is traced ------------------

# Keyword arguments each transform passes to its ducc0.fft function; others are refused
# (``allow_overwriting_input`` above all: the inputs are XLA's buffers, read-only).
_OPTIONS = {
    "c2c": ("forward", "inorm", "nthreads"),
    "genuine_fht": ("inorm", "nthreads"),
    "r2c": ("forward", "inorm", "nthreads"),
    "c2r": ("forward", "inorm", "nthreads"),
}
_INTERNAL = ("axes", "batch_axes", "n")
_HINT = {
    "c2c": "; use r2c for real input, or cast it to complex",
    "genuine_fht": "; the Hartley transform is real to real",
    "r2c": "; use c2c for complex input",
    "c2r": "",
}


def _fft_axes(ndim, kwargs, op="fft"):
    """The array axes to transform (`reference.fft.fft_axes`, the one rule), popping
    ``axes`` and ``batch_axes`` from the call's `kwargs`."""
    return fft_axes(ndim, kwargs.pop("axes", None), kwargs.pop("batch_axes", None), op)


def _check(op, x, kwargs, kind):
    """Trace-time checks of one transform's input and options: (axes, input batch axes)."""
    if np.dtype(x.dtype) not in (_REAL if kind == "complex" else _COMPLEX):
        want = "complex64 or complex128" if kind == "complex" else "float32 or float64"
        raise TypeError(f"jaxducc0.{op}: x must be {want}, got {x.dtype}{_HINT[op]}")
    check_kwargs(op, {k: v for k, v in kwargs.items() if k not in _INTERNAL}, _OPTIONS[op])
    check_choice(op, "inorm", kwargs.get("inorm", 0), (0, 1, 2))
    check_nthreads(op, kwargs.get("nthreads", 1))
    forward = kwargs.get("forward", True)
    if forward is not None and not isinstance(forward, (bool, np.bool_, int, np.integer)):
        raise TypeError(f"jaxducc0.{op}: forward must be a bool, got {forward!r}")
    batch = kwargs.get("batch_axes")
    return _fft_axes(len(x.shape), dict(kwargs), op), (batch[0] if batch else ())


# --- complex FFT and Hartley transform ----------------------------------------------


def _same_shape_abstract(x, *, op, kind, **kwargs):
    batch = kwargs.get("batch_axes")
    _check(op, x, kwargs, kind)
    return ((x.shape, x.dtype, batch[0][-1] if batch else None),)


def _kernel(transform):
    """The jaxbind callback ``f(out, args, kwargs_dump)`` that runs
    ``transform(out, x, axes, kwargs)`` on the call's one output and input, its
    transformed axes and its keyword arguments; it does nothing for an empty input
    (DUCC refuses empty arrays; the transform of nothing is nothing)."""

    @wraps(transform)
    def kernel(out, args, kwargs_dump):
        (x,) = args
        if x.size == 0:
            return
        kwargs = _as_ducc_types(load_kwargs(kwargs_dump))
        transform(out[0], x, _fft_axes(x.ndim, kwargs), kwargs)

    return kernel


def _as_ducc_types(kwargs):
    """The options (checked at trace time) in the types DUCC takes: ``nthreads=2.0``,
    ``inorm=True`` as ints, ``forward=None`` as False (as DUCC reads it)."""
    for name in ("inorm", "nthreads"):
        if name in kwargs:
            kwargs[name] = check_int("fft", name, kwargs[name], None)
    if "forward" in kwargs:
        kwargs["forward"] = bool(kwargs["forward"])
    return kwargs


def _op(name, f, f_T, abstract, abstract_T):
    """A DUCC transform as a linear op: vectorized (batch axes become untransformed
    DUCC axes), named jaxducc0.<name>, in the contrib's GPU mode, with its JAX reference
    (.reference.fft.<name>)."""
    return get_linear_call(
        f,
        f_T,
        abstract,
        abstract_T,
        reference=getattr(reference_fft, name),
        func_can_batch=True,
        name=f"jaxducc0.{name}",
        platform_mode=_MODE,
    )


@_kernel
def _c2c(out, x, axes, kwargs):
    ducc0.fft.c2c(x, axes=axes, out=out, **kwargs)


@_kernel
def _fht(out, x, axes, kwargs):
    ducc0.fft.genuine_fht(x, axes=axes, out=out, **kwargs)


# Both transforms have symmetric matrices, so each is its own transpose.
_c2c_abstract = partial(_same_shape_abstract, op="c2c", kind="complex")
c2c = _op("c2c", _c2c, _c2c, _c2c_abstract, _c2c_abstract)
c2c.__doc__ = """Complex FFT, ``c2c(x, *, axes=None, forward=True, inorm=0, nthreads=1)``.

x: complex64 or complex128 array; returns ``[y]`` of the same shape and dtype.
``axes`` (default all) are the transformed axes; ``forward=True`` uses the
exponent -1; ``inorm`` 0/1/2 divides by 1, sqrt(N), N; ``nthreads`` 0 uses all
hardware threads. Anything else is refused when the program is traced. The
transpose of the DFT is itself (the matrix is symmetric). An empty array gives
an empty result.
"""

_fht_abstract = partial(_same_shape_abstract, op="genuine_fht", kind="real")
genuine_fht = _op("genuine_fht", _fht, _fht, _fht_abstract, _fht_abstract)
genuine_fht.__doc__ = """Hartley transform, ``genuine_fht(x, *, axes=None, inorm=0, nthreads=1)``.

x: float32 or float64 array; returns ``[y]`` of the same shape and dtype. The
transform is ``ducc0.fft.genuine_fht`` (a true multidimensional Hartley
transform); it is symmetric and so its own transpose.
"""


# --- the real FFT pair ----------------------------------------------------------------


def _hermitian_weights(n, length, axis, ndim, dtype):
    """Weights along the half-spectrum axis: 1 at k=0 (and k=n/2 for even n), 2 elsewhere."""
    w = np.full(length, 2.0, dtype=dtype)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    shape = [1] * ndim
    shape[axis] = length
    return w.reshape(shape)


@_kernel
def _r2c(out, x, axes, kwargs):
    del kwargs["n"]
    ducc0.fft.r2c(x, axes=axes, out=out, **kwargs)


@_kernel
def _r2c_T(out, ct, axes, kwargs):
    # r2c is real-to-complex: JAX's transpose is Re(A^T ct), i.e. the sum over the
    # half spectrum without the Hermitian doubling that c2r applies: halve the
    # weights of the modes that c2r doubles.
    n = kwargs.pop("n")
    w = _hermitian_weights(n, ct.shape[axes[-1]], axes[-1], ct.ndim, _REAL[ct.dtype])
    ducc0.fft.c2r(ct / w, axes=axes, lastsize=n, out=out, **kwargs)


def _r2c_abstract(x, **kwargs):
    axes, batch = _check("r2c", x, kwargs, "real")
    shape = list(x.shape)
    shape[axes[-1]] = shape[axes[-1]] // 2 + 1
    return ((tuple(shape), _complex_of(x.dtype, "r2c"), batch[-1] if batch else None),)


def _r2c_abstract_T(ct, **kwargs):
    axes, batch = _check("r2c", ct, kwargs, "complex")
    shape = list(ct.shape)
    shape[axes[-1]] = kwargs["n"]
    return ((tuple(shape), _real_of(ct.dtype, "r2c"), batch[-1] if batch else None),)


_r2c_op = _op("r2c", _r2c, _r2c_T, _r2c_abstract, _r2c_abstract_T)


@_kernel
def _c2r(out, x, axes, kwargs):
    ducc0.fft.c2r(x, axes=axes, lastsize=kwargs.pop("n"), out=out, **kwargs)


@_kernel
def _c2r_T(out, ct, axes, kwargs):
    # c2r(c) = Re(B c) with B doubling the modes 0 < k < n/2, so its transpose is
    # B^T ct: the r2c of ct with those modes doubled.
    n = kwargs.pop("n")
    res = ducc0.fft.r2c(ct, axes=axes, out=out, **kwargs)
    res *= _hermitian_weights(n, res.shape[axes[-1]], axes[-1], ct.ndim, ct.dtype)


def _c2r_abstract(x, **kwargs):
    axes, batch = _check("c2r", x, kwargs, "complex")
    shape = list(x.shape)
    n = kwargs["n"]
    if n // 2 + 1 != shape[axes[-1]]:
        raise ValueError(
            f"jaxducc0.c2r: lastsize={n} needs {n // 2 + 1} input elements along "
            f"the last transformed axis, got {shape[axes[-1]]}"
        )
    shape[axes[-1]] = n
    return ((tuple(shape), _real_of(x.dtype, "c2r"), batch[-1] if batch else None),)


def _c2r_abstract_T(ct, **kwargs):
    axes, batch = _check("c2r", ct, kwargs, "real")
    shape = list(ct.shape)
    shape[axes[-1]] = kwargs["n"] // 2 + 1
    return ((tuple(shape), _complex_of(ct.dtype, "c2r"), batch[-1] if batch else None),)


_c2r_op = _op("c2r", _c2r, _c2r_T, _c2r_abstract, _c2r_abstract_T)


def r2c(x, *, axes=None, forward=True, inorm=0, nthreads=1, **kwargs):
    """Real-to-complex FFT (``ducc0.fft.r2c``).

    x: float32 or float64. The last of ``axes`` (default: all axes) is
    transformed real-to-complex and shrinks from n to n//2 + 1; the others are
    complex FFTs. Returns ``[y]`` (complex64 or complex128). The transpose is
    *not* the inverse: it is c2r with the non-self-conjugate modes halved.
    """
    n = x.shape[_fft_axes(np.ndim(x), {"axes": axes}, "r2c")[-1]]
    if is_symbolic_dim(n):
        raise TypeError(
            f"jaxducc0.r2c: the last transformed axis has the symbolic length {n}; "
            "its length is a parameter of the transform, so under jax.export "
            "only the other (batch) axes may be symbolic"
        )
    if n == 0:
        raise ValueError(
            f"jaxducc0.r2c: the last transformed axis has length 0 (input of "
            f"shape {tuple(np.shape(x))}); the real FFT needs at least one "
            "element there"
        )
    return _r2c_op(x, axes=axes, forward=forward, inorm=inorm, nthreads=nthreads, n=n, **kwargs)


def c2r(x, *, lastsize, axes=None, forward=True, inorm=0, nthreads=1, **kwargs):
    """Complex-to-real FFT (``ducc0.fft.c2r``) of a half spectrum.

    x: complex64 or complex128 with ``lastsize // 2 + 1`` elements along the last
    of ``axes``; returns ``[y]`` (float32 or float64) with ``lastsize`` there.
    ``c2r(r2c(x)[0], lastsize=n, forward=False, inorm=2)`` inverts ``r2c``.
    """
    if is_symbolic_dim(lastsize):
        raise TypeError(
            f"jaxducc0.c2r: lastsize is the symbolic dimension {lastsize}; it is a "
            "parameter of the transform, so under jax.export only the batch axes "
            "may be symbolic"
        )
    lastsize = check_int("c2r", "lastsize", lastsize, 1)
    return _c2r_op(
        x, axes=axes, forward=forward, inorm=inorm, nthreads=nthreads, n=lastsize, **kwargs
    )
