"""native vs reference: an op's native body and every rule it declares against its JAX
reference (``reference=``, ``op.def_reference``), the best oracle a binding can have.

The reference side is the reference itself, differentiated, transposed and vmapped by
JAX (never the op under ``jaxbind.use_reference``: a rule given as a JAX function is
inlined there too, and would be compared with itself). The native side is the op as a
program runs it with the switch off. Per row, with the tolerance of the dtype the program
computes in:

- **native vs reference: forward**: f, called directly, against the reference, per
  output (a convention mismatch, such as a 2-D body that reads its input transposed,
  fails here; so does a reference that returns other shapes or dtypes than the op
  declares);
- **native vs reference: jvp** and **native vs reference: vjp** (nonlinear ops), per
  differentiable argument: the declared JVP along a random tangent, the declared VJP of
  random cotangents, against ``jax.jvp`` and ``jax.vjp`` of the reference;
- **native vs reference: transpose** (linear and multilinear ops), per argument:
  ``jax.linear_transpose`` of the op in that argument against that of the reference;
- **native vs reference: vmap**: the batching rule of f and of each declared rule, its
  inputs batched at axis 0, against the vmapped reference.

A rule the op declares no body for is computed by JAX's derivative of the reference (a
derived rule, see jaxbind._rules.reference): comparing it with the reference would
compare the reference with itself, so it gets a **derived from the reference** row that
says so instead. An op without a reference gets one "not checked" row; so do the
derivative rows where the platform check runs on computes the op by its reference
(``prefer_reference=``, or no native body there): its native rules never run there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .._compat import enable_x64
from .._errors import words
from .._references import use_reference
from .._roles import Body, Kind, Role, for_call
from .._rules.reference import outputs
from .._where import lowering_platform, runs
from .case import Case, Family, cotangent, needs_f, precision, random_like, rel
from .report import CheckResult, derived, not_checked

_FORWARD = "native vs reference: forward"
_JVP = "native vs reference: jvp"
_VJP = "native vs reference: vjp"
_TRANSPOSE = "native vs reference: transpose"
_VMAP = "native vs reference: vmap"
_DERIVED = "derived from the reference"

# How JAX computes each derived rule from the reference
_HOW = {
    "jvp": "jax.jvp of the reference",
    "vjp": "jax.vjp of the reference",
    "T": "jax.linear_transpose of the reference",
}


def _applies(case: Case) -> bool | str:
    if case.binding.reference is None:
        return f"the op has no reference ({words(case.binding.options).give_reference()})"
    return needs_f(case)


def _reference(case: Case) -> Callable[..., list]:
    """The reference as the op's call: a function of its (flat) arrays, with the call's
    keyword arguments, giving its outputs as a list."""
    fn = for_call(case.binding.reference.function, case.trees)

    def ref(*args):
        return outputs(fn(*(jnp.asarray(a) for a in args), **case.kwargs), case.binding.name)

    return ref


# An approximate native body (its Reference has a ``tolerance``) is compared within that
# tolerance, not within the precision's tolerance for two implementations of one map (1e-4
# in single precision would hide a 10-fold loss of accuracy at epsilon 1e-6). Below the
# declared tolerance lies only rounding: the reference's own error in the case's precision
# (measured on the case: single precision against the reference run in double precision,
# tens of rounding units for a sum of a few hundred terms), and the native body's rounding;
# allowed _ROUNDING_FACTOR times (a batch's other inputs round differently), and never
# less than _ROUNDING_UNITS units.
_ROUNDING_FACTOR = 5.0
_ROUNDING_UNITS = 4.0


def _declared_tolerance(case: Case) -> float | None:
    """How far the native body may be from the reference, by the reference's own
    tolerance (``jaxbind.Reference(..., tolerance=)``: an approximate algorithm's accuracy,
    or a function of the call's keyword arguments, e.g. a NUFFT's epsilon); None without one."""
    return case.binding.reference.tolerance_for(case.kwargs)


def _in_double(x):
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x.astype(np.float64)
    if x.dtype == np.complex64:
        return x.astype(np.complex128)
    return x


def _rounding_floor(case: Case, ref: Callable, dtype) -> float:
    """The relative error the comparison of an approximate body with its reference cannot
    go below in `dtype`: rounding units, and in single precision the reference's own error
    on the case (its outputs against the reference run in double precision)."""
    if not np.issubdtype(np.dtype(dtype), np.inexact):
        return case.tol("reference", dtype)
    floor = _ROUNDING_UNITS * float(np.finfo(np.dtype(dtype)).eps)
    if precision(dtype) != "single":
        return _ROUNDING_FACTOR * floor
    measured = case.memo.get("reference error")
    if measured is None:
        try:
            single = ref(*case.args)
            with enable_x64():
                double = ref(*map(_in_double, case.args))
            measured = max((rel(a, b) for a, b in zip(single, double)), default=0.0)
        except Exception:  # a reference that cannot run in double precision: the default
            measured = case.tol("reference", dtype) / _ROUNDING_FACTOR
        case.memo["reference error"] = measured
    return _ROUNDING_FACTOR * max(floor, measured)


def _roles(case: Case) -> list[str]:
    """The op's roles besides f, by name (a multilinear transpose per argument)."""
    if case.kind is Kind.LINEAR:
        return ["T"]
    if case.kind is Kind.MULTILINEAR:
        return [f"T{i}" for i in range(case.n_fixed, len(case.args))]
    return ["jvp", "vjp"]


