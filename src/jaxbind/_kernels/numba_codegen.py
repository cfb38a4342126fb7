"""numba kernels: a ``numba.cfunc`` with the ABI's signature per buffer signature, which
unpacks the call by the ABI's layout table (abi.py) and calls the user's function with
its outputs, its inputs (read-only) and the static keyword arguments it names.

A kernel over ranges (``jaxbind.kernel(fn, ranges=...)``) gets a second cfunc, the task
of the ABI's parallel_for: the wrapper counts the iterations (the user's `ranges`
function of the arrays), splits them into tasks, and hands them to parallel_for; each
task unpacks the call again and calls ``fn(begin, end, *outputs, *inputs, **static)``
on its range. With ``reduction="sum"``, the split depends on the iteration count and
the grain alone, never on the threads: task 0 writes into the outputs and every other
task into outputs of its own, each zeroed by its task, and the wrapper adds them up in
task order, so a call gives the same bits whatever threads it gets.

The functions' source is built as a value (`sources`, with source.Source), every body
inside the error guard; what jaxbind adds to numba is in numba_support.py. A kernel that
runs Python (a ``numba.objmode`` block) is refused once compiled (_check_no_objmode).
"""

from __future__ import annotations

import inspect

import numpy as np

from .._avals import XLA_ELEMENT_TYPES
from .abi import BUFFER, CALL, KWARG
from .numba_support import READONLY_MARK, message, support
from .source import Source

__all__ = ["compile_numba", "count", "parameter_names", "sources", "static_parameters"]

_numba = support  # (the name benchmarks/kernels.py imports)

# The parameter of a numba kernel's function that gets its op's state (in `sources`, the
# value that stands for it among the keyword arguments)
STATE = "state"
_STATE_VALUE = object()
# What a failed numba kernel says (written into call->error by numba_support.failed)
RAISED = (
    "the numba kernel raised an exception (numba's compiled code reports no details: call "
    "the function in Python on the same arrays to see it)"
)
RANGE_RAISED = (
    "the numba kernel raised an exception in one of its ranges (numba's compiled code "
    "reports no details: call the function in Python on the same arrays to see it)"
)
RANGES_RAISED = (
    "its ranges function raised an exception (numba's compiled code reports no details: "
    "call ranges in Python on the same arrays to see it)"
)
WRAPPER_FAILED = "out of memory for the outputs of the reduction's ranges"
COUNT = "its ranges function gave "
COUNT_REST = " iterations; the number of iterations must be a non-negative integer"
# The messages, by the names the generated source gives them
MESSAGES = {
    "m_raised": RAISED,
    "m_range_raised": RANGE_RAISED,
    "m_ranges_raised": RANGES_RAISED,
    "m_wrapper_failed": WRAPPER_FAILED,
    "m_count": COUNT,
    "m_count_rest": COUNT_REST,
}
DEFAULT_GRAIN = 1000
# A reduction's ranges: at most this many, each with outputs of its own
MAX_REDUCTION_RANGES = 64


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


def compile_numba(k, ins, outs, values: dict, where: str, stateful: bool = False):
    """A numba cfunc with the ABI's signature for one buffer signature: it unpacks the
    call by the ABI's layout table, then calls the user's function with the outputs,
    the inputs as read-only arrays, and the keyword arguments it names (for a kernel
    over ranges, through the ABI's parallel_for: see the module's docstring). Refuses
    a function that returns a value (it must write its outputs), and a `ranges` that
    does not give an integer."""
    numba_support = support()
    numba = numba_support["numba"]
    texts, dtypes = sources(k, ins, outs, values, where, stateful)
    env = {
        "carray": numba.carray,
        "np": np,
        **{
            name: numba_support[name]
            for name in ("pointer", "address", "readonly", "failed", "failed_count", "stack_words")
        },
        "parallel_for": numba_support["parallel_for"],
        **{name: message(text) for name, text in MESSAGES.items()},
        "user": numba.njit(**k._options)(k._fn),
        **dtypes,
    }
    cfunc = numba.cfunc(numba.types.int32(numba.types.voidptr), nopython=True)
    try:
        if k.ranges is None:
            compiled = cfunc(texts["wrapper"].define(env, "wrapper"))
        else:
            env["ranges"] = numba.njit(k.ranges)
            task_signature = numba.types.int32(numba.types.voidptr, numba.types.int64)
            task = numba.cfunc(task_signature, nopython=True)(
                texts["task"].define(dict(env), "task")
            )
            env["task_address"] = task.address
            compiled = cfunc(texts["wrapper"].define(env, "wrapper"))
            compiled._jaxbind_task = task  # (the wrapper calls it by its address)
    except Exception as exc:
        raise _compile_error(k, exc, ins, outs, where) from None
    _check_no_objmode(k, (compiled, getattr(compiled, "_jaxbind_task", None)), where)
    _check_returns_nothing(k, env["user"], len(outs), where)
    if k.ranges is not None:
        _check_count(k, env["ranges"], where)
    return compiled


