"""inputs unchanged: each role's body, called directly on writable copies of its inputs,
leaves them, and the call's array keyword arguments, as they were.

jaxbind hands bodies read-only views, and numba kernels read-only arrays, but a C kernel,
or a callable that writes through an address (``ctypes``, ``np.frombuffer``), gets past
that. A compiled kernel gets its array keyword arguments in buffers that `check` owns, as
the trampoline passes them (see .kernels); a callable gets them in a dump of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from .._roles import Body, Kind, Role, for_call
from .._state import outside_programs
from .case import Case, Family, needs_f, random_like, short
from .kernels import call_watched
from .report import CheckResult, not_checked
from .written import outputs_for


def _role_calls(case: Case):
    """(role, inputs, outputs) for each role of the op, with inputs laid out as that role's
    calls take them (see _roles.Args) and its outputs as a call hands them over."""
    binding, args, n, rng = case.binding, case.args, case.n_fixed, case.rng
    zeros = lambda shapes: tuple(np.zeros(shape, dtype) for shape, dtype in shapes)
    outs_f = [(tuple(av.shape), np.dtype(av.dtype)) for av in case.out_avals]
    cotangents = [random_like(np.zeros(shape, dtype), rng) for shape, dtype in outs_f]
    like_inputs = [(a.shape, a.dtype) for a in args[n:]]
    yield (
        "f",
        list(args),
        lambda ins: outputs_for(case, ins, lambda av: np.zeros(av.shape, av.dtype)),
    )
    if binding.kind is Kind.LINEAR:
        yield "T", [*args[:n], *cotangents], lambda ins: zeros(like_inputs)
    elif binding.kind is Kind.MULTILINEAR:
        for i in range(n, len(args)):
            others = [a for k, a in enumerate(args) if k != i]
            shape = [(args[i].shape, args[i].dtype)]
            yield f"T{i}", [*others, *cotangents], lambda ins, shape=shape: zeros(shape)
    else:
        tangents = [random_like(a, rng) for a in args[n:]]
        yield "jvp", [*args, *tangents], lambda ins: zeros(outs_f)
        yield "vjp", [*args, *cotangents], lambda ins: zeros(like_inputs)


def _array_kwargs(kwargs: dict) -> dict:
    """The NumPy arrays among keyword arguments, copied (nested ones by their path)."""
    found = {}

    def visit(path, value):
        if isinstance(value, np.ndarray):
            found[path] = value.copy()
        elif isinstance(value, (list, tuple)):
            for k, v in enumerate(value):
                visit(f"{path}[{k}]", v)
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(f"{path}[{k!r}]", v)

    for name, value in kwargs.items():
        visit(name, value)
    return found


def _changed(before, after) -> float:
    """The fraction of elements that differ (NaNs equal)."""
    if after is None:
        return 0.0
    before, after = np.asarray(before), np.asarray(after)
    if before.size == 0:
        return 0.0
    if before.shape != after.shape:
        return 1.0
    same = (before == after) | ((before != before) & (after != after))
    return float(1.0 - same.mean())


def _run(case: Case, role: str, inputs, outputs) -> tuple[list, dict]:
    """Call `role`'s body on writable copies of `inputs`; return them and the array keyword
    arguments as the body left them."""
    entry = case.binding.role(role)
    body = entry.body
    copies = [np.array(a) for a in inputs]  # writable: nothing stops a write but the body
    if entry.kind.traced:
        arrays = [jnp.asarray(c) for c in copies]
        # (as a program calls it: JAX batches a JAX function, so it gets no batch_axes)
        kwargs = {k: v for k, v in case.dump.to_dict().items() if k != "batch_axes"}
        jax.block_until_ready(for_call(body, case.trees)(*arrays, **kwargs))
        return [np.asarray(a) for a in arrays], {}
    dump = case.fresh_dump()  # its own arrays: a write shows in this call only
    label = f"'{case.binding.name}' ({entry.role.describe()})"
    with outside_programs(case.binding, dump.to_dict(), copies, label, role, case.teardown_failed):
        if entry.kind is Body.KERNEL:
            return copies, call_watched(body, outputs(copies), copies, dump)
        for_call(body, case.trees)(outputs(copies), tuple(copies), dump)
    return copies, _array_kwargs(dump.to_dict())


def _rows(case: Case) -> Iterator[CheckResult]:
    before_kwargs = _array_kwargs(case.kwargs)
    for role, inputs, outputs in _role_calls(case):
        what = Role.parse(role).describe()
        why = case.missing(role)
        if why is not None:
            yield not_checked("inputs unchanged", what, why)
            continue
        if case.binding.role(role).derived:
            continue  # JAX's derivative of the reference: no body to call (see .reference)
        kept = [np.array(a) for a in inputs]
        try:
            after, after_kwargs = _run(case, role, inputs, outputs)
        except Exception as exc:
            yield case.row("inputs unchanged", what, "-", np.inf, 0.0, f"it failed: {short(exc)}")
            continue
        for k, (before, now) in enumerate(zip(kept, after)):
            frac = _changed(before, now)
            detail = f"{what} wrote {frac:.0%} of its input {k}" if frac else ""
            yield case.row(
                "inputs unchanged", f"{what}: input {k}", before.dtype, frac, 0.0, detail
            )
        for path, before in before_kwargs.items():
            frac = _changed(before, after_kwargs.get(path))
            detail = f"{what} wrote {frac:.0%} of keyword argument {path!r}" if frac else ""
            target = f"{what}: keyword argument {path!r}"
            yield case.row("inputs unchanged", target, before.dtype, frac, 0.0, detail)


FAMILY = Family(
    name="inputs unchanged",
    checks=("inputs unchanged",),
    roles=frozenset({"f", "T", "T<i>", "jvp", "vjp"}),
    options=frozenset({"aliases", "pytree_api"}),
    bodies=frozenset({Body.CALLABLE, Body.KERNEL, Body.JAX}),
    applies=needs_f,
    rows=_rows,
)
