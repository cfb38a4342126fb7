"""A compiled kernel called as the trampoline calls it, with keyword-argument buffers that
`check` owns and reads afterwards.

The trampoline hands a kernel the bytes of its array keyword arguments (cpp/kernels.h,
KernelArgs), one copy per call site, that every later call of the site reads again: a
kernel that writes them changes every later call. ``Kernel.__call__`` (and so
``abi.call_kernel``) hands each call a private copy, which hides such a write; here the
copy is check's, and it is read back after the call.
"""

from __future__ import annotations

import numpy as np

from .. import _ext
from .._kernels import Kernel, abi, state_address_for_call
from .._kwargs import KwargsDump, load_kwargs

__all__ = ["call_watched"]


def call_watched(kernel: Kernel, outs, ins, dump: KwargsDump) -> dict[str, np.ndarray]:
    """Run `kernel` on the arrays `ins` (read and written in place: a kernel's writes into
    them show) and `outs`; return its array keyword arguments as the kernel left them."""
    values = load_kwargs(dump)
    values.pop("batch_axes", None)
    where = repr(kernel)
    state = state_address_for_call(kernel, where)
    site = kernel.site_for(values, where, stateful=state is not None)
    describe = lambda arrays: tuple((0, a.shape, abi.xla_code(a.dtype)) for a in arrays)
    address = site.address(describe(ins), describe(outs))
    arrays = {
        name: np.array(values[name], order="C")  # the bytes the kernel gets
        for name, *_, array in site.kwargs
        if array is not None
    }
    status, message = abi.call_kernel(
        address,
        ins,
        outs,
        site.kwargs,
        abi_version=kernel.abi_version,
        threads=min(kernel.threads or 3, 3),
        parallel_for=_ext.parallel_for_address(),
        state=state or 0,
        arrays=arrays,
    )
    if status != 0:
        why = message or (
            "the numba kernel raised an exception" if status == -1 else f"status {status}"
        )
        raise RuntimeError(f"jaxbind: kernel {kernel.name} failed: {why}")
    return arrays
