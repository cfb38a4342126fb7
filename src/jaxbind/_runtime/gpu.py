"""GPU calls: CUDA device buffers handed to Python callables, zero-copy, on XLA's stream.

The CUDA FFI handler (cpp/jaxbind_ext.cc) runs jaxbind's batch loop. Per call site, the
first call (and one with another stream, device or buffer signature) asks `plan` for a
`Plan`: the checks of the element types, the body (a state's, for an op with state), the
`CallContext` and one `CudaArray` view per buffer, worked out once. The trampoline keeps
the plan on the site (cpp/gpu.h); per call (per batch element), it sets each view's
``ptr`` to the element's device address and calls the plan, which sets
`current_call()`, makes the device and XLA's stream current in CuPy and PyTorch (where
they are imported) and calls the callable. A callable that keeps a view gets new ones
at its next call; the kept one keeps its address.

For a binding in the default ``platform_mode="device"``, the callable receives the
`CudaArray` views: they support ``__cuda_array_interface__`` (version 3, with the
stream) and ``__dlpack__``/``__dlpack_device__``, so ``cupy.asarray``,
``torch.from_dlpack`` and ``numba.cuda.as_cuda_array`` take them without a copy. While
the callable runs, XLA's stream is CuPy's and PyTorch's current stream, so their kernels
are ordered with the rest of the program.

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
from .._state import setup_place
from . import state as runtime_state
from .state import StatefulBody

__all__ = ["CallContext", "CudaArray", "Plan", "current_call", "plan"]

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
    """The context of the jaxbind callable running on this thread (CPU if none); during
    the setup of a kernel for CUDA's state, the device and stream of the call it is set
    up for."""
    context = getattr(_local, "context", None)
    if context is not None:
        return context
    place = setup_place()
    return _CPU if place is None else CallContext(*place, "device")


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

    __slots__ = ("ptr", "shape", "dtype", "readonly", "stream", "device", "_dl", "__weakref__")

    def __init__(self, ptr, shape, dtype, readonly, stream, device):
        self.ptr, self.shape, self.dtype = int(ptr), tuple(shape), np.dtype(dtype)
        self.readonly, self.stream, self.device = readonly, stream, device
        self._dl: tuple[int, int] | None = None  # DLPack's (type code, bits), when first asked

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
        dl = self._dl
        if dl is None:
            dl = self._dl = _dlpack_dtype(self.dtype)
        return _ext.dlpack_view(self.ptr, self.shape, dl[0], dl[1], _KDL_CUDA, self.device, self)


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
        self._sig("cuDevicePrimaryCtxRetain", ctypes.POINTER(vp), ctypes.c_int)
        self._sig("cuDevicePrimaryCtxRelease_v2", ctypes.c_int)
        self._sig("cuCtxPushCurrent_v2", vp)
        self._sig("cuCtxPopCurrent_v2", ctypes.POINTER(vp))
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

    @contextlib.contextmanager
    def current(self, device: int):
        """`device`'s primary context (the one XLA uses) current on this thread inside
        the block, as it is when XLA calls a kernel there."""
        context = ctypes.c_void_p()
        self._check(
            self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
            f"retaining device {device}'s context",
        )
        try:
            self._check(self.lib.cuCtxPushCurrent_v2(context), "making it current")
            try:
                yield
            finally:
                self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        finally:
            self.lib.cuDevicePrimaryCtxRelease_v2(device)

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


@contextlib.contextmanager
def device_current(device: int):
    """For a state's teardown: CUDA device `device` current on this thread inside the
    block (a teardown runs when a program is freed, where no device may be current). A
    device that cannot be made current (no driver) leaves the thread as it is."""
    with contextlib.ExitStack() as made:
        try:
            made.enter_context(_driver().current(device))
        except RuntimeError:
            pass
        yield


runtime_state.device_current = device_current  # (for states' teardowns: see state.py)


# --- plans: a site's GPU call, worked out once, run per call ------------------------


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


class _CupyOn:
    """What makes a plan's device and XLA's stream CuPy's current ones: the CuPy calls,
    and a CuPy stream object for XLA's stream (made once; it owns nothing)."""

    __slots__ = ("runtime", "current", "stream")

    def __init__(self, cupy, stream: int, device: int):
        self.runtime, self.current = cupy.cuda.runtime, cupy.cuda.get_current_stream
        with cupy.cuda.Device(device):
            self.stream = cupy_stream(stream, device)


class _TorchOn:
    """The same for PyTorch: its CUDA module, and a stream object for XLA's stream."""

    __slots__ = ("cuda", "stream")

    def __init__(self, torch, stream: int, device: int):
        self.cuda = torch.cuda
        self.stream = torch.cuda.ExternalStream(stream, device=torch.device("cuda", device))


_contexts: dict = {}  # CallContext by (stream, device, mode): one object per stream


