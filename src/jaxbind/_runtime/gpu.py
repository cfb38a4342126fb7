"""GPU calls: CUDA device buffers handed to Python callables, zero-copy, on XLA's stream.

The CUDA FFI handler (cpp/jaxbind_ext.cc) runs jaxbind's batch loop and passes each
call's (or batch element's) device pointers, shapes, element types, XLA's stream and the
device ordinal to `dispatch`. For a
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
import functools
import sys
import threading
from dataclasses import dataclass

import numpy as np

from .. import _ext
from .._avals import XLA_ELEMENT_TYPES
from .state import StatefulBody

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

_DLPACK_KINDS = {"b": 6, "i": 0, "u": 1, "f": 2, "c": 5}
_dlpack_types: dict = {}  # dtype -> (code, bits): dtype.name is slow, and this is per call


def _dlpack_dtype(dtype: np.dtype) -> tuple[int, int]:
    """DLPack (type code, bits) of a NumPy dtype."""
    found = _dlpack_types.get(dtype)
    if found is None:
        if dtype.name == "bfloat16":
            found = (4, 16)
        elif dtype.kind not in _DLPACK_KINDS or (dtype.kind == "f" and dtype.itemsize == 1):
            raise TypeError(
                f"jaxbind: DLPack has no type for {dtype.name}; use "  # float8
                "__cuda_array_interface__ or the raw pointer"
            )
        else:
            found = (_DLPACK_KINDS[dtype.kind], dtype.itemsize * 8)
        _dlpack_types[dtype] = found
    return found


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
        return (
            f"<jaxbind.CudaArray {kind} {self.dtype.name}{list(self.shape)} on cuda:{self.device}>"
        )

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "descr": [("", self.dtype.str)],
            "data": (self.ptr, self.readonly),
            "strides": None,
            "version": 3,
            # 0 is not allowed: the legacy default stream is 1
            "stream": self.stream if self.stream else 1,
        }

    def _not_numpy(self, *args, **kwargs):
        raise TypeError(
            f"jaxbind: {self!r} is a CUDA device buffer, not a NumPy array: in a GPU program a "
            "binding with platform_mode='device' receives CUDA arrays (use cupy.asarray, "
            "torch.from_dlpack, ...). For a CPU-only library pass platform_mode='host'"
        )

    __array__ = __getitem__ = __setitem__ = __iter__ = _not_numpy

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CUDA, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("jaxbind: a CudaArray is a view of an XLA buffer; it cannot copy")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"jaxbind: the buffer is on cuda:{self.device}, not {dl_device}")
        if stream is not None and stream != -1 and stream != self.stream:
            # The consumer works on another stream: that stream waits for XLA's.
            _driver().order(self.stream, stream, self.device)
        code, bits = _dlpack_dtype(self.dtype)
        return _ext.dlpack_view(
            self.ptr, list(self.shape), code, bits, _KDL_CUDA, self.device, self
        )


# --- the CUDA driver, for host mode and stream synchronisation ------------------


class _Driver:
    """The few CUDA driver calls jaxbind needs, from libcuda through ctypes."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(
                f"jaxbind: cannot load the CUDA driver (libcuda.so.1): {exc}"
            ) from None
        u64, vp, sz = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
        self._sig("cuMemcpyDtoHAsync_v2", vp, u64, sz, vp)
        self._sig("cuMemcpyHtoDAsync_v2", u64, vp, sz, vp)
        self._sig("cuStreamSynchronize", vp)
        self._sig("cuEventCreate", ctypes.POINTER(vp), ctypes.c_uint)
        self._sig("cuEventRecord", vp, vp)
        self._sig("cuStreamWaitEvent", vp, vp, ctypes.c_uint)
        self._events = threading.local()  # one event per thread and device

    def _sig(self, name, *argtypes):
        fn = getattr(self.lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"jaxbind: {what} failed with CUDA driver error {status}")

    def synchronize(self, stream: int) -> None:
        self._check(self.lib.cuStreamSynchronize(stream or None), "cuStreamSynchronize")

    def order(self, producer: int, consumer: int, device: int) -> None:
        """Make `consumer` wait, on the GPU, for the work enqueued so far on `producer`.

        An event recorded on the producer and waited for by the consumer: the host does
        not wait. Falls back to synchronizing the producer if the driver refuses.
        """
        # typeshed gives every __dict__ str keys; this thread's events go by device
        events: dict[int, ctypes.c_void_p] = self._events.__dict__  # type: ignore[assignment]
        event = events.get(device)
        if event is None:
            handle = ctypes.c_void_p()
            if self.lib.cuEventCreate(ctypes.byref(handle), 0x2) != 0:  # DISABLE_TIMING
                return self.synchronize(producer)
            event = events[device] = handle
        if (
            self.lib.cuEventRecord(event, producer or None) != 0
            or self.lib.cuStreamWaitEvent(consumer or None, event, 0) != 0
        ):
            self.synchronize(producer)

    def to_host(self, dst: np.ndarray, src: int, stream: int) -> None:
        if dst.nbytes:
            self._check(
                self.lib.cuMemcpyDtoHAsync_v2(dst.ctypes.data, src, dst.nbytes, stream or None),
                "device-to-host copy",
            )

    def to_device(self, dst: int, src: np.ndarray, stream: int) -> None:
        if src.nbytes:
            self._check(
                self.lib.cuMemcpyHtoDAsync_v2(dst, src.ctypes.data, src.nbytes, stream or None),
                "host-to-device copy",
            )


_driver_instance = None


