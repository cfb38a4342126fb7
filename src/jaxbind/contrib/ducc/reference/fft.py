"""References of the FFT family (`..fft`): ``c2c``, ``genuine_fht``, ``r2c``, ``c2r``,
from ``jnp.fft``, with DUCC's conventions.

Each is called as the op's callable is: the input array, then the keyword arguments
the op's wrapper passes (``axes``, ``forward``, ``inorm``, ``nthreads``, and for the
real pair ``n``, the length of the last transformed axis in the real domain). DUCC's
conventions, checked against ducc0 0.42:

- ``forward=True`` is the exponent -1; ``forward=False`` (or None) is +1, unscaled;
- ``inorm`` 0/1/2 divides by 1, sqrt(N), N, with N the product of the transformed
  lengths in the real (longer) domain;
- ``genuine_fht`` is the true multidimensional Hartley transform, Re(F) - Im(F) of the
  forward FFT over all ``axes`` at once (not the separable one);
- ``r2c`` and ``c2r`` halve (and expand) the *last* of ``axes``; the others are complex
  FFTs in the same direction; ``c2r`` ignores the imaginary parts that a Hermitian
  spectrum cannot have, as DUCC does.

``nthreads`` does not change the result: it is accepted and ignored; any other keyword
argument is refused (`..options`). `fft_axes` is the ops' rule for ``axes``, the one both
the ops and these references follow. JAX's FFTs take at most three axes at once, so longer
``axes`` are transformed in groups (the transforms separate).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from . import options

__all__ = ["c2c", "c2r", "fft_axes", "genuine_fht", "r2c"]


def fft_axes(ndim: int, axes=None, batch_axes=None, op: str = "fft") -> list[int]:
    """The transformed array axes, as the ops read ``axes``: None for every non-batch
    axis, else indices (negative ones too) among the non-batch axes, each once. A bad
    ``axes`` is an error naming ``jaxducc0.<op>``."""
    batch = batch_axes[0] if batch_axes else ()
    core = [i for i in range(ndim) if i not in batch]
    if axes is None:
        if not core:
            raise ValueError(f"jaxducc0.{op}: the input is a scalar; it needs an axis to transform")
        return core
    axes = [axes] if isinstance(axes, (int, np.integer)) else list(axes)
    if not axes:
        raise ValueError(
            f"jaxducc0.{op}: axes is empty; give at least one axis to transform (or None for all)"
        )
    if any(isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)) for a in axes):
        raise TypeError(f"jaxducc0.{op}: axes must be integers, got {axes}")
    if not all(-len(core) <= a < len(core) for a in axes):
        raise ValueError(
            f"jaxducc0.{op}: axes {axes} out of range for an array with {len(core)} dimensions"
        )
    picked = [core[a] for a in axes]  # negative axes count from the last core axis
    if len(set(picked)) != len(picked):
        raise ValueError(
            f"jaxducc0.{op}: axes {axes} name an axis twice; ducc0 refuses a repeated axis "
            "(JAXbind 1.3 transformed it once, NumPy's fftn transforms it twice)"
        )
    return picked


def _scale(y, inorm: int, n: int):
    """`y` divided by 1, sqrt(n) or n (``inorm`` 0, 1, 2), in its own dtype."""
    if inorm == 0 or n == 0:
        return y
    return y * (1 / math.sqrt(n) if inorm == 1 else 1 / n)


def _in_groups(transform, x, axes):
    """`transform(x, axes)` applied to at most three axes at a time (JAX's limit)."""
    for i in range(0, len(axes), 3):
        x = transform(x, axes[i : i + 3])
    return x


def _complex_fft(x, axes, forward: bool):
    """The unscaled complex FFT over `axes`, exponent -1 if `forward` else +1."""
    if not axes:
        return x
    if forward:
        return _in_groups(lambda a, ax: jnp.fft.fftn(a, axes=ax, norm="backward"), x, axes)
    return _in_groups(lambda a, ax: jnp.fft.ifftn(a, axes=ax, norm="forward"), x, axes)


def _length(shape, axes) -> int:
    return math.prod(shape[a] for a in axes)


@options(tuning=("nthreads",))
def c2c(x, *, axes=None, forward=True, inorm=0, batch_axes=None):
    """Reference of `..fft.c2c`: ``[y]``, the complex FFT of `x` over `axes`."""
    axes = fft_axes(x.ndim, axes, batch_axes, "c2c")
    y = _complex_fft(x, axes, bool(forward))
    return [_scale(y, int(inorm), _length(x.shape, axes))]


@options(tuning=("nthreads",))
def genuine_fht(x, *, axes=None, inorm=0, batch_axes=None):
    """Reference of `..fft.genuine_fht`: ``[y]``, Re(F) - Im(F) of the forward FFT of
    the real `x` over `axes` (the kernel cas(t) = cos(t) + sin(t) of the whole phase)."""
    axes = fft_axes(x.ndim, axes, batch_axes, "genuine_fht")
    f = _complex_fft(x, axes, True)
    return [_scale(jnp.real(f) - jnp.imag(f), int(inorm), _length(x.shape, axes))]


@options(tuning=("nthreads",))
def r2c(x, *, n=None, axes=None, forward=True, inorm=0, batch_axes=None):
    """Reference of `..fft.r2c`: ``[y]``, the real-to-complex FFT of `x`, the last of
    `axes` shrunk to ``n // 2 + 1`` (`n` is its length, as the op's wrapper passes)."""
    del n
    axes = fft_axes(x.ndim, axes, batch_axes, "r2c")
    y = jnp.fft.rfft(x, axis=axes[-1], norm="backward")
    y = _complex_fft(y, axes[:-1], True)
    if not forward:  # x is real: the +1 transform is the conjugate of the -1 one
        y = jnp.conj(y)
    return [_scale(y, int(inorm), _length(x.shape, axes))]


@options(tuning=("nthreads",))
def c2r(x, *, n, axes=None, forward=True, inorm=0, batch_axes=None):
    """Reference of `..fft.c2r`: ``[y]``, the real signal of length `n` (the op's
    ``lastsize``) along the last of `axes` whose half spectrum is `x`."""
    axes = fft_axes(x.ndim, axes, batch_axes, "c2r")
    if forward:  # the result is real: the -1 transform of x is the +1 one of conj(x)
        x = jnp.conj(x)
    y = _complex_fft(x, axes[:-1], False)
    y = jnp.fft.irfft(y, n=n, axis=axes[-1], norm="forward")
    shape = list(x.shape)
    shape[axes[-1]] = n
    return [_scale(y, int(inorm), _length(shape, axes))]
