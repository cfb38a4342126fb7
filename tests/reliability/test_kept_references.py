"""A callable that keeps its arrays after returning: it is warned, and cannot corrupt results.

The arrays a callable receives are views of XLA's buffers, valid only during the
call. After the call jaxbind makes the output views read-only and warns when a
reference survives; reading a kept view later gives whatever XLA has put there
since (undefined), but writing through it raises instead of corrupting memory.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind

kept = []


def _keeps(out, args, kd):
    out[0][...] = args[0] + 1
    kept.append((out[0], args[0]))


op = jaxbind.get_linear_call(_keeps, None, lambda x: ((x.shape, x.dtype),), None,
                             name="reliability.keeps_references")


def test_kept_references_warn_and_cannot_write():
    fn = jax.jit(lambda x: op(x)[0])
    with pytest.warns(RuntimeWarning, match="kept a reference to its input or output arrays"):
        first = fn(jnp.zeros(4))
    out_view, in_view = kept[-1]
    with pytest.raises(ValueError, match="read-only"):
        out_view[0] = 99.0
    with pytest.raises(ValueError, match="read-only"):
        in_view[0] = 99.0
    with pytest.raises(ValueError):
        out_view.setflags(write=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        second = fn(jnp.ones(4))
    np.testing.assert_array_equal(first, np.ones(4))
    np.testing.assert_array_equal(second, 2 * np.ones(4))


def test_warning_as_error_fails_the_call_cleanly():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Exception, match="kept a reference"):
            jax.block_until_ready(jax.jit(lambda x: op(x)[0] * 3)(jnp.zeros(2)))


def _keeps_then_raises(out, args, kd):
    kept.append(out[0])
    raise KeyError("after keeping its output view")


raising = jaxbind.get_linear_call(_keeps_then_raises, None, lambda x: ((x.shape, x.dtype),),
                                  None, name="reliability.keeps_then_raises")


def test_views_kept_by_a_raising_callable_are_read_only_too():
    with pytest.raises(Exception, match="after keeping its output view"):
        jax.block_until_ready(jax.jit(lambda x: raising(x)[0])(jnp.zeros(3)))
    view = kept.pop()
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1.0
