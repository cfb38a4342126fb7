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

Shared: made at trace time, read by the runtime when it resolves a call site
(`Kernel.call_for`).
"""

from __future__ import annotations

import ctypes
import inspect
import os
import pathlib
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ._avals import XLA_ELEMENT_TYPES

__all__ = ["ABI_VERSION", "Kernel", "KernelCall", "kernel", "kernel_include_dir"]

ABI_VERSION = 1  # JAXBIND_KERNEL_ABI_VERSION of include/jaxbind/kernel.h

# enum jaxbind_kwarg_type
_INT, _FLOAT, _BOOL, _STRING, _ARRAY = 1, 2, 3, 4, 5
_XLA_CODE = {dtype: code for code, dtype in XLA_ELEMENT_TYPES.items()}
_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)


def kernel_include_dir() -> str:
    """The directory with ``jaxbind/kernel.h``, the C ABI of kernels (for ``-I``)."""
    return str(pathlib.Path(__file__).parent / "include")


class KernelCall:
    """What the trampoline reads for one kernel site (see cpp/kernels.h): whether the
    kernel batches, the static keyword arguments as typed values, and `address`, the
    kernel's address for a buffer signature ``(inputs, outputs)``, each a tuple of
    ``(shape, XLA element type)``."""

    __slots__ = ("kernel", "batches", "kwargs", "values", "where")

    def __init__(self, kernel: Kernel, values: dict, where: str):
        self.kernel, self.batches, self.values, self.where = kernel, kernel.batches, values, where
        self.kwargs = [_typed(name, values[name], where) for name in sorted(values)]

    def address(self, ins, outs) -> int:
        return self.kernel.address_for(ins, outs, self.values, self.where)


class Kernel:
    """A compiled op body (made by [`kernel`][jaxbind.kernel]).

    Attributes:
      name: what messages call it.
      batches: it takes a whole batch (the call's ``batch_levels``), instead of being
        called by jaxbind once per batch element.
    """

    def __init__(
        self,
        name: str,
        batches: bool,
        address: int | None,
        fn: Callable | None,
        keep=(),
        options: dict | None = None,
    ):
        self.name, self.batches = name, batches
        self._address, self._fn = address, fn
        self._options = dict(options or {})  # numba: the options of the user's @njit
        self._keep = keep  # what holds the code at `address` (see kernel())
        self._compiled: dict = {}  # numba: buffer signature -> cfunc (kept alive here)
        self._checked: set = set()  # numba: call layouts check_call accepted
        self._lock = threading.Lock()
        self.__wrapped__ = fn  # where it was defined (notebook cells run again)

    def __repr__(self):
        return f"<jaxbind kernel {self.name}{' (batches)' if self.batches else ''}>"

    def for_trees(self, trees) -> Kernel:
        """Kernels take flat arrays, whatever the call's pytree structure."""
        return self

    def call_for(self, values: dict, where: str) -> KernelCall:
        return KernelCall(self, values, where)

    def check_call(self, names, n_inputs: int, n_outputs: int, where: str, shape_fns=()) -> None:
        """At trace time: a numba kernel's function must take the call's arrays, and every
        keyword argument the call passes must be a parameter of the function or of one of
        the op's shape functions (`shape_fns`: a keyword argument that only sets output
        shapes, such as a grid size, need not reach the kernel). Any other one, a typo,
        would be dropped silently. C kernels get every keyword argument."""
        if self._fn is None:
            return
        key = (tuple(sorted(names)), n_inputs, n_outputs)
        if key in self._checked:
            return
        static = _static_parameters(self, self._fn, n_inputs, n_outputs, where)
        outside = set(names) - {p.name for p in static}  # not the kernel's parameters
        if outside:
            named = set().union(*(_parameter_names(fn) for fn in shape_fns))
            unknown = sorted(outside - named)
            if unknown:
                takes = ", ".join(p.name for p in static) or "none"
                raise TypeError(
                    f"{where}: the call passes keyword argument {unknown[0]!r}, which "
                    f"neither kernel {self.name} nor the op's shape function takes (the "
                    f"kernel's keyword parameters, after {_count(n_outputs, 'output')} and "
                    f"{_count(n_inputs, 'input')}: {takes}). Rename the keyword argument, "
                    "or add a parameter of that name to the kernel's function"
                )
        missing = [p.name for p in static if p.name not in names and p.default is p.empty]
        if missing:
            raise TypeError(
                f"{where}: kernel {self.name} takes keyword argument {missing[0]!r}, which "
                "the call does not pass (give it a default, or pass it)"
            )
        if not outside:  # (the shape functions may differ between the kernel's bindings)
            self._checked.add(key)

    def address_for(self, ins, outs, values: dict, where: str | None = None) -> int:
        """The address of the kernel for buffers of these element types and ranks."""
        if self._address is not None:
            return self._address
        key = (
            tuple((code, len(shape)) for shape, code in ins),
            tuple((code, len(shape)) for shape, code in outs),
            tuple(sorted((k, _kind_of(v)) for k, v in values.items())),
        )
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = _compile_numba(self, ins, outs, values, where or repr(self))
                self._compiled[key] = compiled
        return compiled.address

    def __call__(self, out, args, kwargs_dump) -> None:
        """Run the kernel from Python on NumPy arrays, as the trampoline would (for
        ``jaxbind.testing.check`` and debugging): ``out`` and ``args`` are tuples of
        arrays, ``kwargs_dump`` the call's keyword arguments."""
        from ._kwargs import load_kwargs

        values = load_kwargs(kwargs_dump) if kwargs_dump is not None else {}
        values.pop("batch_axes", None)
        ins = [np.asarray(a, order="C") for a in args]  # (ascontiguousarray makes 0-d 1-d)
        for o in out:
            if not o.flags.c_contiguous or not o.flags.writeable:
                raise ValueError(f"jaxbind: {self!r}: outputs must be writable and contiguous")
        describe = lambda arrays: tuple((a.shape, _code(a.dtype)) for a in arrays)  # noqa: E731
        call = self.call_for(values, repr(self))
        address = call.address(describe(ins), describe(out))
        keep: list = []
        in_words, out_words = _buffers(ins, keep), _buffers(out, keep)
        kw_words = np.zeros((max(len(call.kwargs), 1), 10), np.int64)
        for m, (name, kind, ival, fval, text, array) in enumerate(call.kwargs):
            name_b = ctypes.create_string_buffer(name.encode())
            keep.append(name_b)
            kw_words[m, :3] = ctypes.addressof(name_b), kind, ival
            kw_words[m, 3:4].view(np.float64)[0] = fval
            if text is not None:
                text_b = ctypes.create_string_buffer(text)
                keep.append(text_b)
                kw_words[m, 4:6] = ctypes.addressof(text_b), len(text)
            if array is not None:
                data = np.frombuffer(array[2], np.uint8).copy()
                dims = np.asarray(array[1], np.int64)
                keep += [data, dims]
                kw_words[m, 6:10] = data.ctypes.data, array[0], len(array[1]), dims.ctypes.data
        error = ctypes.create_string_buffer(1024)
        words = np.array(
            [
                ABI_VERSION,
                len(ins),
                in_words.ctypes.data,
                len(out),
                out_words.ctypes.data,
                len(call.kwargs),
                kw_words.ctypes.data,
                0,
                0,
                ctypes.addressof(error),
                len(error),
            ],
            np.int64,
        )
        status = _SIGNATURE(address)(words.ctypes.data)
        if status != 0:
            why = error.value.decode(errors="replace") or (
                "the numba kernel raised an exception" if status == -1 else f"status {status}"
            )
            raise RuntimeError(f"jaxbind: kernel {self.name} failed: {why}")


def _buffers(arrays, keep: list) -> np.ndarray:
    words = np.zeros((max(len(arrays), 1), 4), np.int64)
    for i, a in enumerate(arrays):
        dims = np.asarray(a.shape, np.int64)
        keep.append(dims)
        words[i] = a.ctypes.data, _code(a.dtype), a.ndim, dims.ctypes.data
    return words


def _code(dtype) -> int:
    code = _XLA_CODE.get(np.dtype(dtype))
    if code is None:
        raise TypeError(f"jaxbind: kernels take no arrays of dtype {np.dtype(dtype)}")
    return code


def _kind_of(value) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.ndim)
    return type(value).__name__


