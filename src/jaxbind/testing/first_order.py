"""First derivatives: each derivative role on its own against finite differences, then the
roles against each other. Per differentiable argument i, along a random direction v, with
central differences ``(f(x + h v) - f(x - h v)) / 2h``:

- **jvp vs finite differences**: the forward role (the JVP; f itself for linear and
  multilinear ops) per output;
- **vjp vs finite differences**: the reverse role (the VJP, the transpose) on its own,
  through ``<u, fd> = <J^T u, v>`` with JAX's unconjugated pairing ``Re sum(a*b)``: a VJP
  without a JVP is checked too;
- **vjp vs jvp (dot product)**: ``<u, J v> = <J^T u, v>``, exact where both roles exist;
- **transpose adjointness**: the same through ``jax.linear_transpose``, for each argument
  the op is declared linear in (linear and multilinear ops, ``linear_in``).

A role the op was not given makes its rows "not checked", saying which role is missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from .case import Case, Family, cotangent, has_tangent, needs_f, norm, pair, random_like, rel
from .report import CheckResult, not_checked


def _applies(case: Case) -> bool | str:
    if not case.differentiable:
        return False  # nothing to differentiate
    return needs_f(case)


def _rows(case: Case) -> Iterator[CheckResult]:
    args, rng = case.args, case.rng
    for i in case.differentiable:
        x = args[i]
        target, dtype = f"argument {i}", x.dtype

        def f_i(xi, i=i):
            full = list(args)
            full[i] = xi
            return case.call(*full)

        v = random_like(x, rng)
        u = [random_like(np.zeros(av.shape, av.dtype), rng) for av in case.out_avals]
        h = case.step(x)
        c = lambda a: np.asarray(a, np.complex128)
        with np.errstate(over="ignore", invalid="ignore"):
            hi, lo = f_i(np.asarray(x + h * v, x.dtype)), f_i(np.asarray(x - h * v, x.dtype))
            fd = [(c(a) - c(b)) / (2 * h) for a, b in zip(hi, lo)]
        step = f"step {h:.1e}"
        no_fwd = case.missing(case.forward_role(i))
        no_rev = case.missing(case.reverse_role(i))

        tan = None
        if no_fwd is None:
            _, tan = jax.jvp(f_i, (jnp.asarray(x),), (jnp.asarray(v),))
            for name, av, t, d in zip(case.out_names, case.out_avals, tan, fd):
                if not has_tangent(av.dtype):  # an integer or boolean output: float0
                    continue
                tol = case.tol("fd", dtype)
                yield case.row(
                    "jvp vs finite differences", f"{target} -> {name}", dtype, rel(t, d), tol, step
                )
        else:
            yield not_checked("jvp vs finite differences", target, no_fwd)

        if no_rev is not None:
            yield not_checked("vjp vs finite differences", target, no_rev)
            yield not_checked("vjp vs jvp (dot product)", target, no_rev)
        else:
            _, vjp = jax.vjp(f_i, jnp.asarray(x))
            (ct,) = vjp([cotangent(a) for a in u])
            rhs = pair(ct, v)
            lhs = sum(pair(a, d) for a, d in zip(u, fd))
            scale = max(norm(ct) * norm(v), sum(norm(a) * norm(d) for a, d in zip(u, fd)))
            yield case.dot_row(
                "vjp vs finite differences", target, dtype, lhs, rhs, scale, "fd", step
            )
            if tan is None:
                yield not_checked("vjp vs jvp (dot product)", target, no_fwd or "")
            else:
                lhs = sum(pair(a, t) for a, t in zip(u, tan))
                yield case.dot_row(
                    "vjp vs jvp (dot product)", target, dtype, lhs, rhs, norm(ct) * norm(v)
                )

        if i in case.linear_args:
            yield from _adjointness(case, i, u, no_rev)


def _adjointness(case: Case, i: int, u, no_rev) -> Iterator[CheckResult]:
    x = case.args[i]
    target = f"argument {i}"
    if no_rev is not None:
        yield not_checked("transpose adjointness", target, no_rev)
        return
    lin_i = case.restricted(i)
    v = random_like(x, case.rng)
    (tr,) = jax.linear_transpose(lin_i, jnp.asarray(x))([cotangent(a) for a in u])
    lhs = sum(pair(a, y) for a, y in zip(u, lin_i(v)))
    rhs = pair(tr, v)
    yield case.dot_row("transpose adjointness", target, x.dtype, lhs, rhs, norm(tr) * norm(v))


FAMILY = Family(
    name="first derivatives",
    checks=(
        "jvp vs finite differences",
        "vjp vs finite differences",
        "vjp vs jvp (dot product)",
        "transpose adjointness",
    ),
    roles=frozenset({"T", "T<i>", "jvp", "vjp"}),
    options=frozenset({"fixed", "linear_in"}),
    applies=_applies,
    rows=_rows,
)
