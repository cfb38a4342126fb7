"""Linear ops: every transformation against pure JAX, in all float dtypes, x64 off and on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from reference_ops import axpy, axpy_ref, matvec, matvec_ref
from support.arrays import random, tol
from support.dtypes import dtypes_and_x64

pytestmark = dtypes_and_x64()  # each dtype with x64 off and on; 64-bit floats with x64 only


def _inputs(dtype):
    return random((4, 3), dtype, 1), random((3,), dtype, 2)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_forward_matches_jax(x64, dtype, jit):
    a, x = _inputs(dtype)
    fn = lambda a, x: matvec(a, x)[0]
    fn = jax.jit(fn) if jit else fn
    y = fn(a, x)
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_allclose(y, matvec_ref(a, x), rtol=tol(dtype))


def test_kwargs_reach_callable(x64, dtype):
    x, y = random((5,), dtype, 3), random((5,), dtype, 4)
    out = jax.jit(lambda x, y: axpy(x, y, scale=3.0)[0])(x, y)
    np.testing.assert_allclose(out, axpy_ref(x, y, 3.0), rtol=tol(dtype))


def test_jvp_matches_jax(x64, dtype):
    a, x = _inputs(dtype)
    t = random(x.shape, dtype, 5)
    y, ty = jax.jvp(lambda x: matvec(a, x)[0], (x,), (t,))
    np.testing.assert_allclose(y, matvec_ref(a, x), rtol=tol(dtype))
    np.testing.assert_allclose(ty, matvec_ref(a, t), rtol=tol(dtype))


def test_vjp_matches_jax(x64, dtype):
    a, x = _inputs(dtype)
    ct = random((4,), dtype, 6)
    _, vjp = jax.vjp(lambda x: matvec(a, x)[0], x)
    _, vjp_ref = jax.vjp(lambda x: matvec_ref(a, x), x)
    np.testing.assert_allclose(vjp(ct)[0], vjp_ref(ct)[0], rtol=tol(dtype))


def test_transpose_matches_dense_adjoint(x64, dtype):
    a, x = _inputs(dtype)
    ct = random((4,), dtype, 7)
    transpose = jax.linear_transpose(lambda x: matvec(a, x)[0], x)
    np.testing.assert_allclose(transpose(ct)[0], a.T @ ct, rtol=tol(dtype))
    # and back: the transpose of the transpose is the op itself
    back = jax.linear_transpose(lambda c: transpose(c)[0], ct)
    np.testing.assert_allclose(back(x)[0], a @ x, rtol=tol(dtype))


def test_grad_of_real_loss_matches_jax(x64, dtype):
    x, y = random((6,), dtype, 8), random((6,), dtype, 9)
    loss = lambda f: lambda x, y: jnp.sum(jnp.abs(f(x, y)) ** 2)
    g = jax.jit(jax.grad(loss(lambda x, y: axpy(x, y, scale=0.5)[0]), argnums=(0, 1)))(x, y)
    g_ref = jax.grad(loss(lambda x, y: axpy_ref(x, y, 0.5)), argnums=(0, 1))(x, y)
    for got, want in zip(g, g_ref):
        np.testing.assert_allclose(got, want, rtol=tol(dtype), atol=tol(dtype))


def test_check_grads_to_second_order(x64, dtype):
    a, x = _inputs(dtype)
    check_grads(lambda x: matvec(a, x)[0], (x,), order=2, modes=("fwd", "rev"))
    y = random(x.shape, dtype, 10)
    check_grads(lambda x, y: axpy(x, y, scale=2.0)[0], (x, y), order=3, modes=("fwd", "rev"))


def test_fixed_argument_cannot_be_differentiated(x64, dtype):
    a, x = _inputs(dtype)
    with pytest.raises(TypeError, match=r"argument 0 is fixed \(first_n_args_fixed=1\)"):
        jax.jvp(lambda a: matvec(a, x)[0], (a,), (a,))
    with pytest.raises(TypeError, match="cannot be transposed"):
        jax.linear_transpose(lambda a: matvec(a, x)[0], a)(x[:1].repeat(4))
