"""Multilinear ops: product rule, per-argument transposes, second order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from reference_ops import bilinear, bilinear_ref
from support.arrays import random, tol
from support.dtypes import REAL_DTYPES, dtypes_and_x64
from support.ops import same_as_first

import jaxbind


@dtypes_and_x64()
def test_forward_and_jit(x64, dtype):
    x, y = random((3, 4), dtype, 1), random((3, 4), dtype, 2)
    np.testing.assert_allclose(bilinear(x, y)[0], bilinear_ref(x, y), rtol=tol(dtype))
    np.testing.assert_allclose(
        jax.jit(lambda x, y: bilinear(x, y)[0])(x, y), bilinear_ref(x, y), rtol=tol(dtype)
    )


@dtypes_and_x64()
def test_jvp_is_product_rule(x64, dtype):
    x, y, tx, ty = (random((5,), dtype, s) for s in range(4))
    out, tan = jax.jvp(lambda x, y: bilinear(x, y)[0], (x, y), (tx, ty))
    out_ref, tan_ref = jax.jvp(bilinear_ref, (x, y), (tx, ty))
    np.testing.assert_allclose(out, out_ref, rtol=tol(dtype))
    np.testing.assert_allclose(tan, tan_ref, rtol=tol(dtype), atol=tol(dtype))


@dtypes_and_x64()
def test_grad_with_respect_to_each_and_both(x64, dtype):
    x, y = random((5,), dtype, 5), random((5,), dtype, 6)
    for argnums in (0, 1, (0, 1)):
        loss = lambda f: lambda x, y: jnp.sum(jnp.abs(f(x, y)) ** 2)
        g = jax.grad(loss(lambda x, y: bilinear(x, y)[0]), argnums)(x, y)
        g_ref = jax.grad(loss(bilinear_ref), argnums)(x, y)
        for got, want in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
            np.testing.assert_allclose(got, want, rtol=tol(dtype), atol=tol(dtype))


@dtypes_and_x64()
def test_linear_transpose_per_argument(x64, dtype):
    x, y, ct = random((5,), dtype, 7), random((5,), dtype, 8), random((5,), dtype, 9)
    tx = jax.linear_transpose(lambda x: bilinear(x, y)[0], x)(ct)[0]
    ty = jax.linear_transpose(lambda y: bilinear(x, y)[0], y)(ct)[0]
    np.testing.assert_allclose(tx, ct * y, rtol=tol(dtype))
    np.testing.assert_allclose(ty, ct * x, rtol=tol(dtype))


@dtypes_and_x64()
def test_check_grads_to_second_order(x64, dtype):
    x, y = random((4,), dtype, 10), random((4,), dtype, 11)
    check_grads(lambda x, y: bilinear(x, y)[0], (x, y), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("dtype", REAL_DTYPES)  # jax.hessian needs a real output
def test_hessian_matches_jax(enable_x64, dtype):
    x, y = random((3,), dtype, 12), random((3,), dtype, 13)
    f = lambda x, y: jnp.sum(bilinear(x, y)[0] ** 2)
    f_ref = lambda x, y: jnp.sum(bilinear_ref(x, y) ** 2)
    for argnums in ((0, 1), 0):
        h = jax.hessian(f, argnums)(x, y)
        h_ref = jax.hessian(f_ref, argnums)(x, y)
        for got, want in zip(jax.tree.leaves(h), jax.tree.leaves(h_ref)):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _mul(out, args, kd):
    out[0][...] = args[0] * args[1]


@dtypes_and_x64()
def test_missing_transpose_is_a_clear_error(x64, dtype):
    op = jaxbind.get_linear_call(
        _mul, (None, None), same_as_first, (None, None), name="tests.mul_without_transposes"
    )
    x = random((3,), dtype, 1)
    with pytest.raises(
        NotImplementedError,
        match=r"'tests.mul_without_transposes' has no transpose with respect to argument 1, "
        r"which grad, vjp and jax.linear_transpose need; pass it to get_linear_call as f_T\[1\]",
    ):
        jax.grad(lambda x: jnp.sum(jnp.abs(op(x, x)[0])))(x)
