"""Each bad input gives its own clear error naming the binding; nothing crashes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind
from jaxbind.testing import check


def _copy(out, args, kd):
    out[0][...] = args[0]


def _op(abstract, name, f=_copy):
    return jaxbind.get_linear_call(f, None, abstract, None, name=f"reliability.{name}")


@pytest.mark.parametrize("result, error, match", [
    ([((3,), np.float32)][0], TypeError, r"output 0 is \(3,\)"),                 # not nested
    ({"shape": (3,)}, TypeError, "returned dict"),                                # wrong container
    ((((3,), np.float32, 0, 1),), TypeError, "expected \\(shape, dtype\\)"),      # too long
    ((((3,), "float17"),), TypeError, "'float17', which is not a NumPy dtype"),   # unknown dtype
    ((((3,), np.dtype("U5")),), TypeError, "has dtype str160, which jaxbind cannot"),  # unsupported
    ((((-3,), np.float32),), ValueError, "negative dimensions"),                  # negative dim
])
def test_bad_abstract_results(result, error, match):
    op = _op(lambda x: result, f"bad_{abs(hash(str(result)))}")
    with pytest.raises(error, match=match) as info:
        jax.jit(lambda x: op(x))(jnp.ones(3))
    assert "reliability.bad_" in str(info.value)


def test_callable_raising_keeps_the_process_alive():
    def boom(out, args, kd):
        raise ZeroDivisionError("division by zero in the kernel")

    op = _op(lambda x: ((x.shape, x.dtype),), "raises", boom)
    for _ in range(20):
        with pytest.raises(Exception, match="'reliability.raises' \\(the function\\) raised "
                                            "ZeroDivisionError: division by zero in the kernel"):
            jax.block_until_ready(jax.jit(lambda x: op(x)[0])(jnp.ones(3)))


def test_writing_into_a_copy_is_caught_by_check():
    def into_copy(out, args, kd):
        result = np.asarray(args[0]) * 2  # computed, never written into out[0]
        del result

    op = _op(lambda x: ((x.shape, x.dtype),), "into_copy", into_copy)
    with pytest.raises(AssertionError, match="100% of the elements left unwritten"):
        check(op, np.ones(4, np.float32), verbose=False)


def test_unpicklable_kwargs():
    op = _op(lambda x, **k: ((x.shape, x.dtype),), "kwargs")
    with pytest.raises(TypeError, match="'reliability.kwargs': keyword arguments must be plain "
                                        "data or picklable"):
        op(jnp.ones(3), callback=lambda: 0)


def test_wrong_number_of_arguments():
    def one_arg_abstract(x, **kwargs):
        return ((x.shape, x.dtype),)

    op = _op(one_arg_abstract, "arity")
    with pytest.raises(TypeError) as info:
        op(jnp.ones(3), jnp.ones(3))
    assert "abstract function of 'reliability.arity'" in info.value.__notes__[0]
    with pytest.raises(TypeError, match="'reliability.arity' got 0 positional arguments"):
        op()
