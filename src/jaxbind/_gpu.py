"""GPU calls: CUDA device buffers handed to Python callables, zero-copy, on XLA's stream.

The CUDA FFI handler (cpp/jaxbind_ext.cc) passes each call's device pointers,
shapes, element types, XLA's stream and the device ordinal to `dispatch`. For a
binding in the default ``platform_mode="device"``, the callable receives
`CudaArray` views: they support ``__cuda_array_interface__`` (version 3, with
the stream) and ``__dlpack__``/``__dlpack_device__``, so ``cupy.asarray``,
``torch.from_dlpack`` and ``numba.cuda.as_cuda_array`` take them without a copy.
While the callable runs, XLA's stream is CuPy's and PyTorch's current stream (if
they are imported), so their kernels are ordered with the rest of the program.

With ``platform_mode="host"``, the inputs are copied to host NumPy arrays, the
CPU callable runs as on the CPU, and the outputs are copied back: this runs
CPU-only libraries (DUCC, SciPy) inside GPU programs. Copies use the CUDA driver
API (libcuda, which every NVIDIA driver installs), loaded when first needed, so
jaxbind neither builds nor imports against the CUDA toolkit.

`current_call()` tells a callable where it runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from dataclasses import dataclass

import numpy as np

from . import _ext
from ._dtypes import XLA_ELEMENT_TYPES

__all__ = ["CallContext", "CudaArray", "current_call", "dispatch"]

_KDL_CUDA = 2  # DLPack device type of CUDA memory


@dataclass(frozen=True)
class CallContext:
    """Where the running callable was called from.

    Attributes:
      platform: "cpu" or "cuda".
      stream: XLA's CUDA stream (an integer ``cudaStream_t``) on GPU, else None.
      device: the CUDA device ordinal on GPU, else None.
      mode: "device" (CUDA arrays) or "host" (NumPy copies) on GPU; "host" on CPU.
    """

    platform: str
    stream: int | None = None
    device: int | None = None
    mode: str = "host"


_CPU = CallContext("cpu")
_local = threading.local()


def current_call() -> CallContext:
    """The context of the jaxbind callable running on this thread (CPU if none)."""
    return getattr(_local, "context", None) or _CPU


# --- CUDA arrays ---------------------------------------------------------------

def _dlpack_dtype(dtype: np.dtype) -> tuple[int, int]:
    """DLPack (type code, bits) of a NumPy dtype."""
    if dtype.name == "bfloat16":
        return 4, 16
    codes = {"b": 6, "i": 0, "u": 1, "f": 2, "c": 5}
    if dtype.kind not in codes or (dtype.kind == "f" and dtype.itemsize == 1):  # float8
        raise TypeError(f"jaxbind: DLPack has no type for {dtype.name}; use "
                        "__cuda_array_interface__ or the raw pointer")
    return codes[dtype.kind], dtype.itemsize * 8


class CudaArray:
    """A zero-copy view of one XLA buffer in CUDA device memory, valid during the call.

    Attributes:
      ptr: the device pointer (int).
      shape, dtype, size, ndim, nbytes: as for NumPy arrays (C-contiguous).
      readonly: True for inputs.
      stream: XLA's stream, on which the buffer's contents are ready.
      device: the CUDA device ordinal.
    """

    __slots__ = ("ptr", "shape", "dtype", "readonly", "stream", "device", "__weakref__")

    def __init__(self, ptr, shape, dtype, readonly, stream, device):
        self.ptr, self.shape, self.dtype = int(ptr), tuple(shape), np.dtype(dtype)
        self.readonly, self.stream, self.device = readonly, stream, device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __repr__(self):
        kind = "input" if self.readonly else "output"
        return (f"<jaxbind.CudaArray {kind} {self.dtype.name}{list(self.shape)} "
                f"on cuda:{self.device}>")

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": [("", self.dtype.str)],
                "data": (self.ptr, self.readonly), "strides": None, "version": 3,
                # 0 is not allowed: the legacy default stream is 1
                "stream": self.stream if self.stream else 1}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CUDA, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("jaxbind: a CudaArray is a view of an XLA buffer; it cannot copy")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"jaxbind: the buffer is on cuda:{self.device}, not {dl_device}")
        if stream is not None and stream != -1 and stream != self.stream:
            # The consumer works on another stream: make the data ready for it.
            _driver().synchronize(self.stream)
        code, bits = _dlpack_dtype(self.dtype)
        return _ext.dlpack_view(self.ptr, list(self.shape), code, bits, _KDL_CUDA, self.device,
                                self)


# --- the CUDA driver, for host mode and stream synchronisation ------------------

class _Driver:
    """The few CUDA driver calls jaxbind needs, from libcuda through ctypes."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(f"jaxbind: cannot load the CUDA driver (libcuda.so.1): {exc}"
                               ) from None
        u64, vp, sz = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
        self._sig("cuMemcpyDtoHAsync_v2", vp, u64, sz, vp)
        self._sig("cuMemcpyHtoDAsync_v2", u64, vp, sz, vp)
        self._sig("cuStreamSynchronize", vp)

    def _sig(self, name, *argtypes):
        fn = getattr(self.lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"jaxbind: {what} failed with CUDA driver error {status}")

    def synchronize(self, stream: int) -> None:
        self._check(self.lib.cuStreamSynchronize(stream or None), "cuStreamSynchronize")

    def to_host(self, dst: np.ndarray, src: int, stream: int) -> None:
        if dst.nbytes:
            self._check(self.lib.cuMemcpyDtoHAsync_v2(dst.ctypes.data, src, dst.nbytes,
                                                      stream or None), "device-to-host copy")

    def to_device(self, dst: int, src: np.ndarray, stream: int) -> None:
        if src.nbytes:
            self._check(self.lib.cuMemcpyHtoDAsync_v2(dst, src.ctypes.data, src.nbytes,
                                                      stream or None), "host-to-device copy")


