"""vmap: vectorized batching (func_can_batch) and the lax.map fallback, against Python loops."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_ops import (
    axpy,
    axpy_ref,
    flip2,
    flip2_ref,
    flipsum,
    flipsum_loop,
    flipsum_ref,
    matvec,
    nonlinear,
    nonlinear_ref,
)
from support.arrays import batched_inputs, random
from support.ops import same_as_first

import jaxbind

BATCH, SHAPE = 3, (2, 4)
IN_AXES = [(0, 0), (0, None), (None, 0), (1, 0), (0, 2), (2, None), (None, 1), (2, 1)]


def _loop(f, in_axes, args):
    outs = []
    for b in range(BATCH):
        sl = [a if ax is None else np.take(a, b, axis=ax) for a, ax in zip(args, in_axes)]
        outs.append(f(*sl))
    return np.stack(outs)


@pytest.mark.parametrize("op", [flipsum, flipsum_loop], ids=["native", "fallback"])
@pytest.mark.parametrize("in_axes", IN_AXES, ids=str)
def test_vmap_two_inputs_every_in_axes(op, in_axes):
    x, y = batched_inputs(SHAPE, in_axes, BATCH)
    got = jax.vmap(lambda x, y: op(x, y)[0], in_axes=in_axes)(x, y)
    np.testing.assert_allclose(got, _loop(flipsum_ref, in_axes, (x, y)), rtol=1e-6)
    got_jit = jax.jit(jax.vmap(lambda x, y: op(x, y)[0], in_axes=in_axes))(x, y)
    np.testing.assert_allclose(got_jit, got, rtol=1e-6)


@pytest.mark.parametrize("op", [flipsum, flipsum_loop], ids=["native", "fallback"])
@pytest.mark.parametrize("in_axes", IN_AXES, ids=str)
def test_grad_of_vmapped_op(op, in_axes):
    x, y = batched_inputs(SHAPE, in_axes, BATCH, seed=10)
    w = random((BATCH,) + SHAPE, np.float32, 99)

    def loss(f):
        return lambda x, y: jnp.sum(w * jax.vmap(f, in_axes=in_axes)(x, y) ** 2)

    g = jax.grad(loss(lambda x, y: op(x, y)[0]), argnums=(0, 1))(x, y)
    g_ref = jax.grad(loss(flipsum_ref), argnums=(0, 1))(x, y)
    for got, want in zip(g, g_ref):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", [flipsum, flipsum_loop], ids=["native", "fallback"])
def test_vmap_of_grad(op):
    x, y = batched_inputs(SHAPE, (0, 0), BATCH, seed=20)
    loss = lambda f: lambda x, y: jnp.sum(f(x, y) ** 3)
    g = jax.vmap(jax.grad(loss(lambda x, y: op(x, y)[0]), argnums=(0, 1)))(x, y)
    g_ref = jax.vmap(jax.grad(loss(flipsum_ref), argnums=(0, 1)))(x, y)
    for got, want in zip(g, g_ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", [flipsum, flipsum_loop], ids=["native", "fallback"])
@pytest.mark.parametrize(
    "inner,outer",
    list(itertools.product([(0, 0), (1, None), (None, 0)], [(0, 0), (2, 1), (None, 0), (1, None)])),
    ids=str,
)
def test_nested_vmap(op, inner, outer):
    rng = np.random.default_rng(5)

    # Build inputs with an inner batch of 3 and an outer batch of 2.
    def make(ax_in, ax_out):
        shape = list(SHAPE)
        if ax_in is not None:
            shape.insert(ax_in, 3)
        if ax_out is not None:
            shape.insert(ax_out, 2)
        return rng.standard_normal(shape).astype(np.float32)

    x, y = make(inner[0], outer[0]), make(inner[1], outer[1])
    f = jax.vmap(jax.vmap(lambda x, y: op(x, y)[0], in_axes=inner), in_axes=outer)
    ref = jax.vmap(jax.vmap(flipsum_ref, in_axes=inner), in_axes=outer)
    np.testing.assert_allclose(jax.jit(f)(x, y), ref(x, y), rtol=1e-6)
    g = jax.grad(lambda x, y: jnp.sum(f(x, y) ** 2), argnums=(0, 1))(x, y)
    g_ref = jax.grad(lambda x, y: jnp.sum(ref(x, y) ** 2), argnums=(0, 1))(x, y)
    for got, want in zip(g, g_ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_native_batching_passes_batch_axes():
    seen = []

    def f(out, args, kwargs_dump):
        kwargs = jaxbind.load_kwargs(kwargs_dump)
        seen.append(kwargs["batch_axes"])
        out[0][...] = 2 * np.flip(args[0], axis=-1)

    def abstract(x, batch_axes=None, **kwargs):
        return ((x.shape, x.dtype, batch_axes[0][-1] if batch_axes else None),)

    op = jaxbind.get_linear_call(
        f, None, abstract, None, func_can_batch=True, name="tests.records_batch_axes"
    )
    x = np.ones((2, 3, 4), np.float32)
    op(x[0, 0])
    jax.vmap(lambda x: op(x)[0], in_axes=1)(x[0])
    jax.vmap(jax.vmap(lambda x: op(x)[0], in_axes=0), in_axes=2)(x)
    # inner vmap over axis 0 of the slice; the outer one over axis 2 of the full array
    assert seen == [None, ((1,),), ((0, 2),)]


def test_native_vmap_calls_the_callable_once():
    calls = []

    def f(out, args, kwargs_dump):
        calls.append(args[0].shape)
        out[0][...] = args[0]

    def abstract(x, batch_axes=None, **kwargs):
        return ((x.shape, x.dtype, batch_axes[0][-1] if batch_axes else None),)

    op = jaxbind.get_linear_call(
        f, None, abstract, None, func_can_batch=True, name="tests.counts_native_calls"
    )
    jax.vmap(lambda x: op(x)[0])(np.ones((64, 10), np.float32))
    assert calls == [(64, 10)]


def test_fallback_matches_loop_for_fixed_and_nonlinear_ops():
    a = random((BATCH, 4, 3), np.float32, 1)
    x = random((3,), np.float32, 2)
    got = jax.vmap(lambda a: matvec(a, x)[0])(a)
    np.testing.assert_allclose(got, np.einsum("bij,j->bi", a, x), rtol=1e-5)
    x1, x2 = random((BATCH, 5), np.float32, 3), random((5,), np.float32, 4)
    got = jax.vmap(lambda p: nonlinear(p, x2)[0])(x1)
    np.testing.assert_allclose(got, nonlinear_ref(x1, x2), rtol=1e-6)
    g = jax.vmap(jax.grad(lambda p: jnp.sum(nonlinear(p, x2)[0] ** 2)))(x1)
    g_ref = jax.vmap(jax.grad(lambda p: jnp.sum(nonlinear_ref(p, x2) ** 2)))(x1)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5)


def test_vmap_with_kwargs():
    x, y = random((BATCH, 5), np.float32, 5), random((BATCH, 5), np.float32, 6)
    got = jax.vmap(lambda x, y: axpy(x, y, scale=-2.0)[0])(x, y)
    np.testing.assert_allclose(got, axpy_ref(x, y, -2.0), rtol=1e-6)


def test_single_input_native_batching_matches_jax():
    x = random((4, 5, 6), np.float32, 7)
    for axis in range(3):
        got = jax.vmap(lambda v: flip2(v)[0], in_axes=axis, out_axes=axis)(x)
        np.testing.assert_allclose(got, jax.vmap(flip2_ref, axis, axis)(x), rtol=1e-6)
    t = jax.linear_transpose(jax.vmap(lambda v: flip2(v)[0], in_axes=1), x)(
        random((5, 4, 6), np.float32, 8)
    )[0]
    np.testing.assert_allclose(
        t,
        jax.linear_transpose(jax.vmap(flip2_ref, in_axes=1), x)(random((5, 4, 6), np.float32, 8))[
            0
        ],
        rtol=1e-6,
    )


def test_vmap_without_batch_rule_is_one_custom_call_without_a_loop():
    x, y = random((64, 1000), np.float32, 1), random((1000,), np.float32, 2)
    fn = jax.jit(jax.vmap(lambda x, y: flipsum_loop(x, y)[0], in_axes=(0, None)))
    hlo = fn.lower(x, y).as_text()
    assert hlo.count("jaxbind_cpu") == 1 and "while" not in hlo
    np.testing.assert_allclose(fn(x, y), jax.vmap(flipsum_ref, in_axes=(0, None))(x, y), rtol=1e-6)
    calls = []

    def f(out, args, kwargs_dump):
        calls.append(
            (
                args[0].shape,
                args[0].flags.c_contiguous,
                out[0].flags.c_contiguous,
                jaxbind.load_kwargs(kwargs_dump),
            )
        )
        out[0][...] = args[0]

    op = jaxbind.get_linear_call(f, None, same_as_first, None, name="tests.looped_calls")
    jax.vmap(jax.vmap(lambda x: op(x, k=1)[0]), in_axes=2)(np.ones((3, 4, 2, 5), np.float32))
    assert calls == [((4, 5), True, True, {"k": 1})] * 6  # 2 x 3 elements, one custom call


def test_nested_vmap_where_a_fixed_input_is_batched_only_by_the_outer_level():
    """The outer level's new axis lies before the inner level's axes of another input."""
    a = random((2, 4, 3), np.float32, 7)  # outer batch 2, fixed argument of matvec
    x = random((2, 5, 3), np.float32, 8)  # outer batch 2, inner batch 5
    inner = jax.vmap(lambda a, x: matvec(a, x)[0], in_axes=(None, 0))
    got = jax.vmap(inner, in_axes=(0, 0))(a, x)
    np.testing.assert_allclose(got, np.einsum("bij,bkj->bki", a, x), rtol=1e-5)


def test_batch_axes_round_trip():
    """BatchAxes, the one batch-layout type: to_front and from_front are inverses, and the
    core shapes and level sizes are read the same way from either layout."""
    from jaxbind._spec import BatchAxes

    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 5, 3, 4))  # batch axes 3 (innermost level) and 1 (outermost)
    b = rng.standard_normal((7,))  # not batched
    c = rng.standard_normal((5, 6, 4))  # axes 2 (inner) and 0 (outer)
    layout = BatchAxes(((3, 1), (), (2, 0)))
    assert layout.levels == 2 and layout.batched == (True, False, True)
    assert layout.sizes([a.shape, b.shape, c.shape]) == (5, 4)
    assert layout.core_shape(a.shape, 0) == (2, 3) and layout.core_shape(c.shape, 2) == (6,)
    front = layout.to_front([a, b, c], np.moveaxis)
    assert [x.shape for x in front] == [(5, 4, 2, 3), (7,), (5, 4, 6)]
    assert layout.front() == BatchAxes(((1, 0), (), (1, 0)))
    assert layout.front().sizes([x.shape for x in front]) == (5, 4)
    back = layout.from_front(front, np.moveaxis)
    for x, y in zip(back, [a, b, c]):
        np.testing.assert_array_equal(x, y)
    assert BatchAxes.leading(2, 3).all_leading and not layout.all_leading
    assert (layout[:1] + layout[2:]).axes == ((3, 1), (2, 0))
    assert layout.pick([2]).axes == ((2, 0),)


def test_jacfwd_of_a_natively_batched_op_batches_its_jvp_at_unbatched_primals():
    """jacfwd batches the tangents alone; the JVP's outputs, declared at the primals, carry
    that batch (found by the conformance matrix: they were declared unbatched)."""

    @jaxbind.nonlinear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), vectorized=True,
        name="tests.vectorized_square",
    )  # fmt: skip
    def square(x):
        return x * x

    square.def_jvp(lambda p, t: 2 * p[0] * t[0])
    square.def_vjp(lambda p, ct: (2 * p[0] * ct,))

    def _sq(out, args, kwargs_dump):
        out[0][...] = args[0] ** 2

    def _sq_d(out, args, kwargs_dump):
        x, t = args
        out[0][...] = 2 * x * t

    def _abstract(x, batch_axes=None, **kwargs):
        return ((x.shape, x.dtype, 0 if batch_axes and batch_axes[0] else None),)

    square13 = jaxbind.get_nonlinear_call(
        _sq, (_sq_d, _sq_d), _abstract, _abstract, func_can_batch=True,
        name="tests.vectorized_square13",
    )  # fmt: skip
    x = np.arange(1.0, 5.0, dtype=np.float32)
    np.testing.assert_allclose(jax.jacfwd(square)(x), np.diag(2 * x))
    np.testing.assert_allclose(jax.jacfwd(lambda x: square13(x)[0])(x), np.diag(2 * x))
