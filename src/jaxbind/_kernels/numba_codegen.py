"""numba kernels: a ``numba.cfunc`` with the ABI's signature per buffer signature, which
unpacks the call by the ABI's layout table (abi.py) and calls the user's function with
its outputs, its inputs (read-only) and the static keyword arguments it names.

A kernel over ranges (``jaxbind.kernel(fn, ranges=...)``) gets a second cfunc, the task
of the ABI's parallel_for: the wrapper counts the iterations (the user's `ranges`
function of the arrays), splits them into tasks, and hands them to parallel_for; each
task unpacks the call again and calls ``fn(begin, end, *outputs, *inputs, **static)``
on its range. With ``reduction="sum"``, task 0 writes into the outputs, zeroed, and
every other task into zeroed outputs of its own, which the wrapper adds up at the end.
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
    """numba; the intrinsic that turns an address (int64) into a pointer, and back; the one
    that types an array as read-only, so that numba refuses, when it compiles a kernel,
    every write into its inputs (a kernel's inputs are XLA's buffers: JAX arrays are
    immutable); and the one that calls the ABI's parallel_for through its address."""
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
        def address(typingctx, ptr):
            def codegen(context, builder, signature, args):
                return builder.ptrtoint(args[0], cgutils.intp_t)

            return types.int64(types.voidptr), codegen

        @intrinsic
        def parallel_for(typingctx, fn, call, n_tasks, task, context):
            # int32_t (*)(const jaxbind_call *, int64_t, jaxbind_task_fn, void *), all
            # given as int64 addresses
            def codegen(ctx, builder, signature, args):
                from llvmlite import ir

                i64, ptr = ir.IntType(64), cgutils.voidptr_t
                fnty = ir.FunctionType(ir.IntType(32), [ptr, i64, ptr, ptr])
                target = builder.inttoptr(args[0], fnty.as_pointer())
                return builder.call(
                    target,
                    [
                        builder.inttoptr(args[1], ptr),
                        args[2],
                        builder.inttoptr(args[3], ptr),
                        builder.inttoptr(args[4], ptr),
                    ],
                )

            i64 = types.int64
            return types.int32(i64, i64, i64, i64, i64), codegen

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

        _numba_support.update(
            numba=numba,
            pointer=pointer,
            address=address,
            parallel_for=parallel_for,
            readonly=readonly,
        )
    return _numba_support


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
    inputs; a kernel over ranges takes its range's begin and end first), or a TypeError
    saying how the function must be laid out."""
    params = list(inspect.signature(fn).parameters.values())
    lead = 2 if k.ranges is not None else 0
    n_arrays = lead + n_inputs + n_outputs
    if len(params) < n_arrays or any(
        p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[:n_arrays]
    ):
        first = "its range's begin and end, then " if lead else ""
        raise TypeError(
            f"{where}: kernel {k.name} takes {first}its {count(n_outputs, 'output')}, then "
            f"its {count(n_inputs, 'input')}, as positional parameters, but its signature "
            f"is {inspect.signature(fn)}"
        )
    return params[n_arrays:]


def compile_numba(k, ins, outs, values: dict, where: str):
    """A numba cfunc with the ABI's signature for one buffer signature: it unpacks the
    call by the ABI's layout table, then calls the user's function with the outputs,
    the inputs as read-only arrays, and the keyword arguments it names (for a kernel
    over ranges, through the ABI's parallel_for: see the module's docstring)."""
    support = _numba()
    numba = support["numba"]
    params = static_parameters(k, k._fn, len(ins), len(outs), where)
    missing = [p.name for p in params if p.name not in values and p.default is p.empty]
    if missing:
        raise TypeError(
            f"{where}: kernel {k.name} takes keyword argument {missing[0]!r}, which the call "
            "does not pass (give it a default, or pass it)"
        )
    env = {
        "carray": numba.carray,
        "pointer": support["pointer"],
        "address": support["address"],
        "parallel_for": support["parallel_for"],
        "readonly": support["readonly"],
        "np": np,
        "user": numba.njit(**k._options)(k._fn),
    }
    for side, buffers in (("o", outs), ("i", ins)):
        for i, (_, _, code) in enumerate(buffers):
            env[f"t_{side}{i}"] = _numba_dtype(k, XLA_ELEMENT_TYPES[code])
    signature = numba.types.int32(numba.types.voidptr)
    try:
        if k.ranges is None:
            lines, args = _unpacked(k, "call", ins, outs, values, params, env)
            src = ["def wrapper(call):", *lines]
            src += _called("user(" + ", ".join(args) + ")", "-1") + ["    return 0"]
            exec("\n".join(src), env)
            return numba.cfunc(signature, nopython=True)(env["wrapper"])
        task = _ranges_task(k, ins, outs, values, params, env)
        exec("\n".join(_ranges_wrapper(k, ins, outs, values, params, env, task)), env)
        compiled = numba.cfunc(signature, nopython=True)(env["wrapper"])
        compiled._jaxbind_task = task  # (the wrapper calls it by its address)
        return compiled
    except Exception as exc:
        raise _compile_error(k, exc, ins, outs, len(outs), where) from None


# The context of a kernel over ranges, a row of int64 words that the wrapper fills and
# every task reads: the call, the iterations, the tasks, then for each output, with
# reduction="sum", the address of the other tasks' outputs (one block) and their size.
_CTX_CALL, _CTX_N, _CTX_TASKS, _CTX_OUTPUTS = 0, 1, 2, 3


def _ctx_words(outs) -> int:
    return _CTX_OUTPUTS + 2 * len(outs)


def _ranges_task(k, ins, outs, values, params, env):
    """The task cfunc of a kernel over ranges: task t of the context's tasks calls the
    user's function on its share of the iterations."""
    numba = _numba()["numba"]
    data = None
    if k.reduction is not None:  # task 0 writes the outputs, task t > 0 its own
        data = {
            i: f"(ob[{BUFFER.words * i + BUFFER['data']}] if t == 0 else "
            f"x[{_CTX_OUTPUTS + 2 * i}] + (t - 1) * x[{_CTX_OUTPUTS + 2 * i + 1}])"
            for i in range(len(outs))
        }
    lines, args = _unpacked(k, f"pointer(x[{_CTX_CALL}])", ins, outs, values, params, env, data)
    src = [
        "def task(context, t):",
        f"    x = carray(context, ({_ctx_words(outs)},), np.int64)",
        f"    n, tasks = x[{_CTX_N}], x[{_CTX_TASKS}]",
        *lines,
    ]
    args = ["n * t // tasks", "n * (t + 1) // tasks", *args]
    src += _called("user(" + ", ".join(args) + ")", "-1") + ["    return 0"]
    local = dict(env)
    exec("\n".join(src), local)
    signature = numba.types.int32(numba.types.voidptr, numba.types.int64)
    return numba.cfunc(signature, nopython=True)(local["task"])


