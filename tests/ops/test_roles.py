"""The role table: derivative shapes from the primals in both APIs, and the table itself."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random
from support.ops import same_as_last

import jaxbind
from jaxbind._roles import Args, Body, Kind, role_table


def _scale(out, args, kwargs_dump):
    out[0][...] = 3.0 * args[-1]


def test_linear_transpose_shapes_from_primals():
    """get_linear_call without abstract_T: the transpose's outputs are shaped as the
    inputs (a non-square op, so a wrong guess would show)."""
    a = random((4, 3), np.float32, 1)

    def f(out, args, kwargs_dump):
        out[0][...] = args[0] @ args[1]

    def f_T(out, args, kwargs_dump):
        out[0][...] = args[0].T @ args[1]

    op = jaxbind.get_linear_call(
        f, f_T, lambda a, x: (((a.shape[0],), x.dtype),), first_n_args_fixed=1
    )
    x = random((3,), np.float32, 2)
    ct = random((4,), np.float32, 3)
    (got,) = jax.linear_transpose(lambda x: op(a, x)[0], x)(ct)
    np.testing.assert_allclose(got, a.T @ ct, rtol=1e-5)
    # batched, looped and under jit
    xs = random((5, 3), np.float32, 4)
    g = jax.jit(jax.vmap(jax.grad(lambda x: op(a, x)[0].sum())))(xs)
    np.testing.assert_allclose(g, np.broadcast_to(a.sum(0), (5, 3)), rtol=1e-5)


def test_nonlinear_vjp_shapes_from_primals():
    def f(out, args, kwargs_dump):
        out[0][...] = np.sin(args[0]).sum(-1)

    def vjp(out, args, kwargs_dump):
        x, ct = args
        out[0][...] = np.cos(x) * ct[..., None]

    op = jaxbind.get_nonlinear_call(
        f, (None, vjp), lambda x: ((x.shape[:-1], x.dtype),), name="test_roles.sinsum"
    )
    x = random((2, 3), np.float32, 5)
    g = jax.grad(lambda x: op(x)[0].sum())(x)
    np.testing.assert_allclose(g, np.cos(x), rtol=1e-5)
    g = jax.vmap(jax.grad(lambda x: op(x)[0].sum()))(jnp.stack([x, 2 * x]))
    np.testing.assert_allclose(g[1], np.cos(2 * x), rtol=1e-5)


def test_multilinear_transposes_shapes_from_primals():
    def f(out, args, kwargs_dump):
        out[0][...] = np.outer(args[0], args[1])

    def t0(out, args, kwargs_dump):
        y, ct = args
        out[0][...] = ct @ y

    def t1(out, args, kwargs_dump):
        x, ct = args
        out[0][...] = x @ ct

    op = jaxbind.get_linear_call(
        f, (t0, t1), lambda x, y: (((x.shape[0], y.shape[0]), x.dtype),), None
    )
    x, y = random((3,), np.float32, 6), random((4,), np.float32, 7)
    gx, gy = jax.grad(lambda x, y: op(x, y)[0].sum(), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(gx, np.full(3, y.sum()), rtol=1e-5)
    np.testing.assert_allclose(gy, np.full(4, x.sum()), rtol=1e-5)


def test_abstract_T_must_be_callable_or_none():
    with pytest.raises(TypeError, match="must be callables or None"):
        jaxbind.get_linear_call(_scale, _scale, same_as_last, 3)


def test_role_table_entries():
    """Each role: its body, abstract function, argument layout and transpose partner."""
    f, t = object(), object()
    table = role_table(Kind.LINEAR, f, t, None, same_as_last, None)
    assert table["f"].body is f and table["f"].partner == "T" and table["f"].args is Args.F
    assert table["T"].body is t and table["T"].partner == "f" and table["T"].abstract is None
    jvp = jaxbind.jax_function(lambda *a: a)
    table = role_table(Kind.NONLINEAR, f, None, (jvp, t), same_as_last, None)
    assert table["jvp"].kind is Body.JAX and table["vjp"].kind is Body.CALLABLE
    assert table["jvp"].abstract is same_as_last and table["jvp"].args.shaped_like_f
    assert table["f"].partner is None and not table["f"].jointly_linear
    assert (table["jvp"].partner, table["vjp"].partner) == ("vjp", "jvp")
    table = role_table(Kind.MULTILINEAR, f, (t, None), None, same_as_last, None)
    assert list(table) == ["f", "T0", "T1"] and table["T1"].body is None


def test_binding_reports_missing_role():
    op = jaxbind.get_linear_call(_scale, None, same_as_last, name="test_roles.no_transpose")
    with pytest.raises(
        NotImplementedError, match="no_transpose' has no transpose, .* get_linear_call as f_T"
    ):
        jax.linear_transpose(lambda x: op(x)[0], jnp.ones(3))(jnp.ones(3))
    with pytest.raises(LookupError, match="has no role 'vjp'"):
        op.binding.role("vjp")