def _typed(name: str, value, where: str) -> tuple:
    """One static keyword argument as the ABI carries it (jaxbind_kwarg)."""
    if isinstance(value, (bool, np.bool_)):
        return (name, _BOOL, int(value), 0.0, None, None)
    if isinstance(value, (int, np.integer)):
        if not -(2**63) <= int(value) < 2**63:
            raise OverflowError(f"{where}: keyword argument {name!r} does not fit in int64")
        return (name, _INT, int(value), 0.0, None, None)
    if isinstance(value, (float, np.floating)):
        return (name, _FLOAT, 0, float(value), None, None)
    if isinstance(value, str):
        return (name, _STRING, 0, 0.0, value.encode(), None)
    if isinstance(value, np.ndarray):
        array = np.asarray(value, order="C")  # 0-d stays 0-d
        return (
            name,
            _ARRAY,
            0,
            0.0,
            None,
            (_code(array.dtype), list(array.shape), array.tobytes()),
        )
    raise TypeError(
        f"{where}: a kernel takes keyword arguments that are ints, floats, bools, strings or "
        f"NumPy arrays; {name!r} is {type(value).__name__}"
    )


def kernel(
    fn=None, /, *, abi_version: int | None = None, batches: bool = False, name: str | None = None
):
    """Make a compiled op body (a decorator when called without `fn`).

    Args:
      fn: a numba-compilable Python function ``fn(*outputs, *inputs, **static)`` (its
        parameters after the arrays are bound to the call's keyword arguments by name),
        a numba ``@cfunc``, a ctypes or cffi function pointer implementing the ABI of
        ``jaxbind/kernel.h``, or an integer address (then `abi_version` is required).
      abi_version: the ABI version the kernel implements (default: this jaxbind's, 1).
      batches: the kernel takes a whole batch under ``vmap`` (the leading
        ``batch_levels`` axes of its buffers); otherwise jaxbind's C++ loop calls it once
        per batch element.
      name: what messages call it (default: the function's name).

    Returns:
      A [`Kernel`][jaxbind.Kernel], to pass wherever a callable goes (``f``, ``f_T``, ``f_jvp``,
      ``f_vjp``, ``def_transpose``, ...).
    """
    if fn is None:
        return lambda f: kernel(f, abi_version=abi_version, batches=batches, name=name)
    if isinstance(fn, Kernel):
        return fn
    label = name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if abi_version is not None and abi_version != ABI_VERSION:
        raise ValueError(
            f"jaxbind.kernel: {label or fn!r} implements kernel ABI version {abi_version}, but "
            f"this jaxbind calls version {ABI_VERSION}"
        )
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
    if address is not None:
        if not address:
            raise ValueError(f"jaxbind.kernel: {label}: the address is 0")
        # The code must outlive the binding: keep the pointer object (a numba cfunc owns
        # its code; a ctypes pointer its CDLL), and the shared library that holds the
        # address open (cffi closes a library when its object is collected).
        keep = (fn, _pin_library(address))
        return Kernel(label or f"at {address:#x}", batches, address, None, keep)
    options = None
    if _is_numba_dispatcher(fn):  # @njit(...): its Python function, compiled with its options
        fn, options = _from_dispatcher(fn, label)
    if not callable(fn) or not inspect.isfunction(fn):
        raise TypeError(
            "jaxbind.kernel: expected a numba-compilable Python function (plain, or decorated "
            "with @numba.njit), a numba cfunc, a ctypes or cffi function pointer, or an "
            f"address; got {fn!r}"
        )
    try:
        import numba  # noqa: F401
    except ImportError:
        raise ImportError(
            f"jaxbind.kernel: compiling {label} needs numba (pip install numba)"
        ) from None
    return Kernel(label, batches, None, fn, options=options)


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