def _on_host(a) -> np.ndarray:
    """An input's values on the host: a device array's copied (waiting for the copy on the
    array's stream); a host-mode input is one already."""
    if not isinstance(a, CudaArray):
        return np.asarray(a)
    out = np.empty(a.shape, a.dtype)
    driver = _driver()
    driver.to_host(out, a.ptr, a.stream)
    driver.synchronize(a.stream)
    return out


def _driver() -> _Driver:
    global _driver_instance
    if _driver_instance is None:
        _driver_instance = _Driver()
    return _driver_instance


# --- dispatch --------------------------------------------------------------------


class _StreamRef:
    """An XLA stream under the CUDA stream protocol (``__cuda_stream__``)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def cupy_stream(stream: int, device: int):
    """A CuPy stream object for XLA's stream (not owned: CuPy never destroys it).

    CuPy 14 deprecates ``ExternalStream`` for ``Stream.from_external``; both work.
    """
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamRef(stream))
    return cupy.cuda.ExternalStream(stream, device)


_NO_CONTEXT = contextlib.nullcontext()
_framework_streams: dict = {}


def _streams_for(stream: int, device: int) -> tuple:
    """Context managers that make XLA's stream current in CuPy and in PyTorch (where imported).

    Built once per stream and set of imported frameworks: XLA keeps its streams for the
    life of the client, and the wrappers own nothing (they never destroy the stream).
    """
    cupy, torch = sys.modules.get("cupy"), sys.modules.get("torch")
    key = (stream, device, cupy is not None, torch is not None)
    found = _framework_streams.get(key)
    if found is None:
        cupy_on = torch_on = None
        if cupy is not None:
            with cupy.cuda.Device(device):
                cupy_on = cupy_stream(stream, device)
        if torch is not None and torch.cuda.is_available():
            torch_on = torch.cuda.ExternalStream(stream, device=torch.device("cuda", device))
        found = _framework_streams[key] = (cupy_on, torch_on)
    cupy_on, torch_on = found
    # A fresh Device and torch context each call (they hold the state they restore).
    return (
        (_NO_CONTEXT, _NO_CONTEXT)
        if cupy is None or cupy_on is None
        else (cupy.cuda.Device(device), cupy_on)
    ) + ((_NO_CONTEXT,) if torch is None or torch_on is None else (torch.cuda.stream(torch_on),))


_contexts: dict = {}  # CallContext by (stream, device, mode): one object per stream


def dispatch(resolved, stream: int, device: int, ins: tuple, outs: tuple) -> None:
    """Run one GPU call of a site's callable, or one batch element of it (called by the
    trampoline, which runs jaxbind's batch loop, with the GIL held). `resolved` is the
    site (see resolve.Resolved); each buffer is ``(device address, shape, XLA element
    type)``."""
    for _ptr, _shape, code in (*ins, *outs):
        if code not in XLA_ELEMENT_TYPES:
            raise TypeError(f"a buffer has XLA element type {code}, which jaxbind cannot wrap")
    mode = resolved.platform_mode
    body = resolved.callable
    if isinstance(body, StatefulBody):  # the state of this device (see .state)
        body = functools.partial(body.on_gpu, device, _on_host)
    previous = getattr(_local, "context", None)
    context = _contexts.get((stream, device, mode))
    if context is None:
        context = _contexts[stream, device, mode] = CallContext("cuda", stream, device, mode)
    _local.context = context
    try:
        if mode == "host":
            _run_on_host(body, resolved.kwargs_dump, stream, ins, outs, _driver())
        else:
            _run_on_device(body, resolved.kwargs_dump, stream, device, ins, outs)
    finally:
        _local.context = previous


def _run_on_device(callable_, kwargs_dump, stream, device, ins, outs) -> None:
    """Device mode: the callable gets CudaArray views, with XLA's stream current in CuPy
    and PyTorch."""
    args = tuple(
        CudaArray(p, shape, XLA_ELEMENT_TYPES[c], True, stream, device) for p, shape, c in ins
    )
    out = tuple(
        CudaArray(p, shape, XLA_ELEMENT_TYPES[c], False, stream, device) for p, shape, c in outs
    )
    cupy_device, cupy_on, torch_on = _streams_for(stream, device)
    with cupy_device, cupy_on, torch_on:
        callable_(out, args, kwargs_dump)


def _run_on_host(callable_, kwargs_dump, stream, ins, outs, driver) -> None:
    """Host mode: the buffers copied to the host, the callable called on NumPy arrays
    (the inputs read-only), the outputs copied back. `driver` copies (see _Driver)."""
    host_in = []
    for ptr, shape, code in ins:
        a = np.empty(shape, XLA_ELEMENT_TYPES[code])
        driver.to_host(a, ptr, stream)
        host_in.append(a)
    host_out = [np.empty(shape, XLA_ELEMENT_TYPES[code]) for _, shape, code in outs]
    driver.synchronize(stream)  # the inputs have arrived
    by_address = {ptr: a for (ptr, _, _), a in zip(ins, host_in)}
    for (ptr, _, _), o in zip(outs, host_out):  # input_output_aliases: same device memory
        if ptr in by_address and by_address[ptr].shape == o.shape:
            o[...] = by_address[ptr]  # the output starts as the input, as on the device
    for a in host_in:
        a.flags.writeable = False
    callable_(tuple(host_out), tuple(host_in), kwargs_dump)
    for (ptr, _, _), o in zip(outs, host_out):
        driver.to_device(ptr, o, stream)  # host_out arrays are C-contiguous
