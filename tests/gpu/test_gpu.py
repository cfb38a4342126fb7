"""jaxbind on CUDA: zero-copy device buffers, XLA's stream, host mode, dtypes, errors.

Needs JAX with CUDA; CuPy and PyTorch tests also need those packages. Skipped
without a GPU (see conftest.py).
"""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.dtypes import JAX_DTYPES, name
from support.ops import same_as_first

import jaxbind

# DLPack and the CUDA array interface have no float8 types
DTYPES = [name(d) for d in JAX_DTYPES if not name(d).startswith("float8")]


pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py


def _gpu(x):
    return jax.device_put(x, jax.devices("cuda")[0])


# --- CuPy ------------------------------------------------------------------------


def _cupy():
    return pytest.importorskip("cupy")


def _cupy_scale(out, args, kwargs_dump):
    cp = _cupy()
    x, y = cp.asarray(args[0]), cp.asarray(out[0])
    cp.multiply(x, 3, out=y)  # on XLA's stream: jaxbind made it CuPy's current stream


cupy_scale = jaxbind.get_linear_call(
    _cupy_scale, _cupy_scale, same_as_first, same_as_first, name="gpu.cupy_scale"
)


def test_cupy_callable_writes_device_output_in_place():
    cp = _cupy()
    x = _gpu(jnp.arange(1000, dtype=jnp.float32))
    seen = {}

    def f(out, args, kwargs_dump):
        ctx = jaxbind.current_call()
        seen.update(
            platform=ctx.platform,
            stream=ctx.stream,
            mode=ctx.mode,
            kind=type(args[0]).__name__,
            ptr=args[0].ptr,
        )
        y = cp.asarray(out[0])
        assert y.data.ptr == out[0].ptr  # no copy
        cp.multiply(cp.asarray(args[0]), 3, out=y)

    op = jaxbind.get_nonlinear_call(f, (None, None), same_as_first, None, name="gpu.cupy_ctx")
    y = jax.jit(lambda x: op(x)[0])(x)
    np.testing.assert_allclose(np.asarray(y), 3 * np.arange(1000))
    assert seen["platform"] == "cuda" and seen["mode"] == "device"
    assert seen["kind"] == "CudaArray" and seen["stream"] is not None
    assert list(y.devices())[0].platform == "gpu"


def test_stream_ordering_async_kernel_read_by_next_jax_op():
    cp = _cupy()
    slow = cp.RawKernel(
        r"""
    extern "C" __global__ void slow_copy(const float* x, float* y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) { float v = x[i]; for (int k = 0; k < 20000; ++k) v = v * 1.0000001f;
                   y[i] = x[i] + 1.0f; }
    }""",
        "slow_copy",
    )

    def f(out, args, kwargs_dump):
        stream = cp.cuda.get_current_stream()  # jaxbind made XLA's stream CuPy's current one
        assert stream.ptr == jaxbind.current_call().stream
        n = args[0].size
        slow(
            ((n + 255) // 256,),
            (256,),
            (cp.asarray(args[0]), cp.asarray(out[0]), np.int32(n)),
            stream=stream,
        )  # returns at once

    op = jaxbind.get_nonlinear_call(f, (None, None), same_as_first, None, name="gpu.async")
    x = _gpu(jnp.arange(1 << 20, dtype=jnp.float32))
    y = jax.jit(lambda x: jnp.sum(op(x)[0] * 2))(x)  # the next op reads the kernel's result
    expected = 2 * float(np.sum(np.arange(1 << 20, dtype=np.float64) + 1))
    np.testing.assert_allclose(float(y), expected, rtol=1e-5)


def test_jit_grad_vmap_on_gpu():
    _cupy()
    x = _gpu(jnp.linspace(0, 1, 64, dtype=jnp.float32))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: cupy_scale(x)[0])(x)), 3 * x, rtol=1e-6)
    g = jax.grad(lambda x: jnp.sum(cupy_scale(x)[0] ** 2))(x)
    np.testing.assert_allclose(np.asarray(g), 18 * np.asarray(x), rtol=1e-5)
    xs = _gpu(jnp.ones((8, 64), jnp.float32))
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda v: cupy_scale(v)[0])(xs)), 3.0)


