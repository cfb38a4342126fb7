"""The dtypes jaxbind can hand to Python callables, keyed by XLA element type."""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["XLA_ELEMENT_TYPES", "check_supported"]

# XLA PrimitiveType numbers (xla_data.proto / XLA_FFI_DataType) -> NumPy dtype.
XLA_ELEMENT_TYPES: dict[int, np.dtype] = {
    1: np.dtype(np.bool_),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.uint8),
    7: np.dtype(np.uint16),
    8: np.dtype(np.uint32),
    9: np.dtype(np.uint64),
    10: np.dtype(np.float16),
    11: np.dtype(np.float32),
    12: np.dtype(np.float64),
    15: np.dtype(np.complex64),
    16: np.dtype(ml_dtypes.bfloat16),
    18: np.dtype(np.complex128),
    19: np.dtype(ml_dtypes.float8_e5m2),
    20: np.dtype(ml_dtypes.float8_e4m3fn),
    23: np.dtype(ml_dtypes.float8_e4m3b11fnuz),
    24: np.dtype(ml_dtypes.float8_e5m2fnuz),
    25: np.dtype(ml_dtypes.float8_e4m3fnuz),
    28: np.dtype(ml_dtypes.float8_e4m3),
    29: np.dtype(ml_dtypes.float8_e3m4),
}

_SUPPORTED = frozenset(XLA_ELEMENT_TYPES.values())


def check_supported(dtype, where: str) -> None:
    try:
        np.dtype(dtype)
    except TypeError:  # an extended JAX dtype: PRNG keys, float0
        raise TypeError(
            f"{where} has dtype {dtype}, which is not an array of numbers jaxbind "
            "can pass to Python callables"
            + ("; pass jax.random.key_data(key) for a PRNG key" if "key" in str(dtype) else "")
        ) from None
    if np.dtype(dtype) not in _SUPPORTED:
        names = ", ".join(sorted(d.name for d in _SUPPORTED))
        raise TypeError(
            f"{where} has dtype {np.dtype(dtype).name}, which jaxbind cannot pass "
            f"to Python callables; supported: {names}"
        )
