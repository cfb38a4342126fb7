"""Compiled kernels: op bodies that the trampoline calls without the GIL and without Python.

A kernel implements the C ABI of ``jaxbind/kernel.h`` (shipped with the package, see
[`kernel_include_dir`][jaxbind.kernel_include_dir]):
``int32_t kernel(const jaxbind_call *call)``. It can be the body of any role (f, a
transpose, the JVP, the VJP), in either API, beside Python callables and JAX functions in
the same op. [`kernel`][jaxbind.kernel] makes one from

- a numba-compilable Python function ``fn(*outputs, *inputs, **static)`` over arrays:
  jaxbind compiles, for each buffer signature (dtypes and ranks), a ``numba.cfunc``
  that unpacks the call and calls ``fn`` with the outputs, the inputs and the static
  keyword arguments it names; compiled code holds no GIL;
- a numba ``@cfunc``, a ctypes function pointer (``ctypes.CDLL(...).name``) or a cffi
  function pointer that implements the ABI;
- a raw address, with ``abi_version=`` (any library: C, C++, Fortran, Rust).

Programs never hold an address: a call names its binding and role, as for Python
callables, and the process that runs the program (a loaded ``jax.export`` artifact
too) finds the kernel through the binding it made under that name.

A common module (tests/test_layers.py): made at trace time, read by the runtime when
it instantiates a call site (`Kernel.site_for`). The ABI's layout is in `abi`, numba's
code generation in `numba`.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import pathlib
import sys
import threading
from _ctypes import CFuncPtr
from collections.abc import Callable
from typing import Any

import numpy as np

from .._roles import Body
from . import abi
from .abi import ABI_VERSION, ABI_VERSIONS
from .state import state_address

__all__ = [
    "ABI_VERSION",
    "GraphSafeKernel",
    "Kernel",
    "KernelSite",
    "StreamKernel",
    "kernel",
    "kernel_include_dir",
    "state_address",
    "state_address_for_call",
]


def kernel_include_dir() -> str:
    """The directory with ``jaxbind/kernel.h``, the C ABI of kernels (for ``-I``)."""
    return str(pathlib.Path(__file__).parent.parent / "include")


class KernelSite:
    """What the trampoline reads for one kernel site (see cpp/site.h): whether the
    kernel batches, the ABI version it was registered for, the threads it may use (0:
    all of XLA's), the static keyword arguments as typed values (cpp/kernels.h), what
    the kernel was made from (`origin`, for messages), and `address`, the kernel's
    address for a buffer signature ``(inputs, outputs)``, each a tuple of ``(address,
    shape, XLA element type)``, and `platform`, where it runs ("cpu"; "cuda": a kernel
    called with XLA's stream). For an op with a state (`stateful`), `state` is what the
    run time sets for the trampoline, a _runtime.state.KernelState (fields read by name;
    see _runtime.state.Lease.for_kernel)."""

    __slots__ = (
        "stateful",
        "state",
        "kernel",
        "batches",
        "abi_version",
        "threads",
        "kwargs",
        "values",
        "where",
        "origin",
        "platform",
    )

    def __init__(self, kernel: Kernel, values: dict, where: str, stateful: bool = False):
        self.kernel, self.batches, self.values, self.where = kernel, kernel.batches, values, where
        self.platform = kernel.platform
        self.stateful = stateful
        self.state: Any = None  # (set by the run time, which this module does not import)
        self.origin = kernel.origin
        self.abi_version, self.threads = kernel.abi_version, kernel.threads or 0
        self.kwargs = [abi.typed_kwarg(name, values[name], where) for name in sorted(values)]

    def address(self, ins, outs) -> int:
        return self.kernel.address_for(ins, outs, self.values, self.where, self.stateful)


class Kernel:
    """A compiled op body (made by [`kernel`][jaxbind.kernel]).

    Attributes:
      name: what messages call it.
      batches: it takes a whole batch (the call's ``batch_levels``), instead of being
        called by jaxbind once per batch element.
      abi_version: the version of the ABI it implements (what its calls say they are).
      threads: the most threads it and its batch loop may use (None: all of XLA's).
      ranges: a numba kernel over ranges, with its grain and reduction (see
        [`kernel`][jaxbind.kernel]); ranges is None for every other kernel.
      origin: what it was made from, as messages say it ("numba function", "ctypes
        function", "cffi function", "numba cfunc", "kernel at a raw address").
      platform: where its calls run: "cpu" (on host memory, on XLA's CPU threads), or
        "cuda" (a `StreamKernel`).
    """

    body_kind = Body.KERNEL  # what the rules and the runtime see (see _roles.Body.of)
    platform = "cpu"

    def __init__(
        self,
        name: str,
        batches: bool,
        address: int | None,
        fn: Callable | None,
        keep=(),
        options: dict | None = None,
        *,
        abi_version: int = ABI_VERSION,
        threads: int | None = None,
        ranges: Callable | None = None,
        grain: int | None = None,
        reduction: str | None = None,
        origin: str = "numba function",
    ):
        self.name, self.batches, self.origin = name, batches, origin
        self.abi_version, self.threads = abi_version, threads
        self.ranges, self.grain, self.reduction = ranges, grain, reduction
        self._address, self._fn = address, fn
        self._options = dict(options or {})  # numba: the options of the user's @njit
        self._keep = keep  # what holds the code at `address` (see kernel())
        self._compiled: dict = {}  # numba: buffer signature -> cfunc (kept alive here)
        self._refused: dict = {}  # numba: (buffer signature, where) -> why it was refused
        self._checked: set = set()  # numba: call layouts check_call accepted
        self._lock = threading.Lock()
        self.__wrapped__ = fn  # where it was defined (notebook cells run again)

    def __repr__(self):
        return f"<jaxbind kernel {self.name}{' (batches)' if self.batches else ''}>"

    def for_trees(self, trees) -> Kernel:
        """Kernels take flat arrays, whatever the call's pytree structure."""
        return self

    def library_function(self) -> tuple[str, str] | None:
        """The shared library (an absolute path) and the exported symbol of a compiled
        kernel, as a host without Python finds it (jaxbind.bundle); None for a numba
        function, or code in no library under a symbol of its own."""
        if self._address is None:
            return None
        return library_function(self._address)

    def site_for(self, values: dict, where: str, stateful: bool = False) -> KernelSite:
        return KernelSite(self, values, where, stateful)

    def check_state(self, where: str, sdef=None) -> None:
        """When an op with ``state=`` (`sdef`) is made with this kernel as a body: it must
        see the state (kernel ABI version 3; a numba function, through a ``state``
        parameter)."""
        if self.abi_version < 3:
            raise TypeError(
                f"{where} is kernel {self.name}, registered for kernel ABI version "
                f"{self.abi_version}, which has no state field, but the op was given state=. "
                "A kernel sees its op's state from version 3 on (jaxbind_call.state): build "
                "it against this jaxbind's jaxbind/kernel.h and register it with "
                "abi_version=3, or give the op no state="
            )
        if self._fn is None:
            return
        try:
            params = inspect.signature(self._fn).parameters
        except (TypeError, ValueError):
            return
        if "state" not in params:
            raise TypeError(
                f"{where} is the numba kernel {self.name}, which takes no 'state' parameter, "
                "but the op was given state=; add one after the arrays (def "
                f"{getattr(self._fn, '__name__', 'kernel')}(out, x, ..., state): it gets the "
                "address of the state's object, a numba voidptr)"
            )

    def check_call(
        self,
        names,
        n_inputs: int,
        n_outputs: int,
        where: str,
        shape_fns=(),
        state=None,
    ) -> None:
        """At trace time: a numba kernel's function must take the call's arrays, and every
        keyword argument the call passes must be a parameter of the function or of one of
        the op's shape functions (`shape_fns`: a keyword argument that only sets output
        shapes, such as a grid size, need not reach the kernel). Any other one, a typo,
        would be dropped silently. C kernels get every keyword argument. With a `state`
        (the op's StateDef), the kernel's `state` parameter gets the state, and a keyword
        argument that its setup takes need not reach the kernel either."""
        stateful = state is not None
        if self._fn is None:
            return
        # (numba's code generator is loaded where a numba kernel is first checked)
        from .numba_codegen import count, parameter_names, static_parameters

        key = (tuple(sorted(names)), n_inputs, n_outputs, stateful)
        if key in self._checked:
            return
        static = static_parameters(self, self._fn, n_inputs, n_outputs, where)
        if stateful:  # (its `state` parameter gets the state, not a keyword argument)
            static = [p for p in static if p.name != "state"]
        outside = set(names) - {p.name for p in static}  # not the kernel's parameters
        if stateful:
            outside -= set(names) if state.all_kwargs else set(state.params)
        if outside:
            named = set().union(*(parameter_names(fn) for fn in shape_fns))
            unknown = sorted(outside - named)
            if unknown:
                takes = ", ".join(p.name for p in static) or "none"
                raise TypeError(
                    f"{where}: the call passes keyword argument {unknown[0]!r}, which "
                    f"neither kernel {self.name} nor the op's shape function takes (the "
                    f"kernel's keyword parameters, after {count(n_outputs, 'output')} and "
                    f"{count(n_inputs, 'input')}: {takes}). Rename the keyword argument, "
                    "or add a parameter of that name to the kernel's function"
                )
        missing = [p.name for p in static if p.name not in names and p.default is p.empty]
        if missing:
            hint = (
                "; a kernel's 'state' parameter gets its op's state: give the op state="
                if missing[0] == "state"
                else ""
            )
            raise TypeError(
                f"{where}: kernel {self.name} takes keyword argument {missing[0]!r}, which "
                f"the call does not pass (give it a default, or pass it{hint})"
            )
        if not outside:  # (the shape functions may differ between the kernel's bindings)
            self._checked.add(key)

    def address_for(
        self, ins, outs, values: dict, where: str | None = None, stateful: bool = False
    ) -> int:
        """The address of the kernel for buffers of these element types and ranks (and,
        for a numba function, whether its op has a state, which its `state` gets)."""
        if self._address is not None:
            return self._address
        key = (
            tuple((code, len(shape)) for _, shape, code in ins),
            tuple((code, len(shape)) for _, shape, code in outs),
            tuple(sorted((k, _kind_of(v)) for k, v in values.items())),
            stateful,
        )
        where = where or repr(self)
        from .numba_codegen import compile_numba

        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                refused = self._refused.get((key, where))
                if refused is not None:  # (numba would refuse it again, slowly)
                    raise type(refused)(*refused.args)
                try:
                    compiled = compile_numba(self, ins, outs, values, where, stateful)
                except TypeError as exc:
                    self._refused[(key, where)] = exc
                    raise
                self._compiled[key] = compiled
        return compiled.address

    def __call__(self, out, args, kwargs_dump) -> None:
        """Run the kernel from Python on NumPy arrays, as the trampoline would (for
        ``jaxbind.testing.check`` and debugging): ``out`` and ``args`` are tuples of
        arrays, ``kwargs_dump`` the call's keyword arguments."""
        from .._kwargs import load_kwargs

        values = load_kwargs(kwargs_dump) if kwargs_dump is not None else {}
        values.pop("batch_axes", None)
        ins = [np.asarray(a, order="C") for a in args]  # (ascontiguousarray makes 0-d 1-d)
        for o in out:
            if not o.flags.c_contiguous or not o.flags.writeable:
                raise ValueError(f"jaxbind: {self!r}: outputs must be writable and contiguous")
        describe = lambda arrays: tuple((0, a.shape, abi.xla_code(a.dtype)) for a in arrays)
        state = state_address_for_call(self, repr(self))
        site = self.site_for(values, repr(self), stateful=state is not None)
        address = site.address(describe(ins), describe(out))
        from .. import _ext

        # parallel_for runs the tasks in order here; a kernel is told of 3 threads (unless
        # it may use fewer), so that its split into tasks is exercised (a reduction's split
        # depends on its iterations alone: it sums as in a program)
        status, message = abi.call_kernel(
            address,
            ins,
            out,
            site.kwargs,
            abi_version=self.abi_version,
            threads=min(self.threads or 3, 3),
            parallel_for=_ext.parallel_for_address(),
            state=state or 0,
        )
        if status != 0:  # (jaxbind's numba wrappers always write a message)
            why = message or (
                f"the {self.origin} returned status {status} without writing a message into "
                "call->error"
            )
            raise RuntimeError(f"jaxbind: kernel {self.name} failed: {why}")


class StreamKernel(Kernel):
    """A compiled op body for GPU programs (made by [`kernel`][jaxbind.kernel] with
    ``platform="cuda"``): a host function the trampoline calls with device buffers, XLA's
    stream and the device ordinal (ABI version 4), which enqueues the work on the stream,
    for instance through a CUDA library's C entry points. Its op's state is per device."""

    body_kind = Body.STREAM_KERNEL
    platform = "cuda"

    def __repr__(self):
        safe = " (graph-safe)" if isinstance(self, GraphSafeKernel) else ""
        return f"<jaxbind kernel {self.name} for CUDA{safe}{' (batches)' if self.batches else ''}>"

    def check_state(self, where: str, sdef=None) -> None:
        """Its state is per device, set up at a call: a state keyed on inputs would have
        to read device memory on the host at every call."""
        super().check_state(where, sdef)
        if sdef is not None and sdef.key:
            raise TypeError(
                f"{where} is the kernel for CUDA {self.name}, but the op's state "
                f"{sdef.name!r} has key={sdef.key}: its inputs are device memory, which a key "
                "value would copy to the host at every call. Drop key= (the kernel can keep the "
                "last value it saw in the state's object), or use a Python body"
            )

    def __call__(self, out, args, kwargs_dump) -> None:
        raise TypeError(
            f"jaxbind: {self!r} runs in GPU programs only (its buffers are device memory): "
            "it was called on host arrays (a CPU program lowered before jaxbind refused it, "
            "or jaxbind.testing on the CPU). Run the program on a CUDA device, or give the op "
            "a reference (reference=), which runs in CPU programs"
        )


class GraphSafeKernel(StreamKernel):
    """A `StreamKernel` that declared itself safe for CUDA graph capture
    (``graph_safe=True``): it only enqueues work on the call's stream (no synchronization,
    allocation or host reads), so XLA may capture its calls into command buffers and
    replay them without calling it. It takes no state (a state's setup at a device's first
    call could not be replayed)."""

    body_kind = Body.GRAPH_SAFE_KERNEL

    def check_state(self, where: str, sdef=None) -> None:
        raise TypeError(
            f"{where} is the graph-safe kernel {self.name}, but the op was given state=. "
            "XLA may replay a graph-safe kernel's calls from a CUDA graph without calling it, "
            "so it cannot take a state set up at a call: drop graph_safe=True (the kernel "
            "then runs at every call, with its state), or give the op no state="
        )


def state_address_for_call(kernel: Kernel, where: str) -> int | None:
    """For a kernel called from Python (jaxbind.testing, debugging): the address of the
    state object current on this thread (see _state.outside_programs), or None."""
    from .._state import thread_stack

    stack = thread_stack()
    if not stack or kernel.abi_version < 3:
        return None
    return state_address(stack[-1], where, None)


def _kind_of(value) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.ndim)
    return type(value).__name__


def kernel(
    fn=None,
    /,
    *,
    abi_version: int | None = None,
    batches: bool = False,
    name: str | None = None,
    threads: int | None = None,
    ranges: Callable | None = None,
    grain: int | None = None,
    reduction: str | None = None,
    platform: str = "cpu",
    graph_safe: bool = False,
):
    """Make a compiled op body (a decorator when called without `fn`).

    Args:
      fn: a numba-compilable Python function ``fn(*outputs, *inputs, **static)`` (its
        parameters after the arrays are bound to the call's keyword arguments by name; on
        an op with ``state=``, a parameter named ``state`` gets the address of the
        state's object as a numba ``voidptr``), a numba ``@cfunc``, a ctypes or cffi
        function pointer implementing the ABI of ``jaxbind/kernel.h``, or an integer
        address (then `abi_version` is required).
      abi_version: the ABI version the kernel implements, 1 to 4 (default: this
        jaxbind's, 4; an op with ``state=`` takes kernels of version 3 or later, and
        ``platform="cuda"`` those of version 4). Its calls say that version, and carry the
        fields of every version.
      batches: the kernel takes a whole batch under ``vmap`` (the leading
        ``batch_levels`` axes of its buffers); otherwise jaxbind's C++ loop calls it once
        per batch element, on several of XLA's threads when the elements are worth it.
      name: what messages call it (default: the function's name).
      threads: the most threads its calls may use, in the batch loop and through the
        ABI's ``parallel_for`` (default: all of XLA's intra-op pool). ``threads=1`` for a
        kernel that brings threads of its own (OpenMP, numba's ``parallel=True``).
      ranges: makes a numba function a kernel over ranges: a function of the kernel's
        arrays (the outputs, then the inputs), compiled by numba, that gives the number
        of iterations, a non-negative integer; ``fn(begin, end, *outputs, *inputs,
        **static)`` then does iterations ``begin`` to ``end - 1``, and jaxbind splits
        them over XLA's threads. The ranges must be independent: each writes its own
        part of the outputs.
      grain: the fewest iterations worth a range of their own (a kernel over ranges;
        default 1000, and with ``reduction="sum"`` at least the outputs' element count).
      reduction: ``"sum"``: the ranges' writes to the outputs add up instead (a scatter,
        a histogram). Each range writes into outputs of its own, zeroed (the first into
        the outputs themselves), and jaxbind adds them up in range order. The ranges
        depend on the iteration count and `grain` alone (at most 64), not on the
        threads: the same bits whatever threads a call gets.
      platform: where the kernel runs: ``"cpu"`` (default: it reads and writes host
        memory), or ``"cuda"``: a C function (ABI version 4) that GPU programs call on the
        host with the buffers' device pointers, XLA's stream (``call->stream``) and the
        device ordinal (``call->device``), and that enqueues its work on that stream: a
        CUDA library's entry points, through ctypes or cffi, with no compiler. Its op's
        state is per device (see docs/kernels.md). A CPU program cannot call it (its op's
        reference runs there, or the lowering refuses, naming the op).
      graph_safe: (``platform="cuda"``) the kernel only enqueues work on the call's
        stream, with nothing XLA could not replay from a CUDA graph (no synchronization,
        allocation, host reads or state): XLA may then capture its calls into command
        buffers.

    Returns:
      A [`Kernel`][jaxbind.Kernel], to pass wherever a callable goes (``f``, ``f_T``, ``f_jvp``,
      ``f_vjp``, ``def_transpose``, ...).
    """
    options: dict[str, Any] = dict(
        abi_version=abi_version,
        batches=batches,
        name=name,
        threads=threads,
        ranges=ranges,
        grain=grain,
        reduction=reduction,
        platform=platform,
        graph_safe=graph_safe,
    )
    label = (
        None
        if fn is None
        else (name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None))
    )
    shown = f"at {int(fn):#x}" if isinstance(fn, (int, np.integer)) else repr(fn)  # (addresses)
    what = "jaxbind.kernel" + ("" if fn is None else f": {label or shown}")
    if platform not in ("cpu", "cuda"):
        raise ValueError(f"{what}: platform must be 'cpu' or 'cuda', not {platform!r}")
    if not isinstance(graph_safe, bool):
        raise TypeError(f"{what}: graph_safe must be True or False, not {graph_safe!r}")
    if graph_safe and platform != "cuda":
        raise ValueError(
            f"{what}: graph_safe=True is about CUDA graphs: it needs platform='cuda' (a CPU "
            "kernel is never captured)"
        )
    if abi_version is not None and abi_version not in ABI_VERSIONS:
        raise ValueError(
            f"{what} implements kernel ABI version {abi_version}, but this jaxbind calls "
            f"versions {', '.join(map(str, ABI_VERSIONS))}"
        )
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1
    ):
        raise ValueError(f"{what}: threads must be a positive integer or None, not {threads!r}")
    if fn is None:
        return lambda f: kernel(f, **options)
    if isinstance(fn, Kernel):
        if fn.platform != platform or isinstance(fn, GraphSafeKernel) != graph_safe:
            raise ValueError(
                f"{what} is a kernel for {fn.platform} already"
                f"{' (graph-safe)' if isinstance(fn, GraphSafeKernel) else ''}; make it again "
                "from its function to change its platform or graph_safe"
            )
        given = [k for k, v in options.items() if k not in ("platform", "graph_safe")]
        given = [k for k in given if options[k] not in (None, False)]
        if given:
            raise ValueError(
                f"{what} is a kernel already, made with its options; {given[0]}= would be "
                "dropped: make it again from its function with the options"
            )
        return fn
    parallel = _parallel_options(what, batches, ranges, grain, reduction)
    if isinstance(fn, bool) or not isinstance(fn, (int, np.integer)):
        address = _address_of(fn)
    else:
        if abi_version is None:
            raise TypeError(
                "jaxbind.kernel: a raw address needs abi_version= (the version of "
                "jaxbind/kernel.h it was compiled against)"
            )
        address = int(fn)
        label = label if name else f"at {address:#x}"
    version = ABI_VERSION if abi_version is None else abi_version
    if address is not None:
        if not address:
            raise ValueError(f"jaxbind.kernel: {label}: the address is 0")
        if ranges is not None:
            raise TypeError(
                f"{what}: ranges= makes a numba Python function a kernel over ranges; a "
                "compiled kernel splits its work itself, with the ABI's parallel_for"
            )
        # The code must outlive the binding: keep the pointer object (a numba cfunc owns
        # its code; a ctypes pointer its CDLL), and the shared library that holds the
        # address open (cffi closes a library when its object is collected).
        keep = (fn, _pin_library(address))
        kind = Kernel
        if platform == "cuda":
            _check_stream_kernel(what, version, threads)
            kind = GraphSafeKernel if graph_safe else StreamKernel
        return kind(
            label or f"at {address:#x}",
            batches,
            address,
            None,
            keep,
            abi_version=version,
            threads=threads,
            origin=_origin_of(fn),
        )
    if platform == "cuda":
        raise TypeError(
            f"{what}: platform='cuda' takes a compiled host function of the kernel ABI (a "
            "ctypes or cffi function pointer, a numba cfunc, or an address), which enqueues "
            "its work on XLA's stream; jaxbind compiles a numba Python function for the CPU, "
            "where it reads the buffers, but a GPU program's buffers are device memory. For "
            "code that runs on the GPU itself, use jaxbind.cuda_kernel (PTX or a cubin)"
        )
    numba_options = None
    if _is_numba_dispatcher(fn):  # @njit(...): its Python function, compiled with its options
        fn, numba_options = _from_dispatcher(fn, label)
    if not callable(fn) or not inspect.isfunction(fn):
        raise TypeError(
            "jaxbind.kernel: expected a numba-compilable Python function (plain, or decorated "
            "with @numba.njit), a numba cfunc, a ctypes or cffi function pointer, or an "
            f"address; got {fn!r}"
        )
    if version != ABI_VERSION:
        raise ValueError(
            f"{what}: jaxbind compiles a numba function for ABI version {ABI_VERSION}; drop "
            f"abi_version={abi_version}"
        )
    try:
        import numba  # noqa: F401
    except ImportError:
        raise ImportError(
            f"jaxbind.kernel: compiling {label} needs numba (pip install numba)"
        ) from None
    return Kernel(
        label or fn.__qualname__,
        batches,
        None,
        fn,
        options=numba_options,
        threads=threads,
        **parallel,
    )


def _check_stream_kernel(what: str, version: int, threads) -> None:
    """A kernel for CUDA reads the stream and the device: ABI version 4 or later; it runs
    on the calling thread."""
    if version < 4:
        raise ValueError(
            f"{what}: a kernel for CUDA gets XLA's stream and the device from kernel ABI "
            f"version 4 on (call->stream, call->device), but it implements version {version}: "
            "build it against this jaxbind's jaxbind/kernel.h and register it with "
            "abi_version=4"
        )
    if threads is not None:
        raise ValueError(
            f"{what}: a kernel for CUDA runs on the calling thread and enqueues its work on "
            "the stream; threads= is for CPU kernels"
        )


def _parallel_options(what: str, batches: bool, ranges, grain, reduction) -> dict:
    """The checked options of a kernel over ranges."""
    if ranges is None:
        if reduction is not None:
            raise TypeError(f"{what}: reduction= needs ranges= (a kernel over ranges)")
        if grain is not None:
            raise TypeError(f"{what}: grain= needs ranges= (a kernel over ranges)")
        return {}
    if not callable(ranges):
        raise TypeError(
            f"{what}: ranges= takes a function of the kernel's arrays (the outputs, then the "
            f"inputs) that gives the number of iterations, such as "
            f"lambda out, x: out.shape[0]; got {ranges!r}"
        )
    if batches:
        raise TypeError(
            f"{what}: a kernel over ranges cannot take whole batches (batches=True): "
            "jaxbind's batch loop calls it once per batch element"
        )
    if grain is not None and (
        isinstance(grain, bool) or not isinstance(grain, (int, np.integer)) or grain < 1
    ):
        raise ValueError(f"{what}: grain must be a positive integer or None, not {grain!r}")
    if reduction not in (None, "sum"):
        raise ValueError(f"{what}: reduction must be None or 'sum', not {reduction!r}")
    return dict(ranges=ranges, grain=None if grain is None else int(grain), reduction=reduction)


def _is_numba_dispatcher(fn) -> bool:
    """A function decorated with @numba.njit / @numba.jit (numba's Dispatcher)."""
    return hasattr(fn, "py_func") and hasattr(fn, "targetoptions") and hasattr(fn, "overloads")


def _from_dispatcher(dispatcher, label) -> tuple[Callable, dict]:
    options = dict(dispatcher.targetoptions)
    if getattr(dispatcher, "_required_target_backend", None) not in (None, "cpu") or type(
        dispatcher
    ).__name__ not in ("CPUDispatcher", "Dispatcher"):
        raise TypeError(
            f"jaxbind.kernel: {label} is compiled by numba for "
            f"{type(dispatcher).__name__}, not the CPU; pass the plain Python function, or "
            "a function decorated with @numba.njit"
        )
    if options.get("forceobj") or options.get("nopython") is False:
        raise TypeError(
            f"jaxbind.kernel: {label} is compiled by numba in object mode (forceobj=True or "
            "nopython=False), which needs the GIL; a kernel runs without it. Use "
            "@numba.njit, or pass the plain Python function"
        )
    options.pop("nopython", None)  # njit sets it
    return dispatcher.py_func, options


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _pin_library(address: int):
    """Open once more the shared library that holds `address`, so that it stays loaded
    whatever its other owners do (the loader counts openings; this one is never closed).
    Returns the handle, or None where the address is in no library (JIT-compiled code)."""
    try:
        if sys.platform == "win32":
            handle = ctypes.c_void_p()
            from_address = 0x4  # GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS: counts a reference
            ok = ctypes.WinDLL("kernel32").GetModuleHandleExW(
                from_address, ctypes.c_void_p(address), ctypes.byref(handle)
            )
            return handle if ok else None
        dladdr = ctypes.CDLL(None).dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        if not dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
            return None
        path = os.fsdecode(info.dli_fname)
        return ctypes.CDLL(path) if os.path.isabs(path) else None  # not the main program
    except (OSError, AttributeError):  # no dladdr, or a library that cannot be opened by path
        return None


def library_function(address: int) -> tuple[str, str] | None:
    """The shared library (absolute path) and exported symbol at `address`, or None."""
    if sys.platform == "win32":
        return None
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    if not info.dli_sname or info.dli_saddr != address:
        return None
    path = os.fsdecode(info.dli_fname)
    if not os.path.isabs(path):
        return None
    return os.path.realpath(path), os.fsdecode(info.dli_sname)


def _origin_of(fn) -> str:
    """What a compiled kernel was made from, for messages."""
    if isinstance(fn, CFuncPtr):
        return "ctypes function"
    if type(fn).__module__ == "_cffi_backend":
        return "cffi function"
    if type(fn).__name__ == "CFunc":
        return "numba cfunc"
    return "kernel at a raw address"


def _address_of(fn) -> int | None:
    """The address of a compiled function pointer, or None for a Python function."""
    if isinstance(fn, CFuncPtr):
        return ctypes.cast(fn, ctypes.c_void_p).value or 0
    if type(fn).__module__ == "_cffi_backend":
        import cffi

        ffi = cffi.FFI()
        if ffi.typeof(fn).kind != "function":
            raise TypeError(f"jaxbind.kernel: {fn!r} is not a cffi function pointer")
        return int(ffi.cast("uintptr_t", fn))
    if type(fn).__name__ == "CFunc" and hasattr(fn, "address"):  # numba.cfunc
        return int(fn.address)
    return None
