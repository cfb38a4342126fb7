"""Every dtype JAX has on CPU crosses the trampoline unchanged, zero-copy, 0-d and empty too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.dtypes import JAX_DTYPES, global_x64, name
from support.ops import same_as_first

import jaxbind

SHAPES = [(), (0,), (3, 0, 2), (5,), (2, 3, 4)]

seen = {}


def _copy(out, args, kwargs_dump):
    (x,) = args
    seen["in"] = (x.dtype, x.shape, x.flags.writeable, x.flags.c_contiguous)
    seen["out"] = (out[0].dtype, out[0].flags.writeable)
    out[0][...] = x


copy = jaxbind.get_linear_call(_copy, _copy, same_as_first, same_as_first, name="tests.copy")


def _values(shape, dtype):
    rng = np.random.default_rng(0)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    x = rng.standard_normal(shape) * 4
    if dtype.kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", JAX_DTYPES, ids=name)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_round_trip(enable_x64, dtype, shape, jit):
    x = _values(shape, dtype)
    seen.clear()
    fn = jax.jit(lambda x: copy(x)[0]) if jit else (lambda x: copy(x)[0])
    y = fn(jnp.asarray(x))
    assert y.dtype == np.dtype(dtype) and y.shape == shape
    np.testing.assert_array_equal(np.asarray(y), x)
    if x.size == 0 and not seen:
        return  # XLA skips a custom call whose outputs are all empty
    assert seen["in"] == (np.dtype(dtype), shape, False, True)
    assert seen["out"] == (np.dtype(dtype), True)


def _count(out, args, kwargs_dump):
    seen["shapes"] = [a.shape for a in args]
    out[0][...] = sum(a.size for a in args)


count = jaxbind.get_nonlinear_call(
    _count, (None, None), lambda *a: (((), np.int32),), None, name="tests.count"
)


@pytest.mark.parametrize("dtype", JAX_DTYPES, ids=name)
def test_empty_inputs_reach_the_callable(enable_x64, dtype):
    xs = [jnp.asarray(_values(s, dtype)) for s in [(0,), (3, 0, 2), ()]]
    assert int(jax.jit(lambda *xs: count(*xs)[0])(*xs)) == 1
    assert seen["shapes"] == [(0,), (3, 0, 2), ()]


def test_inputs_are_read_only_views():
    def f(out, args, kwargs_dump):
        args[0][0] = 1.0

    op = jaxbind.get_linear_call(f, None, same_as_first, None, name="tests.writes_input")
    with pytest.raises(Exception, match="read-only"):
        jax.block_until_ready(op(jnp.zeros(3)))


def test_unsupported_input_dtype_is_a_clear_error():
    x = jnp.zeros(4, dtype=jnp.int4)
    with pytest.raises(TypeError, match="'tests.copy'.*argument 0 has dtype int4"):
        copy(x)


def test_x64_off_canonicalizes_declared_output_dtype():
    def f(out, args, kwargs_dump):
        seen["dtype"] = out[0].dtype
        out[0][...] = args[0]

    op = jaxbind.get_linear_call(
        f, None, lambda x: ((x.shape, np.float64),), None, name="tests.declares_float64"
    )
    with (
        jax.experimental.enable_x64(False)
        if hasattr(jax.experimental, "enable_x64")
        else global_x64(False)
    ):
        y = op(jnp.ones(3, jnp.float32))[0]
    assert y.dtype == np.float32 and seen["dtype"] == np.float32


def test_64_bit_program_run_on_a_thread_without_x64():
    """`jax.enable_x64` is thread-local; XLA may run a call on a thread where it is off.

    The run-time buffer check then sees the abstract function's float64 canonicalized
    to float32; the 64-bit buffers of a program traced with x64 are still right.
    """
    import threading

    # thread-local x64: jax.enable_x64 (newer JAX) or jax.experimental.enable_x64
    x64 = getattr(jax, "enable_x64", None)
    if x64 is None:
        from jax.experimental import enable_x64 as x64
    with x64(True):
        x = jnp.arange(6.0, dtype=jnp.float64)
        compiled = jax.jit(lambda a: copy(a)[0] * 2).lower(x).compile()
    result = {}

    def run():
        try:
            result["y"] = np.asarray(compiled(x))
        except Exception as exc:  # reported below
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert "error" not in result, result.get("error")
    np.testing.assert_array_equal(result["y"], np.arange(6.0) * 2)
    assert result["y"].dtype == np.float64