def sources(
    k, ins, outs, values: dict, where: str, stateful: bool = False
) -> tuple[dict[str, Source], dict]:
    """The source of the functions numba compiles for one buffer signature ("wrapper",
    the kernel; "task", a kernel over ranges' task), and the dtypes they name. For an op
    with a state (`stateful`), the function's `state` parameter gets the address of the
    call's object (jaxbind_call.state) as a numba ``voidptr``: what ``numba.carray(state,
    shape, dtype)`` views, and a ctypes or cffi function's ``void *`` parameter takes."""
    params = static_parameters(k, k._fn, len(ins), len(outs), where)
    if stateful:
        values = {**values, STATE: _STATE_VALUE}
    missing = [p.name for p in params if p.name not in values and p.default is p.empty]
    if missing:
        raise TypeError(
            f"{where}: kernel {k.name} takes keyword argument {missing[0]!r}, which the call "
            "does not pass (give it a default, or pass it)"
        )
    dtypes = {}
    for side, buffers in (("o", outs), ("i", ins)):
        for i, (_, _, code) in enumerate(buffers):
            dtypes[f"t_{side}{i}"] = _numba_dtype(k, XLA_ELEMENT_TYPES[code])
    unpack = lambda call, data=None: _unpacked(k, call, ins, outs, values, params, dtypes, data)
    if k.ranges is None:
        wrapper = Source()
        lines, arrays, keywords = unpack("call")
        with wrapper.function("wrapper", "call"):
            wrapper(*lines)
            with wrapper.guarded("return failed(call, m_raised)"):
                wrapper("user(" + ", ".join(arrays + keywords) + ")")
        return {"wrapper": wrapper}, dtypes
    lines, arrays, _ = unpack("call")
    return {
        "wrapper": _ranges_wrapper(k, outs, lines, arrays),
        "task": _ranges_task(k, outs, unpack),
    }, dtypes


# The context of a kernel over ranges, a row of int64 words that the wrapper fills and
# every task reads: the call, the iterations, the tasks, then for each output, with
# reduction="sum", the address of the other tasks' outputs (one block) and their size.
_CTX_CALL, _CTX_N, _CTX_TASKS, _CTX_OUTPUTS = 0, 1, 2, 3


def _ctx_words(outs) -> int:
    return _CTX_OUTPUTS + 2 * len(outs)


def _ranges_task(k, outs, unpack) -> Source:
    """The task of a kernel over ranges: task t of the context's tasks calls the user's
    function on its share of the iterations (with reduction="sum", into outputs it
    zeroes first: the call's own for task 0, its own block for the others)."""
    data = None
    if k.reduction is not None:
        data = {
            i: f"(ob[{BUFFER.words * i + BUFFER['data']}] if t == 0 else "
            f"x[{_CTX_OUTPUTS + 2 * i}] + (t - 1) * x[{_CTX_OUTPUTS + 2 * i + 1}])"
            for i in range(len(outs))
        }
    lines, arrays, keywords = unpack(f"pointer(x[{_CTX_CALL}])", data)
    task = Source()
    with task.function("task", "context, t"):
        task(
            f"x = carray(context, ({_ctx_words(outs)},), np.int64)",
            f"n, tasks = x[{_CTX_N}], x[{_CTX_TASKS}]",
            *lines,
        )
        if k.reduction is not None:
            task(*(f"o{i}.reshape(o{i}.size)[:] = 0" for i in range(len(outs))))
        bounds = ["n * t // tasks", "n * (t + 1) // tasks"]
        with task.guarded("return -1"):  # (a task writes no message: its wrapper does)
            task("user(" + ", ".join(bounds + arrays + keywords) + ")")
    return task


