"""One `check` call (`Case`): the op, its example call, tolerances, steps and the roles it has;
and `Family`, what every family of rows declares.

A family of rows says which roles, options and kinds of body it covers
(tests/testing/test_testing.py asserts that every one is covered by some family), whether
it applies to an op, and yields its rows. A check that applies but cannot run yields a
"not checked" row saying why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .._kwargs import KwargsDump, encode_kwargs
from .._roles import Body, Kind, Role
from .report import CheckResult, not_checked

__all__ = ["Case", "Family", "as_computed", "cotangent", "pair", "random_like", "rel"]

# Relative tolerances per precision: exact paths, dot products, finite differences, and
# two implementations of one map (the native body against its JAX reference).
_TOL = {
    "single": dict(exact=1e-5, dot=1e-4, fd=3e-2, reference=1e-4),
    "double": dict(exact=1e-11, dot=1e-10, fd=1e-5, reference=1e-10),
}
# Finite-difference steps per precision (times the input's scale, at least 1); `eps`
# replaces them, and only them.
_STEP = {"single": 1e-3, "double": 1e-6}


def as_computed(x) -> np.ndarray:
    """`x` as a NumPy array of the dtype a program computes it in: JAX's canonical dtype
    (float64 becomes float32, int64 int32, ... while ``jax_enable_x64`` is off), so that
    tolerances, steps and direct calls follow what the op's program does with `x`."""
    x = np.asarray(x)
    return x.astype(jax.dtypes.canonicalize_dtype(x.dtype), copy=False)


def precision(dtype) -> str:
    return "double" if np.dtype(dtype) in (np.float64, np.complex128) else "single"


def _numbers(a) -> np.ndarray:
    """`a` as complex numbers; a float0 tangent (of an integer or boolean value: always
    zero, and no numbers) as zeros of its shape."""
    a = np.asarray(a)
    if a.dtype == jax.dtypes.float0:
        return np.zeros(a.shape, np.complex128)
    return np.asarray(a, np.complex128)


def cotangent(c, dtype=None):
    """`c` as a cotangent JAX takes for an output of `dtype` (default: c's own): a JAX
    array for an inexact output; float0 zeros for an integer or boolean one, which has no
    tangents (the checks seed such outputs with zeros of their own dtype)."""
    if has_tangent(c.dtype if dtype is None else dtype):
        return jax.numpy.asarray(c)
    return np.zeros(np.shape(c), jax.dtypes.float0)  # c may be traced (under vmap)


def has_tangent(dtype) -> bool:
    """Whether values of `dtype` have tangents (integer and boolean ones have float0)."""
    return np.issubdtype(np.dtype(dtype), np.inexact)


def rel(a, b, same_nonfinite: bool = False) -> float:
    """max |a - b| relative to the larger of max |a| and max |b| (inf: shapes differ, or a
    value is not finite, e.g. an output that was never written). `same_nonfinite`: for
    two runs of one computation, a NaN or infinity that both have agrees."""
    with np.errstate(invalid="ignore", over="ignore"):
        a, b = _numbers(a), _numbers(b)
    if a.shape != b.shape:
        return np.inf
    if same_nonfinite:
        both = ~np.isfinite(a) & ~np.isfinite(b)
        agree = both & (np.isnan(a) == np.isnan(b)) & ((a == b) | np.isnan(a))
        a, b = a[~agree], b[~agree]
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return np.inf
    with np.errstate(over="ignore", invalid="ignore"):
        scale = max(np.max(np.abs(a), initial=0.0), np.max(np.abs(b), initial=0.0), 1e-30)
        error = float(np.max(np.abs(a - b), initial=0.0) / scale)
    return error if np.isfinite(error) else np.inf


def pair(a, b) -> float:
    """JAX's (unconjugated) real pairing of tangents and cotangents: Re sum(a * b)."""
    return float(np.real(np.sum(_numbers(a) * _numbers(b))))


