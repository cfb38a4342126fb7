"""numba kernels: a ``numba.cfunc`` with the ABI's signature per buffer signature, which
unpacks the call by the ABI's layout table (abi.py) and calls the user's function with
its outputs, its inputs (read-only) and the static keyword arguments it names.
"""

from __future__ import annotations

import inspect

import numpy as np

from .._avals import XLA_ELEMENT_TYPES
from .abi import BUFFER, CALL, KWARG

__all__ = ["compile_numba", "count", "parameter_names", "static_parameters"]


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


def parameter_names(fn) -> set:
    """The names a function takes as parameters, other than *args and **kwargs."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def static_parameters(k, fn, n_inputs: int, n_outputs: int, where: str) -> list:
    """The parameters of a numba kernel's function after its arrays (the outputs, then the
    inputs), or a TypeError saying how the function must be laid out."""
    params = list(inspect.signature(fn).parameters.values())
    n_arrays = n_inputs + n_outputs
    if len(params) < n_arrays or any(
        p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[:n_arrays]
    ):
        raise TypeError(
            f"{where}: kernel {k.name} takes its {count(n_outputs, 'output')}, then its "
            f"{count(n_inputs, 'input')}, as positional parameters, but its signature is "
            f"{inspect.signature(fn)}"
        )
    return params[n_arrays:]


def compile_numba(k, ins, outs, values: dict, where: str):
    """A numba cfunc with the ABI's signature for one buffer signature: it unpacks the
    call by the ABI's layout table, then calls the user's function with the outputs,
    the inputs as read-only arrays, and the keyword arguments it names."""
    numba, pointer, readonly = _numba()
    fn = k._fn
    params = static_parameters(k, fn, len(ins), len(outs), where)
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
    src = ["def wrapper(call):", f"    c = carray(call, ({CALL.words},), np.int64)"]
    for side, buffers, field in (("o", outs, "outputs"), ("i", ins, "inputs")):
        if buffers:
            words = BUFFER.words * len(buffers)
            src.append(f"    {side}b = carray(pointer(c[{CALL[field]}]), ({words},), np.int64)")
    if names:
        words = KWARG.words * len(names)
        src.append(f"    kb = carray(pointer(c[{CALL['kwargs']}]), ({words},), np.int64)")
        src.append(f"    kf = carray(pointer(c[{CALL['kwargs']}]), ({words},), np.float64)")
    args = []
    for side, buffers in (("o", outs), ("i", ins)):
        for i, (_, shape, code) in enumerate(buffers):
            var = f"{side}{i}"
            dtype = XLA_ELEMENT_TYPES[code]
            env[f"t_{var}"] = _numba_dtype(k, dtype)
            src.append(_array_lines(var, f"{side}b", BUFFER.words * i, len(shape), f"t_{var}"))
            args.append(var if side == "o" else f"readonly({var})")
    exprs = {}
    for m, key in enumerate(names):
        if key not in static:
            continue
        value, base = values[key], KWARG.words * m
        at = {field: base + offset for field, offset in KWARG.offsets.items()}
        if isinstance(value, (bool, np.bool_)):
            exprs[key] = f"kb[{at['int_value']}] != 0"
        elif isinstance(value, (int, np.integer)):
            exprs[key] = f"kb[{at['int_value']}]"
        elif isinstance(value, (float, np.floating)):
            exprs[key] = f"kf[{at['float_value']}]"
        elif isinstance(value, str):
            text, size = at["string"], at["string_size"]
            src.append(f"    s{m} = carray(pointer(kb[{text}]), (kb[{size}],), np.uint8)")
            exprs[key] = f"s{m}"
        elif isinstance(value, np.ndarray):
            env[f"t_k{m}"] = _numba_dtype(k, value.dtype)
            src.append(f"    kw{m} = kb[{at['array']}:{at['array'] + BUFFER.words}]")
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
    exec("\n".join(src), env)
    signature = numba.types.int32(numba.types.voidptr)
    try:
        return numba.cfunc(signature, nopython=True)(env["wrapper"])
    except Exception as exc:
        raise _compile_error(k, exc, ins, outs, len(outs), where) from None


def _compile_error(k, exc: Exception, ins, outs, n_outputs: int, where: str):
    """numba's compile error, as the kernel's: what it was compiled for, and why."""
    text = str(exc)
    params = list(inspect.signature(k._fn).parameters)
    described = lambda buffers: ", ".join(
        f"{XLA_ELEMENT_TYPES[code].name}[{len(shape)}d]" for _, shape, code in buffers
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
    """Lines that make `var` the array of the jaxbind_buffer at word `at` of `words`."""
    data = f"pointer({words}[{at + BUFFER['data']}])"
    if rank == 0:
        return f"    {var} = carray({data}, (1,), {dtype})[0:1].reshape(())"
    dims = f"carray(pointer({words}[{at + BUFFER['dims']}]), ({rank},), np.int64)"
    shape = ", ".join(f"d_{var}[{j}]" for j in range(rank))
    return f"    d_{var} = {dims}\n    {var} = carray({data}, ({shape},), {dtype})"


def _numba_dtype(k, dtype: np.dtype):
    if dtype.name in ("bfloat16", "float16"):
        raise TypeError(f"jaxbind.kernel {k.name}: numba has no {dtype.name} arrays")
    return dtype.type
