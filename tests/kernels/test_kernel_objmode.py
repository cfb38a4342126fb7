"""numba's ``with numba.objmode():`` in a jaxbind.kernel: refused when the kernel is
compiled, naming the op and the fix. A kernel runs without the GIL on XLA's threads; an
objmode block takes the GIL there, and an exception in it left Python's error state set,
so the call surfaced as a SystemError from nanobind rather than an error about the op."""

import jax
import numpy as np
import pytest
from support.ops import same_as_last

import jaxbind

numba = pytest.importorskip("numba")


def _raises():
    raise ValueError("the user's own error")


def _objmode_raising(out, x):
    with numba.objmode():
        _raises()
    out[:] = x


def _objmode_quiet(out, x):
    with numba.objmode(y="float64"):
        y = 2.0
    out[:] = y * x


@numba.njit
def _helper_with_objmode(x):
    with numba.objmode():
        _raises()
    return x


def _objmode_in_a_callee(out, x):
    out[:] = _helper_with_objmode(x)


def _objmode_in_a_range(begin, end, out, x):
    with numba.objmode():
        _raises()
    for i in range(begin, end):
        out[i] = x[i]


_BODIES = {
    "raising in the block": (_objmode_raising, {}),
    "not raising": (_objmode_quiet, {}),
    "in a function it calls": (_objmode_in_a_callee, {}),
    "in a kernel over ranges": (_objmode_in_a_range, {"ranges": lambda out, x: x.shape[0]}),
}


@pytest.mark.parametrize("what", list(_BODIES))
def test_a_kernel_using_objmode_is_refused_naming_the_op_and_the_fix(what):
    fn, options = _BODIES[what]
    name = f"tests.objmode_{what.replace(' ', '_')}"
    op = jaxbind.get_linear_call(jaxbind.kernel(fn, **options), None, same_as_last, name=name)
    x = np.arange(4.0, dtype=np.float32)
    for route in (lambda x: op(x)[0], jax.jit(lambda x: op(x)[0])):
        with pytest.raises(Exception, match=rf"jaxbind: '{name}' \(the function\)") as info:
            jax.block_until_ready(route(x))
        assert not isinstance(info.value, SystemError)
        text = str(info.value)
        assert f"kernel {fn.__name__} uses numba.objmode" in text
        assert "without the GIL" in text and "without jaxbind.kernel" in text


def test_a_kernel_using_objmode_is_refused_under_the_native_api():
    @jaxbind.linear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.objmode_native"
    )
    @jaxbind.kernel
    def scaled(out, x):
        with numba.objmode(y="float64"):
            y = 2.0
        out[:] = y * x

    with pytest.raises(Exception, match=r"'tests.objmode_native'.*uses numba.objmode"):
        jax.block_until_ready(scaled(np.arange(4.0, dtype=np.float32)))
