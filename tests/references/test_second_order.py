"""An op whose JVP and VJP are callables (first order only) and that has a JAX reference:
its second and higher derivatives come from the reference, while the declared callables
still compute every first-order part, in both APIs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind
from jaxbind.testing import check

X = jnp.linspace(0.1, 1.0, 4, dtype=jnp.float32)
CALLS = {"jvp": 0, "vjp": 0}


def _sin(out, args, kd):
    out[0][...] = np.sin(args[0])


def _sin_jvp(out, args, kd):
    CALLS["jvp"] += 1
    out[0][...] = np.cos(args[0]) * args[1]


def _sin_vjp(out, args, kd):
    CALLS["vjp"] += 1
    out[0][...] = np.cos(args[0]) * args[1]


def _same(x):
    return ((x.shape, x.dtype),)


def _same_T(x, ct):
    return ((x.shape, x.dtype),)


def _op_13(reference):
    op = jaxbind.get_nonlinear_call(
        _sin,
        (_sin_jvp, _sin_vjp),
        _same,
        _same_T,
        reference=reference,
        name=f"tests.references.second.sin13{'' if reference else '_noref'}",
    )
    return op, lambda x: op(x)[0]


def _op_native(reference):
    op = jaxbind.nonlinear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        reference=reference,
        name=f"tests.references.second.sin_native{'' if reference else '_noref'}",
    )(lambda x: np.sin(x))

    @op.def_jvp
    def _(primals, tangents):
        CALLS["jvp"] += 1
        return np.cos(primals[0]) * tangents[0]

    @op.def_vjp
    def _(primals, ct):
        CALLS["vjp"] += 1
        return (np.cos(primals[0]) * ct,)

    return op, op


OPS = {"1.3": _op_13(jnp.sin), "native": _op_native(jnp.sin)}
NO_REFERENCE = {"1.3": _op_13(None), "native": _op_native(None)}

ORDERS = {
    "hessian": (lambda g: jax.hessian(g), lambda x: np.diag(-np.sin(x))),
    "jacfwd(jacfwd)": (lambda g: jax.jacfwd(jax.jacfwd(g)), lambda x: np.diag(-np.sin(x))),
    "grad(grad)": (
        lambda g: jax.grad(lambda x: jax.grad(g)(x).sum()),
        lambda x: -np.sin(x),
    ),
    "third order": (
        lambda g: jax.grad(lambda x: jax.grad(lambda x: jax.grad(g)(x).sum())(x).sum()),
        lambda x: -np.cos(x),
    ),
}


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("api", list(OPS))
def test_higher_derivatives_of_callable_rules_come_from_the_reference(api, order):
    _, f = OPS[api]
    derivative, expected = ORDERS[order]
    for run in (derivative, lambda g: jax.jit(derivative(g))):
        got = run(lambda x: f(x).sum())(X)
        np.testing.assert_allclose(got, expected(np.asarray(X)), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("api", list(OPS))
def test_first_order_still_runs_the_declared_callables(api):
    _, f = OPS[api]
    before = CALLS["vjp"]
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(X), np.cos(X), rtol=1e-6)
    assert CALLS["vjp"] == before + 1


@pytest.mark.parametrize("api", list(OPS))
def test_without_a_reference_a_second_derivative_still_says_first_order_only(api):
    _, f = NO_REFERENCE[api]
    with pytest.raises(NotImplementedError, match=r"differentiable to order 1 only"):
        jax.hessian(lambda x: f(x).sum())(X)


@pytest.mark.parametrize("api", list(OPS))
def test_check_runs_the_second_order_rows_of_callable_rules_with_a_reference(api):
    op, _ = OPS[api]
    report = check(op, X, verbose=False)  # (raises where a row fails)
    checks = {r.check for r in report if r.checked and r.status == "ok"}
    assert "hessian-vector product vs finite differences" in checks, report
    assert "second-order jvp vs finite differences" in checks, report
