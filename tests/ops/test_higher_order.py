"""Second and higher derivatives of nonlinear ops whose JVP and VJP are JAX functions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import same_as_first

import jaxbind
from jaxbind.testing import check

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py: 1e-10 in float64


def _max_err(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


# f(x, y) = sin(x) * y**2: callables for f, derivatives in jax.numpy
def _sin_y2(out, args, kwargs_dump):
    x, y = args
    out[0][...] = np.sin(x) * y**2


sin_y2 = jaxbind.get_nonlinear_call(
    _sin_y2,
    (
        jaxbind.jax_function(
            lambda x, y, dx, dy: [jnp.cos(x) * y**2 * dx + 2 * jnp.sin(x) * y * dy]
        ),
        jaxbind.jax_function(lambda x, y, ct: [jnp.cos(x) * y**2 * ct, 2 * jnp.sin(x) * y * ct]),
    ),
    same_as_first,
    lambda x, y, ct: ((x.shape, x.dtype), (y.shape, y.dtype)),
    name="tests.sin_y2",
)


def sin_y2_ref(x, y):  # returns a list, as ops do
    return [jnp.sin(x) * y**2]


# exp, with JVP and VJP that are jaxbind ops with callables: differentiable to order 2
def _exp(out, args, kwargs_dump):
    out[0][...] = np.exp(args[0])


def _lin_exp(out, args, kwargs_dump):  # exp(x) * v: the JVP and the VJP of exp
    x, v = args
    out[0][...] = np.exp(x) * v


def _lin_exp_jvp(out, args, kwargs_dump):
    x, v, tx, tv = args
    out[0][...] = np.exp(x) * (tx * v + tv)


def _lin_exp_vjp(out, args, kwargs_dump):
    x, v, ct = args
    out[0][...] = np.exp(x) * v * ct
    out[1][...] = np.exp(x) * ct


def _two(x, v, *rest):
    return ((x.shape, x.dtype),) * (1 if not rest else 2)


lin_exp = jaxbind.get_nonlinear_call(
    _lin_exp, (_lin_exp_jvp, _lin_exp_vjp), _two, _two, name="tests.lin_exp"
)
exp2 = jaxbind.get_nonlinear_call(
    _exp,
    (lin_exp, lin_exp),
    same_as_first,
    same_as_first,
    name="tests.exp2",
)


def _loss(op):
    return lambda x, y: jnp.sum(op(x, y)[0] ** 2) + jnp.sum(x * y)


X = np.linspace(0.1, 1.3, 5)
Y = np.linspace(-1.0, 2.0, 5)


@pytest.mark.parametrize("how", ["hessian", "jacfwd(jacrev)", "jacrev(jacfwd)", "jacrev(jacrev)"])
def test_hessian_matches_pure_jax(how):
    outer, inner = {
        "hessian": (jax.hessian, None),
        "jacfwd(jacrev)": (jax.jacfwd, jax.jacrev),
        "jacrev(jacfwd)": (jax.jacrev, jax.jacfwd),
        "jacrev(jacrev)": (jax.jacrev, jax.jacrev),
    }[how]

    def second(f):
        if inner is None:
            return outer(f, argnums=(0, 1))
        return outer(inner(f, argnums=(0, 1)), argnums=(0, 1))

    got = jax.jit(second(_loss(sin_y2)))(X, Y)
    want = second(_loss(sin_y2_ref))(X, Y)
    assert _max_err(got, want) < 1e-10


def test_jvp_of_grad_and_hessian_vector_product():
    g = jax.grad(_loss(sin_y2), argnums=(0, 1))
    g_ref = jax.grad(_loss(sin_y2_ref), argnums=(0, 1))
    got = jax.jvp(g, (X, Y), (Y, X))[1]
    want = jax.jvp(g_ref, (X, Y), (Y, X))[1]
    assert _max_err(got, want) < 1e-10


def test_hessian_under_vmap_and_jit():
    xs, ys = np.stack([X, 2 * X, X - 1]), np.stack([Y, Y**2, -Y])
    got = jax.jit(jax.vmap(jax.hessian(_loss(sin_y2))))(xs, ys)
    want = jax.vmap(jax.hessian(_loss(sin_y2_ref)))(xs, ys)
    assert _max_err(got, want) < 1e-10
    # vmap inside: the Hessian of a batched op
    got = jax.hessian(lambda x: jnp.sum(jax.vmap(lambda a: sin_y2(a, Y)[0])(x) ** 2))(xs)
    want = jax.hessian(lambda x: jnp.sum(jax.vmap(lambda a: sin_y2_ref(a, Y)[0])(x) ** 2))(xs)
    assert _max_err(got, want) < 1e-10


def test_derivatives_given_as_jaxbind_ops_reach_second_order_and_name_the_third():
    assert exp2.binding.order() == 2 and sin_y2.binding.order() == float("inf")
    f = lambda x: jnp.sum(exp2(x)[0] ** 2)
    assert _max_err(jax.hessian(f)(X), jax.hessian(lambda x: jnp.sum(jnp.exp(x) ** 2))(X)) < 1e-10
    with pytest.raises(
        NotImplementedError,
        match=r"'tests\.lin_exp' is a nonlinear op "
        r"differentiable to order 1 only; a derivative "
        r"of order 2",
    ):
        jax.jacfwd(jax.hessian(f))(X)


def test_callables_as_derivatives_stop_at_first_order_with_the_order_named():
    op = jaxbind.get_nonlinear_call(
        _exp,
        (_lin_exp, _lin_exp),
        same_as_first,
        same_as_first,
        name="tests.exp1",
    )
    f = lambda x: jnp.sum(op(x)[0] ** 2)
    np.testing.assert_allclose(jax.grad(f)(X), 2 * np.exp(2 * X), rtol=1e-12)
    with pytest.raises(
        NotImplementedError,
        match=r"'tests\.exp1' is a nonlinear op "
        r"differentiable to order 1 only; a derivative "
        r"of order 2 needs the (JVP|VJP)",
    ):
        jax.hessian(f)(X)


def test_fixed_arguments_stay_fixed_at_second_order():
    def f(out, args, kwargs_dump):
        p, x = args
        out[0][...] = x**p

    jvp = jaxbind.jax_function(lambda p, x, dx: [p * x ** (p - 1) * dx])
    vjp = jaxbind.jax_function(lambda p, x, ct: [p * x ** (p - 1) * ct])
    op = jaxbind.get_nonlinear_call(
        f,
        (jvp, vjp),
        lambda p, x: ((x.shape, x.dtype),),
        lambda p, x, ct: ((x.shape, x.dtype),),
        first_n_args_fixed=1,
        name="tests.pow_jaxfn",
    )
    p = np.float64(3.0)
    got = jax.hessian(lambda x: jnp.sum(op(p, x)[0]))(X)
    np.testing.assert_allclose(got, np.diag(6 * X), atol=1e-12)
    with pytest.raises(TypeError, match=r"argument 0 is fixed"):
        jax.grad(lambda p: jnp.sum(op(p, X)[0]))(p)


def test_keyword_arguments_reach_the_jax_functions():
    def f(out, args, kwargs_dump):
        out[0][...] = jaxbind.load_kwargs(kwargs_dump)["scale"] * np.tanh(args[0])

    def jvp(x, dx, *, scale):
        return [scale * dx / jnp.cosh(x) ** 2]

    op = jaxbind.get_nonlinear_call(
        f,
        (jaxbind.jax_function(jvp), jaxbind.jax_function(jvp)),
        same_as_first,
        same_as_first,
        name="tests.scaled_tanh",
    )
    got = jax.hessian(lambda x: jnp.sum(op(x, scale=1.5)[0] ** 2))(X)
    want = jax.hessian(lambda x: jnp.sum((1.5 * jnp.tanh(x)) ** 2))(X)
    assert _max_err(got, want) < 1e-10


def test_export_of_a_hessian():
    exp = jaxbind.export(jax.hessian(_loss(sin_y2)))(X, Y)
    rexp = jax.export.deserialize(exp.serialize())
    assert _max_err(rexp.call(X, Y), jax.hessian(_loss(sin_y2_ref))(X, Y)) < 1e-10


def test_jax_function_that_returns_no_list_is_a_clear_error():
    op = jaxbind.get_nonlinear_call(
        _exp,
        (jaxbind.jax_function(lambda x, dx: jnp.exp(x) * dx), None),
        same_as_first,
        None,
        name="tests.exp_bad",
    )
    with pytest.raises(TypeError, match=r"tests\.exp_bad.*must return a list or tuple"):
        jax.jvp(lambda x: op(x)[0], (X,), (X,))


def test_check_covers_second_derivatives():
    report = check(sin_y2, X, Y, verbose=False)
    names = {r.check for r in report}
    assert {"hessian symmetry", "hessian-vector product vs finite differences"} <= names
    assert not report.failures(), str(report)


def test_check_catches_a_wrong_second_derivative():
    wrong = jaxbind.get_nonlinear_call(  # the VJP's derivative in x is off by a factor 2
        _sin_y2,
        (
            jaxbind.jax_function(
                lambda x, y, dx, dy: [jnp.cos(x) * y**2 * dx + 2 * jnp.sin(x) * y * dy]
            ),
            jaxbind.jax_function(
                lambda x, y, ct: [
                    jax.lax.stop_gradient(jnp.cos(x)) * y**2 * ct + 0 * x,
                    2 * jnp.sin(x) * y * ct,
                ]
            ),
        ),
        same_as_first,
        lambda x, y, ct: ((x.shape, x.dtype), (y.shape, y.dtype)),
        name="tests.sin_y2_wrong",
    )
    with pytest.raises(
        AssertionError,
        match=r"- hessian-vector product vs finite differences "
        r"\[arguments 0, 1, float64\]",
    ):
        check(wrong, X, Y, verbose=False)