def _ranges_wrapper(k, ins, outs, values, params, env, task) -> list:
    """The kernel of a kernel over ranges: counts the iterations, splits them into tasks
    (a few per thread, or one per thread with reduction="sum", each of at least `grain`
    iterations), runs them with the ABI's parallel_for, and adds up a reduction."""
    env["ranges"] = _numba()["numba"].njit(k.ranges)
    lines, args = _unpacked(k, "call", ins, outs, values, params, env)
    src = ["def wrapper(call):", *lines]
    arrays = args[: len(ins) + len(outs)]
    per_thread = 1 if k.reduction is not None else 4
    src += [
        f"    n = np.int64(ranges({', '.join(arrays)}))",
        "    if n < 0:",
        "        n = 0",
        f"    tasks = min((n + {k.grain - 1}) // {k.grain}, {per_thread} * c[{CALL['n_threads']}])",
        "    if tasks < 1:",
        "        tasks = 1",
        f"    x = np.zeros({_ctx_words(outs)}, np.int64)",
        f"    x[{_CTX_CALL}] = address(call)",
        f"    x[{_CTX_N}] = n",
        f"    x[{_CTX_TASKS}] = tasks",
    ]
    if k.reduction is not None:
        for i in range(len(outs)):
            src += [
                f"    f{i} = o{i}.reshape(o{i}.size)",
                f"    f{i}[:] = 0",
                f"    p{i} = np.zeros((tasks - 1) * o{i}.size, t_o{i})",
                f"    x[{_CTX_OUTPUTS + 2 * i}] = p{i}.ctypes.data",
                f"    x[{_CTX_OUTPUTS + 2 * i + 1}] = o{i}.nbytes",
            ]
    src += [
        f"    status = parallel_for(c[{CALL['parallel_for']}], address(call), tasks, "
        f"{task.address}, x.ctypes.data)",
        "    if status != 0:",
        "        return status",
    ]
    if k.reduction is not None:  # in task order: the same sum for the same thread count
        for i in range(len(outs)):
            src += [
                f"    for t in range(x[{_CTX_TASKS}] - 1):",
                f"        f{i} += p{i}[t * f{i}.size : (t + 1) * f{i}.size]",
            ]
    src += [f"    return 0 if x[{_CTX_TASKS}] >= 1 else -1"]  # (x lives until the tasks end)
    return src


