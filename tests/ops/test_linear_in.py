"""linear_in: a nonlinear op transposes in the arguments it is linear in (a NUFFT in its values)."""

import jax
import numpy as np
import pytest

import jaxbind


# f(a, x) = a * sin(x): nonlinear, but linear in a when x is known (linear_in=(0,)).
def _scaled_sin(out, args, kwargs_dump):
    a, x = args
    out[0][...] = a * np.sin(x)


def _scaled_sin_jvp(out, args, kwargs_dump):
    a, x, da, dx = args
    out[0][...] = da * np.sin(x) + a * np.cos(x) * dx


def _scaled_sin_vjp(out, args, kwargs_dump):
    a, x, ct = args
    out[0][...] = ct * np.sin(x)
    out[1][...] = ct * a * np.cos(x)


def _same_as_first(a, x, **kwargs):
    return ((a.shape, a.dtype),)


def _vjp_shapes(a, x, ct, **kwargs):
    return ((a.shape, a.dtype), (x.shape, x.dtype))


def _scaled_sin_op(linear_in):
    return jaxbind.get_nonlinear_call(
        _scaled_sin,
        (_scaled_sin_jvp, _scaled_sin_vjp),
        _same_as_first,
        _vjp_shapes,
        linear_in=linear_in,
        name=f"tests.scaled_sin{len(linear_in)}",
        replace=True,
    )


def test_linear_transpose_in_the_arguments_declared_linear():
    op = _scaled_sin_op((0,))
    a, x, ct = np.array([1.0, 2.0, 3.0]), np.array([0.3, 0.5, 0.7]), np.array([2.0, -1.0, 4.0])
    (got,) = jax.linear_transpose(lambda a: op(a, x)[0], a)(ct)
    np.testing.assert_allclose(got, ct * np.sin(x), rtol=1e-6)
    # batched, and inside a jitted program
    cts = np.stack([ct, 2 * ct])
    got = jax.jit(jax.vmap(jax.linear_transpose(lambda a: op(a, x)[0], a)))(cts)[0]
    np.testing.assert_allclose(got, cts * np.sin(x), rtol=1e-6)


def test_transpose_in_a_nonlinear_argument_is_a_clear_error():
    op = _scaled_sin_op((0,))
    a, x = np.ones(3), np.ones(3)
    with pytest.raises(
        TypeError,
        match=r"scaled_sin1' is a nonlinear op; it cannot be "
        r"transposed with respect to arguments \[1\]",
    ):
        jax.linear_transpose(lambda x: op(a, x)[0], x)(np.ones(3))
    plain = _scaled_sin_op(())
    with pytest.raises(TypeError, match="no arguments are declared linear"):
        jax.linear_transpose(lambda a: plain(a, x)[0], a)(np.ones(3))


def test_linear_in_is_validated():
    with pytest.raises(TypeError, match="linear_in must be a sequence"):
        jaxbind.get_nonlinear_call(
            _scaled_sin, (None, None), _same_as_first, None, linear_in=("a",)
        )
    with pytest.raises(ValueError, match="names fixed arguments"):
        jaxbind.get_nonlinear_call(
            _scaled_sin, (None, None), _same_as_first, None, linear_in=(0,), first_n_args_fixed=1
        )
