"""Dtype lists, jax_enable_x64, and tests parametrized by (dtype, x64)."""

import contextlib

import jax
import ml_dtypes
import numpy as np
import pytest

FLOAT_DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
REAL_DTYPES = [np.float32, np.float64]

# Every dtype JAX has on the CPU (jaxbind's callables see each of them)
JAX_DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    ml_dtypes.bfloat16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
]


def name(dtype) -> str:
    """The dtype's name (float32, bfloat16, ...), as test ids and binding names use it."""
    return np.dtype(dtype).name


def needs_x64(dtype) -> bool:
    """Whether JAX has `dtype` only with jax_enable_x64 on (a float of 64 bits)."""
    return np.dtype(dtype) in (np.float64, np.complex128)


def dtypes_and_x64(dtypes=FLOAT_DTYPES, *, both=True):
    """Parametrize a test by ``dtype`` and the ``x64`` fixture (tests/conftest.py), with
    only the pairs that run: each dtype with jax_enable_x64 off and on (``both=False``:
    only as the dtype needs it), and a 64-bit float never with x64 off."""
    cases = [
        pytest.param(dtype, x64, id=f"{name(dtype)}-{'x64' if x64 else 'x32'}")
        for dtype in dtypes
        for x64 in ((False, True) if both else (needs_x64(dtype),))
        if x64 or not needs_x64(dtype)
    ]
    return pytest.mark.parametrize(("dtype", "x64"), cases, indirect=["x64"])


@contextlib.contextmanager
def global_x64(enabled: bool):
    """jax_enable_x64 set to `enabled` (for every thread) inside the block."""
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", enabled)
    try:
        yield enabled
    finally:
        jax.config.update("jax_enable_x64", old)
