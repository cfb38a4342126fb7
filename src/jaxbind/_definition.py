"""The definition a program was made for: every property of an op that the lowering bakes
into a program, written into each call (call format 4's ``definition`` attribute) and
compared with the op's definition at run time before any body runs (see
_runtime.fits, step 1).

A program names its op by string, so the op it finds may be another definition than the
one it was traced with (redefined with ``replace=True``, or defined otherwise in the
process that loads an exported program). Shapes, dtypes and counts are checked against
the buffers; what this module records is the rest, which no buffer shows: whether an
output shares an input's memory, the effects, the fixed count, vectorized batching, the
state and its key, linearity, the API, the CUDA kernel target, and the sharding rule a
partitioned call was split by.

Every field of `Options` is in exactly one of `COMPARED` (recorded per op and compared
whole), `PER_CALL` (recorded as what the call used: the rule, only for a call that was
partitioned by it; a call that runs whole gives the right result under any rule),
`READ_AT_RUN_TIME` (the runtime reads it from the op it finds, so no program keeps it) and
`CHOSEN_AT_LOWERING` (it decides whether a call is a custom call at all; ``prefer_reference=``
would be one, but it is part of the op's reference, not of `Options`).

Besides options, a program holds code of the op that it inlined when it was traced: the
rules derived from the op's JAX reference, a reference that computes a role on a platform
without its native body, and rules given as JAX functions. Its custom calls run the body
the op has now, so the record keeps the identity of that code (`inlined`: the functions'
source, or their code where there is none, and the values they close over, read from
their defaults, cells and globals; never an address). A redefinition with equal code keeps
old programs running, as it does for bodies; another reference or JAX-function rule makes
them fail, naming the op, rather than mix the new body with the old rule.
tests/runtime/test_definition_travels.py redefines every option of both APIs and fails for an
option left out of these tables.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._errors import words
from ._options import Options
from ._roles import Body, JaxFunction, OpBase, RoleDef

__all__ = [
    "CHOSEN_AT_LOWERING",
    "COMPARED",
    "PER_CALL",
    "READ_AT_RUN_TIME",
    "kept_rule",
    "differences",
    "inlined",
    "record",
]

# Options a program bakes in, each as a plain value (JSON) the record keeps.
COMPARED: dict[str, Callable[[Options], Any]] = {
    "fixed": lambda o: o.fixed,
    "vectorized": lambda o: o.vectorized,
    "aliases": lambda o: [list(pair) for pair in o.aliases],
    "effect": lambda o: o.effect,
    "linear_in": lambda o: list(o.linear_in),
    "pytree_api": lambda o: o.pytree_api,
    "state": lambda o: o.state is not None,
    "state_key": lambda o: list(o.state_key),
}
# Options a program keeps as the value its call used (see `kept_rule`).
PER_CALL = ("sharding",)  # with its reduction factors
# Options the runtime reads from the op it finds, at every site: not in any program.
READ_AT_RUN_TIME = {
    "platform_mode": "the GPU handler reads it from the op when it makes a site's plan",
}
# Options that choose, when a program is lowered, between the native body's custom call
# and the op's JAX reference inlined: a program holds no record of them, and is right
# under any value (a custom call runs the native body; an inlined reference is JAX code).
# (none now: where the reference computes the op instead of the native body, its
# platforms, is part of the op's reference, _roles.Reference, whose function is `inlined`)
CHOSEN_AT_LOWERING: dict[str, str] = {}


def kept_rule(options: Options, kwargs: dict, shapes: Sequence[Sequence[int]]) -> list | None:
    """f's rule for a call as a program records it, ``[text, [reduction factors]]``, or
    None (the op declares none, or its function gives none for this call); a rule
    function is called with the shapes of f's arguments and the call's keyword
    arguments (_sharding.Sharding.for_call)."""
    if options.sharding is None:
        return None
    rule = options.sharding.for_call(shapes, kwargs, "jaxbind: the op's sharding function")
    return None if rule is None else rule.record()


def record(
    options: Options,
    cuda_kernel: bool,
    rule: list | None = None,
    shapes: Sequence[Sequence[int]] = (),
    inlined: str | None = None,
) -> str:
    """The ``definition`` attribute of a call: the op's compared options, whether the
    role's body is a CUDA kernel (its own FFI target), the identity of the op's code a
    program may inline (`inlined`, see `inlined`), and, for a call partitioned by its
    rule, that rule and the shapes of f's arguments it was worked out for."""
    value = {name: get(options) for name, get in COMPARED.items()}
    value["cuda_kernel"] = cuda_kernel
    value["inlined"] = inlined
    if rule is not None:
        value["rule"] = rule
        value["rule_shapes"] = [list(s) for s in shapes]
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def differences(
    recorded: str,
    options: Options,
    cuda_kernel: bool,
    kwargs: dict,
    inlined_now: str | None = None,
) -> list[str]:
    """What differs between a call's recorded definition and the op's `options` and
    inlined code (`inlined_now`) now, one phrase per property in the user's words (empty:
    the call fits). A program that inlined none of the op's code (or was recorded before
    jaxbind kept its identity) fits any."""
    try:
        then = json.loads(recorded)
    except ValueError:
        then = None
    if not isinstance(then, dict):
        return ["the program's record of the op's definition is not readable"]
    if "native" in then and "pytree_api" not in then:  # the key's name before 2.0.0.dev0's last
        then["pytree_api"] = then.pop("native")  # renaming: records written then
    now = {name: get(options) for name, get in COMPARED.items()}
    now["cuda_kernel"] = cuda_kernel
    found = []
    for name in (*COMPARED, "cuda_kernel"):
        if name not in then or then[name] != now[name]:
            found.append(_phrase(name, then.get(name), now[name], options))
    if then.get("inlined") is not None and then["inlined"] != inlined_now:
        found.append(
            "the program inlined the op's JAX reference (the rules derived from it) or its "
            "rules given as JAX functions when it was traced, and the op now has "
            + ("none" if inlined_now is None else "other ones")
            + " (its custom calls would run the new body with the old rules)"
        )
    if "rule" in then:
        shapes = then.get("rule_shapes", [])
        try:
            rule = kept_rule(options, kwargs, shapes)
        except Exception as exc:  # the user's rule function
            found.append(
                f"the program was partitioned by the rule {_rule(then['rule'])}, and the op's "
                f"sharding function now raises {type(exc).__name__}: {exc}"
            )
        else:
            if rule != then["rule"]:
                found.append(
                    f"the program was partitioned by the rule {_rule(then['rule'])}, but the "
                    f"op now gives {_rule(rule)} for this call"
                )
    return found


