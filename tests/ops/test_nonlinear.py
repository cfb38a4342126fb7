"""Nonlinear ops: JVP and VJP callables, first order only, fixed arguments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_ops as ro
from jax.test_util import check_grads
from reference_ops import nonlinear, nonlinear_ref, power
from support.arrays import random, tol
from support.dtypes import REAL_DTYPES, dtypes_and_x64


@dtypes_and_x64()
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_forward_matches_jax(x64, dtype, jit):
    x1, x2 = random((3, 2), dtype, 1), random((3, 2), dtype, 2)
    fn = lambda a, b: nonlinear(a, b)[0]
    fn = jax.jit(fn) if jit else fn
    np.testing.assert_allclose(fn(x1, x2), nonlinear_ref(x1, x2), rtol=tol(dtype))


@dtypes_and_x64()
def test_jvp_and_vjp_match_jax(x64, dtype):
    x1, x2, t1, t2, ct = (random((4,), dtype, s) for s in range(5))
    y, ty = jax.jvp(lambda a, b: nonlinear(a, b)[0], (x1, x2), (t1, t2))
    y_ref, ty_ref = jax.jvp(nonlinear_ref, (x1, x2), (t1, t2))
    np.testing.assert_allclose(ty, ty_ref, rtol=tol(dtype), atol=tol(dtype))
    _, vjp = jax.vjp(lambda a, b: nonlinear(a, b)[0], x1, x2)
    _, vjp_ref = jax.vjp(nonlinear_ref, x1, x2)
    for got, want in zip(vjp(ct), vjp_ref(ct)):
        np.testing.assert_allclose(got, want, rtol=tol(dtype), atol=tol(dtype))


@dtypes_and_x64()
def test_grad_under_jit_matches_jax(x64, dtype):
    x1, x2 = random((4,), dtype, 6), random((4,), dtype, 7)
    loss = lambda f: lambda a, b: jnp.sum(jnp.abs(f(a, b)) ** 2)
    g = jax.jit(jax.grad(loss(lambda a, b: nonlinear(a, b)[0]), argnums=(0, 1)))(x1, x2)
    g_ref = jax.grad(loss(nonlinear_ref), argnums=(0, 1))(x1, x2)
    for got, want in zip(g, g_ref):
        np.testing.assert_allclose(got, want, rtol=10 * tol(dtype), atol=tol(dtype))


@dtypes_and_x64()
def test_check_grads_first_order(x64, dtype):
    x1, x2 = random((4,), dtype, 8), random((4,), dtype, 9)
    check_grads(lambda a, b: nonlinear(a, b)[0], (x1, x2), order=1, modes=("fwd", "rev"))


@dtypes_and_x64()
def test_second_order_is_a_clear_error_without_a_reference(x64, dtype):
    x1, x2 = random((4,), dtype, 10), random((4,), dtype, 11)
    f = lambda a: jnp.sum(jnp.real(ro.nonlinear_without_reference(a, x2)[0]))
    missing = "differentiable to order 1 only; a derivative of order 2"
    if np.dtype(dtype).kind == "f":
        with pytest.raises(NotImplementedError, match=missing):
            jax.hessian(f)(x1)
    with pytest.raises(NotImplementedError, match=missing):
        jax.jvp(jax.grad(f), (x1,), (x1,))


@dtypes_and_x64(REAL_DTYPES)
def test_second_order_comes_from_the_twin_given_as_reference(x64, dtype):
    x1, x2 = random((4,), dtype, 10), random((4,), dtype, 11)
    hessian = jax.hessian(lambda a: jnp.sum(nonlinear(a, x2)[0] ** 2))(x1)
    want = jax.hessian(lambda a: jnp.sum(ro.nonlinear_ref(a, x2) ** 2))(x1)
    np.testing.assert_allclose(hessian, want, rtol=tol(dtype), atol=tol(dtype))


@dtypes_and_x64(REAL_DTYPES)  # power is tested on real inputs
def test_fixed_argument(x64, dtype):
    p, x = np.asarray(3.0, dtype), np.abs(random((5,), dtype, 12)) + 0.5
    np.testing.assert_allclose(power(p, x)[0], x**3, rtol=tol(dtype))
    g = jax.grad(lambda x: jnp.sum(power(p, x)[0]))(x)
    np.testing.assert_allclose(g, 3 * x**2, rtol=tol(dtype))
    with pytest.raises(TypeError, match=r"argument 0 is fixed \(first_n_args_fixed=1\)"):
        jax.grad(lambda p: jnp.sum(power(p, x)[0]))(p)