def test_cupy_from_dlpack_and_batching_with_an_unbatched_argument():
    cp = _cupy()

    def axpy(out, args, kwargs_dump):
        a, x = cp.from_dlpack(args[0]), cp.from_dlpack(args[1])  # DLPack, no copy
        scale = jaxbind.load_kwargs(kwargs_dump)["scale"]
        cp.add(scale * a, x, out=cp.from_dlpack(out[0]))

    op = jaxbind.get_nonlinear_call(
        axpy, (None, None), lambda a, x, **kw: ((x.shape, x.dtype),), None, name="gpu.axpy"
    )
    a = _gpu(jnp.arange(6.0))
    xs = _gpu(jnp.arange(24.0).reshape(4, 6))
    ys = jax.jit(jax.vmap(lambda x: op(a, x, scale=2.0)[0], in_axes=0))(xs)  # a: unbatched
    np.testing.assert_allclose(np.asarray(ys), 2 * np.arange(6.0) + np.arange(24.0).reshape(4, 6))
    ys = jax.jit(jax.vmap(lambda a_, x: op(a_, x, scale=-1.0)[0], in_axes=(0, None)))(xs, a)
    np.testing.assert_allclose(np.asarray(ys), -np.arange(24.0).reshape(4, 6) + np.arange(6.0))


def test_numba_arrays_on_the_cuda_array_interface():
    cuda = pytest.importorskip("numba.cuda")
    if not cuda.is_available():
        pytest.skip("numba sees no CUDA device")

    # A device-to-device copy through numba's arrays (no kernel: numba's compiler is
    # not needed, and numba-cuda's may not import against the installed NumPy).
    def f(out, args, kwargs_dump):
        x, y = cuda.as_cuda_array(args[0]), cuda.as_cuda_array(out[0])
        assert x.device_ctypes_pointer.value == args[0].ptr  # zero-copy
        y.copy_to_device(x, stream=cuda.external_stream(jaxbind.current_call().stream))

    op = jaxbind.get_nonlinear_call(f, (None, None), same_as_first, None, name="gpu.numba_copy")
    x = _gpu(jnp.linspace(-2, 2, 1000, dtype=jnp.float32))
    np.testing.assert_allclose(
        np.asarray(jax.jit(lambda x: op(x * 2)[0] + 1)(x)), 2 * np.asarray(x) + 1, rtol=1e-6
    )


def test_numpy_callable_in_device_mode_is_a_clear_error():
    op = jaxbind.get_nonlinear_call(
        _np_cumsum_any, (None, None), same_as_first, None, name="gpu.numpy_in_device_mode"
    )
    x = _gpu(jnp.ones(5))
    with pytest.raises(
        Exception,
        match=r"gpu.numpy_in_device_mode.*CUDA device buffer.*"
        r"platform_mode='host'",
    ):
        jax.block_until_ready(jax.jit(lambda x: op(x)[0])(x))


def _np_cumsum_any(out, args, kwargs_dump):
    np.cumsum(args[0], axis=-1, out=out[0])


def test_dlpack_consumer_on_another_stream_waits_for_xla_without_a_host_sync(monkeypatch):
    """``__dlpack__(stream=other)``: the other stream waits for XLA's on the GPU (an event)."""
    cp = _cupy()
    from jaxbind._runtime import gpu as jaxbind_gpu

    other = cp.cuda.Stream(non_blocking=True)
    syncs = []
    monkeypatch.setattr(jaxbind_gpu._Driver, "synchronize", lambda self, s: syncs.append(s))

    def f(out, args, kwargs_dump):
        with other:
            cp.add(cp.from_dlpack(args[0]), 1, out=cp.from_dlpack(out[0]))
        other.synchronize()  # work on a stream of the callable's own ends before it returns

    op = jaxbind.get_nonlinear_call(f, (None, None), same_as_first, None, name="gpu.other_stream")
    a = _gpu(jnp.ones((4096, 4096), jnp.float32))
    fn = jax.jit(lambda a, k: op(jnp.mean(a @ a @ a, axis=1) / 4096**2 * k)[0])  # slow
    for k in (1.0, 2.0, 3.0):  # new values each call: stale memory cannot pass
        np.testing.assert_allclose(np.asarray(fn(a, k)), k + 1, rtol=1e-5)
    assert syncs == []


# --- PyTorch ---------------------------------------------------------------------


