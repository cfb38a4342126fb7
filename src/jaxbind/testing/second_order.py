"""Second derivatives of nonlinear ops whose JVP or VJP is a JAX function (so that JAX
differentiates it) or is derived to second order from the op's reference, over the
differentiable arguments jointly; a complex argument counts as its real and imaginary
parts, so that complex arguments are checked as real ones are.

- through the VJP (forward over reverse), for ``phi(x) = Re <u, f(x)>``:
  **hessian symmetry** ``<w, H v> = <v, H w>`` and **hessian-vector product vs finite
  differences** (``H v``, the JVP of the gradient, against central differences of the
  gradient);
- through the JVP (forward over forward): **second-order jvp vs finite differences**, the
  JVP of ``x -> J(x) v`` along w against central differences of ``J(x) v``.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from .._roles import Kind
from .case import Case, Family, has_tangent, needs_f, pair, random_like, rel
from .report import CheckResult, not_checked


def _applies(case: Case) -> bool | str:
    if case.kind is not Kind.NONLINEAR or not case.differentiable:
        return False  # linear ops: zero
    if not (case.twice_differentiable("vjp") or case.twice_differentiable("jvp")):
        return False  # callables and kernels without a reference: first order only
    return needs_f(case)


def _rows(case: Case) -> Iterator[CheckResult]:
    if case.twice_differentiable("vjp"):
        if case.missing("jvp"):
            why = f"{case.missing('jvp')}, which the forward pass over the gradient calls"
            yield not_checked("hessian-vector product vs finite differences", "-", why)
        else:
            yield from _through_vjp(case)
    if case.twice_differentiable("jvp"):
        yield from _through_jvp(case)


def _target(diff) -> str:
    return "arguments " + ", ".join(map(str, diff))


def _through_vjp(case: Case) -> Iterator[CheckResult]:
    args, rng, diff = case.args, case.rng, case.differentiable
    split = [np.iscomplexobj(args[i]) for i in diff]
    xs: list = []
    for i, cplx in zip(diff, split):
        xs += [args[i].real.copy(), args[i].imag.copy()] if cplx else [args[i]]
    xs = [jnp.asarray(x) for x in xs]
    u = [jnp.asarray(random_like(np.zeros(av.shape, av.dtype), rng)) for av in case.out_avals]

    def phi(*parts):
        full, k = list(args), 0
        for i, cplx in zip(diff, split):
            full[i] = jax.lax.complex(parts[k], parts[k + 1]) if cplx else parts[k]
            k += 2 if cplx else 1
        return sum(jnp.real(jnp.sum(c * y)) for c, y in zip(u, case.call(*full)))

    grad = jax.grad(phi, argnums=tuple(range(len(xs))))
    v = tuple(jnp.asarray(random_like(x, rng)) for x in xs)
    w = tuple(jnp.asarray(random_like(x, rng)) for x in xs)
    h = case.step(*xs)

    @jax.jit  # one program: compiling is most of the time
    def products(xs):
        hv, hw = (jax.jvp(grad, xs, d)[1] for d in (v, w))
        hi = grad(*(x + h * d for x, d in zip(xs, v)))
        lo = grad(*(x - h * d for x, d in zip(xs, v)))
        return hv, hw, hi, lo

    hv, hw, hi, lo = products(tuple(xs))
    dtype, target = xs[0].dtype, _target(diff)
    parts = [f"argument {i}" for i, cplx in zip(diff, split) if cplx]
    detail = f"the real and imaginary parts of {', '.join(parts)}" if parts else ""
    lhs, rhs = sum(map(pair, w, hv)), sum(map(pair, v, hw))
    flat = lambda t: np.concatenate([np.ravel(np.asarray(a)) for a in t])
    scale = float(np.linalg.norm(flat(hv)) * np.linalg.norm(flat(w)))
    yield case.dot_row("hessian symmetry", target, dtype, lhs, rhs, scale, detail=detail)
    fd = (flat(hi).astype(np.float64) - flat(lo)) / (2 * h)
    detail = ", ".join(filter(None, [detail, f"step {h:.1e}"]))
    error = rel(flat(hv), fd)
    yield case.row(
        "hessian-vector product vs finite differences",
        target,
        dtype,
        error,
        case.tol("fd", dtype),
        detail,
    )


def _through_jvp(case: Case) -> Iterator[CheckResult]:
    args, rng, diff = case.args, case.rng, case.differentiable
    xs = tuple(jnp.asarray(args[i]) for i in diff)
    v = tuple(jnp.asarray(random_like(x, rng)) for x in xs)
    w = tuple(jnp.asarray(random_like(x, rng)) for x in xs)

    def f(*d):
        full = list(args)
        for i, x in zip(diff, d):
            full[i] = x
        return case.call(*full)

    def jv(*d):
        return jax.jvp(f, d, v)[1]

    h = case.step(*xs)

    @jax.jit  # one program: compiling is most of the time
    def products(xs):
        second = jax.jvp(jv, xs, w)[1]
        hi = jv(*(x + h * d for x, d in zip(xs, w)))
        lo = jv(*(x - h * d for x, d in zip(xs, w)))
        return second, hi, lo

    second, hi, lo = products(xs)
    c = lambda a: np.asarray(a, np.complex128)
    target, dtype = _target(diff), xs[0].dtype
    for name, av, s, a, b in zip(case.out_names, case.out_avals, second, hi, lo):
        if not has_tangent(av.dtype):  # an integer or boolean output: float0
            continue
        error = rel(s, (c(a) - c(b)) / (2 * h))
        yield case.row(
            "second-order jvp vs finite differences",
            f"{target} -> {name}",
            dtype,
            error,
            case.tol("fd", dtype),
            f"step {h:.1e}",
        )


FAMILY = Family(
    name="second derivatives",
    checks=(
        "hessian symmetry",
        "hessian-vector product vs finite differences",
        "second-order jvp vs finite differences",
    ),
    roles=frozenset({"jvp", "vjp"}),
    options=frozenset({"fixed"}),
    applies=_applies,
    rows=_rows,
)
