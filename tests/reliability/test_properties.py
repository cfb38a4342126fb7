"""Property-based tests (hypothesis): shapes, dtypes and in_axes for reference ops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_ops import axpy, axpy_ref, bilinear, flipsum, flipsum_loop, flipsum_ref
from support.arrays import batched_inputs, random

shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
dtypes = st.sampled_from([np.float32, np.complex64])
SETTINGS = settings(max_examples=25, deadline=None)


@SETTINGS
@given(shape=shapes, dtype=dtypes, scale=st.floats(-4, 4, allow_nan=False), seed=st.integers(0, 9))
def test_linear_op_forward_and_transpose(shape, dtype, scale, seed):
    x, y = random(shape, dtype, seed), random(shape, dtype, seed + 1)
    np.testing.assert_allclose(
        jax.jit(lambda x, y: axpy(x, y, scale=scale)[0])(x, y),
        axpy_ref(x, y, np.float32(scale)),
        rtol=2e-5,
        atol=1e-5,
    )
    ct = random(shape, dtype, seed + 2)
    tx, ty = jax.linear_transpose(lambda x, y: axpy(x, y, scale=scale)[0], x, y)(ct)
    np.testing.assert_allclose(tx, np.float32(scale) * ct, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(ty, 2 * np.float32(scale) * ct, rtol=2e-5, atol=1e-5)


@st.composite
def batched_pair(draw):
    """Two arrays of one core shape, each batched (size b) along a drawn axis, or not."""
    core = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple))
    b = draw(st.integers(1, 3))
    axes = []
    for _ in range(2):
        ax = draw(st.one_of(st.none(), st.integers(0, len(core))))
        axes.append(ax)
    if axes == [None, None]:
        axes[0] = 0
    seed = draw(st.integers(0, 100))
    return batched_inputs(core, axes, b, seed), tuple(axes)


@pytest.mark.slow  # about 11 s
@SETTINGS
@given(case=batched_pair(), native=st.booleans())
def test_vmap_any_in_axes_matches_jax(case, native):
    (x, y), in_axes = case
    op = flipsum if native else flipsum_loop
    got = jax.vmap(lambda x, y: op(x, y)[0], in_axes=in_axes)(x, y)
    want = jax.vmap(flipsum_ref, in_axes=in_axes)(x, y)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    g = jax.grad(
        lambda x, y: jnp.sum(jax.vmap(lambda x, y: op(x, y)[0], in_axes=in_axes)(x, y) ** 2),
        argnums=(0, 1),
    )(x, y)
    g_ref = jax.grad(
        lambda x, y: jnp.sum(jax.vmap(flipsum_ref, in_axes=in_axes)(x, y) ** 2), argnums=(0, 1)
    )(x, y)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(shape=shapes, dtype=dtypes, seed=st.integers(0, 9))
def test_bilinear_grad_matches_jax(shape, dtype, seed):
    x, y = random(shape, dtype, seed), random(shape, dtype, seed + 1)
    loss = lambda f: lambda x, y: jnp.sum(jnp.abs(f(x, y)) ** 2)
    g = jax.grad(loss(lambda x, y: bilinear(x, y)[0]), argnums=(0, 1))(x, y)
    g_ref = jax.grad(loss(lambda x, y: x * y), argnums=(0, 1))(x, y)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
