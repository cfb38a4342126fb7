"""CUDA kernels: op bodies that jaxbind's C++ launches on XLA's stream, with no Python per
call and no GIL.

[`cuda_kernel`][jaxbind.cuda_kernel] takes compiled GPU code (PTX text, or a cubin or
fatbin image: from ``nvcc``, NVRTC, CuPy, Triton, ...) and the name of a
``__global__`` function in it. A call launches that function once (once per batch
element under ``vmap``) with, in order:

- each output's device pointer, then each input's;
- the values of the site's scalar parameters (`scalars`), each passed by value.

The launch shape (grid, block, dynamic shared memory) and the scalars are worked out
in Python once per call site and buffer signature, from the shapes and dtypes of one
batch element's outputs and inputs (``jax.ShapeDtypeStruct``) and the call's keyword
arguments; every call after that is a ``cuLaunchKernel`` from C++ (cpp/cuda_kernels.h).
The runtime loads the code into each device's context at its first call there.

Such a call is compatible with XLA's command buffers (CUDA graphs): it does no host
work that a graph could not replay.

A common module (tests/test_layers.py): made at trace time, read by the runtime when
it instantiates a call site (`CudaKernel.site_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._avals import XLA_ELEMENT_TYPES
from .._roles import Body

__all__ = ["CudaKernel", "CudaKernelSite", "cuda_kernel"]

_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_BLOCK = (1024, 1024, 64)

# The launch shape: a count, or up to three (x, y, z), or a function of the element's
# arrays (jax.ShapeDtypeStruct: the outputs, then the inputs) and keyword arguments.
Dims = int | Sequence[int] | Callable[..., Any]


def cuda_kernel(
    code: str | bytes,
    entry: str,
    *,
    grid: Dims | None = None,
    block: Dims = 256,
    shared_memory: int | Callable[..., int] = 0,
    scalars: Callable[..., Sequence] | None = None,
    name: str | None = None,
) -> CudaKernel:
    """Make an op body of a compiled CUDA kernel, which jaxbind launches on XLA's stream.

    Args:
      code: the module: PTX text (``str``, or ``bytes`` that start as PTX does), or a
        cubin or fatbin image (``bytes``).
      entry: the name of the ``__global__`` function in `code` (declare it
        ``extern "C"`` in CUDA C++, or give its mangled name).
      grid: blocks per grid: an int, up to three ints, or a function
        ``grid(*outputs, *inputs, **kwargs)`` of one batch element's arrays (as
        ``jax.ShapeDtypeStruct``) and the call's keyword arguments that gives either.
        Default: enough blocks of `block` for one thread per element of the first
        output.
      block: threads per block, in the same forms (default 256).
      shared_memory: bytes of dynamic shared memory per block, an int or such a function.
      scalars: a function of the same arguments that gives the values passed after the
        pointers, in order: NumPy scalars (``np.int64(n)``, ``np.float32(a)``) of the
        parameters' C types; a Python int is passed as ``int64`` and a float as
        ``double``.
      name: what messages call it (default: `entry`).

    Returns:
      A body to give wherever a callable goes (``f``, ``f_T``, ``def_transpose``, ...).
      It runs in GPU programs only: in a program lowered for the CPU, the op's JAX
      reference (``reference=``) runs instead, and an op without one is an error when the
      program is lowered, naming the binding and the platform (as is
      ``jaxbind.testing.check``, which calls bodies on host arrays).
    """
    what = f"jaxbind.cuda_kernel: {name or entry!r}"
    if not isinstance(entry, str) or not entry:
        raise TypeError(f"{what}: entry must be the kernel function's name, a non-empty string")
    image = _image(code, what)
    for label, value in (("grid", grid), ("block", block)):
        if value is not None and not callable(value):
            _dims(value, f"{what}: {label}", _MAX_BLOCK if label == "block" else _MAX_GRID)
    if not callable(shared_memory) and (
        isinstance(shared_memory, bool)
        or not isinstance(shared_memory, (int, np.integer))
        or shared_memory < 0
    ):
        raise TypeError(f"{what}: shared_memory must be a non-negative int or a function")
    if scalars is not None and not callable(scalars):
        raise TypeError(
            f"{what}: scalars= takes a function of the arrays and keyword arguments that "
            f"gives the values, such as lambda out, x, **kw: (np.int64(x.size),); got "
            f"{scalars!r}"
        )
    return CudaKernel(name or entry, image, entry, grid, block, shared_memory, scalars)


def _image(code, what: str) -> bytes:
    """The module image the driver loads: PTX text NUL-terminated, binary images as given."""
    if isinstance(code, str):
        code = code.encode()
    if not isinstance(code, (bytes, bytearray)) or not code:
        raise TypeError(f"{what}: code must be PTX text or a cubin/fatbin image (bytes)")
    code = bytes(code)
    binary = code[:4] == b"\x7fELF" or code[:4] == b"\x50\xed\x55\xba"  # cubin, fatbin
    if not binary and b".entry" not in code:
        raise ValueError(
            f"{what}: code is neither a cubin or fatbin image nor PTX with an .entry "
            "(compile the kernel to PTX, e.g. nvcc -ptx, or to a cubin)"
        )
    return code if binary or code.endswith(b"\0") else code + b"\0"


def _dims(value, what: str, limits) -> tuple[int, int, int]:
    """(x, y, z) of a launch dimension, checked against CUDA's limits."""
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(
        isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in dims
    ):
        raise TypeError(f"{what} must be an int or up to three ints, not {value!r}")
    dims = (*(int(d) for d in dims), 1, 1)[:3]
    for d, top, axis in zip(dims, limits, "xyz"):
        if not 1 <= d <= top:
            raise ValueError(f"{what} has {axis} = {d}; CUDA allows 1 to {top}")
    return dims  # type: ignore[return-value]