def norm(a) -> float:
    return float(np.linalg.norm(_numbers(a).ravel()))


def random_like(x, rng):
    """Random values shaped and typed as `x` (complex parts for a complex dtype); an integer
    or boolean `x` is copied."""
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.complexfloating):
        return (rng.standard_normal(x.shape) + 1j * rng.standard_normal(x.shape)).astype(x.dtype)
    if np.issubdtype(x.dtype, np.floating):
        return rng.standard_normal(x.shape).astype(x.dtype)
    return x.copy()


def inexact(x) -> bool:
    return np.issubdtype(np.asarray(x).dtype, np.inexact)


def short(exc: BaseException) -> str:
    """An exception in one line, for a row's detail."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


@dataclass
class Case:
    """One `check` call: the op, its example call, and what every family reads.

    Attributes:
      op: the jaxbind Op checked (a pytree-API op is checked through its Op, on the
        array leaves of its call, with the call's pytree structure `trees`).
      direct: f's outputs, called directly (set by the `written` family); None if it
        could not be called (`failed` then says why).
    """

    op: Any  # a jaxbind Op (see _api): .binding, .apply
    args: tuple
    kwargs: dict
    trees: KwargsDump | None
    rng: np.random.Generator
    rtol: float | None
    eps: float | None
    batch_size: int
    out_avals: list = field(default_factory=list)
    direct: tuple | None = None
    failed: str | None = None
    watch: Any = None  # the Watch of the op's state (see .watch), or None
    mesh: Any = None  # a jax.sharding.Mesh to check a sharding rule on (see .mesh), or None
    memo: dict = field(default_factory=dict)  # what a family measured once per case

    # --- the op ----------------------------------------------------------------------
    @property
    def binding(self):
        return self.op.binding

    @property
    def kind(self) -> Kind:
        return self.binding.kind

    @property
    def n_fixed(self) -> int:
        return int(self.binding.options.fixed)

    def call(self, *a) -> list:
        return self.op.apply(a, self.kwargs, self.trees)

    def teardown_failed(self, message: str) -> None:
        """A state's teardown raised after a direct call: reported by the state rows (the
        call itself did not fail)."""
        if self.watch is not None:
            self.watch.teardown_failed(message)

    @functools.cached_property
    def dump(self) -> KwargsDump:
        """The keyword arguments as the callables receive them."""
        return self.fresh_dump()

    def fresh_dump(self) -> KwargsDump:
        """The keyword arguments encoded anew: with their own copies of the arrays."""
        dump = encode_kwargs(self.kwargs)
        if self.binding.options.vectorized:
            dump = dump.with_extra(batch_axes=None)
        return dump

    @property
    def out_names(self) -> list[str]:
        return [f"output {k}" for k in range(len(self.out_avals))]

    @property
    def differentiable(self) -> list[int]:
        """The arguments after the fixed ones with inexact dtypes."""
        return [i for i in range(self.n_fixed, len(self.args)) if inexact(self.args[i])]

    @property
    def linear_args(self) -> list[int]:
        """The differentiable arguments the op is declared linear in: all of them for
        linear and multilinear ops, those in ``linear_in`` for a nonlinear one."""
        if self.kind is Kind.NONLINEAR:
            return [i for i in self.differentiable if i in self.binding.options.linear_in]
        return self.differentiable

    def restricted(self, i: int, call: Callable | None = None) -> Callable:
        """The op (or `call`, a function of the op's arguments) as a function of argument
        i alone, where it is declared linear: the other arguments it is jointly linear in
        are zero (linear ops, linear_in), the rest as given (the fixed ones, a
        multilinear op's other arguments)."""
        zero = set(self.linear_args) if self.kind is not Kind.MULTILINEAR else set()
        call = self.call if call is None else call

        def fn(xi):
            full = [np.zeros_like(a) if k in zero else a for k, a in enumerate(self.args)]
            full[i] = xi
            return call(*full)

        return fn

    # --- its roles -------------------------------------------------------------------
    def forward_role(self, i: int) -> str:
        """The role that differentiates argument i in forward mode."""
        return "jvp" if self.kind is Kind.NONLINEAR else "f"

    def reverse_role(self, i: int) -> str:
        """The role that differentiates argument i in reverse mode (and transposes it)."""
        return {Kind.LINEAR: "T", Kind.MULTILINEAR: f"T{i}", Kind.NONLINEAR: "vjp"}[self.kind]

    def missing(self, role: str) -> str | None:
        """Why `role` cannot be run: the op was given no body for it; None if it can."""
        if self.binding.has(role):
            return None
        return f"the op has no {Role.parse(role).describe().removeprefix('the ')}"

    def traced(self, role: str) -> bool:
        """Whether JAX differentiates `role`'s body itself (a JAX function): second order."""
        return self.binding.has(role) and self.binding.role(role).kind.traced

    def twice_differentiable(self, role: str) -> bool:
        """Whether JAX differentiates `role` (second order): its body is a JAX function, or
        the op's reference derives the role's own derivative (its body computes the first
        order only)."""
        return self.traced(role) or (
            self.binding.has(role) and self.binding.role(role).reference is not None
        )

    # --- tolerances and steps --------------------------------------------------------
    def tol(self, kind: str, dtype) -> float:
        """The relative tolerance of checks of `kind` ("exact", "dot", "fd", "reference")."""
        return self.rtol if self.rtol is not None else _TOL[precision(dtype)][kind]

    def step(self, *xs) -> float:
        """The finite-difference step at `xs`: `eps` (default per precision) times their
        scale, at least 1. Never the tolerance."""
        eps = self.eps if self.eps is not None else _STEP[precision(np.asarray(xs[0]).dtype)]
        return eps * max(1.0, *(float(np.max(np.abs(np.asarray(x)), initial=0.0)) for x in xs))

    def row(self, check, target, dtype, error, tol, detail="") -> CheckResult:
        return CheckResult(check, target, str(dtype), float(error), float(tol), detail)

    def dot_row(self, check, target, dtype, lhs, rhs, scale, kind="dot", detail=""):
        """<u, A v> against <A* u, v>, relative to `scale` (at least |lhs|)."""
        scale = max(abs(lhs), scale, 1e-30)
        return self.row(check, target, dtype, abs(lhs - rhs) / scale, self.tol(kind, dtype), detail)


@dataclass(frozen=True)
class Family:
    """A family of rows.

    Attributes:
      name: what the family checks, as a "not checked" row of the whole family names it.
      checks: the names of the rows it yields.
      roles: the roles it covers ("f", "T", "T<i>", "jvp", "vjp").
      options: the fields of `jaxbind._options.Options` it covers.
      bodies: the kinds of body (`Body`) it calls directly, or whose rows it has.
      applies: True; False if the op has nothing it checks (no row); or why the family
        cannot run (one "not checked" row).
      rows: its rows for a case it applies to.
    """

    name: str
    checks: tuple[str, ...]
    roles: frozenset[str]
    options: frozenset[str]
    applies: Callable[[Case], bool | str]
    rows: Callable[[Case], Iterator[CheckResult]]
    bodies: frozenset[Body] = frozenset()

    def run(self, case: Case) -> Iterator[CheckResult]:
        """Its rows, or the row that says why there are none; a family that raises ends
        with a failed row that names the exception."""
        applies = self.applies(case)
        if applies is False:
            return
        if isinstance(applies, str):
            yield not_checked(self.name, "-", applies)
            return
        try:
            yield from self.rows(case)
        except Exception as exc:
            yield CheckResult(self.name, "-", "-", np.inf, 0.0, f"it raised {short(exc)}")


def needs_f(case: Case) -> bool | str:
    """For families that compare with f's direct call: True, or why it is missing."""
    if case.failed is not None:
        return f"the function failed when called directly ({case.failed})"
    return True