def _address_of(fn) -> int | None:
    """The address of a compiled function pointer, or None for a Python function."""
    if isinstance(fn, ctypes._CFuncPtr):
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


# --- numba ------------------------------------------------------------------------------

_numba_support: dict = {}
_READONLY_MARK = "a write into a read-only array"


class _ReadOnlyWrite(TypeError):
    """Raised while numba types a write into a read-only array that numba itself lets
    through (not a numba error, so that numba does not try another typing rule)."""


def _numba():
    """numba; the intrinsic that turns an address (int64) into a pointer; and the one that
    types an array as read-only, so that numba refuses, when it compiles a kernel, every
    write into its inputs (a kernel's inputs are XLA's buffers: JAX arrays are immutable)."""
    if not _numba_support:
        import operator

        import numba
        from numba.core import cgutils, types
        from numba.core.imputils import impl_ret_borrowed
        from numba.core.typing.templates import AbstractTemplate, infer_global
        from numba.extending import intrinsic

        @intrinsic
        def pointer(typingctx, address):
            def codegen(context, builder, signature, args):
                return builder.inttoptr(args[0], cgutils.voidptr_t)

            return types.voidptr(types.int64), codegen

        @intrinsic
        def readonly(typingctx, array):
            if not isinstance(array, types.Array):
                return None

            def codegen(context, builder, signature, args):  # the same array, retyped
                return impl_ret_borrowed(context, builder, signature.return_type, args[0])

            return array.copy(readonly=True)(array), codegen

        # numba refuses most writes into a read-only array, but lets three routes
        # through (numba 0.60 - 0.62): `a.flat[i] = v` (typed by its generic rule for
        # sequences), np.nditer (whose elements are typed writable) and the in-place
        # operators (`a += 1`, an internal error). These rules are tried before numba's
        # own (a CPU-specific rule comes before generic ones) and refuse them.
        def refuse(array, how):
            raise _ReadOnlyWrite(
                f"{_READONLY_MARK}: {how} {array}, a jaxbind kernel's input (or array "
                "keyword argument), which is read-only"
            )

        def first_rule(op, check):
            class Rule(AbstractTemplate):
                metadata = {"target": "cpu"}

                def generic(self, args, kws):
                    check(args)
                    return None

            infer_global(op)(Rule)

        def flat_write(args):
            if args and isinstance(args[0], types.NumpyFlatType):
                if not args[0].array_type.mutable:
                    refuse(args[0].array_type, "a.flat[...] = ... writes into")

        def nditer(args):
            arrays = args[0] if args and isinstance(args[0], types.BaseTuple) else args
            for array in arrays or ():
                if isinstance(array, types.Array) and not array.mutable:
                    refuse(array, "np.nditer yields writable elements of")

        def in_place(args):
            if args and isinstance(args[0], types.Array) and not args[0].mutable:
                refuse(args[0], "an in-place operator writes into")

        first_rule(operator.setitem, flat_write)
        first_rule(np.nditer, nditer)
        for name in (
            "iadd isub imul itruediv ifloordiv imod ipow imatmul iand ior ixor ilshift irshift"
        ).split():
            first_rule(getattr(operator, name), in_place)

        _numba_support.update(numba=numba, pointer=pointer, readonly=readonly)
    support = _numba_support
    return support["numba"], support["pointer"], support["readonly"]