def test_torch_callable_via_dlpack():
    torch = pytest.importorskip("torch")

    def f(out, args, kwargs_dump):
        x, y = torch.from_dlpack(args[0]), torch.from_dlpack(out[0])
        assert y.data_ptr() == out[0].ptr
        torch.sin(x, out=y)  # on XLA's stream: jaxbind made it torch's current stream

    op = jaxbind.get_nonlinear_call(f, (None, None), same_as_first, None, name="gpu.torch_sin")
    x = _gpu(jnp.linspace(0, 3, 4096, dtype=jnp.float32))
    y = jax.jit(lambda x: op(x)[0] + 1)(x)
    np.testing.assert_allclose(np.asarray(y), np.sin(np.asarray(x)) + 1, rtol=1e-5, atol=1e-6)


# --- host mode -------------------------------------------------------------------


def _np_cumsum(out, args, kwargs_dump):
    assert isinstance(args[0], np.ndarray) and jaxbind.current_call().mode == "host"
    np.cumsum(args[0], axis=-1, out=out[0])


host_cumsum = jaxbind.get_nonlinear_call(
    _np_cumsum, (None, None), same_as_first, None, platform_mode="host", name="gpu.host_cumsum"
)


def test_host_mode_runs_a_cpu_callable_inside_a_gpu_program():
    x = _gpu(jnp.arange(24.0).reshape(4, 6))
    y = jax.jit(lambda x: host_cumsum(x * 2)[0] + 1)(x)
    np.testing.assert_allclose(
        np.asarray(y), np.cumsum(2 * np.arange(24.0).reshape(4, 6), axis=-1) + 1
    )
    yb = jax.jit(jax.vmap(lambda v: host_cumsum(v)[0]))(x)  # jaxbind's loop, on the host
    np.testing.assert_allclose(np.asarray(yb), np.cumsum(np.arange(24.0).reshape(4, 6), -1))


def test_host_mode_ducc_fft_on_gpu_data():
    pytest.importorskip("ducc0")
    from jaxbind.contrib import jaxducc0

    assert jaxducc0.c2c.binding.options.platform_mode == "host"
    roles = jaxducc0.c2c.binding.roles
    host_c2c = jaxbind.get_linear_call(
        roles["f"].body,
        roles["T"].body,
        roles["f"].abstract,
        roles["T"].abstract,
        func_can_batch=True,
        platform_mode="host",
        name="gpu.host_c2c",
    )
    z = _gpu((jnp.arange(64.0) + 1j).astype(jnp.complex128))
    np.testing.assert_allclose(
        np.asarray(jax.jit(lambda z: host_c2c(z)[0])(z)),
        np.fft.fft(np.arange(64.0) + 1j),
        rtol=1e-10,
        atol=1e-9,
    )


def test_jaxducc0_ops_run_inside_gpu_programs():
    """DUCC is CPU-only: jaxducc0's ops use host mode, so GPU arrays work with jit/grad/vmap."""
    pytest.importorskip("ducc0")
    from jaxbind.contrib import jaxducc0

    rng = np.random.default_rng(1)
    z = rng.standard_normal((3, 32)) + 1j * rng.standard_normal((3, 32))
    zg = _gpu(jnp.asarray(z))
    y = jax.jit(lambda z: jaxducc0.c2c(z, axes=(1,))[0])(zg)
    assert list(y.devices())[0].platform == "gpu"
    np.testing.assert_allclose(np.asarray(y), np.fft.fft(z, axis=1), rtol=1e-10, atol=1e-9)
    yv = jax.jit(jax.vmap(lambda v: jaxducc0.c2c(v)[0]))(zg)
    np.testing.assert_allclose(np.asarray(yv), np.fft.fft(z, axis=1), rtol=1e-10, atol=1e-9)
    r = rng.standard_normal(64)
    g = jax.jit(jax.grad(lambda r: jnp.sum(jnp.abs(jaxducc0.r2c(r)[0]) ** 2)))(_gpu(r))
    np.testing.assert_allclose(
        np.asarray(g),
        jax.grad(lambda r: jnp.sum(jnp.abs(jnp.fft.rfft(r)) ** 2))(jnp.asarray(r)),
        rtol=1e-9,
        atol=1e-9,
    )
    coord = rng.uniform(-np.pi, np.pi, (50, 2))
    t2 = jaxducc0.get_nufft(coord, (16, 16), nufft_type=2, epsilon=1e-9)
    grid = rng.standard_normal((16, 16)) + 0j
    got = jax.jit(lambda g: t2(g)[0])(_gpu(grid))
    cpu = jax.jit(lambda g: t2(g)[0])(jax.device_put(grid, jax.devices("cpu")[0]))
    np.testing.assert_allclose(np.asarray(got), np.asarray(cpu), rtol=1e-12, atol=1e-12)
    ct = rng.standard_normal(50) + 1j * rng.standard_normal(50)
    back = jax.linear_transpose(lambda g: t2(g)[0], _gpu(grid))(_gpu(ct))[0]
    lhs, rhs = np.vdot(np.conj(ct), np.asarray(got)), np.vdot(np.conj(np.asarray(back)), grid)
    np.testing.assert_allclose(lhs, rhs, rtol=1e-9)