def _ranges_wrapper(k, outs, lines, arrays) -> Source:
    """The kernel of a kernel over ranges: counts the iterations, splits them into tasks,
    runs them with the ABI's parallel_for, and adds up a reduction.

    Without a reduction: ranges of at least `grain` iterations, a few per thread. With
    reduction="sum": n // grain ranges (at least 1, at most MAX_REDUCTION_RANGES),
    whatever the threads; the grain defaults to the outputs' element count (at least
    DEFAULT_GRAIN), so that the ranges' own outputs cost no more than the iterations."""
    src = Source()
    with src.function("wrapper", "call"):
        src(*lines)
        with src.guarded("return failed(call, m_ranges_raised)"):
            src(f"count = ranges({', '.join(arrays)})")
        with src.block("if count < 0:"):
            src("return failed_count(call, m_count, count, m_count_rest)")
        src("n = np.int64(count)")
        if k.reduction is None:
            grain = k.grain or DEFAULT_GRAIN
            src(f"tasks = max(min(n // {grain}, 4 * c[{CALL['n_threads']}]), 1)")
        else:
            sizes = " + ".join(f"o{i}.size" for i in range(len(outs)))
            grain = str(k.grain) if k.grain else f"max({DEFAULT_GRAIN}, {sizes})"
            src(f"tasks = min(max(n // {grain}, 1), {MAX_REDUCTION_RANGES})")
        # the context on the stack: it lives until the tasks end, and cannot fail
        src(f"x = carray(stack_words({_ctx_words(outs)}), ({_ctx_words(outs)},), np.int64)")
        src("x[:] = 0")
        if k.reduction is not None:  # the other tasks' outputs (each task zeroes its own)
            with src.guarded("return failed(call, m_wrapper_failed)"):  # (out of memory)
                src(
                    *(f"p{i} = np.empty((tasks - 1) * o{i}.size, t_o{i})" for i in range(len(outs)))
                )
        src(
            f"x[{_CTX_CALL}] = address(call)",
            f"x[{_CTX_N}] = n",
            f"x[{_CTX_TASKS}] = tasks",
        )
        if k.reduction is not None:
            for i in range(len(outs)):
                src(
                    f"x[{_CTX_OUTPUTS + 2 * i}] = p{i}.ctypes.data",
                    f"x[{_CTX_OUTPUTS + 2 * i + 1}] = o{i}.nbytes",
                )
        src(
            f"status = parallel_for(c[{CALL['parallel_for']}], address(call), tasks, "
            "task_address, x.ctypes.data)"
        )
        with src.block("if status != 0:"):
            src("return failed(call, m_range_raised)")
        if k.reduction is not None:  # in task order, whatever the threads: the same sum
            for i in range(len(outs)):
                src(
                    f"f{i} = o{i}.reshape(o{i}.size)",
                    "for t in range(tasks - 1):",
                    f"    f{i} += p{i}[t * f{i}.size : (t + 1) * f{i}.size]",
                )
    return src