def _rule(rule: Any) -> str:
    if not rule:
        return "none (the call runs whole)"
    text, reduction = rule
    return repr(text) + (f" with reduction={tuple(reduction)!r}" if reduction else "")


def _phrase(name: str, then: Any, now: Any, options: Options) -> str:
    said = words(options)
    label = {
        "fixed": said.fixed,
        "vectorized": said.vectorized,
        "aliases": "input_output_aliases",
        "linear_in": "linear_in",
        "state_key": "the state's key inputs (positions)",
    }.get(name)
    if label is not None:
        show = _aliases if name == "aliases" else _plain
        return (
            f"the program was traced when the op had {label}={show(then)}, but it now has "
            f"{label}={show(now)}"
        )
    if name == "effect":
        return f"the program was traced with {_effect(then)}, but the op now has {_effect(now)}"
    if name == "state":
        return (
            f"the program was traced when the op had {'a' if then else 'no'} state=, but it "
            f"now has {'one' if now else 'none'}"
        )
    if name == "pytree_api":
        api = {True: "the pytree API (a decorator)", False: "jaxbind.get_*_call"}
        return (
            f"the program was traced when the op was made with {api.get(then, then)}, but it "
            f"is now made with {api[now]} (the callables receive their arguments otherwise)"
        )
    kind = {True: "a CUDA kernel", False: "not a CUDA kernel"}
    return (
        f"the program was traced when this role's body was {kind.get(then, then)}, but it is "
        f"now {kind[now]} (they run through different FFI targets)"
    )


def _plain(value: Any) -> str:
    return repr(tuple(value)) if isinstance(value, list) else repr(value)


def _aliases(value: Any) -> str:
    if value is None:
        return "None"
    return repr({int(i): int(k) for i, k in value}) if value else "None"


def _effect(value: Any) -> str:
    return {
        None: "no side effects",
        "unordered": "has_side_effect=True",
        "ordered": "ordered=True",
    }.get(value, repr(value))


def option_fields() -> tuple[str, ...]:
    """Every field of `Options` (the definition-coverage test reads it)."""
    return tuple(f.name for f in dataclasses.fields(Options))


# --- the identity of inlined code ---------------------------------------------------------


def inlined(binding) -> str | None:
    """The identity of the op's code that a program may inline at trace time (its JAX
    reference, and each rule given as a JAX function or a jaxbind op), as a digest; None
    if the op has none. Equal for equal code closing over equal values, in any process
    and Python version where the source is found. Worked out once per role table of the
    binding (_binding.Binding.inlined_cache): recorded at every lowering, compared at
    every site's instantiation."""
    roles, cached = binding.roles, binding.inlined_cache
    if cached is None or cached[0] is not roles:
        cached = binding.inlined_cache = (roles, _inlined(roles))
    return cached[1]


