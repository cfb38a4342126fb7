"""jaxbind on CUDA: zero-copy device buffers, XLA's stream, host mode, dtypes, errors.

Needs JAX with CUDA; CuPy and PyTorch tests also need those packages. Skipped
without a GPU (see conftest.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]


pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py


def _same(x, **kwargs):
    return ((x.shape, x.dtype),)


def _gpu(x):
    return jax.device_put(x, jax.devices("cuda")[0])


# --- CuPy ------------------------------------------------------------------------



def _cupy():
    return pytest.importorskip("cupy")


def _cupy_scale(out, args, kwargs_dump):
    cp = _cupy()
    x, y = cp.asarray(args[0]), cp.asarray(out[0])
    cp.multiply(x, 3, out=y)  # on XLA's stream: jaxbind made it CuPy's current stream


cupy_scale = jaxbind.get_linear_call(_cupy_scale, _cupy_scale, _same, _same,
                                     name="gpu.cupy_scale")


def test_cupy_callable_writes_device_output_in_place():
    cp = _cupy()
    x = _gpu(jnp.arange(1000, dtype=jnp.float32))
    seen = {}

    def f(out, args, kwargs_dump):
        ctx = jaxbind.current_call()
        seen.update(platform=ctx.platform, stream=ctx.stream, mode=ctx.mode,
                    kind=type(args[0]).__name__, ptr=args[0].ptr)
        y = cp.asarray(out[0])
        assert y.data.ptr == out[0].ptr  # no copy
        cp.multiply(cp.asarray(args[0]), 3, out=y)
    op = jaxbind.get_nonlinear_call(f, (None, None), _same, None, name="gpu.cupy_ctx")
    y = jax.jit(lambda x: op(x)[0])(x)
    np.testing.assert_allclose(np.asarray(y), 3 * np.arange(1000))
    assert seen["platform"] == "cuda" and seen["mode"] == "device"
    assert seen["kind"] == "CudaArray" and seen["stream"] is not None
    assert list(y.devices())[0].platform == "gpu"


def test_stream_ordering_async_kernel_read_by_next_jax_op():
    cp = _cupy()
    slow = cp.RawKernel(r"""
    extern "C" __global__ void slow_copy(const float* x, float* y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) { float v = x[i]; for (int k = 0; k < 20000; ++k) v = v * 1.0000001f;
                   y[i] = x[i] + 1.0f; }
    }""", "slow_copy")

    def f(out, args, kwargs_dump):
        stream = cp.cuda.ExternalStream(jaxbind.current_call().stream)
        n = args[0].size
        slow(((n + 255) // 256,), (256,), (cp.asarray(args[0]), cp.asarray(out[0]),
                                           np.int32(n)), stream=stream)  # returns at once
    op = jaxbind.get_nonlinear_call(f, (None, None), _same, None, name="gpu.async")
    x = _gpu(jnp.arange(1 << 20, dtype=jnp.float32))
    y = jax.jit(lambda x: jnp.sum(op(x)[0] * 2))(x)  # the next op reads the kernel's result
    expected = 2 * float(np.sum(np.arange(1 << 20, dtype=np.float64) + 1))
    np.testing.assert_allclose(float(y), expected, rtol=1e-5)


def test_jit_grad_vmap_on_gpu():
    _cupy()
    x = _gpu(jnp.linspace(0, 1, 64, dtype=jnp.float32))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: cupy_scale(x)[0])(x)), 3 * x,
                               rtol=1e-6)
    g = jax.grad(lambda x: jnp.sum(cupy_scale(x)[0] ** 2))(x)
    np.testing.assert_allclose(np.asarray(g), 18 * np.asarray(x), rtol=1e-5)
    xs = _gpu(jnp.ones((8, 64), jnp.float32))
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda v: cupy_scale(v)[0])(xs)), 3.0)


# --- PyTorch ---------------------------------------------------------------------

def test_torch_callable_via_dlpack():
    torch = pytest.importorskip("torch")

    def f(out, args, kwargs_dump):
        x, y = torch.from_dlpack(args[0]), torch.from_dlpack(out[0])
        assert y.data_ptr() == out[0].ptr
        torch.sin(x, out=y)  # on XLA's stream: jaxbind made it torch's current stream
    op = jaxbind.get_nonlinear_call(f, (None, None), _same, None, name="gpu.torch_sin")
    x = _gpu(jnp.linspace(0, 3, 4096, dtype=jnp.float32))
    y = jax.jit(lambda x: op(x)[0] + 1)(x)
    np.testing.assert_allclose(np.asarray(y), np.sin(np.asarray(x)) + 1, rtol=1e-5, atol=1e-6)


# --- host mode -------------------------------------------------------------------

def _np_cumsum(out, args, kwargs_dump):
    assert isinstance(args[0], np.ndarray) and jaxbind.current_call().mode == "host"
    np.cumsum(args[0], axis=-1, out=out[0])


host_cumsum = jaxbind.get_nonlinear_call(_np_cumsum, (None, None), _same, None,
                                         platform_mode="host", name="gpu.host_cumsum")


def test_host_mode_runs_a_cpu_callable_inside_a_gpu_program():
    x = _gpu(jnp.arange(24.0).reshape(4, 6))
    y = jax.jit(lambda x: host_cumsum(x * 2)[0] + 1)(x)
    np.testing.assert_allclose(np.asarray(y), np.cumsum(2 * np.arange(24.0).reshape(4, 6),
                                                        axis=-1) + 1)
    yb = jax.jit(jax.vmap(lambda v: host_cumsum(v)[0]))(x)  # jaxbind's loop, on the host
    np.testing.assert_allclose(np.asarray(yb), np.cumsum(np.arange(24.0).reshape(4, 6), -1))


def test_host_mode_ducc_fft_on_gpu_data():
    pytest.importorskip("ducc0")
    from jaxbind.contrib import jaxducc0
    assert jaxducc0.c2c.binding.platform_mode in ("device", "host")
    host_c2c = jaxbind.get_linear_call(jaxducc0.c2c.binding.f, jaxducc0.c2c.binding.transposes,
                                       jaxducc0.c2c.binding.abstract,
                                       jaxducc0.c2c.binding.abstract_T, func_can_batch=True,
                                       platform_mode="host", name="gpu.host_c2c")
    z = _gpu((jnp.arange(64.0) + 1j).astype(jnp.complex128))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda z: host_c2c(z)[0])(z)),
                               np.fft.fft(np.arange(64.0) + 1j), rtol=1e-10, atol=1e-9)


# --- dtypes and errors -------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips_in_device_and_host_mode(dtype):
    dt = jnp.dtype(dtype)
    x = _gpu(jnp.asarray(np.arange(12) % 2 if dt == np.bool_ else np.arange(12), dt))

    def dev(out, args, kwargs_dump):
        cai_in, cai_out = args[0].__cuda_array_interface__, out[0].__cuda_array_interface__
        assert cai_in["data"][1] is True and cai_out["data"][1] is False
        assert cai_in["typestr"] == dt.str and cai_in["shape"] == (12,)
        _copy_device(out[0], args[0])

    def host(out, args, kwargs_dump):
        out[0][...] = args[0]
    for mode, fn in (("device", dev), ("host", host)):
        op = jaxbind.get_nonlinear_call(fn, (None, None), _same, None, platform_mode=mode,
                                        name=f"gpu.copy_{dtype}_{mode}")
        y = jax.jit(lambda x: op(x)[0])(x)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def _copy_device(dst, src):
    import ctypes
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t,
                                  ctypes.c_void_p]
    assert lib.cuMemcpyAsync(dst.ptr, src.ptr, src.nbytes, dst.stream) == 0


def test_exception_on_gpu_is_a_clear_error_and_the_process_survives():
    def bad(out, args, kwargs_dump):
        raise KeyError("missing-table")
    op = jaxbind.get_nonlinear_call(bad, (None, None), _same, None, name="gpu.bad")
    x = _gpu(jnp.ones(3))
    with pytest.raises(Exception, match=r"gpu.bad.*KeyError.*missing-table"):
        jax.block_until_ready(jax.jit(lambda x: op(x)[0])(x))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: x + 1)(x)), 2.0)  # still works