def _called(call: str, failed: str) -> list:
    return ["    try:", f"        {call}", "    except Exception:", f"        return {failed}"]


def _unpacked(k, call, ins, outs, values, params, env, data=None) -> tuple[list, list]:
    """Lines that unpack `call` (a pointer expression) into the arrays o0.., i0.. and the
    keyword arguments, and the arguments of the user's function (outputs, read-only
    inputs, then the static keyword arguments it names). `data`: for an output, an
    expression of its data's address other than its buffer's. Array keyword arguments'
    dtypes go into `env`."""
    static = [p.name for p in params]
    names = sorted(values)
    src = [f"    c = carray({call}, ({CALL.words},), np.int64)"]
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
        for i, (_, shape, _) in enumerate(buffers):
            var = f"{side}{i}"
            at = (data or {}).get(i) if side == "o" else None
            src.append(_array_lines(var, f"{side}b", BUFFER.words * i, len(shape), f"t_{var}", at))
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
    return src, args


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
    got = [f"output {i}" for i in range(len(outs))] + [f"input {i}" for i in range(len(ins))]
    given = zip(params[2 if k.ranges is not None else 0 :], got)  # (after begin, end)
    return TypeError(
        f"{head}. Its parameters got {', '.join(f'{p} = {g}' for p, g in given)}: a kernel "
        "takes its role's outputs first, then its inputs (if they are out of order, see the "
        f"table of roles in the docs, 'A kernel for every role').\n\nnumba said: {text}"
    )


def _array_lines(
    var: str, words: str, at: int, rank: int, dtype: str, data_at: str | None = None
) -> str:
    """Lines that make `var` the array of the jaxbind_buffer at word `at` of `words` (at
    the address `data_at`, where given)."""
    if data_at is None:
        data_at = f"{words}[{at + BUFFER['data']}]"
    data = f"pointer({data_at})"
    if rank == 0:
        return f"    {var} = carray({data}, (1,), {dtype})[0:1].reshape(())"
    dims = f"carray(pointer({words}[{at + BUFFER['dims']}]), ({rank},), np.int64)"
    shape = ", ".join(f"d_{var}[{j}]" for j in range(rank))
    return f"    d_{var} = {dims}\n    {var} = carray({data}, ({shape},), {dtype})"


def _numba_dtype(k, dtype: np.dtype):
    if dtype.name in ("bfloat16", "float16"):
        raise TypeError(f"jaxbind.kernel {k.name}: numba has no {dtype.name} arrays")
    return dtype.type
