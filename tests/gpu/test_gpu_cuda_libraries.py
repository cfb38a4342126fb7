"""jaxbind.contrib.cuda on a GPU: cuFFT (the library JAX's CUDA plugin loads) against
JAX's own FFT, and cufinufft (from its wheel) against jaxbind's CPU DUCC NUFFT, values
and gradients in the values and the points; a plan per call site and device, torn down
with the program; no Python per call. Skipped without a GPU (see conftest.py); the
cufinufft tests skip, saying why, where its library cannot load (its wheel links CUDA
12's runtime and cuFFT)."""

import ctypes
import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbind import _ext
from jaxbind._runtime import state as _state
from jaxbind.contrib import cuda


def _gpu(x):
    return jax.device_put(x, jax.devices("cuda")[0])


def _relative(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def cufinufft_loads():
    try:
        path = cuda.library_path("cufinufft")
        ctypes.CDLL(path)
    except (LookupError, OSError) as exc:
        pytest.skip(f"cufinufft cannot load here: {exc}")


def test_cufft_matches_jax_fft_and_is_its_own_transpose():
    rng = np.random.default_rng(0)
    x = _gpu(
        (rng.normal(size=(3, 64, 48)) + 1j * rng.normal(size=(3, 64, 48))).astype(np.complex64)
    )
    y = jax.jit(lambda x: cuda.fft(x, 2))(x)
    assert _relative(y, jnp.fft.fftn(x, axes=(-2, -1))) < 1e-5
    inv = jax.jit(lambda x: cuda.fft(x, 1, inverse=True))(x)
    assert _relative(inv, 48 * jnp.fft.ifft(x, axis=-1)) < 1e-5
    (t,) = jax.jit(lambda x: jax.linear_transpose(lambda v: cuda.fft(v, 2), x)(x))(x)
    assert _relative(t, jnp.fft.fftn(x, axes=(-2, -1))) < 1e-5


def test_cufft_plans_once_per_site_and_device_with_no_python_per_call():
    x = _gpu(jnp.ones((256, 256), jnp.complex64))
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, 100, lambda i, x: cuda.fft(x, 2) / 256.0, x))
    before_states = _state.live_states()
    jax.block_until_ready(loop(x))
    assert _state.live_states() == before_states + 1  # one site, one device
    entries, calls = _ext.python_entries(), _ext.stream_kernel_calls()
    jax.block_until_ready(loop(x))
    assert _ext.python_entries() == entries  # no Python in 100 transforms
    assert _ext.stream_kernel_calls() - calls in (0, 100)  # (0: replayed from a graph)
    del loop
    jax.clear_caches()
    gc.collect()
    assert _state.live_states() == before_states


def test_cufinufft_types_1_and_2_match_the_cpu_ducc_nufft(cufinufft_loads):
    from jaxbind.contrib import jaxducc0

    rng = np.random.default_rng(1)
    m, modes = 10_000, (64, 48)
    x, y = (rng.uniform(-np.pi, np.pi, m).astype(np.float32) for _ in range(2))
    c = (rng.normal(size=m) + 1j * rng.normal(size=m)).astype(np.complex64)
    f = jax.jit(lambda c, x, y: cuda.nufft1(modes, c, x, y, eps=1e-6))(_gpu(c), _gpu(x), _gpu(y))
    with jax.default_device(jax.devices("cpu")[0]):
        want = jaxducc0.nufft1(modes, c, x, y, eps=1e-6)
    assert _relative(f, want) < 1e-5
    back = jax.jit(lambda f, x, y: cuda.nufft2(f, x, y, eps=1e-6))(f, _gpu(x), _gpu(y))
    with jax.default_device(jax.devices("cpu")[0]):
        want2 = jaxducc0.nufft2(np.asarray(f), x, y, eps=1e-6)
    assert _relative(back, want2) < 1e-5


def test_cufinufft_gradients_in_values_and_points_match_the_cpu_ducc_nufft(
    cufinufft_loads, enable_x64
):
    from jaxbind.contrib import jaxducc0

    rng = np.random.default_rng(2)
    m, modes = 2_000, (32, 32)
    x, y = (rng.uniform(-np.pi, np.pi, m) for _ in range(2))
    c = rng.normal(size=m) + 1j * rng.normal(size=m)
    w = rng.normal(size=modes)

    def loss(fn):
        return lambda c, x, y: jnp.sum(jnp.abs(fn(modes, c, x, y, eps=1e-9) * w) ** 2)

    got = jax.jit(jax.grad(loss(cuda.nufft1), argnums=(0, 1, 2)))(_gpu(c), _gpu(x), _gpu(y))
    with jax.default_device(jax.devices("cpu")[0]):
        want = jax.grad(loss(jaxducc0.nufft1), argnums=(0, 1, 2))(c, x, y)
    for g, h in zip(got, want):
        assert _relative(g, h) < 1e-5


def test_cufinufft_plans_per_site_and_device_and_tears_them_down(cufinufft_loads):
    m, modes = 1000, (32, 32)
    x = _gpu(jnp.linspace(-3, 3, m, dtype=jnp.float32))
    c = _gpu(jnp.ones(m, jnp.complex64))
    loop = jax.jit(
        lambda c: jax.lax.fori_loop(
            0, 10, lambda i, c: cuda.nufft2(cuda.nufft1(modes, c, x, x), x, x) / 1e3, c
        )
    )
    before = _state.live_states()
    jax.block_until_ready(loop(c))
    assert _state.live_states() == before + 1  # both types share a state: one plan of each
    entries = _ext.python_entries()
    jax.block_until_ready(loop(c))
    assert _ext.python_entries() == entries
    del loop
    jax.clear_caches()
    gc.collect()
    assert _state.live_states() == before
