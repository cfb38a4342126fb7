"""A compiled kernel called as the trampoline calls it, with keyword-argument buffers that
`check` owns and reads afterwards.

The trampoline hands a kernel the bytes of its array keyword arguments (cpp/kernels.h,
KernelArgs), one copy per call site, that every later call of the site reads again: a
kernel that writes them changes every later call. ``Kernel.__call__`` (and so
``abi.call_kernel``) hands each call a private copy, which hides such a write; here the
copy is check's, and it is read back after the call.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import _ext
from .._kernels import Kernel, abi
from .._kwargs import KwargsDump, load_kwargs

__all__ = ["call_watched"]

_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)


def call_watched(kernel: Kernel, outs, ins, dump: KwargsDump) -> dict[str, np.ndarray]:
    """Run `kernel` on the arrays `ins` (read and written in place: a kernel's writes into
    them show) and `outs`; return its array keyword arguments as the kernel left them."""
    values = load_kwargs(dump)
    values.pop("batch_axes", None)
    where = repr(kernel)
    call = kernel.call_for(values, where)
    describe = lambda arrays: tuple((0, a.shape, abi.xla_code(a.dtype)) for a in arrays)
    address = call.address(describe(ins), describe(outs))
    keep: list[object] = []
    arrays: dict[str, np.ndarray] = {}

    def pointer(data) -> int:
        keep.append(data)
        if isinstance(data, np.ndarray):
            return int(data.ctypes.data)
        return ctypes.addressof(data)

    def buffer_row(a: np.ndarray) -> dict[str, int]:
        dims = np.asarray(a.shape, np.int64)
        return {
            "data": pointer(a),
            "dtype": abi.xla_code(a.dtype),
            "rank": a.ndim,
            "dims": pointer(dims),
        }

    rows = []
    for name, kind, int_value, float_value, string, array in call.kwargs:
        row = {
            "name": pointer(ctypes.create_string_buffer(name.encode())),
            "type": kind,
            "int_value": int_value,
            "float_value": float_value,
        }
        if string is not None:
            row.update(string=pointer(ctypes.create_string_buffer(string)), string_size=len(string))
        if array is not None:
            original = np.asarray(values[name])
            arrays[name] = own = np.array(original, order="C")  # the bytes the kernel gets
            row.update({f"array.{k}": v for k, v in buffer_row(own).items()})
        rows.append(row)
    error = ctypes.create_string_buffer(1024)
    in_words = abi.BUFFER.pack([buffer_row(a) for a in ins])
    out_words = abi.BUFFER.pack([buffer_row(a) for a in outs])
    kw_words = abi.KWARG.pack(rows)
    words = abi.CALL.pack(
        [
            {
                "abi_version": kernel.abi_version,
                "n_inputs": len(ins),
                "inputs": pointer(in_words),
                "n_outputs": len(outs),
                "outputs": pointer(out_words),
                "n_kwargs": len(rows),
                "kwargs": pointer(kw_words),
                "error": pointer(error),
                "error_size": len(error),
                "n_threads": min(kernel.threads or 3, 3),
                "parallel_for": _ext.parallel_for_address(),
            }
        ]
    )
    status = _SIGNATURE(address)(words.ctypes.data)
    if status != 0:
        why = error.value.decode(errors="replace") or (
            "the numba kernel raised an exception" if status == -1 else f"status {status}"
        )
        raise RuntimeError(f"jaxbind: kernel {kernel.name} failed: {why}")
    return arrays
