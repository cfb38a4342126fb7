"""The kernel ABI's layout: the one table of ``jaxbind/kernel.h``'s structs.

Every field of the ABI's structs is one 8-byte word (an array keyword argument holds a
whole ``jaxbind_buffer``), so a struct is a row of 64-bit words and a field is an
offset into it. The header declares the fields in this order (tests/kernels/test_kernels.py
reads the header against this table; cpp/kernels.h asserts the sizes), the packing
below writes by it, and the numba code generator (numba_codegen.py) reads by it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from .._avals import XLA_ELEMENT_TYPES

__all__ = [
    "ABI_VERSION",
    "ABI_VERSIONS",
    "BUFFER",
    "CALL",
    "KWARG",
    "PLATFORMS",
    "SETUP",
    "Struct",
    "call_kernel",
    "pack_kwargs",
    "typed_kwarg",
]

ABI_VERSION = 4  # JAXBIND_KERNEL_ABI_VERSION
ABI_VERSIONS = (1, 2, 3, 4)  # the versions a kernel may be registered for (each appends fields)


class Struct:
    """One struct of the ABI: its C name and its fields, in order, with their offsets in
    8-byte words (``struct["field"]``, ``struct["array.dims"]`` for a nested struct's)."""

    def __init__(self, name: str, *fields: str | tuple[str, Struct]):
        self.offsets: dict[str, int] = {}
        self.name, at = name, 0
        for field in fields:
            field_name, inner = (field, None) if isinstance(field, str) else field
            self.offsets[field_name] = at
            if inner is not None:
                for inner_name, offset in inner.offsets.items():
                    self.offsets[f"{field_name}.{inner_name}"] = at + offset
            at += inner.words if inner is not None else 1
        self.fields = tuple(f if isinstance(f, str) else f[0] for f in fields)
        self.words: int = at

    def __getitem__(self, field: str) -> int:
        return self.offsets[field]

    def pack(self, rows: Sequence[Mapping[str, int | float]]) -> np.ndarray:
        """Rows of this struct as 64-bit words (at least one row, zeros); a float value
        is stored as its IEEE bits."""
        words = np.zeros((max(len(rows), 1), self.words), np.int64)
        for r, row in enumerate(rows):
            for field, value in row.items():
                at = self.offsets[field]
                if isinstance(value, float):
                    words[r, at : at + 1].view(np.float64)[0] = value
                else:
                    words[r, at] = value
        return words


BUFFER = Struct("jaxbind_buffer", "data", "dtype", "rank", "dims")
KWARG = Struct(
    "jaxbind_kwarg",
    "name",
    "type",
    "int_value",
    "float_value",
    "string",
    "string_size",
    ("array", BUFFER),
)
CALL = Struct(
    "jaxbind_call",
    "abi_version",
    "n_inputs",
    "inputs",
    "n_outputs",
    "outputs",
    "n_kwargs",
    "kwargs",
    "batch_levels",
    "batched",
    "error",
    "error_size",
    "n_threads",  # version 2
    "parallel_for",
    "workers",
    "state",  # version 3
    "platform",  # version 4
    "stream",
    "device",
)
SETUP = Struct(
    "jaxbind_setup",
    "abi_version",
    "n_kwargs",
    "kwargs",
    "error",
    "error_size",
    "platform",  # version 4
    "stream",
    "device",
)

# enum jaxbind_platform
PLATFORMS = {"cpu": 1, "cuda": 2}

# enum jaxbind_kwarg_type
INT, FLOAT, BOOL, STRING, ARRAY = 1, 2, 3, 4, 5
_XLA_CODE = {dtype: code for code, dtype in XLA_ELEMENT_TYPES.items()}
_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)

# One keyword argument as `typed_kwarg` gives it
TypedKwarg = tuple[str, int, int, float, bytes | None, tuple[int, list[int], bytes] | None]


def xla_code(dtype: npt.DTypeLike) -> int:
    """The ABI's (XLA's) element type of a NumPy dtype."""
    code = _XLA_CODE.get(np.dtype(dtype))
    if code is None:
        raise TypeError(f"jaxbind: kernels take no arrays of dtype {np.dtype(dtype)}")
    return code