def _parameter_names(fn) -> set:
    """The names a function takes as parameters, other than *args and **kwargs."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _static_parameters(k: Kernel, fn, n_inputs: int, n_outputs: int, where: str) -> list:
    """The parameters of a numba kernel's function after its arrays (the outputs, then the
    inputs), or a TypeError saying how the function must be laid out."""
    params = list(inspect.signature(fn).parameters.values())
    n_arrays = n_inputs + n_outputs
    if len(params) < n_arrays or any(
        p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[:n_arrays]
    ):
        raise TypeError(
            f"{where}: kernel {k.name} takes its {_count(n_outputs, 'output')}, then its "
            f"{_count(n_inputs, 'input')}, as positional parameters, but its signature is "
            f"{inspect.signature(fn)}"
        )
    return params[n_arrays:]


def _compile_numba(k: Kernel, ins, outs, values: dict, where: str):
    """A numba cfunc with the ABI's signature for one buffer signature: it unpacks the
    call (every struct is 8-byte words), then calls the user's function with the outputs,
    the inputs as read-only arrays, and the keyword arguments it names."""
    numba, pointer, readonly = _numba()
    fn = k._fn
    params = _static_parameters(k, fn, len(ins), len(outs), where)
    static = [p.name for p in params]
    missing = [p.name for p in params if p.name not in values and p.default is p.empty]
    if missing:
        raise TypeError(
            f"{where}: kernel {k.name} takes keyword argument {missing[0]!r}, which the call "
            "does not pass (give it a default, or pass it)"
        )
    names = sorted(values)
    env = {
        "carray": numba.carray,
        "pointer": pointer,
        "readonly": readonly,
        "np": np,
        "user": numba.njit(**k._options)(fn),
    }
    src = ["def wrapper(call):", "    c = carray(call, (11,), np.int64)"]
    for side, buffers, word in (("o", outs, 4), ("i", ins, 2)):
        if buffers:
            src.append(f"    {side}b = carray(pointer(c[{word}]), ({4 * len(buffers)},), np.int64)")
    if names:
        src.append(f"    kb = carray(pointer(c[6]), ({10 * len(names)},), np.int64)")
        src.append(f"    kf = carray(pointer(c[6]), ({10 * len(names)},), np.float64)")
    args = []
    for side, buffers in (("o", outs), ("i", ins)):
        for i, (shape, code) in enumerate(buffers):
            var = f"{side}{i}"
            dtype = XLA_ELEMENT_TYPES[code]
            env[f"t_{var}"] = _numba_dtype(k, dtype)
            src.append(_array_lines(var, f"{side}b", 4 * i, len(shape), f"t_{var}"))
            args.append(var if side == "o" else f"readonly({var})")
    exprs = {}
    for m, key in enumerate(names):
        if key not in static:
            continue
        value, base = values[key], 10 * m
        if isinstance(value, (bool, np.bool_)):
            exprs[key] = f"kb[{base + 2}] != 0"
        elif isinstance(value, (int, np.integer)):
            exprs[key] = f"kb[{base + 2}]"
        elif isinstance(value, (float, np.floating)):
            exprs[key] = f"kf[{base + 3}]"
        elif isinstance(value, str):
            src.append(f"    s{m} = carray(pointer(kb[{base + 4}]), (kb[{base + 5}],), np.uint8)")
            exprs[key] = f"s{m}"
        elif isinstance(value, np.ndarray):
            env[f"t_k{m}"] = _numba_dtype(k, value.dtype)
            src.append(f"    kw{m} = kb[{base + 6}:{base + 10}]")
            src.append(_array_lines(f"k{m}", f"kw{m}", 0, value.ndim, f"t_k{m}"))
            exprs[key] = f"readonly(k{m})"
        else:
            raise TypeError(f"jaxbind.kernel {k.name}: keyword argument {key!r} cannot be passed")
    # positionally, in the function's order, up to the first one left to its default
    for key in static:
        if key not in exprs:
            break
        args.append(exprs.pop(key))
    args += [f"{key}={expr}" for key, expr in exprs.items()]
    src += [
        "    try:",
        f"        user({', '.join(args)})",
        "    except Exception:",
        "        return -1",
    ]
    src.append("    return 0")
    exec("\n".join(src), env)  # noqa: S102 - generated from names and numbers only
    signature = numba.types.int32(numba.types.voidptr)
    try:
        return numba.cfunc(signature, nopython=True)(env["wrapper"])
    except Exception as exc:
        raise _compile_error(k, exc, ins, outs, len(outs), where) from None


def _compile_error(k: Kernel, exc: Exception, ins, outs, n_outputs: int, where: str):
    """numba's compile error, as the kernel's: what it was compiled for, and why."""
    text = str(exc)
    params = list(inspect.signature(k._fn).parameters)
    described = lambda buffers: ", ".join(  # noqa: E731
        f"{XLA_ELEMENT_TYPES[code].name}[{len(shape)}d]" for shape, code in buffers
    )
    head = (
        f"{where}: numba cannot compile kernel {k.name} for outputs ({described(outs)}) "
        f"and inputs ({described(ins)})"
    )
    if _READONLY_MARK in text or "readonly array" in text:
        inputs = ", ".join(params[n_outputs : n_outputs + len(ins)])
        outputs = ", ".join(params[:n_outputs])
        return TypeError(
            f"{head}: it writes into an input, and inputs are read-only. A kernel's function "
            f"takes the outputs first, then the inputs: here the outputs are ({outputs}) "
            f"and the inputs ({inputs}). Write only into the outputs.\n\nnumba said: {text}"
        )
    return TypeError(f"{head}:\n{text}")


def _array_lines(var: str, words: str, at: int, rank: int, dtype: str) -> str:
    data = f"pointer({words}[{at}])"
    if rank == 0:
        return f"    {var} = carray({data}, (1,), {dtype})[0:1].reshape(())"
    dims = f"carray(pointer({words}[{at + 3}]), ({rank},), np.int64)"
    shape = ", ".join(f"d_{var}[{j}]" for j in range(rank))
    return f"    d_{var} = {dims}\n    {var} = carray({data}, ({shape},), {dtype})"


def _numba_dtype(k: Kernel, dtype: np.dtype):
    if dtype.name in ("bfloat16", "float16"):
        raise TypeError(f"jaxbind.kernel {k.name}: numba has no {dtype.name} arrays")
    return dtype.type