def _inlined(roles: Mapping[str, RoleDef]) -> str | None:
    parts: list = []
    reference = next((e.reference.fn for e in roles.values() if e.reference is not None), None)
    if reference is not None:
        parts.append(["reference", identity(reference)])
    for name in sorted(roles):
        entry = roles[name]
        if entry.kind is Body.JAX:
            parts.append([name, identity(entry.body)])
    if not parts:
        return None
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def identity(value: Any) -> Any:
    """A plain value (JSON) that is equal for equal functions and data: a function by its
    qualified name, source (else code) and what it reads (defaults, closure cells, the
    globals it names), data by value; never by address."""
    return _identity(value, 0, set(), [_VALUES])


_DEPTH = 8  # how deep identity follows functions and objects
_VALUES = 20_000  # how many values it reads of one function (then types only)


def _identity(value: Any, depth: int, seen: set, budget: list) -> Any:
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return [type(value).__name__, repr(value)]
    if isinstance(value, (bytes, bytearray)):
        return ["bytes", hashlib.sha256(bytes(value)).hexdigest()]
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, type):
        return ["type", value.__module__, value.__qualname__]
    budget[0] -= 1
    if depth > _DEPTH or budget[0] < 0:
        return ["deep", _type(value)]
    if id(value) in seen:
        return ["cycle", _type(value)]
    seen = seen | {id(value)}
    deeper = functools.partial(_identity, depth=depth + 1, seen=seen, budget=budget)
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [deeper(v) for v in value]]
    if isinstance(value, dict):
        return ["dict", sorted(([repr(k), deeper(v)] for k, v in value.items()), key=repr)]
    if isinstance(value, (set, frozenset)):
        return ["set", sorted((deeper(v) for v in value), key=repr)]
    if isinstance(value, OpBase):
        return ["op", getattr(value, "name", _type(value))]
    if isinstance(value, JaxFunction):
        return deeper(value.fn)
    if isinstance(value, functools.partial):
        return ["partial", deeper(value.func), deeper(value.args), deeper(value.keywords)]
    if isinstance(value, types.MethodType):
        return ["method", deeper(value.__func__), deeper(value.__self__)]
    if isinstance(value, types.FunctionType):
        return _function(value, deeper)
    if hasattr(value, "__wrapped__"):  # functools.wraps, jax.jit, jaxbind's own wrappers
        return ["wrapped", deeper(value.__wrapped__)]
    if isinstance(value, (np.ndarray, np.generic)) or (
        hasattr(value, "__array__") and hasattr(value, "shape") and hasattr(value, "dtype")
    ):
        return _array(value)
    if callable(value) and not hasattr(value, "__dict__"):  # builtins, ufuncs
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", "")
        return ["callable", _type(value), getattr(value, "__module__", None), name]
    fields = getattr(value, "__dict__", None)
    return ["object", _type(value), deeper(dict(fields)) if fields is not None else None]


def _function(fn: types.FunctionType, deeper: Callable) -> list:
    code = fn.__code__
    try:  # the source, with the code's constants and names (lambdas on one line)
        source: Any = [inspect.getsource(fn), _constants(code)]
    except (OSError, TypeError):
        source = _code(code)
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(deeper(cell.cell_contents))
        except ValueError:  # an empty cell
            cells.append(None)
    names = sorted(n for n in _names(code) if n in fn.__globals__)
    reads = [[n, deeper(fn.__globals__[n])] for n in names if fn.__globals__[n] is not fn]
    return [
        "function",
        fn.__module__,
        fn.__qualname__,
        source,
        deeper(fn.__defaults__),
        deeper(fn.__kwdefaults__),
        cells,
        reads,
    ]


def _names(code: types.CodeType) -> set[str]:
    """The global (and attribute) names `code` and the code nested in it use."""
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found


def _constants(code: types.CodeType) -> list:
    """The names and constants of `code` and the code nested in it, as the source gives
    them (what the interpreter adds, None and the code objects, left out)."""
    found: list = [list(code.co_names)]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.append(_constants(const))
        elif const is not None:
            found.append(repr(const))
    return found


def _code(code: types.CodeType) -> list:
    """A function's code where its source is not found (the interpreter's own form)."""
    consts = [_code(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return ["code", code.co_code.hex(), list(code.co_names), consts]


def _array(value: Any) -> list:
    try:
        array = np.asarray(value)
        data = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
        if array.dtype.hasobject:
            data = repr(array.tolist())
        return ["array", array.dtype.str, list(array.shape), data]
    except Exception:  # e.g. a tracer: no value to compare
        return ["array", _type(value)]


def _type(value: Any) -> str:
    t = type(value)
    return f"{t.__module__}.{t.__qualname__}"
