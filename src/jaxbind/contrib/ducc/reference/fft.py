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

``nthreads`` does not change the result and is ignored. JAX's FFTs take at most three
axes at once, so longer ``axes`` are transformed in groups (the transforms separate).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

__all__ = ["c2c", "genuine_fht", "r2c", "c2r"]


def fft_axes(ndim: int, axes=None, batch_axes=None) -> list[int]:
    """The transformed array axes, as the op reads ``axes``: None for every non-batch
    axis, else indices (negative ones too) among the non-batch axes."""
    batch = batch_axes[0] if batch_axes else ()
    core = [i for i in range(ndim) if i not in batch]
    if axes is None:
        return core
    axes = [axes] if isinstance(axes, int) else list(axes)
    return [core[a] for a in axes]


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


def c2c(x, *, axes=None, forward=True, inorm=0, nthreads=1, batch_axes=None, **_):
    """Reference of `..fft.c2c`: ``[y]``, the complex FFT of `x` over `axes`."""
    del nthreads
    axes = fft_axes(x.ndim, axes, batch_axes)
    y = _complex_fft(x, axes, bool(forward))
    return [_scale(y, int(inorm), _length(x.shape, axes))]


def genuine_fht(x, *, axes=None, inorm=0, nthreads=1, batch_axes=None, **_):
    """Reference of `..fft.genuine_fht`: ``[y]``, Re(F) - Im(F) of the forward FFT of
    the real `x` over `axes` (the kernel cas(t) = cos(t) + sin(t) of the whole phase)."""
    del nthreads
    axes = fft_axes(x.ndim, axes, batch_axes)
    f = _complex_fft(x, axes, True)
    return [_scale(jnp.real(f) - jnp.imag(f), int(inorm), _length(x.shape, axes))]


def r2c(x, *, n=None, axes=None, forward=True, inorm=0, nthreads=1, batch_axes=None, **_):
    """Reference of `..fft.r2c`: ``[y]``, the real-to-complex FFT of `x`, the last of
    `axes` shrunk to ``n // 2 + 1`` (`n` is its length, as the op's wrapper passes)."""
    del nthreads, n
    axes = fft_axes(x.ndim, axes, batch_axes)
    y = jnp.fft.rfft(x, axis=axes[-1], norm="backward")
    y = _complex_fft(y, axes[:-1], True)
    if not forward:  # x is real: the +1 transform is the conjugate of the -1 one
        y = jnp.conj(y)
    return [_scale(y, int(inorm), _length(x.shape, axes))]


def c2r(x, *, n, axes=None, forward=True, inorm=0, nthreads=1, batch_axes=None, **_):
    """Reference of `..fft.c2r`: ``[y]``, the real signal of length `n` (the op's
    ``lastsize``) along the last of `axes` whose half spectrum is `x`."""
    del nthreads
    axes = fft_axes(x.ndim, axes, batch_axes)
    if forward:  # the result is real: the -1 transform of x is the +1 one of conj(x)
        x = jnp.conj(x)
    y = _complex_fft(x, axes[:-1], False)
    y = jnp.fft.irfft(y, n=n, axis=axes[-1], norm="forward")
    shape = list(x.shape)
    shape[axes[-1]] = n
    return [_scale(y, int(inorm), _length(shape, axes))]
