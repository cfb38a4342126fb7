"""A body computes in jaxbind what it computes when called from Python: XLA runs its CPU
threads with subnormal numbers flushed to zero, and the trampoline restores IEEE floating
point while a body runs (cpp/floats.h), on the calling thread and on XLA's threads that
run a call's tasks. XLA's own operations keep XLA's mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import same_as_last

import jaxbind

TINY = np.array([1e-310, 3e-320, -2e-309, 1e-300])  # float64 subnormals, and a normal one


def _callable(out, args, kd):
    out[0][...] = args[0] * 0.5


@pytest.mark.parametrize("how", ["eager", "jit", "vmap", "grad"])
def test_callable_keeps_subnormals(enable_x64, how):
    op = jaxbind.get_linear_call(_callable, _callable, same_as_last, same_as_last)
    f = lambda x: op(x)[0]
    want = TINY * 0.5
    assert want[0] != 0  # NumPy, outside XLA
    if how == "eager":
        got = f(TINY)
    elif how == "jit":
        got = jax.jit(f)(TINY)
    elif how == "vmap":
        got = jax.jit(jax.vmap(f))(np.stack([TINY, TINY]))[1]
    else:  # the transpose, through grad
        got = jax.jit(jax.grad(lambda x: jnp.vdot(TINY, f(x))))(np.ones(4))
        want = TINY * 0.5
    np.testing.assert_array_equal(np.asarray(got), want)


def test_native_body_keeps_subnormals(enable_x64):
    @jaxbind.linear_op(shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype))
    def halve(x):
        return x * 0.5

    np.testing.assert_array_equal(np.asarray(jax.jit(halve)(TINY)), TINY * 0.5)


def test_xla_operations_keep_xla_mode(enable_x64):
    """Only bodies change mode: jnp around a jaxbind call flushes as before (the mode is
    restored after the call)."""
    op = jaxbind.get_linear_call(_callable, _callable, same_as_last, same_as_last)
    got = jax.jit(lambda x: x * 0.5 + 0 * op(x)[0])(TINY)
    assert np.asarray(got)[0] == 0.0  # XLA's own multiply, flushed


numba = pytest.importorskip("numba")


def _halve_kernel(out, x):
    for i in range(x.shape[0]):
        out[i] = x[i] * 0.5


def _halve_range(begin, end, out, x):
    for i in range(begin, end):
        out[i] = x[i] * 0.5


@pytest.mark.parametrize("form", ["kernel", "ranges"])
def test_kernel_keeps_subnormals(enable_x64, form):
    if form == "kernel":
        k = jaxbind.kernel(_halve_kernel)
    else:  # split across XLA's threads (grain 1): tasks on helper threads too
        k = jaxbind.kernel(_halve_range, ranges=lambda out, x: x.shape[0], grain=1)
    op = jaxbind.get_nonlinear_call(k, (None, None), same_as_last, name=f"tests.floats_{form}")
    x = np.tile(TINY, 256)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: op(x)[0])(x)), x * 0.5)
    xs = np.stack([x] * 8)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(lambda x: op(x)[0]))(xs)), xs * 0.5)