def _declared(case: Case, role: str) -> bool:
    return case.binding.has(role) and not case.binding.role(role).derived


def _tolerance(case: Case, ref: Callable, dtype) -> float:
    """The tolerance of a comparison in `dtype`: the precision's for two implementations of
    one map, or for an approximate native body its declared tolerance (above rounding)."""
    declared = _declared_tolerance(case) if case.rtol is None else None
    if declared is None:
        return case.tol("reference", dtype)
    return max(declared, _rounding_floor(case, ref, dtype))


def _compare(case: Case, check: str, target: str, dtype, native, reference, tol) -> CheckResult:
    """One comparison, its detail naming the op and what differed where it fails."""
    native, reference = np.asarray(native), np.asarray(reference)
    error = rel(native, reference)
    detail = ""
    if native.shape != reference.shape:
        detail = (
            f"'{case.binding.name}' gives shape {native.shape} for {target}, its reference "
            f"{reference.shape}"
        )
    elif error > tol:
        detail = (
            f"'{case.binding.name}' differs from its reference in {target}: max relative "
            f"error {error:.3g}"
        )
    return case.row(check, target, dtype, error, tol, detail)


# --- forward ---------------------------------------------------------------------------


def _forward(case: Case, ref: Callable) -> Iterator[CheckResult]:
    assert case.direct is not None
    outs = ref(*case.args)
    if len(outs) != len(case.out_avals):
        yield case.row(
            _FORWARD,
            "-",
            "-",
            np.inf,
            0.0,
            f"'{case.binding.name}' has {len(case.out_avals)} output(s), its reference "
            f"returned {len(outs)}",
        )
        return
    for name, av, native, r in zip(case.out_names, case.out_avals, case.direct, outs):
        row = _compare(case, _FORWARD, name, av.dtype, native, r, _tolerance(case, ref, av.dtype))
        if row.ok and np.dtype(r.dtype) != np.dtype(av.dtype):
            row = case.row(
                _FORWARD,
                name,
                av.dtype,
                np.inf,
                row.tol,
                f"the reference of '{case.binding.name}' returns {np.dtype(r.dtype).name} "
                f"for {name}, the op declares {np.dtype(av.dtype).name}",
            )
        yield row


# --- each declared rule, unbatched and batched -------------------------------------------


@dataclass
class _Rule:
    """One declared rule as JAX reaches it, in one argument: `make` turns a function of
    the op's arguments (the op, or the reference) into the rule's function of `inputs`;
    the inputs at `batched` are batched by the vmap row."""

    check: str
    what: str  # the role, as the vmap row's target names it
    target: str  # the argument
    make: Callable[[Callable], Callable[..., list]]
    inputs: list
    batched: tuple[int, ...]
    out_names: list[str]
    dtype: np.dtype


def _merged(args, i: int, xi) -> list:
    full = list(args)
    full[i] = xi
    return full


def _rules(case: Case) -> Iterator[_Rule]:
    """The declared rules, per differentiable argument (f's own is the forward row)."""
    args, rng = case.args, case.rng
    cts = [random_like(np.zeros(av.shape, av.dtype), rng) for av in case.out_avals]
    n_cts = len(cts)
    for i in case.differentiable:
        x, target = args[i], f"argument {i}"
        if case.kind is Kind.NONLINEAR:
            if _declared(case, "jvp"):

                def jvp(fn, i=i):
                    def run(xi, v):
                        at = lambda d: fn(*_merged(args, i, d))
                        return list(jax.jvp(at, (xi,), (v,))[1])

                    return run

                names = [f"tangent of {name}" for name in case.out_names]
                yield _Rule(
                    _JVP, "the JVP", target, jvp, [x, random_like(x, rng)], (0, 1), names, x.dtype
                )
            if _declared(case, "vjp"):

                def vjp(fn, i=i):
                    def run(xi, *u):
                        _, pull = jax.vjp(lambda d: fn(*_merged(args, i, d)), xi)
                        return list(pull([cotangent(c) for c in u]))

                    return run

                yield _Rule(
                    _VJP,
                    "the VJP",
                    target,
                    vjp,
                    [x, *cts],
                    tuple(range(1 + n_cts)),
                    [f"cotangent of {target}"],
                    x.dtype,
                )
        elif _declared(case, case.reverse_role(i)):

            def transpose(fn, i=i):
                def run(*u):
                    t = jax.linear_transpose(case.restricted(i, fn), jnp.asarray(args[i]))
                    return list(t([cotangent(c) for c in u]))

                return run

            yield _Rule(
                _TRANSPOSE,
                Role.parse(case.reverse_role(i)).describe(),
                target,
                transpose,
                list(cts),
                tuple(range(n_cts)),
                [f"cotangent of {target}"],
                x.dtype,
            )


