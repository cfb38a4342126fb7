"""linearity: an op declared linear in an argument is, there: ``f(0) = 0``,
``f(a x) = a f(x)`` with ``a = -1.75`` and ``f(x + y) = f(x) + f(y)``.

Per argument declared linear: every differentiable argument of a linear op (the others
zero) or of a multilinear one (the others as given), and the ``linear_in`` arguments of a
nonlinear op (the other ``linear_in`` ones zero, the rest as given). An affine function
fails the first row, ``abs`` the second, a homogeneous but not additive one the third: the
cause is named, not only seen as a transpose that disagrees.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .._roles import Kind
from .case import Case, Family, needs_f, random_like, rel
from .report import CheckResult

_SCALE = -1.75  # negative, and not a power of two: catches abs() and a factor of 2


def _applies(case: Case) -> bool | str:
    if case.kind is Kind.NONLINEAR and not case.binding.options.linear_in:
        return False  # declared linear in nothing
    return needs_f(case)


def _largest(outputs) -> float:
    return max((float(np.max(np.abs(np.asarray(o)), initial=0.0)) for o in outputs), default=0.0)


def _rows(case: Case) -> Iterator[CheckResult]:
    for i in case.linear_args:
        x = case.args[i]
        y = random_like(x, case.rng)
        f = case.restricted(i)
        fx, fy, f0 = f(x), f(y), f(np.zeros_like(x))
        fax = f(np.asarray(_SCALE * x, x.dtype))
        fxy = f(np.asarray(x + y, x.dtype))
        target, tol = f"argument {i}", case.tol("exact", x.dtype) * 10
        zero = _largest(f0) / max(_largest([*fx, *fy]), 1e-30)
        detail = "f is affine or nonlinear in this argument" if zero > tol else ""
        yield case.row("linearity: f(0) = 0", target, x.dtype, zero, tol, detail)
        c = lambda a: np.asarray(a, np.complex128)
        error = max((rel(a, _SCALE * c(b)) for a, b in zip(fax, fx)), default=0.0)
        detail = "f is not homogeneous in this argument" if error > tol else ""
        yield case.row("linearity: f(a x) = a f(x)", target, x.dtype, error, tol, detail)
        error = max((rel(s, c(a) + c(b)) for s, a, b in zip(fxy, fx, fy)), default=0.0)
        detail = "f is not additive in this argument" if error > tol else ""
        yield case.row("linearity: f(x + y) = f(x) + f(y)", target, x.dtype, error, tol, detail)


FAMILY = Family(
    name="linearity",
    checks=(
        "linearity: f(0) = 0",
        "linearity: f(a x) = a f(x)",
        "linearity: f(x + y) = f(x) + f(y)",
    ),
    roles=frozenset({"f"}),
    options=frozenset({"fixed", "linear_in"}),
    applies=_applies,
    rows=_rows,
)
