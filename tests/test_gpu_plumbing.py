"""The GPU path, as far as a machine without a GPU can check it: lowering for
CUDA, the CudaArray interfaces, and the dispatcher's batching over device
pointers (exercised on host memory). The GPU itself is tested in tests/gpu/."""

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import ops

import jaxbind
from jaxbind import _gpu

double = jaxbind.get_linear_call(
    ops.double, ops.double, ops.same_as_first, ops.same_as_first, name="gpu_plumbing.double"
)


def _cuda_text(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_lowering_for_cuda_targets_the_cuda_handler():
    x = jnp.ones((4, 3), jnp.float32)
    text = _cuda_text(lambda x: double(x, scale=2)[0], x)
    assert "jaxbind_cuda" in text and "jaxbind_cpu" not in text
    assert 'binding = "gpu_plumbing.double"' in text
    grad = _cuda_text(jax.grad(lambda x: jnp.sum(double(x)[0])), x)
    assert 'role = "T"' in grad
    vm = _cuda_text(jax.vmap(lambda v: double(v)[0]), x)
    assert 'num_batch_dims = "1"' in vm


def test_platform_mode_is_checked_and_part_of_the_binding():
    with pytest.raises(ValueError, match="platform_mode must be one of"):
        jaxbind.get_linear_call(
            ops.double, ops.double, ops.same_as_first, None, platform_mode="gpu"
        )
    host = jaxbind.get_linear_call(
        ops.double,
        ops.double,
        ops.same_as_first,
        ops.same_as_first,
        platform_mode="host",
        name="gpu_plumbing.host_double",
    )
    assert host.binding.options.platform_mode == "host"
    # On the CPU, host mode behaves as the default
    np.testing.assert_array_equal(jax.jit(lambda x: host(x)[0])(jnp.arange(3.0)), [0, 2, 4])
    with pytest.raises(ValueError, match="already used"):
        jaxbind.get_linear_call(
            ops.double,
            ops.double,
            ops.same_as_first,
            ops.same_as_first,
            platform_mode="device",
            name="gpu_plumbing.host_double",
        )


def test_current_call_on_cpu():
    seen = []

    def f(out, args, kwargs_dump):
        seen.append(jaxbind.current_call())
        out[0][...] = args[0]

    op = jaxbind.get_nonlinear_call(
        f, (None, None), ops.same_as_first, None, name="gpu_plumbing.where"
    )
    x = jax.device_put(jnp.ones(2), jax.devices("cpu")[0])  # also where a GPU is the default
    jax.block_until_ready(jax.jit(lambda x: op(x)[0])(x))
    assert seen == [jaxbind.CallContext("cpu")]
    assert jaxbind.current_call().platform == "cpu"  # outside any call


def test_cuda_array_interface_and_dlpack_metadata():
    a = jaxbind.CudaArray(0x7000, (2, 3), np.float32, True, 1234, 1)
    cai = a.__cuda_array_interface__
    assert cai["shape"] == (2, 3) and cai["typestr"] == "<f4" and cai["version"] == 3
    assert cai["data"] == (0x7000, True) and cai["stream"] == 1234 and cai["strides"] is None
    assert a.__dlpack_device__() == (2, 1)
    assert (a.ndim, a.size, a.nbytes) == (2, 6, 24)
    assert (
        jaxbind.CudaArray(0, (1,), np.float32, False, 0, 0).__cuda_array_interface__["stream"] == 1
    )  # the legacy default stream is 1, never 0
    assert _gpu._dlpack_dtype(np.dtype(np.complex64)) == (5, 64)


def test_cuda_array_used_as_numpy_says_to_use_host_mode():
    """A NumPy callable in device mode gets a clear error, not an object array."""
    a = jaxbind.CudaArray(0x7000, (3,), np.float64, False, 1, 0)
    for use in (
        np.asarray,
        lambda a: np.cumsum(a),
        lambda a: a[0],
        lambda a: a.__setitem__(Ellipsis, 1.0),
        list,
    ):
        with pytest.raises(TypeError, match="CUDA device buffer.*platform_mode='host'"):
            use(a)
    assert bool(a) and a.ndim == 1  # still an ordinary object otherwise
    assert _gpu._dlpack_dtype(np.dtype(jnp.bfloat16)) == (4, 16)
    assert _gpu._dlpack_dtype(np.dtype(np.bool_)) == (6, 8)
    with pytest.raises(TypeError, match="DLPack has no type for float8_e4m3fn"):
        _gpu._dlpack_dtype(np.dtype(jnp.float8_e4m3fn))
    with pytest.raises(BufferError, match="cannot copy"):
        a.__dlpack__(copy=True)


def test_dispatch_walks_batch_elements_by_pointer():
    # Host memory stands in for device memory: the dispatcher only does pointer
    # arithmetic and never dereferences a device pointer itself.
    x = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    fixed = np.array([10.0, 20.0], np.float32)
    y = np.zeros((3, 4), np.float32)
    calls = []

    def callable_(out, args, kwargs_dump):
        ctx = jaxbind.current_call()
        calls.append((ctx, [a.shape for a in args], out[0].shape))
        src = np.ctypeslib.as_array(
            ctypes.cast(args[1].ptr, ctypes.POINTER(ctypes.c_float)), args[1].shape
        )
        dst = np.ctypeslib.as_array(
            ctypes.cast(out[0].ptr, ctypes.POINTER(ctypes.c_float)), out[0].shape
        )
        dst[...] = src * 2 + float(args[0].ptr == fixed.ctypes.data)

    f32 = 11  # XLA element type of float32
    ins = ((fixed.ctypes.data, (2,), f32), (x.ctypes.data, (3, 4), f32))
    outs = ((y.ctypes.data, (3, 4), f32),)
    _gpu.dispatch(callable_, None, "device", 1, (False, True), 99, 0, ins, outs)
    np.testing.assert_array_equal(y, 2 * x + 1)  # 3 elements, the fixed input unbatched
    assert len(calls) == 3
    assert all(c[0] == jaxbind.CallContext("cuda", 99, 0, "device") for c in calls)
    assert calls[0][1] == [(2,), (4,)] and calls[0][2] == (4,)
    assert jaxbind.current_call().platform == "cpu"  # reset afterwards


def test_dispatch_rejects_unknown_element_types():
    with pytest.raises(TypeError, match="element type 99"):
        _gpu.dispatch(lambda *a: None, None, "device", 0, (), 0, 0, ((0, (1,), 99),), ())


class _HostMemoryDriver:
    """Host memory standing in for device memory: copies are memmoves, streams no-ops."""

    def to_host(self, dst, src, stream):
        ctypes.memmove(dst.ctypes.data, src, dst.nbytes)

    def to_device(self, dst, src, stream):
        ctypes.memmove(dst, src.ctypes.data, src.nbytes)

    def synchronize(self, stream):
        pass


def test_host_mode_runs_the_same_batch_loop_on_host_copies():
    """Host mode: copies in, the batch loop over read-only NumPy views of the copies (the
    fixed input unbatched), copies out; an aliased output starts as its input."""
    x = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    fixed = np.array([10.0, 20.0], np.float32)
    y = np.zeros((3, 4), np.float32)
    empty = np.zeros((3, 0), np.float32)
    seen = []

    def callable_(out, args, kwargs_dump):
        seen.append((args[0].flags.writeable, args[1].flags.writeable, out[0].flags.writeable))
        assert args[1].base is not None  # views of the host copy, not copies of their own
        out[0][...] = 2 * args[1] + args[0][0]
        assert out[1].shape == (0,)

    f32 = 11
    ins = ((fixed.ctypes.data, (2,), f32), (x.ctypes.data, (3, 4), f32))
    outs = ((y.ctypes.data, (3, 4), f32), (empty.ctypes.data, (3, 0), f32))
    _gpu._run_on_host(callable_, None, 1, (False, True), 0, ins, outs, _HostMemoryDriver())
    np.testing.assert_array_equal(y, 2 * x + 10)
    assert seen == [(False, False, True)] * 3

    z = np.full(4, 7.0, np.float32)  # input 0 and output 0 share memory (aliases)

    def add_one(out, args, kwargs_dump):
        out[0][...] += 1

    aliased = ((z.ctypes.data, (4,), f32),)
    _gpu._run_on_host(add_one, None, 0, (), 0, aliased, aliased, _HostMemoryDriver())
    np.testing.assert_array_equal(z, 8.0)