def _scale_anywhere(out, args, kwargs_dump):
    if jaxbind.current_call().platform == "cuda":
        cp = _cupy()
        cp.multiply(cp.asarray(args[0]), 3, out=cp.asarray(out[0]))
    else:
        np.multiply(args[0], 3, out=out[0])


scale_anywhere = jaxbind.get_nonlinear_call(
    _scale_anywhere, (None, None), same_as_first, None, name="gpu.scale_anywhere"
)


def test_exported_cpu_and_cuda_program_runs_on_both():
    _cupy()
    x = np.linspace(0, 1, 64, dtype=np.float32)
    exp = jaxbind.export(
        jax.jit(lambda x: host_cumsum(x * 2)[0] + scale_anywhere(x)[0]), platforms=("cpu", "cuda")
    )(jax.ShapeDtypeStruct(x.shape, x.dtype))
    rexp = jax.export.deserialize(exp.serialize())
    want = np.cumsum(2 * x) + 3 * x
    got_gpu = rexp.call(_gpu(x))
    assert list(got_gpu.devices())[0].platform == "gpu"
    np.testing.assert_allclose(np.asarray(got_gpu), want, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(rexp.call(jax.device_put(x, jax.devices("cpu")[0]))), want, rtol=1e-5
    )


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
        op = jaxbind.get_nonlinear_call(
            fn,
            (None, None),
            same_as_first,
            None,
            platform_mode=mode,
            name=f"gpu.copy_{dtype}_{mode}",
        )
        y = jax.jit(lambda x: op(x)[0])(x)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def _copy_device(dst, src):
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemcpyAsync.argtypes = [
        ctypes.c_uint64,
        ctypes.c_uint64,
        ctypes.c_size_t,
        ctypes.c_void_p,
    ]
    assert lib.cuMemcpyAsync(dst.ptr, src.ptr, src.nbytes, dst.stream) == 0


def test_exception_on_gpu_is_a_clear_error_and_the_process_survives():
    def bad(out, args, kwargs_dump):
        raise KeyError("missing-table")

    op = jaxbind.get_nonlinear_call(bad, (None, None), same_as_first, None, name="gpu.bad")
    x = _gpu(jnp.ones(3))
    with pytest.raises(Exception, match=r"gpu.bad.*KeyError.*missing-table"):
        jax.block_until_ready(jax.jit(lambda x: op(x)[0])(x))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: x + 1)(x)), 2.0)  # still works


# --- state -----------------------------------------------------------------------


def test_a_cupy_fft_plan_in_state_is_made_at_the_first_call_on_its_device():
    """On a GPU the state is set up at the site's first call on each device, inside the
    call (XLA's stream and the device current in CuPy), reused by later calls, and torn
    down when the executable goes."""
    cp = _cupy()
    import cupyx.scipy.fft as cufft

    made, freed = [], []

    @jaxbind.state(teardown=lambda plan: freed.append(type(plan).__name__))
    def fft_plan(*, n):
        ctx = jaxbind.current_call()
        made.append((ctx.platform, ctx.device, cp.cuda.Device().id))
        return cufft.get_fft_plan(cp.empty(n, cp.complex64), axes=(0,))

    def body(out, args, kwargs_dump):
        plan = jaxbind.load_state(kwargs_dump)
        with plan:
            cp.asarray(out[0])[...] = cufft.fft(cp.asarray(args[0]))

    op = jaxbind.get_nonlinear_call(
        body, (None, None), same_as_first, None, state=fft_plan, name="gpu.state_fft13"
    )
    x = _gpu(jnp.arange(64, dtype=jnp.complex64))
    f = jax.jit(lambda x: op(x, n=64)[0])
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(x)), np.fft.fft(np.arange(64)), rtol=1e-4)
    assert made == [("cuda", 0, 0)]  # once, at the first call, on device 0
    assert freed == []
    del f
    jax.clear_caches()
    gc.collect()
    assert len(freed) == 1, freed  # with the executable
