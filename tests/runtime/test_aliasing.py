"""In-place outputs: input_output_aliases, with and without donation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import same_as_first

import jaxbind

POINTERS = []


def _scale_every_other(out, args, kwargs_dump):
    """Linear, in place: multiply every other element by 3 (out holds the input)."""
    (x,) = args
    POINTERS.append((x.ctypes.data, out[0].ctypes.data))
    out[0][::2] *= 3


def _scale_T(out, args, kwargs_dump):  # the same diagonal map, not in place
    (ct,) = args
    out[0][...] = ct
    out[0][::2] *= 3


inplace = jaxbind.get_linear_call(
    _scale_every_other,
    _scale_T,
    same_as_first,
    same_as_first,
    input_output_aliases={0: 0},
    name="tests.inplace",
)


def _ref(x):
    return x.at[..., ::2].multiply(3)


def test_donated_input_is_the_output_memory():
    x = jnp.arange(8.0)
    want = _ref(x)
    address = x.unsafe_buffer_pointer()
    y = jax.jit(lambda x: inplace(x)[0], donate_argnums=0)(x)
    x_in, out = POINTERS[-1]
    assert x_in == out == address  # no copy: the callable updated the donated buffer
    assert y.unsafe_buffer_pointer() == address
    np.testing.assert_array_equal(y, want)


def test_without_donation_xla_copies_and_the_input_survives():
    x = jnp.arange(8.0)
    y = jax.jit(lambda x: inplace(x)[0])(x)
    x_in, out = POINTERS[-1]
    assert x_in == out != x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(y, _ref(jnp.arange(8.0)))
    np.testing.assert_array_equal(x, np.arange(8.0))  # untouched
    np.testing.assert_array_equal(inplace(x)[0], _ref(x))  # eager, too


def test_grad_jvp_and_transpose_through_an_aliased_op():
    x = jnp.arange(1.0, 7.0)
    np.testing.assert_array_equal(
        jax.grad(lambda x: jnp.sum(inplace(x)[0] ** 2))(x),
        jax.grad(lambda x: jnp.sum(_ref(x) ** 2))(x),
    )
    np.testing.assert_array_equal(jax.jvp(lambda x: inplace(x)[0], (x,), (x,))[1], _ref(x))
    (t,) = jax.linear_transpose(lambda x: inplace(x)[0], x)(x)
    np.testing.assert_array_equal(t, _ref(x))


def test_vmap_through_an_aliased_op():
    xs = jnp.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(jax.vmap(lambda x: inplace(x)[0])(xs), _ref(xs))
    np.testing.assert_array_equal(
        jax.vmap(lambda x: inplace(x)[0], in_axes=1, out_axes=1)(xs.T), _ref(xs).T
    )
    np.testing.assert_array_equal(
        jax.jit(jax.vmap(lambda x: inplace(x)[0]), donate_argnums=0)(xs + 0), _ref(xs)
    )


def test_nonlinear_op_with_a_second_input():
    def f(out, args, kwargs_dump):  # out[0] (= x) += y**2, in place
        x, y = args
        POINTERS.append((x.ctypes.data, out[0].ctypes.data))
        out[0][...] += y**2

    def jvp(out, args, kwargs_dump):
        x, y, dx, dy = args
        out[0][...] = dx + 2 * y * dy

    def vjp(out, args, kwargs_dump):
        x, y, ct = args
        out[0][...] = ct
        out[1][...] = 2 * y * ct

    op = jaxbind.get_nonlinear_call(
        f,
        (jvp, vjp),
        same_as_first,
        lambda x, y, ct: ((x.shape, x.dtype), (y.shape, y.dtype)),
        input_output_aliases={0: 0},
        name="tests.add_square",
    )
    x, y = jnp.ones(5), jnp.arange(5.0)
    np.testing.assert_array_equal(jax.jit(lambda x, y: op(x, y)[0])(x, y), 1 + np.arange(5.0) ** 2)
    gx, gy = jax.grad(lambda x, y: jnp.sum(op(x, y)[0]), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gx, np.ones(5))
    np.testing.assert_array_equal(gy, 2 * np.arange(5.0))


def test_bad_aliases_are_clear_errors():
    with pytest.raises(TypeError, match="input_output_aliases must be a dict"):
        jaxbind.get_linear_call(
            _scale_every_other, None, same_as_first, None, input_output_aliases=[0]
        )
    with pytest.raises(ValueError, match="input 0 is fixed"):
        jaxbind.get_linear_call(
            _scale_every_other,
            None,
            same_as_first,
            None,
            first_n_args_fixed=1,
            input_output_aliases={0: 0},
        )
    half = jaxbind.get_linear_call(
        _scale_every_other,
        None,
        lambda x: (((x.shape[0] // 2,), x.dtype),),
        None,
        input_output_aliases={0: 0},
        name="tests.alias_half",
    )
    with pytest.raises(
        TypeError,
        match=r"'tests\.alias_half' input_output_aliases: input 0 "
        r"\(float32\[8\]\) and output 0 \(float32\[4\]\)",
    ):
        jax.jit(lambda x: half(x)[0])(jnp.ones(8))
    two = jaxbind.get_linear_call(
        _scale_every_other,
        None,
        same_as_first,
        None,
        input_output_aliases={1: 0},
        name="tests.alias_missing",
    )
    with pytest.raises(ValueError, match=r"'tests\.alias_missing'.*1 inputs and 1 outputs"):
        jax.jit(lambda x: two(x)[0])(jnp.ones(8))