def _unpacked(k, call, ins, outs, values, params, dtypes, data=None) -> tuple[list, list, list]:
    """Lines that unpack `call` (a pointer expression) into the arrays o0.., i0.. and the
    keyword arguments, and the arguments of the user's function: its arrays (outputs,
    read-only inputs), then the static keyword arguments it names. `data`: for an
    output, an expression of its data's address other than its buffer's. Array keyword
    arguments' dtypes go into `dtypes`."""
    static = [p.name for p in params]
    stateful = values.get(STATE) is _STATE_VALUE
    names = sorted(key for key, value in values.items() if value is not _STATE_VALUE)
    src = [f"c = carray({call}, ({CALL.words},), np.int64)"]
    for side, buffers, field in (("o", outs, "outputs"), ("i", ins, "inputs")):
        if buffers:
            words = BUFFER.words * len(buffers)
            src.append(f"{side}b = carray(pointer(c[{CALL[field]}]), ({words},), np.int64)")
    if names:
        words = KWARG.words * len(names)
        src.append(f"kb = carray(pointer(c[{CALL['kwargs']}]), ({words},), np.int64)")
        src.append(f"kf = carray(pointer(c[{CALL['kwargs']}]), ({words},), np.float64)")
    arrays = []
    for side, buffers in (("o", outs), ("i", ins)):
        for i, (_, shape, _) in enumerate(buffers):
            var = f"{side}{i}"
            at = (data or {}).get(i) if side == "o" else None
            src += _array_lines(var, f"{side}b", BUFFER.words * i, len(shape), f"t_{var}", at)
            arrays.append(var if side == "o" else f"readonly({var})")
    exprs = {}
    if stateful and STATE in static:  # the address of the call's object (see `sources`)
        exprs[STATE] = f"pointer(c[{CALL['state']}])"
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
            src.append(f"s{m} = carray(pointer(kb[{text}]), (kb[{size}],), np.uint8)")
            exprs[key] = f"s{m}"
        elif isinstance(value, np.ndarray):
            dtypes[f"t_k{m}"] = _numba_dtype(k, value.dtype)
            src.append(f"kw{m} = kb[{at['array']}:{at['array'] + BUFFER.words}]")
            src += _array_lines(f"k{m}", f"kw{m}", 0, value.ndim, f"t_k{m}")
            exprs[key] = f"readonly(k{m})"
        else:
            raise TypeError(f"jaxbind.kernel {k.name}: keyword argument {key!r} cannot be passed")
    # positionally, in the function's order, up to the first one left to its default
    keywords = []
    for key in static:
        if key not in exprs:
            break
        keywords.append(exprs.pop(key))
    keywords += [f"{key}={expr}" for key, expr in exprs.items()]
    return src, arrays, keywords


def _array_lines(
    var: str, words: str, at: int, rank: int, dtype: str, data_at: str | None = None
) -> list[str]:
    """Lines that make `var` the array of the jaxbind_buffer at word `at` of `words` (at
    the address `data_at`, where given)."""
    if data_at is None:
        data_at = f"{words}[{at + BUFFER['data']}]"
    data = f"pointer({data_at})"
    if rank == 0:
        return [f"{var} = carray({data}, (1,), {dtype})[0:1].reshape(())"]
    dims = f"carray(pointer({words}[{at + BUFFER['dims']}]), ({rank},), np.int64)"
    shape = ", ".join(f"d_{var}[{j}]" for j in range(rank))
    return [f"d_{var} = {dims}", f"{var} = carray({data}, ({shape},), {dtype})"]


def _parameters(k, n_inputs: int, n_outputs: int) -> tuple[str, str]:
    """The names of the function's output and input parameters, for messages."""
    params = list(inspect.signature(k._fn).parameters)
    lead = 2 if k.ranges is not None else 0
    outputs = params[lead : lead + n_outputs]
    return ", ".join(outputs), ", ".join(params[lead + n_outputs : lead + n_outputs + n_inputs])


