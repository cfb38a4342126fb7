"""Integer and boolean outputs and inputs under every transformation: their tangents are
float0 (as JAX gives its own integer outputs), their cotangents reach a VJP callable as
zeros of the output's dtype, in both APIs, with declared rules and with rules derived from
the reference; and testing.check checks such ops (and still fails a wrong one)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_ops import (
    _sort_with_order,
    _sort_with_order_abstract,
    _sort_with_order_jvp,
    gather,
    masked_square,
    masked_square_ref,
    native_sort_with_order,
    native_sort_with_order_derived,
    sort_with_order,
    sort_with_order_derived,
    sort_with_order_ref,
)

import jaxbind
import jaxbind.testing

SORTS = {
    "declared": sort_with_order,
    "derived": sort_with_order_derived,
    "native-declared": native_sort_with_order,
    "native-derived": native_sort_with_order_derived,
}
X = np.array([3.0, -1.0, 2.0, 5.0, -4.0], np.float32)
W = np.arange(5.0, dtype=np.float32)


def _loss(op):
    return lambda x: jnp.sum(op(x)[0] * W)


def _ref_loss(x):
    return jnp.sum(sort_with_order_ref(x)[0] * W)


def _is_float0(t) -> bool:
    return t.dtype == jax.dtypes.float0


@pytest.fixture(params=list(SORTS), ids=list(SORTS))
def sort(request):
    return SORTS[request.param]


def test_jvp_gives_float0_tangents_for_integer_and_boolean_outputs(sort):
    v = np.linspace(1, 2, 5, dtype=np.float32)
    outs, tans = jax.jvp(sort, (X,), (v,))
    ref_outs, ref_tans = jax.jvp(sort_with_order_ref, (X,), (v,))
    for got, want in zip(outs, ref_outs):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(tans[0], ref_tans[0])
    assert _is_float0(tans[1]) and _is_float0(tans[2])
    assert tans[1].shape == tans[2].shape == X.shape


@pytest.mark.parametrize(
    "transform",
    ["grad", "jit(grad)", "vmap(grad)", "grad(vmap)", "jacfwd", "jacrev"],
)
def test_gradients_through_integer_outputs_match_jax(sort, transform):
    xs = np.stack([X, -X, 2 * X])

    def run(loss):
        if transform == "grad":
            return jax.grad(loss)(X)
        if transform == "jit(grad)":
            return jax.jit(jax.grad(loss))(X)
        if transform == "vmap(grad)":
            return jax.vmap(jax.grad(loss))(xs)
        if transform == "grad(vmap)":
            return jax.grad(lambda x: jnp.sum(jax.vmap(loss)(x)))(xs)
        jac = jax.jacfwd if transform == "jacfwd" else jax.jacrev
        return jac(loss)(X)

    np.testing.assert_allclose(run(_loss(sort)), run(_ref_loss), rtol=1e-6)


def test_vjp_takes_float0_cotangents_of_integer_outputs(sort):
    outs, pull = jax.vjp(sort, X)
    float0 = np.zeros(X.shape, jax.dtypes.float0)
    (ct,) = pull(type(outs)([jnp.asarray(W), float0, float0]))
    _, ref_pull = jax.vjp(sort_with_order_ref, X)
    np.testing.assert_allclose(ct, ref_pull((jnp.asarray(W), float0, float0))[0])


def test_vmap_of_an_op_with_integer_outputs_matches_a_loop(sort):
    xs = np.stack([X, -X])
    got = jax.vmap(sort)(xs)
    for k, x in enumerate(xs):
        for g, w in zip(got, sort_with_order_ref(x)):
            np.testing.assert_array_equal(g[k], w)
            assert g.dtype == w.dtype


def test_hessian_through_integer_outputs_with_derived_rules():
    f = lambda op: lambda x: jnp.sum(op(x)[0] ** 2 * W)
    want = jax.hessian(f(sort_with_order_ref))(X)
    for op in (sort_with_order_derived, native_sort_with_order_derived):
        np.testing.assert_allclose(jax.hessian(f(op))(X), want, rtol=1e-6)


def test_hessian_through_integer_outputs_with_callable_rules_and_a_reference():
    """The callables compute the first order, the reference the second: their terms are
    added for the float outputs only (an integer output's tangent is float0; found by the
    conformance matrix)."""
    f = lambda op: lambda x: jnp.sum(op(x)[0] ** 2 * W)
    want = jax.hessian(f(sort_with_order_ref))(X)
    np.testing.assert_allclose(jax.hessian(f(sort_with_order))(X), want, rtol=1e-6)


def test_boolean_input_and_integer_output_with_jax_function_rules():
    """A boolean argument after the fixed ones has float0 tangents and cotangents; the
    JAX-function rules make second derivatives."""
    m = np.array([True, False, True, True, False])
    v = np.ones(5, np.float32)
    (y, count), (ty, tcount) = jax.jvp(masked_square, (X, m), (v, np.zeros(5, jax.dtypes.float0)))
    np.testing.assert_allclose(ty, jax.jvp(lambda x: masked_square_ref(x, m)[0], (X,), (v,))[1])
    assert count == 3 and _is_float0(tcount)
    gx, gm = jax.grad(lambda x, m: masked_square(x, m)[0] @ W, (0, 1), allow_int=True)(X, m)
    np.testing.assert_allclose(gx, jax.grad(lambda x: masked_square_ref(x, m)[0] @ W)(X))
    assert _is_float0(gm)
    hess = jax.hessian(lambda x: masked_square(x, m)[0] @ W)(X)
    np.testing.assert_allclose(hess, jax.hessian(lambda x: masked_square_ref(x, m)[0] @ W)(X))


def test_linear_op_with_fixed_integer_indices_transposes():
    idx = np.array([3, 0, 0, 2], np.int32)
    fn = lambda x: gather(idx, x, n=5)[0]
    (t,) = jax.linear_transpose(fn, X)(jnp.asarray(W[:4]))
    np.testing.assert_allclose(t, jax.grad(lambda x: x[idx] @ W[:4])(X))
    gi, gx = jax.grad(lambda i, x: gather(i, x, n=5)[0] @ W[:4], (0, 1), allow_int=True)(idx, X)
    assert _is_float0(gi)
    np.testing.assert_allclose(gx, t)


@pytest.mark.parametrize("op", [*SORTS.values(), masked_square, gather], ids=lambda o: o.name)
def test_check_passes_ops_with_integer_outputs(enable_x64, op):
    x = X.astype(np.float64)
    if op is gather:
        report = jaxbind.testing.check(op, np.array([3, 0, 0, 2], np.int32), x, n=5)
    elif op is masked_square:
        report = jaxbind.testing.check(op, x, x > 0)
    else:
        report = jaxbind.testing.check(op, x)
    checks = {r.check for r in report if r.status == "ok"}
    assert {"vjp vs finite differences", "vmap(grad) vs loop"} <= checks


def test_check_fails_a_wrong_vjp_of_an_op_with_integer_outputs(enable_x64):
    def wrong_vjp(out, args, kwargs_dump):
        x, ct, _, _ = args
        out[0][...] = ct  # forgets to undo the permutation
        out[0][0] *= 2  # in case the permutation was the identity

    op = jaxbind.get_nonlinear_call(
        _sort_with_order,
        (_sort_with_order_jvp, wrong_vjp),
        _sort_with_order_abstract,
        name="test.wrong_sort_vjp",
    )
    with pytest.raises(AssertionError, match="vjp vs"):
        jaxbind.testing.check(op, X.astype(np.float64), verbose=False)
