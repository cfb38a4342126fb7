"""first_n_args_fixed as JAXbind 1.3's users spelled it: a NumPy integer, a bool, an integral
float, None (tests/differential compares with 1.3.1 itself). A value that is not a count is
refused, saying that 1.3 took it only until a derivative."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind


def _scale(out, args, kwargs_dump):
    out[0][...] = args[0] * args[1]


def _same_as_last(*args, **kwargs):
    return ((args[-1].shape, args[-1].dtype),)


@pytest.mark.parametrize(
    "spelled", [1, np.int64(1), np.int32(1), True, np.True_, 1.0, np.float64(1)]
)
def test_a_count_of_one_in_any_spelling_fixes_the_first_argument(spelled):
    op = jaxbind.get_linear_call(
        _scale, _scale, _same_as_last, _same_as_last, first_n_args_fixed=spelled
    )
    a, x = jnp.float32(3.0), jnp.arange(3.0)
    assert op.binding.options.fixed == 1
    assert jnp.array_equal(jax.linear_transpose(lambda x: op(a, x)[0], x)(x)[0], 3 * x)
    with pytest.raises(TypeError, match="argument 0 is fixed"):
        jax.grad(lambda a: op(a, x)[0].sum())(a)


def test_none_fixes_nothing():
    op = jaxbind.get_linear_call(
        _scale, _scale, _same_as_last, _same_as_last, first_n_args_fixed=None
    )
    assert op.binding.options.fixed == 0


@pytest.mark.parametrize("bad", [1.5, -1, "1", [1]])
def test_what_is_not_a_count_is_refused_saying_what_1_3_did(bad):
    with pytest.raises(
        TypeError, match=r"first_n_args_fixed must be a non-negative int.*JAXbind 1\.3"
    ):
        jaxbind.get_linear_call(_scale, _scale, _same_as_last, first_n_args_fixed=bad)
