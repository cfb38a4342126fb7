"""What the DUCC op families share: ducc0 itself, dtype pairs, the GPU platform mode."""

from __future__ import annotations

import numpy as np

try:
    import ducc0
except ImportError as exc:  # pragma: no cover - exercised only without ducc0
    raise ImportError(
        "jaxbind.contrib.jaxducc0 needs the ducc0 package; install it with "
        "pip install 'jaxbind[ducc]'") from exc

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