def _scalar_bytes(value, what: str) -> bytes:
    """A scalar parameter's value as the kernel takes it (its C type's bytes)."""
    if isinstance(value, bool) or isinstance(value, np.bool_):
        return np.bool_(value).tobytes()
    if isinstance(value, int):
        return np.int64(value).tobytes()
    if isinstance(value, float):
        return np.float64(value).tobytes()
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return value.tobytes()
    raise TypeError(
        f"{what}: a scalar parameter must be a NumPy scalar (np.int32(n), np.float32(a), ...) "
        f"or a Python int (int64) or float (double), not {value!r}"
    )


class CudaKernel:
    """A CUDA kernel as an op body (made by [`cuda_kernel`][jaxbind.cuda_kernel]).

    Attributes:
      name: what messages call it.
      image: the module (PTX, NUL-terminated, or a cubin/fatbin image).
      entry: the kernel function's name in it.
    """

    body_kind = Body.CUDA_KERNEL  # what the rules see: compiled code the trampoline launches
    batches = False  # launched once per batch element by jaxbind's loop
    reduction = None
    origin = "CUDA kernel"

    def __init__(self, name, image, entry, grid, block, shared_memory, scalars):
        self.name, self.image, self.entry = name, image, entry
        self._grid, self._block, self._shared, self._scalars = grid, block, shared_memory, scalars

    def __repr__(self):
        return f"<jaxbind CUDA kernel {self.name}>"

    def for_trees(self, trees) -> CudaKernel:
        """Kernels take flat arrays, whatever the call's pytree structure."""
        return self

    def check_state(self, where: str, sdef=None) -> None:
        raise TypeError(
            f"{where} is the CUDA kernel {self.name}, but the op was given state=; CUDA "
            "kernels take no state yet: keep the state in a Python body, or give the op no "
            "state="
        )

    def check_call(self, names, n_inputs, n_outputs, where, shape_fns=(), state=None) -> None:
        """Keyword arguments reach the kernel through `grid`, `block`, `shared_memory` and
        `scalars` (functions that take ``**kwargs``), so any may be passed."""
        if state is not None:
            self.check_state(where)

    def site_for(self, values: dict, where: str) -> CudaKernelSite:
        return CudaKernelSite(self, values, where)

    def __call__(self, out, args, kwargs_dump) -> None:
        raise TypeError(
            f"jaxbind: {self!r} runs in GPU programs only: it was called on the CPU (a CPU "
            "program lowered before jaxbind refused it, or jaxbind.testing on host arrays). "
            "Run the program on a CUDA device "
            "(jax.device_put its inputs there); for CPU programs, define another op whose "
            "body is a Python callable or a jaxbind.kernel"
        )


class CudaKernelSite:
    """What the trampoline reads for one CUDA kernel site (see cpp/cuda_kernels.h):
    `image` and `entry`, and `launch`, the launch of one batch element's buffers of a
    signature ``(inputs, outputs)``, each a tuple of ``(address, shape, XLA element
    type)``."""

    __slots__ = ("kernel", "values", "where", "image", "entry")

    def __init__(self, kernel: CudaKernel, values: dict, where: str):
        self.kernel, self.values, self.where = kernel, values, where
        self.image, self.entry = kernel.image, kernel.entry

    def launch(self, ins, outs) -> tuple:
        """``(grid, block, shared memory bytes, (scalar bytes, ...))`` for these buffers."""
        import jax

        k, what = self.kernel, f"{self.where}: CUDA kernel {self.kernel.name}"
        arrays = [
            jax.ShapeDtypeStruct(tuple(shape), XLA_ELEMENT_TYPES[code])
            for _, shape, code in (*outs, *ins)
        ]

        def value(option, label):
            if not callable(option):
                return option
            try:
                return option(*arrays, **self.values)
            except Exception as exc:
                raise type(exc)(f"{what}: its {label} function failed: {exc}") from exc

        if k._grid is None:
            if not outs:
                raise TypeError(f"{what}: without outputs it needs grid=")
            block = _dims(value(k._block, "block"), f"{what}: block", _MAX_BLOCK)
            n = int(np.prod(outs[0][1], dtype=np.int64))
            grid = _dims(max(1, -(-n // block[0])), f"{what}: grid", _MAX_GRID)
        else:
            grid = _dims(value(k._grid, "grid"), f"{what}: grid", _MAX_GRID)
            block = _dims(value(k._block, "block"), f"{what}: block", _MAX_BLOCK)
        if block[0] * block[1] * block[2] > 1024:
            raise ValueError(f"{what}: block {block} has more than 1024 threads")
        shared = value(k._shared, "shared_memory")
        if isinstance(shared, bool) or not isinstance(shared, (int, np.integer)) or shared < 0:
            raise TypeError(f"{what}: shared_memory must give a non-negative int, not {shared!r}")
        given = () if k._scalars is None else value(k._scalars, "scalars")
        if isinstance(given, (np.generic, int, float)):
            given = (given,)
        scalars = tuple(_scalar_bytes(v, f"{what}: scalars") for v in given)
        return grid, block, int(shared), scalars
