"""The definition a program was made for: every property of an op that the lowering bakes
into a program, written into each call (call format 4's ``definition`` attribute) and
compared with the op's definition at run time before any body runs (see
_runtime.fits, step 1).

A program names its op by string, so the op it finds may be another definition than the
one it was traced with (redefined with ``replace=True``, or defined otherwise in the
process that loads an exported program). Shapes, dtypes and counts are checked against
the buffers; what this module records is the rest, which no buffer shows: whether an
output shares an input's memory, the effects, the fixed count, native batching, the
state and its key, linearity, the API, the CUDA kernel target, and the sharding rule a
partitioned call was split by.

Every field of `Options` is in exactly one of `COMPARED` (recorded per op and compared
whole), `PER_CALL` (recorded as what the call used: the rule, only for a call that was
partitioned by it; a call that runs whole gives the right result under any rule),
`READ_AT_RUN_TIME` (the runtime reads it from the op it finds, so no program keeps it) and
`CHOSEN_AT_LOWERING` (it decides whether a call is a custom call at all).
tests/runtime/test_definition_travels.py redefines every option of both APIs and fails for an
option left out of these tables.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from ._errors import words
from ._options import Options

__all__ = [
    "CHOSEN_AT_LOWERING",
    "COMPARED",
    "PER_CALL",
    "READ_AT_RUN_TIME",
    "call_rule",
    "differences",
    "record",
]

# Options a program bakes in, each as a plain value (JSON) the record keeps.
COMPARED: dict[str, Callable[[Options], Any]] = {
    "fixed": lambda o: o.fixed,
    "vectorized": lambda o: o.vectorized,
    "aliases": lambda o: [list(pair) for pair in o.aliases],
    "effect": lambda o: o.effect,
    "linear_in": lambda o: list(o.linear_in),
    "native": lambda o: o.native,
    "state": lambda o: o.state is not None,
    "state_key": lambda o: list(o.state_key),
}
# Options a program keeps as the value its call used (see `call_rule`).
PER_CALL = ("sharding",)  # with its reduction factors
# Options the runtime reads from the op it finds, at every site: not in any program.
READ_AT_RUN_TIME = {
    "platform_mode": "the GPU handler reads it from the op when it makes a site's plan",
}
# Options that choose, when a program is lowered, between the native body's custom call
# and the op's JAX reference inlined: a program holds no record of them, and is right
# under any value (a custom call runs the native body; an inlined reference is JAX code).
CHOSEN_AT_LOWERING = {
    "prefer_reference": "where the reference computes the op instead of the native body",
}


def call_rule(options: Options, kwargs: dict, shapes: Sequence[Sequence[int]]) -> list | None:
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
) -> str:
    """The ``definition`` attribute of a call: the op's compared options, whether the
    role's body is a CUDA kernel (its own FFI target), and, for a call partitioned by its
    rule, that rule and the shapes of f's arguments it was worked out for."""
    value = {name: get(options) for name, get in COMPARED.items()}
    value["cuda_kernel"] = cuda_kernel
    if rule is not None:
        value["rule"] = rule
        value["rule_shapes"] = [list(s) for s in shapes]
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def differences(recorded: str, options: Options, cuda_kernel: bool, kwargs: dict) -> list[str]:
    """What differs between a call's recorded definition and the op's `options` now, one
    phrase per property in the user's words (empty: the call fits)."""
    try:
        then = json.loads(recorded)
    except ValueError:
        then = None
    if not isinstance(then, dict):
        return ["the program's record of the op's definition is not readable"]
    now = {name: get(options) for name, get in COMPARED.items()}
    now["cuda_kernel"] = cuda_kernel
    found = []
    for name in (*COMPARED, "cuda_kernel"):
        if name not in then or then[name] != now[name]:
            found.append(_phrase(name, then.get(name), now[name], options))
    if "rule" in then:
        shapes = then.get("rule_shapes", [])
        try:
            rule = call_rule(options, kwargs, shapes)
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
    if name == "native":
        api = {True: "the JAX-native API (a decorator)", False: "jaxbind.get_*_call"}
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
