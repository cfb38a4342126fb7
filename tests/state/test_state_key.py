"""State keyed on traced inputs (``@jaxbind.state(key=...)``) in both APIs, on fixed and
non-fixed inputs: set up once for loop-invariant values, again when they change, with
the right values under jit, grad, vmap and fori_loop; and every refused layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind


def square_sum_op(api: str, made: list, name: str):
    """A nonlinear op (v, x) -> v * sum(x**2), where sum(x**2) is its state (keyed on the
    non-fixed input x, set up by its setup, which records every x it gets). The JVP and
    VJP are JAX functions that call the op again."""

    @jaxbind.state(key=("x",))
    def s(*, x, power=2):
        made.append(np.array(x))
        return float(np.sum(x**power))

    if api == "1.3":

        def f(out, args, kwargs_dump):
            v, x = args
            out[0][...] = v * jaxbind.load_state(kwargs_dump)

        def abstract(v, x, **kw):
            return ((v.shape, v.dtype),)

        @jaxbind.jax_function
        def jvp(v, x, dv, dx, **kw):
            return [op(dv, x, **kw)[0] + v * 2 * jnp.sum(x * dx)]

        @jaxbind.jax_function
        def vjp(v, x, ct, **kw):
            return [op(ct, x, **kw)[0], 2 * x * jnp.sum(ct * v)]

        op = jaxbind.get_nonlinear_call(
            f, (jvp, vjp), abstract, None, state=s, name=name, replace=True
        )
        return lambda v, x: op(v, x)[0]

    @jaxbind.nonlinear_op(shape=lambda v, x, **kw: v, state=s, name=name, replace=True)
    def native(v, x, *, state):
        return v * state

    @native.def_jvp
    def _(primals, tangents, *, state):  # a callable: it receives the primals first
        (v, x), (dv, dx) = primals, tangents
        return dv * state + v * 2 * np.sum(x * dx)

    @native.def_vjp
    def _(primals, ct, *, state):
        v, x = primals
        return ct * state, 2 * x * np.sum(ct * v)

    return native


APIS = ["1.3", "native"]


@pytest.mark.parametrize("api", APIS)
def test_key_on_a_non_fixed_input_under_jit_grad_and_vmap(api):
    made = []
    op = square_sum_op(api, made, f"state_key.nonfixed_{api.replace('.', '')}")
    v, x = jnp.arange(1.0, 4.0), jnp.array([1.0, 2.0])
    np.testing.assert_allclose(jax.jit(op)(v, x), 5.0 * v)
    assert len(made) == 1

    def loss(v, x):
        return jnp.sum(op(v, x) ** 2)

    gv, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(v, x)
    np.testing.assert_allclose(gv, 2 * 25.0 * v)
    np.testing.assert_allclose(gx, 2 * 5.0 * np.sum(v**2) * 2 * x)
    assert all(np.array_equal(m, x) for m in made)  # only ever x itself, in every role

    tangent = jax.jvp(lambda x: op(v, x), (x,), (jnp.array([1.0, 0.0]),))[1]
    np.testing.assert_allclose(tangent, v * 2 * 1.0)

    vs = jnp.stack([v, 2 * v])
    np.testing.assert_allclose(jax.jit(jax.vmap(op, (0, None)))(vs, x), 5.0 * vs)
    xs = jnp.array([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0]])
    before = len(made)
    got = jax.jit(jax.vmap(op, (None, 0)))(v, xs)  # the loop: one element per setup
    np.testing.assert_allclose(got, np.array([5.0, 9.0, 1.0])[:, None] * v)
    # each element's own points; [1, 2] was set up already (states are shared by value)
    assert [m.tolist() for m in made[before:]] == xs[1:].tolist()
    jaxbind.testing.check(op if api == "native" else op_of(op), v, x)


def op_of(fn):
    """The jaxbind op behind a lambda made by square_sum_op (1.3 API)."""
    return fn.__closure__[0].cell_contents


@pytest.mark.parametrize("api", APIS)
def test_traced_loop_invariant_points_set_up_once_in_a_fori_loop(api):
    made = []
    op = square_sum_op(api, made, f"state_key.loop_{api.replace('.', '')}")

    @jax.jit
    def run(v, x):
        return jax.lax.fori_loop(0, 20, lambda i, v: op(v, x) / 5.0 + 1.0, v)

    v, x = jnp.ones(3), jnp.array([1.0, 2.0])
    np.testing.assert_allclose(run(v, x), 21.0 * v)
    assert len(made) == 1
    np.testing.assert_allclose(run(v, x), 21.0 * v)
    assert len(made) == 1  # the same values: set up already
    expected = np.ones(3)
    for _ in range(20):
        expected = expected * 2.0 / 5.0 + 1.0  # sum([1, 1] ** 2) = 2
    np.testing.assert_allclose(run(v, jnp.array([1.0, 1.0])), expected)
    assert len(made) == 2 and made[-1].tolist() == [1.0, 1.0]


def test_multilinear_transposes_find_the_key_at_their_own_position():
    made = []

    @jaxbind.state(key=("b",))
    def s(*, b):
        made.append(np.array(b))
        return float(np.sum(b))

    def f(out, args, kwargs_dump):
        a, b = args
        out[0][...] = a * b * jaxbind.load_state(kwargs_dump)

    def t0(out, args, kwargs_dump):  # the other arguments (b), then the cotangent
        b, ct = args
        out[0][...] = ct * b * jaxbind.load_state(kwargs_dump)

    op = jaxbind.get_linear_call(
        f,
        (t0, None),
        lambda a, b, **kw: ((a.shape, a.dtype),),
        state=s,
        name="state_key.multilinear",
        replace=True,
    )
    a, b = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
    g = jax.jit(jax.grad(lambda a: jnp.sum(op(a, b)[0])))(a)
    np.testing.assert_allclose(g, b * 7.0)
    assert all(np.array_equal(m, b) for m in made) and made

    with pytest.raises(TypeError) as err:
        jaxbind.get_linear_call(
            f,
            (t0, t0),
            lambda a, b, **kw: ((a.shape, a.dtype),),
            state=s,
            name="state_key.multilinear_bad",
        )
    message = str(err.value)
    assert "'state_key.multilinear_bad' (the transpose with respect to argument 1)" in message
    assert "key input 'b' (argument 1) is not among the arguments" in message
    assert "first_n_args_fixed=" in message and "jaxbind.jax_function" in message


def test_a_linear_transpose_does_not_receive_a_non_fixed_key():
    keyed = jaxbind.state(key=("x",))(lambda *, x: 1.0)

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=keyed, name="state_key.linear")
    def op(x, *, state):
        return x * state

    with pytest.raises(TypeError) as err:

        @op.def_transpose
        def _(ct, *, state):
            return ct * state

    message = str(err.value)
    assert "'state_key.linear' (the transpose): its state's key input 'x'" in message
    assert "the fixed arguments, then cotangents" in message
    assert "a fixed argument (fixed=)" in message
    np.testing.assert_allclose(op(jnp.ones(2)), jnp.ones(2))  # without a transpose: fine


def test_key_names_must_be_parameters_of_the_function_that_names_the_inputs():
    keyed = jaxbind.state(key=("points",))(lambda *, points: 1.0)
    with pytest.raises(ValueError) as err:
        jaxbind.get_nonlinear_call(
            lambda out, args, kw: None,
            (None, None),
            lambda values, xs, *rest, **kw: ((values.shape, values.dtype),),
            state=keyed,
            name="state_key.badname",
        )
    message = str(err.value)
    assert "'state_key.badname'" in message and "'points' is not one of" in message
    assert "its abstract function names them ('values', 'xs')" in message
    with pytest.raises(ValueError, match=r"as the op's function names them \('v', 'x'\)"):

        @jaxbind.nonlinear_op(shape=lambda v, x: v, state=keyed, name="state_key.badname2")
        def op(v, x, *, state):
            return v


def test_natively_batching_ops_keep_keys_out_of_vmap():
    keyed = jaxbind.state(key=("x",))(lambda *, x: float(np.sum(x)))
    with pytest.raises(ValueError, match="'x' is not a fixed argument, and the op is vectorized"):
        jaxbind.get_nonlinear_call(
            lambda out, args, kw: None,
            (None, None),
            lambda v, x, **kw: ((v.shape, v.dtype),),
            state=keyed,
            func_can_batch=True,
            name="state_key.vectorized",
        )

    @jaxbind.linear_op(
        shape=lambda x, v, **kw: v, fixed=1, vectorized=True, state=keyed, name="state_key.vec"
    )
    def op(x, v, *, state, batch_axes=()):
        return v * state

    x, v = jnp.array([1.0, 2.0]), jnp.ones((2, 3))
    with pytest.raises(ValueError) as err:
        jax.vmap(op)(jnp.stack([x, x]), v)
    message = str(err.value)
    assert "key input 'x' is batched under vmap" in message
    assert "in_axes=None" in message and "vectorized=True" in message


def test_arguments_up_to_a_key_must_be_single_arrays():
    keyed = jaxbind.state(key=("x",))(lambda *, x: float(np.sum(x)))

    @jaxbind.nonlinear_op(
        shape=lambda t, x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        state=keyed,
        name="state_key.pytree",
    )
    def op(t, x, *, state):
        return x * state

    with pytest.raises(TypeError, match="argument 0 must be one array, not a pytree"):
        op((jnp.ones(2), jnp.ones(2)), jnp.ones(2))
