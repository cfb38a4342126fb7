"""jaxbind.contrib.cuda (cuFFT and cufinufft through kernels for CUDA), as far as a
machine without a GPU can check it: the ops' references in CPU programs against NumPy
and direct sums, their transposes, and the CUDA handler's body on host memory with
stand-ins for the libraries (tests/support/cuda_stand_ins.py): the glue opens the
library by its path, makes a plan per call site, device, stream and type, tells it the
device and the stream, maps jax-finufft's axis order onto the C API's, and destroys the
plans with the site. tests/gpu runs the real libraries."""

import ctypes
import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import cuda_stand_ins
from support.clib import compile_c_library
from support.gpu_sites import buffers, site_on_cuda

import jaxbind
from jaxbind import _ext
from jaxbind.contrib import cuda


def _counts(lib, n):
    out = (ctypes.c_int64 * n)()
    lib.stand_in_counts(out)
    return list(out)


def _direct(kind, values, points, modes, iflag, modeord=0):
    """The NUFFT by its definition, in NumPy (x pairs with the grid's axis 0)."""
    ks = [
        np.fft.ifftshift(np.arange(-(n // 2), (n + 1) // 2))
        if modeord
        else np.arange(-(n // 2), (n + 1) // 2)
        for n in modes
    ]
    grids = np.meshgrid(*ks, indexing="ij")
    phase = sum(g[..., None] * np.asarray(p, np.float64) for g, p in zip(grids, points))
    e = np.exp(np.sign(iflag) * 1j * phase).reshape(-1, len(points[0]))  # (modes, M)
    if kind == 1:
        return (e @ values).reshape(modes)
    return np.ravel(values) @ e


# --- in CPU programs: the references ------------------------------------------------------


def test_fft_runs_jnp_fft_in_a_cpu_program_and_is_its_own_transpose():
    x = (np.random.default_rng(0).normal(size=(2, 4, 6)) + 1j).astype(np.complex64)
    y = jax.jit(lambda x: cuda.fft(x, 2))(x)
    np.testing.assert_allclose(y, np.fft.fftn(x, axes=(-2, -1)), rtol=1e-5, atol=1e-4)
    inv = cuda.fft(x, 1, inverse=True)
    np.testing.assert_allclose(inv, 6 * np.fft.ifft(x, axis=-1), rtol=1e-5, atol=1e-4)
    (t,) = jax.linear_transpose(lambda v: cuda.fft(v, 2), x)(x)
    np.testing.assert_allclose(t, np.fft.fftn(x, axes=(-2, -1)), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dim", [1, 2])
def test_nufft_types_1_and_2_run_the_reference_on_the_cpu_and_transpose_each_other(dim, enable_x64):
    rng = np.random.default_rng(dim)
    modes = (6, 5)[:dim]
    pts = [rng.uniform(-np.pi, np.pi, 9) for _ in range(dim)]
    c = rng.normal(size=9) + 1j * rng.normal(size=9)
    f = jax.jit(lambda c, *p: cuda.nufft1(modes, c, *p, eps=1e-10))(c, *pts)
    np.testing.assert_allclose(f, _direct(1, c, pts, modes, 1), rtol=1e-8, atol=1e-8)
    g = rng.normal(size=modes) + 1j * rng.normal(size=modes)
    back = cuda.nufft2(g, *pts, iflag=1, eps=1e-10)
    np.testing.assert_allclose(back, _direct(2, g, pts, modes, 1), rtol=1e-8, atol=1e-8)
    (t,) = jax.linear_transpose(lambda c: cuda.nufft1(modes, c, *pts, eps=1e-10), c)(g)
    np.testing.assert_allclose(t, back, rtol=1e-8, atol=1e-8)  # type 2, the same sign
    grad = jax.grad(lambda c: jnp.sum(jnp.abs(cuda.nufft1(modes, c, *pts, eps=1e-10)) ** 2))(c)
    assert grad.shape == c.shape and np.all(np.isfinite(grad))


@pytest.mark.parametrize("kind", [1, 2])
def test_gradients_in_the_values_and_the_points_match_the_ducc_nufft(kind, enable_x64):
    """The same loss through cuda's NUFFT (here: its reference and its JVP rule) and
    jaxducc0's (DUCC, its own rules): gradients in the values and in both coordinates,
    and a second derivative in the points."""
    from jaxbind.contrib import jaxducc0

    rng = np.random.default_rng(10 + kind)
    modes, m = (6, 5), 9
    x, y = (rng.uniform(-np.pi, np.pi, m) for _ in range(2))
    shape = (m,) if kind == 1 else modes
    v = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    w = rng.normal(size=modes if kind == 1 else (m,)) + 0j
    if kind == 1:
        ours = lambda v, x, y: cuda.nufft1(modes, v, x, y, eps=1e-11)
        theirs = lambda v, x, y: jaxducc0.nufft1(modes, v, x, y, eps=1e-11)
    else:
        ours = lambda v, x, y: cuda.nufft2(v, x, y, eps=1e-11)
        theirs = lambda v, x, y: jaxducc0.nufft2(v, x, y, eps=1e-11)

    def loss(fn):
        return lambda v, x, y: jnp.sum(jnp.abs(fn(v, x, y) * w) ** 2)

    got = jax.grad(loss(ours), argnums=(0, 1, 2))(v, x, y)
    want = jax.grad(loss(theirs), argnums=(0, 1, 2))(v, x, y)
    for g, h in zip(got, want):
        np.testing.assert_allclose(g, h, rtol=1e-7, atol=1e-7)
    second = jax.grad(lambda x: jax.grad(loss(ours), argnums=1)(v, x, y)[0])(x)
    expected = jax.grad(lambda x: jax.grad(loss(theirs), argnums=1)(v, x, y)[0])(x)
    np.testing.assert_allclose(second, expected, rtol=1e-6, atol=1e-6)


def test_bad_inputs_are_refused_naming_the_op_and_the_fix():
    with pytest.raises(TypeError, match="cuda.fft: takes complex64 or complex128"):
        cuda.fft(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="ndim must be an int from 1 to 3"):
        cuda.fft(np.ones(4, np.complex64), 2)
    x = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="coordinates are 1-d float32 arrays of one length"):
        cuda.nufft1((8, 8), np.ones(4, np.complex64), x, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="output_shape \\(8, 8\\) has 2 dimensions"):
        cuda.nufft1((8, 8), np.ones(4, np.complex64), x)
    with pytest.raises(ValueError, match="no library 'cublas'"):
        cuda.library_path("cublas")
    c, pts = np.ones(5, np.complex64), np.zeros(9, np.float32)
    with pytest.raises(ValueError, match="nufft1: the values have shape \\(5,\\).*\\(9,\\)"):
        cuda.nufft1(6, c, pts)
    assert cuda.nufft2(c, pts).shape == (9,)  # (a grid of 5 modes, 9 points)
    for eps in (np.inf, 0.0, True, 2.0, "1e-6"):
        with pytest.raises(ValueError, match="eps must be a number between 0 and 1"):
            cuda.nufft1(6, np.ones(9, np.complex64), pts, eps=eps)
    assert cuda.nufft1(6, np.ones(9, np.complex64), pts, eps=np.float32(1e-6)).shape == (6,)
    for modeord in (2, -1, 1.5, "1", None, True):
        with pytest.raises(ValueError, match="modeord must be 0 .* or 1"):
            cuda.nufft1(6, np.ones(9, np.complex64), pts, modeord=modeord)
    with pytest.raises(TypeError, match="iflag must be an int"):
        cuda.nufft1(6, np.ones(9, np.complex64), pts, iflag=None)
    with pytest.raises(ValueError, match="output_shape must be a non-negative int"):
        cuda.nufft1((2.7,), np.ones(9, np.complex64), pts)
    with pytest.raises(ValueError, match="ndim must be an int"):
        cuda.fft(np.ones(4, np.complex64), True)
    with pytest.raises(TypeError, match="inverse must be True or False"):
        cuda.fft(np.ones(4, np.complex64), inverse="yes")
    assert cuda.fft(np.ones(4, np.complex64), np.int64(1)).shape == (4,)


def test_empty_transforms_need_no_plan():
    """cuFFT and cufinufft plan no empty transform: an empty FFT is empty, an empty sum zero."""
    assert cuda.fft(np.ones((0, 8), np.complex64)).shape == (0, 8)
    assert cuda.fft(np.ones((3, 0), np.complex64)).shape == (3, 0)
    empty = np.zeros(0, np.float32)
    np.testing.assert_array_equal(cuda.nufft1((4, 3), np.ones(0, np.complex64), empty, empty), 0)
    assert cuda.nufft2(np.ones((4, 3), np.complex64), empty, empty).shape == (0,)
    pts = np.zeros(5, np.float32)
    np.testing.assert_array_equal(cuda.nufft2(np.ones(0, np.complex64), pts), np.zeros(5))


def test_programs_traced_without_a_gpu_carry_no_library_path():
    """The library is found by the state's setup, where the program runs: a program
    lowered for CUDA on this machine (or exported for both) names no path or layout."""
    x = np.ones((4, 4), np.complex64)
    text = jax.jit(lambda x: cuda.fft(x, 2)).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "jaxbind_cuda" in text and "libcufft" not in text and "library" not in text
    pts = np.zeros(5, np.float32)
    lowered = jax.jit(lambda c: cuda.nufft1(4, c, pts)).trace(np.ones(5, np.complex64))
    text = lowered.lower(lowering_platforms=("cuda",)).as_text()
    assert "stream_at" not in text and "library" not in text


def test_a_library_not_installed_says_what_to_install(monkeypatch):
    monkeypatch.delenv("JAXBIND_CUFINUFFT_LIBRARY", raising=False)
    monkeypatch.setattr(cuda, "_wheel_libraries", lambda name: [])
    with pytest.raises(LookupError, match="pip install cufinufft.*JAXBIND_CUFINUFFT_LIBRARY"):
        cuda.library_path("cufinufft")
    monkeypatch.setenv("JAXBIND_CUFINUFFT_LIBRARY", "/opt/lib/libcufinufft.so")
    assert cuda.library_path("cufinufft") == "/opt/lib/libcufinufft.so"


def test_the_options_layout_is_read_from_cufinuffts_own_description():
    declared = cuda_stand_ins.OPTS_FIELDS
    layout = cuda.opts_layout(declared)
    # a double, 12 ints, the device's int, the stream pointer (aligned), modeord, 2 ints
    assert layout == {"opts_size": 88, "stream_at": 64, "device_at": 56, "modeord_at": 72}
    # the same fields spelled otherwise (double quotes, ctypes.): the same layout
    other = declared.replace("'", '"').replace("c_int", "ctypes.c_int")
    assert cuda.opts_layout(other) == layout
    with pytest.raises(LookupError, match="no 'gpu_stream'"):
        cuda.opts_layout("fields = [('modeord', c_int)]")
    with pytest.raises(LookupError, match="option 'gpu_np' has the type NufftThing"):
        cuda.opts_layout(declared.replace("('gpu_np', c_int)", "('gpu_np', NufftThing)"))
    with pytest.raises(LookupError, match="cannot read this cufinufft's options"):
        cuda.opts_layout(declared.replace("('debug', c_int)", "('debug', c_int, 4)"))


# --- in GPU programs: the glue on host memory, with stand-ins -------------------------------


@pytest.fixture(scope="module")
def cufft_lib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "cufft_stand_in", cuda_stand_ins.CUFFT)


@pytest.fixture(scope="module")
def cufinufft_lib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "cufinufft_stand_in", cuda_stand_ins.CUFINUFFT)


@pytest.fixture
def cufft(cufft_lib, monkeypatch):
    """The stand-in, where the setup looks for cuFFT (the program names no library)."""
    monkeypatch.setenv("JAXBIND_CUFFT_LIBRARY", cufft_lib._name)
    return cufft_lib


@pytest.fixture
def cufinufft(cufinufft_lib, monkeypatch):
    """The stand-in, where the setup looks for cufinufft, with its options' layout."""
    monkeypatch.setenv("JAXBIND_CUFINUFFT_LIBRARY", cufinufft_lib._name)
    layout = cuda.opts_layout(cuda_stand_ins.OPTS_FIELDS)
    monkeypatch.setattr(cuda, "_opts_layout", lambda: layout)
    return cufinufft_lib


def test_cufft_plans_once_per_site_device_and_stream_and_destroys_them(cufft):
    x = (np.random.default_rng(1).normal(size=(2, 4, 3)) + 0.5j).astype(np.complex64)
    kwargs = dict(shape=np.array([4, 3], np.int64), batch=2, double=False, forward=True)
    sites = {d: site_on_cuda(cuda._fft_op(), kwargs) for d in (0, 1)}
    for stream, device in ((7, 0), (7, 0), (9, 0), (7, 1)):
        y = np.zeros_like(x)
        _ext.gpu_call_for_tests(sites[device], stream, device, buffers(x), buffers(y))
        np.testing.assert_allclose(y, np.fft.fftn(x, axes=(-2, -1)), rtol=1e-4, atol=1e-4)
    made, destroyed, *streams = _counts(cufft, 10)
    assert (made, destroyed) == (3, 0)  # device 0: streams 7 and 9; device 1: stream 7
    assert streams[:3] == [7, 9, 7]
    inverse = site_on_cuda(cuda._fft_op(), dict(kwargs, forward=False))
    y = np.zeros_like(x)
    _ext.gpu_call_for_tests(inverse, 7, 0, buffers(x), buffers(y))
    np.testing.assert_allclose(y, 12 * np.fft.ifftn(x, axes=(-2, -1)), rtol=1e-4, atol=1e-4)
    assert _counts(cufft, 10)[:2] == [3, 0]  # (equal setup arguments: the same state)
    del sites, inverse
    gc.collect()
    assert _counts(cufft, 10)[:2] == [3, 3]  # every plan destroyed with its site


@pytest.mark.parametrize("modeord", [0, 1])
def test_cufinufft_types_1_and_2_in_jax_finufft_axis_order(cufinufft, modeord):
    rng = np.random.default_rng(modeord)
    modes, m = (6, 5), 7
    x, y = (rng.uniform(-np.pi, np.pi, m).astype(np.float32) for _ in range(2))
    c = (rng.normal(size=m) + 1j * rng.normal(size=m)).astype(np.complex64)
    kwargs = dict(modes=np.array(modes, np.int64), iflag=1, eps=1e-6, single=True, modeord=modeord)
    before = _counts(cufinufft, 6)
    op = cuda._nufft_op(1, 2)
    f_site = site_on_cuda(op, kwargs, n_args=3, n_fixed=0)
    f = np.zeros(modes, np.complex64)
    _ext.gpu_call_for_tests(f_site, 5, 3, buffers(x, y, c), buffers(f))
    np.testing.assert_allclose(f, _direct(1, c, (x, y), modes, 1, modeord), rtol=2e-4, atol=2e-4)
    made, _, kind, device, stream, _ = _counts(cufinufft, 6)
    assert (made - before[0], kind, device, stream) == (1, 1, 3, 5)  # told the device, stream
    t_site = site_on_cuda(cuda._nufft_op(2, 2), kwargs, n_args=3, n_fixed=0)  # type 2
    back = np.zeros(m, np.complex64)
    _ext.gpu_call_for_tests(t_site, 5, 3, buffers(x, y, f), buffers(back))
    np.testing.assert_allclose(back, _direct(2, f, (x, y), modes, 1, modeord), rtol=2e-4, atol=2e-3)
    assert _counts(cufinufft, 6)[2] == 2
    fine = site_on_cuda(op, dict(kwargs, eps=1e-9), n_args=3, n_fixed=0)  # (status 1: a plan)
    _ext.gpu_call_for_tests(fine, 5, 3, buffers(x, y, c), buffers(f))
    np.testing.assert_allclose(f, _direct(1, c, (x, y), modes, 1, modeord), rtol=2e-4, atol=2e-4)
    del fine
    for _ in range(2):  # a plan per type; the points set at every call
        _ext.gpu_call_for_tests(f_site, 5, 3, buffers(x, y, c), buffers(f))
    now = _counts(cufinufft, 6)
    assert now[0] - before[0] == 3 and now[5] - before[5] == 5
    del f_site, t_site
    gc.collect()
    assert _counts(cufinufft, 6)[1] - before[1] == 3


def test_the_glue_refuses_a_cpu_call_and_names_a_library_it_cannot_open(cufft):
    setup, teardown, execute = _ext.cuda_library_entry_points()["cufft"]
    state = jaxbind.c_state(setup, teardown)
    with pytest.raises(Exception, match="cuFFT's setup: a cuFFT plan runs in GPU programs"):
        state.setup(library=cufft._name, shape=np.array([4], np.int64), batch=1, double=False)
    from jaxbind._kernels import abi

    x = np.ones(4, np.complex64)
    status, message = abi.call_kernel(execute, [x], [x.copy()], [])
    assert status == 1 and message.startswith("cuFFT: a cuFFT transform runs in GPU programs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAXBIND_CUFFT_LIBRARY", "/nowhere/libcufft.so")
        site = site_on_cuda(
            cuda._fft_op(),
            dict(shape=np.array([5], np.int64), batch=1, double=False, forward=True),
        )
        with pytest.raises(Exception, match="cannot open /nowhere/libcufft.so"):
            _ext.gpu_call_for_tests(site, 1, 0, buffers(x[:1].repeat(5)), buffers(x[:1].repeat(5)))