def typed_kwarg(name: str, value: object, where: str) -> TypedKwarg:
    """One static keyword argument as the trampoline stores it for the ABI
    (cpp/kernels.h, KernelArgs): (name, type, int value, float value, bytes or None,
    (dtype, dims, bytes) or None)."""
    if isinstance(value, (bool, np.bool_)):
        return (name, BOOL, int(value), 0.0, None, None)
    if isinstance(value, (int, np.integer)):
        if not -(2**63) <= int(value) < 2**63:
            raise OverflowError(f"{where}: keyword argument {name!r} does not fit in int64")
        return (name, INT, int(value), 0.0, None, None)
    if isinstance(value, (float, np.floating)):
        return (name, FLOAT, 0, float(value), None, None)
    if isinstance(value, str):
        return (name, STRING, 0, 0.0, value.encode(), None)
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(
            f"{where}: a kernel cannot take the masked array {name!r}: it takes no mask, and "
            "would see the masked elements as values. Pass its data and its mask "
            "(np.ma.getmaskarray) as two keyword arguments"
        )
    if isinstance(value, np.ndarray):
        array = np.asarray(value, order="C")  # 0-d stays 0-d
        return (
            name,
            ARRAY,
            0,
            0.0,
            None,
            (xla_code(array.dtype), list(array.shape), array.tobytes()),
        )
    raise TypeError(
        f"{where}: a kernel takes keyword arguments that are ints, floats, bools, strings or "
        f"NumPy arrays; {name!r} is {type(value).__name__}"
    )


def pack_kwargs(
    kwargs: Sequence[TypedKwarg], keep: list[object], arrays: Mapping[str, np.ndarray] | None = None
) -> np.ndarray:
    """Keyword arguments (as `typed_kwarg` gives them) as the ABI's jaxbind_kwarg rows;
    what the rows point to is appended to `keep`, which must outlive them. An array's
    bytes are a copy, or the C-contiguous array of its name in `arrays`."""

    def text(data: bytes) -> int:
        buffer = ctypes.create_string_buffer(data)
        keep.append(buffer)
        return ctypes.addressof(buffer)

    rows = []
    for name, kind, int_value, float_value, string, array in kwargs:
        row = {
            "name": text(name.encode()),
            "type": kind,
            "int_value": int_value,
            "float_value": float_value,
        }
        if string is not None:
            row.update(string=text(string), string_size=len(string))
        if array is not None:
            own = None if arrays is None else arrays.get(name)
            data = np.frombuffer(array[2], np.uint8).copy() if own is None else own
            dims = np.asarray(array[1], np.int64)
            keep.extend((data, dims))
            row.update({"array.data": data.ctypes.data, "array.dtype": array[0]})
            row.update({"array.rank": len(array[1]), "array.dims": dims.ctypes.data})
        rows.append(row)
    words = KWARG.pack(rows)
    keep.append(words)
    return words


def call_kernel(
    address: int,
    ins: Sequence[np.ndarray],
    outs: Sequence[np.ndarray],
    kwargs: Sequence[TypedKwarg],
    *,
    abi_version: int = ABI_VERSION,
    threads: int = 1,
    parallel_for: int = 0,
    state: int = 0,
    arrays: Mapping[str, np.ndarray] | None = None,
    platform: str = "cpu",
    stream: int = 0,
    device: int = -1,
) -> tuple[int, str]:
    """Call the kernel at `address` from Python, as the trampoline does: `ins` and `outs`
    are C-contiguous NumPy arrays, `kwargs` what `typed_kwarg` gives. `parallel_for` is
    the address of the ABI's parallel_for, which, with no workers, runs the tasks in
    order on this thread; `threads` is the thread count the kernel is told; `state` the
    address of the op's state (0: none); `platform`, `stream` and `device` where the call
    says it runs (the CPU: no stream, device -1). An array keyword argument's bytes are a copy
    for the call, or the C-contiguous array of its name in `arrays` (which the caller
    reads afterwards: jaxbind.testing watches a kernel's writes). Returns the status and
    the kernel's message."""
    keep: list[object] = []

    def buffer_row(a: np.ndarray) -> dict[str, int]:
        dims = np.asarray(a.shape, np.int64)
        keep.append(dims)
        return {
            "data": a.ctypes.data,
            "dtype": xla_code(a.dtype),
            "rank": a.ndim,
            "dims": dims.ctypes.data,
        }

    kw_words = pack_kwargs(kwargs, keep, arrays)
    in_words, out_words = (
        BUFFER.pack([buffer_row(a) for a in ins]),
        BUFFER.pack([buffer_row(a) for a in outs]),
    )
    error = ctypes.create_string_buffer(1024)
    call = CALL.pack(
        [
            {
                "abi_version": abi_version,
                "n_inputs": len(ins),
                "inputs": in_words.ctypes.data,
                "n_outputs": len(outs),
                "outputs": out_words.ctypes.data,
                "n_kwargs": len(kwargs),
                "kwargs": kw_words.ctypes.data,
                "error": ctypes.addressof(error),
                "error_size": len(error),
                "n_threads": threads,
                "parallel_for": parallel_for,
                "state": state,
                "platform": PLATFORMS[platform],
                "stream": stream,
                "device": device,
            }
        ]
    )
    status = _SIGNATURE(address)(call.ctypes.data)
    return status, error.value.decode(errors="replace")