_driver_instance = None


def _driver() -> _Driver:
    global _driver_instance
    if _driver_instance is None:
        _driver_instance = _Driver()
    return _driver_instance


# --- dispatch --------------------------------------------------------------------

@contextlib.contextmanager
def _frameworks_on(stream: int, device: int):
    """Make XLA's stream the current stream of CuPy and PyTorch, where imported."""
    with contextlib.ExitStack() as stack:
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            stack.enter_context(cupy.cuda.Device(device))
            stack.enter_context(cupy.cuda.ExternalStream(stream, device))
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            stack.enter_context(torch.cuda.stream(
                torch.cuda.ExternalStream(stream, device=torch.device("cuda", device))))
        yield


def _element(buffers, levels, k, batched):
    """(pointer, shape, dtype) of batch element k of each buffer (all of them if levels=0)."""
    out = []
    for i, (ptr, shape, code) in enumerate(buffers):
        dtype = XLA_ELEMENT_TYPES[code]
        if levels and (not batched or batched[i]):
            core = shape[levels:]
            ptr += k * int(np.prod(core, dtype=np.int64)) * dtype.itemsize
            shape = core
        out.append((ptr, shape, dtype))
    return out


def _batch_count(outs, levels) -> int:
    """Number of batch elements of jaxbind's loop: the leading `levels` axes of output 0."""
    return int(np.prod(outs[0][1][:levels], dtype=np.int64)) if levels and outs else 1


def dispatch(callable_, kwargs_dump, mode, levels, batched, stream, device, ins, outs):
    """Run one GPU call (called by the CUDA FFI handler, with the GIL held)."""
    for ptr, shape, code in (*ins, *outs):
        if code not in XLA_ELEMENT_TYPES:
            raise TypeError(f"a buffer has XLA element type {code}, which jaxbind cannot wrap")
    previous = getattr(_local, "context", None)
    _local.context = CallContext("cuda", stream, device, mode)
    try:
        if mode == "host":
            _run_on_host(callable_, kwargs_dump, levels, batched, stream, ins, outs)
        else:
            _run_on_device(callable_, kwargs_dump, levels, batched, stream, device, ins, outs)
    finally:
        _local.context = previous


def _run_on_device(callable_, kwargs_dump, levels, batched, stream, device, ins, outs):
    with _frameworks_on(stream, device):
        for k in range(_batch_count(outs, levels)):
            args = tuple(CudaArray(p, s, d, True, stream, device)
                         for p, s, d in _element(ins, levels, k, batched))
            out = tuple(CudaArray(p, s, d, False, stream, device)
                        for p, s, d in _element(outs, levels, k, ()))
            callable_(out, args, kwargs_dump)


def _run_on_host(callable_, kwargs_dump, levels, batched, stream, ins, outs):
    driver = _driver()
    host_in = []
    for ptr, shape, code in ins:
        a = np.empty(shape, XLA_ELEMENT_TYPES[code])
        driver.to_host(a, ptr, stream)
        host_in.append(a)
    host_out = [np.empty(shape, XLA_ELEMENT_TYPES[code]) for _, shape, code in outs]
    driver.synchronize(stream)  # the inputs have arrived
    for a in host_in:
        a.flags.writeable = False
    for k in range(_batch_count(outs, levels)):
        if levels:
            args = tuple(a[np.unravel_index(k, a.shape[:levels])] if (not batched or batched[i])
                         else a for i, a in enumerate(host_in))
            out = tuple(o[np.unravel_index(k, o.shape[:levels])] for o in host_out)
        else:
            args, out = tuple(host_in), tuple(host_out)
        callable_(out, args, kwargs_dump)
    for (ptr, _, _), o in zip(outs, host_out):
        driver.to_device(ptr, o, stream)  # host_out arrays are C-contiguous