def _compile_error(k, exc: Exception, ins, outs, where: str):
    """numba's compile error, as the kernel's: what it was compiled for, and why."""
    text = str(exc)
    described = lambda buffers: ", ".join(
        f"{XLA_ELEMENT_TYPES[code].name}[{len(shape)}d]" for _, shape, code in buffers
    )
    head = (
        f"{where}: numba cannot compile kernel {k.name} for outputs ({described(outs)}) "
        f"and inputs ({described(ins)})"
    )
    if READONLY_MARK in text or "readonly array" in text:
        outputs, inputs = _parameters(k, len(ins), len(outs))
        # numba refuses some writes by name, others as a call it finds no implementation
        # for, with a read-only array among the argument types (which another mistake
        # in a call that takes an input looks like too)
        sure = READONLY_MARK in text or "Cannot modify readonly array" in text
        what = (
            "it writes into an input"
            if sure
            else "it may write into an input (numba found no implementation of a call that "
            "takes a read-only array; if nothing writes into an input, numba's message "
            "below says what else is wrong)"
        )
        return TypeError(
            f"{head}: {what}, and inputs are read-only. A kernel's function takes the "
            f"outputs first, then the inputs: here the outputs are ({outputs}) and the "
            f"inputs ({inputs}). Write only into the outputs.\n\nnumba said: {text}"
        )
    got = [f"output {i}" for i in range(len(outs))] + [f"input {i}" for i in range(len(ins))]
    params = list(inspect.signature(k._fn).parameters)
    given = zip(params[2 if k.ranges is not None else 0 :], got)  # (after begin, end)
    return TypeError(
        f"{head}. Its parameters got {', '.join(f'{p} = {g}' for p, g in given)}: a kernel "
        "takes its role's outputs first, then its inputs (if they are out of order, see the "
        f"table of roles in the docs, 'A kernel for every role').\n\nnumba said: {text}"
    )


# What numba's lowering of a ``with numba.objmode():`` block names the global that caches
# the block's dispatcher (numba 0.49 - 0.68), in the compiled code of the kernel or of any
# function it calls (their code is linked into the kernel's)
_OBJMODE_MARK = "cached_objmode_dispatcher"


def _check_no_objmode(k, cfuncs, where: str) -> None:
    """A kernel runs without the GIL, on XLA's threads, past jaxbind's guards for Python
    (interpreter exit, Ctrl-C, the callable's traceback). A ``numba.objmode`` block takes
    the GIL there and runs Python, and an exception in it is left set in Python's error
    state, where a later, unrelated call finds it (a SystemError): refused here, when the
    kernel is compiled, as numba's object mode is (see _from_dispatcher)."""
    if any(f is not None and _OBJMODE_MARK in f.inspect_llvm() for f in cfuncs):
        raise TypeError(
            f"{where}: kernel {k.name} uses numba.objmode (a `with numba.objmode():` block, "
            "in its function or in one it calls, or in its ranges), which runs Python inside "
            "compiled code; a kernel runs without the GIL on XLA's threads, where it cannot "
            "run Python safely or report a Python exception. Keep the kernel in nopython "
            "code, or make the body a Python function (pass it without jaxbind.kernel), "
            "which jaxbind calls with the GIL and whose exceptions it reports"
        )


def _check_returns_nothing(k, user, n_outputs: int, where: str) -> None:
    """A kernel's function writes its results into its outputs: one that returns a value
    (``return 2 * x``) would leave them unwritten."""
    from numba.core import types

    for signature in user.nopython_signatures:
        if signature.return_type != types.none:
            outputs, _ = _parameters(k, 0, n_outputs)
            raise TypeError(
                f"{where}: kernel {k.name} returns a value ({signature.return_type}) instead "
                f"of writing its results: a kernel's function writes each result into its "
                f"output argument ({outputs}), as in out[...] = 2 * x, and returns nothing. "
                "Write the result into the output instead of returning it"
            )


def _check_count(k, ranges, where: str) -> None:
    """A kernel's `ranges` gives the number of iterations: an integer."""
    from numba.core import types

    for signature in ranges.nopython_signatures:
        if not isinstance(signature.return_type, types.Integer):
            raise TypeError(
                f"{where}: the ranges function of kernel {k.name} gives "
                f"{signature.return_type}, but it must give the number of iterations, a "
                "non-negative integer (use // rather than /, or int(...))"
            )


def _numba_dtype(k, dtype: np.dtype):
    if dtype.name in ("bfloat16", "float16"):
        raise TypeError(f"jaxbind.kernel {k.name}: numba has no {dtype.name} arrays")
    return dtype.type