def _rule_rows(case: Case, rule: _Rule, ref) -> Iterator[CheckResult]:
    with use_reference(False):  # the op's own rules, whatever JAXBIND_USE_REFERENCE says
        mine = rule.make(case.call)(*rule.inputs)
    theirs = rule.make(ref)(*rule.inputs)
    for name, a, b in zip(rule.out_names, mine, theirs):
        tol = _tolerance(case, ref, rule.dtype)
        yield _compare(case, rule.check, f"{rule.target} -> {name}", rule.dtype, a, b, tol)


def _stacked(case: Case, x) -> np.ndarray:
    """`batch_size` versions of `x` (the first x itself), stacked along axis 0."""
    x = np.asarray(x)
    versions = [
        x if b == 0 else x + 0.1 * b * random_like(x, case.rng) for b in range(case.batch_size)
    ]
    return np.stack([np.asarray(v, x.dtype) for v in versions])


def _vmap_rows(case: Case, what: str, rule: _Rule, ref, dtypes) -> Iterator[CheckResult]:
    """The rule under vmap, its batched inputs at axis 0, against the vmapped reference."""
    ins = [_stacked(case, x) if k in rule.batched else x for k, x in enumerate(rule.inputs)]
    axes = tuple(0 if k in rule.batched else None for k in range(len(ins)))
    with use_reference(False):
        mine = jax.vmap(rule.make(case.call), in_axes=axes)(*ins)
    theirs = jax.vmap(rule.make(ref), in_axes=axes)(*ins)
    for name, dtype, a, b in zip(rule.out_names, dtypes, mine, theirs):
        tol = _tolerance(case, ref, dtype)
        yield _compare(case, _VMAP, f"{what}: batched at axis 0 -> {name}", dtype, a, b, tol)


# --- the family --------------------------------------------------------------------------


def _derived_rows(case: Case) -> Iterator[CheckResult]:
    for role in _roles(case):
        entry = case.binding.role(role)
        if entry.derived:
            how = _HOW[Role.parse(role).base]
            index = Role.parse(role).index
            how += "" if index is None else f" with respect to argument {index}"
            yield derived(_DERIVED, entry.role.describe(), f"no body declared: {how}")


def _reference_here(case: Case) -> str | None:
    """Why programs on this platform compute every role of the op by its reference (so
    that its native rules cannot be compared there), or None."""
    platform = lowering_platform(jax.default_backend())
    where = runs(case.binding, "f", platform)
    if where.why == "preferred":
        return (
            f"the op has prefer_reference={case.binding.reference.platforms}: on "
            f"{platform} its reference computes every rule (f's body is compared, called "
            "directly)"
        )
    if where.why == "elsewhere":
        return f"the op has no native body on {platform}: its reference computes it there"
    return None


def _rows(case: Case) -> Iterator[CheckResult]:
    yield from _derived_rows(case)
    ref = _reference(case)
    yield from _forward(case, ref)
    if (why := _reference_here(case)) is not None:
        for check in (_JVP, _VJP, _TRANSPOSE, _VMAP):
            yield not_checked(check, "-", why)
        return
    if case.differentiable:
        f = _Rule(
            _VMAP,
            "the function",
            "-",
            lambda fn: fn,
            list(case.args),
            tuple(case.differentiable),
            case.out_names,
            case.args[case.differentiable[0]].dtype,
        )
        yield from _vmap_rows(case, f.what, f, ref, [av.dtype for av in case.out_avals])
    for rule in _rules(case):
        yield from _rule_rows(case, rule, ref)
        what = f"{rule.what} in {rule.target}"
        yield from _vmap_rows(case, what, rule, ref, [rule.dtype] * len(rule.out_names))


FAMILY = Family(
    name="native vs reference",
    checks=(_FORWARD, _JVP, _VJP, _TRANSPOSE, _VMAP, _DERIVED),
    roles=frozenset({"f", "T", "T<i>", "jvp", "vjp"}),
    options=frozenset({"fixed"}),  # (and the reference's platforms, prefer_reference=)
    bodies=frozenset({Body.DERIVED}),  # its "derived" rows
    applies=_applies,
    rows=_rows,
)