def plan(description, stream: int, device: int, ins: tuple, outs: tuple) -> Plan:
    """A site's GPU call for one stream, device and buffer signature (of one batch
    element), worked out once (called by the trampoline, with the GIL held, which keeps
    the plan on the site). `description` is the site (see .sites.SiteDescription); each buffer is
    ``(device address, shape, XLA element type)``."""
    kind = HostPlan if description.platform_mode == "host" else DevicePlan
    return kind(description, stream, device, ins, outs)


class Plan:
    """One site's GPU call, worked out once: its body (for an op with state, the state of
    the device), its `CallContext`, and `views`, one `CudaArray` per buffer (the inputs',
    then the outputs'). Per call, the trampoline sets each view's ``ptr`` to the call's
    buffer (cpp/gpu.h) and calls the plan, which runs the body on them with
    `current_call()` set."""

    __slots__ = ("views", "n_in", "body", "kwargs_dump", "context", "stream", "device")

    def __init__(self, description, stream: int, device: int, ins: tuple, outs: tuple):
        for _ptr, _shape, code in (*ins, *outs):
            if code not in XLA_ELEMENT_TYPES:
                raise TypeError(f"a buffer has XLA element type {code}, which jaxbind cannot wrap")
        body = description.callable
        if isinstance(body, StatefulBody):  # the state of this device (see .state)
            body = functools.partial(body.on_gpu, device, _on_host)
        self.body, self.kwargs_dump = body, description.kwargs_dump
        key = (stream, device, description.platform_mode)
        context = _contexts.get(key)
        if context is None:
            context = _contexts[key] = CallContext("cuda", *key)
        self.context, self.stream, self.device, self.n_in = context, stream, device, len(ins)
        self.views = tuple(
            CudaArray(ptr, shape, XLA_ELEMENT_TYPES[code], i < len(ins), stream, device)
            for i, (ptr, shape, code) in enumerate((*ins, *outs))
        )

    def __call__(self) -> None:
        previous = getattr(_local, "context", None)
        _local.context = self.context
        try:
            self._run()
        finally:
            _local.context = previous

    def _run(self) -> None:
        raise NotImplementedError


class DevicePlan(Plan):
    """Device mode: the body gets the views, with the plan's device and XLA's stream
    current in CuPy and PyTorch where they are imported (looked for again at each call
    until they are), restored afterwards."""

    __slots__ = ("cupy", "torch")

    def __init__(self, *args):
        super().__init__(*args)
        self.cupy: _CupyOn | None = None
        self.torch: _TorchOn | bool | None = None  # False: imported, without CUDA

    def _run(self) -> None:
        stream, device = self.stream, self.device
        if self.cupy is None and "cupy" in sys.modules:
            self.cupy = _CupyOn(sys.modules["cupy"], stream, device)
        if self.torch is None and "torch" in sys.modules:
            torch = sys.modules["torch"]
            self.torch = torch.cuda.is_available() and _TorchOn(torch, stream, device)
        cupy = self.cupy
        if cupy is None:
            return self._run_torch()
        was = cupy.runtime.getDevice()
        if was != device:
            cupy.runtime.setDevice(device)
        try:
            previous = cupy.current()
            cupy.stream.use()
            try:
                self._run_torch()
            finally:
                previous.use()
        finally:
            if was != device:
                cupy.runtime.setDevice(was)

    def _run_torch(self) -> None:
        views, n, torch = self.views, self.n_in, self.torch
        if not isinstance(torch, _TorchOn):
            return self.body(views[n:], views[:n], self.kwargs_dump)
        cuda, device = torch.cuda, self.device
        was = cuda.current_device()
        previous = cuda.current_stream(device)
        cuda.set_stream(torch.stream)  # (makes its device current)
        try:
            self.body(views[n:], views[:n], self.kwargs_dump)
        finally:
            cuda.set_stream(previous)
            if was != device:
                cuda.set_device(was)


class HostPlan(Plan):
    """Host mode: the buffers the views point at copied to the host, the body called on
    NumPy arrays (the inputs read-only), the outputs copied back, through `_driver()`."""

    __slots__ = ()

    def _run(self) -> None:
        driver, stream = _driver(), self.stream
        ins, outs = self.views[: self.n_in], self.views[self.n_in :]
        host_in = []
        for v in ins:
            a = np.empty(v.shape, v.dtype)
            driver.to_host(a, v.ptr, stream)
            host_in.append(a)
        host_out = [np.empty(v.shape, v.dtype) for v in outs]
        driver.synchronize(stream)  # the inputs have arrived
        by_address = {v.ptr: a for v, a in zip(ins, host_in)}
        for v, o in zip(outs, host_out):  # input_output_aliases: same device memory
            if v.ptr in by_address and by_address[v.ptr].shape == o.shape:
                o[...] = by_address[v.ptr]  # the output starts as the input, as on the device
        for a in host_in:
            a.flags.writeable = False
        self.body(tuple(host_out), tuple(host_in), self.kwargs_dump)
        for v, o in zip(outs, host_out):
            driver.to_device(v.ptr, o, stream)  # host_out arrays are C-contiguous
