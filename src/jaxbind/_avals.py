"""Abstract values as jaxbind declares and checks them, at trace time and at run time.

- the dtypes jaxbind can hand to Python callables, keyed by XLA element type;
- `check_result`: the ``(shape, dtype[, out_batch_axis])`` entries an abstract function
  returns, checked (the lowering's abstract evaluation and the runtime's check of
  exported programs' buffers both read them).
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.export  # a submodule: not loaded by "import jax"
import ml_dtypes
import numpy as np

from ._compat import InconclusiveDimensionOperation

__all__ = ["XLA_ELEMENT_TYPES", "check_result", "check_supported", "shown"]

is_symbolic_dim = jax.export.is_symbolic_dim  # public since jax 0.4.30

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


def check_supported(dtype: Any, where: str) -> None:
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


def check_result(
    result: object, where: str, batched: bool
) -> list[tuple[tuple[Any, ...], np.dtype, int | None]]:
    """[(shape, dtype, out_batch_axis | None)] from what an abstract function returned."""
    must = (
        "it must return a tuple with one (shape, dtype) or (shape, dtype, out_batch_axis) "
        "per output"
    )
    if not isinstance(result, (tuple, list)) or _one_entry(result):
        raise TypeError(f"{where} returned {shown(result)}; {must}{_hint(result)}")
    outs = []
    for i, entry in enumerate(result):
        if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
            raise TypeError(
                f"{where} returned {shown(result)}, whose output {i} is {shown(entry)}; "
                f"{must}{_hint(result)}"
            )
        shape, dtype = _shape(entry[0], f"{where}: output {i}"), entry[1]
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(
                f"{where}: output {i} has dtype {dtype!r}, which is not a NumPy dtype"
            ) from None
        check_supported(dtype, f"{where}: output {i}")
        axis = None
        if len(entry) == 3 and batched:  # unbatched, JAXbind 1.3 ignores it (often "()")
            try:
                axis = operator.index(entry[2])
            except TypeError:
                raise TypeError(
                    f"{where}: output {i} has out_batch_axis {entry[2]!r}; when "
                    "batch_axes is set it must be an integer"
                ) from None
            if not -len(shape) <= axis < max(len(shape), 1):
                raise ValueError(
                    f"{where}: output {i} has out_batch_axis {axis}, "
                    f"outside its {len(shape)} dimensions"
                )
            axis %= max(len(shape), 1)
        outs.append((shape, jax.dtypes.canonicalize_dtype(dtype), axis))
    return outs


def shown(value: object, limit: int = 120) -> str:
    """`value` as a message shows it: its repr, shortened (what a user's function returned)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hint(result: object) -> str:
    """What a wrongly formed abstract result looks like it meant, if anything."""
    if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(result)):
        return (
            " (jax.ShapeDtypeStruct is how the shape functions of the decorators linear_op, "
            "multilinear_op and nonlinear_op say it; here write ((x.shape, x.dtype),) for "
            "one output)"
        )
    if _one_entry(result):
        return (
            " (that is one output's (shape, dtype): put it in a tuple of outputs, "
            "((shape, dtype),), e.g. return ((x.shape, x.dtype),))"
        )
    return ""


def _one_entry(result: object) -> bool:
    """Whether an abstract function's result is one output's (shape, dtype[, axis]) where
    a tuple of them belongs: a shape (a tuple of integers), then something that is not."""
    return (
        isinstance(result, (tuple, list))
        and len(result) in (2, 3)
        and isinstance(result[0], (tuple, list))
        and all(isinstance(d, int) or is_symbolic_dim(d) for d in result[0])
        and not isinstance(result[1], (tuple, list))
    )


def _shape(shape: Any, where: str) -> tuple[Any, ...]:
    """A declared shape as a tuple of ints and JAX symbolic dimensions (jax.export).

    Symbolic dimensions (``b``, ``2 * b``, ``n // 2 + 1``) come from abstract
    functions that compute with the shapes of symbolic inputs; XLA evaluates them
    for the concrete shapes when the program runs.
    """
    try:
        dims = tuple(d if is_symbolic_dim(d) else operator.index(d) for d in shape)
    except TypeError:
        hint = f": write ({shape},) for one dimension" if isinstance(shape, int) else ""
        raise TypeError(
            f"{where} has shape {shape!r}, which is not a tuple of integers "
            f"(or of symbolic dimensions, under jax.export){hint}"
        ) from None
    for d in dims:
        try:
            negative = d < 0
        except InconclusiveDimensionOperation:  # e.g. b - 2: negative for b < 2
            raise ValueError(
                f"{where} has the dimension {d}, which is negative for some values of its "
                f"symbols; state the bound when exporting, e.g. jax.export.symbolic_shape(..., "
                f'constraints=("{d} >= 0",))'
            ) from None
        if negative:
            raise ValueError(f"{where} has negative dimensions {shape}")
    size = 1
    for d in dims:
        if not is_symbolic_dim(d):
            size *= d
    if size >= 2**63:
        raise ValueError(
            f"{where} has shape {shape}, with {size} elements: more than a 64-bit size can count"
        )
    return dims
