"""Kernels for CUDA (jaxbind.kernel(..., platform="cuda"), kernel ABI version 4) on a GPU:
a C function, built without the CUDA toolkit, that reaches the CUDA driver through dlopen
and enqueues its work on XLA's stream (tests/support/stream_kernels.py); under jit, vmap,
grad and export, on each device with the device its buffers are on, with a state per
device, and (graph-safe) captured into XLA's command buffers. Skipped without a GPU (see
conftest.py) and without a C compiler."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import stream_kernels
from support.clib import compile_c_library

import jaxbind
from jaxbind._runtime import state as _state


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "gpu_stream", stream_kernels.SOURCE)


def _where(x, **kw):
    return ((x.shape, x.dtype), ((2,), np.dtype(np.int32)))


def _same(x, **kw):
    return ((x.shape, x.dtype),)


def _kernel(lib, graph_safe=False):
    return jaxbind.kernel(lib.copy_on_stream, platform="cuda", graph_safe=graph_safe)


def _where_op(lib, name, *, state=None):
    """y, where = op(x): the copy, and where it ran (the device, and its state's)."""
    return jaxbind.get_nonlinear_call(
        _kernel(lib), (None, None), _where, None, state=state, name=name, replace=True
    )


def _copy_op(lib, name, graph_safe=False):
    """A copy, linear in x: its own transpose (the same kernel on the cotangent)."""
    k = _kernel(lib, graph_safe)
    return jaxbind.get_linear_call(k, k, _same, _same, name=name, replace=True)


def _on(device_index, x):
    return jax.device_put(x, jax.devices("cuda")[device_index])


def test_it_runs_on_xla_stream_under_jit_vmap_and_grad(lib):
    x = _on(0, jnp.linspace(0, 1, 1000, dtype=jnp.float32))
    y, where = jax.jit(_where_op(lib, "tests.gpu.stream_where"))(x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert np.asarray(where).tolist() == [0, -1]
    op = _copy_op(lib, "tests.gpu.stream_copy")
    xs = _on(0, jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4))
    (ys,) = jax.jit(jax.vmap(op))(xs)  # one call per batch element, each on the stream
    np.testing.assert_array_equal(np.asarray(ys), np.asarray(xs))
    g = jax.grad(lambda x: jnp.sum(op(x)[0] ** 2))(x)  # the transpose: the same kernel
    np.testing.assert_allclose(np.asarray(g), 2 * np.asarray(x), rtol=1e-6)


def test_each_device_gets_calls_with_its_own_ordinal(lib):
    devices = jax.devices("cuda")
    if len(devices) < 2:
        pytest.skip("one GPU: the ordinal of a second device cannot be checked")
    op = _where_op(lib, "tests.gpu.stream_devices")
    for d in range(len(devices)):
        y, where = jax.jit(op)(_on(d, jnp.ones(8, jnp.float32)))
        assert np.asarray(where).tolist() == [d, -1]  # (the kernel checks the buffers' device)


def test_its_state_is_set_up_once_per_device_and_torn_down_with_the_program(lib):
    state = jaxbind.c_state(lib.placed_setup, lib.placed_teardown)
    op = _where_op(lib, "tests.gpu.stream_state", state=state)
    before = _state.live_states()
    devices = jax.devices("cuda")
    f = jax.jit(op)
    for _ in range(3):
        for d in range(len(devices)):
            _, where = f(_on(d, jnp.ones(8, jnp.float32)))
            assert np.asarray(where).tolist() == [d, d]
    assert _state.live_states() == before + len(devices)
    del f
    jax.clear_caches()
    gc.collect()
    assert _state.live_states() == before


def test_an_exported_program_runs_it_by_name(lib):
    op = _copy_op(lib, "tests.gpu.stream_export")
    x = _on(0, jnp.arange(5.0, dtype=jnp.float32))
    exported = jaxbind.export(jax.jit(op), platforms=("cuda",))(x)
    restored = jax.export.deserialize(exported.serialize())
    (y,) = restored.call(x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_a_graph_safe_kernel_is_replayed_from_a_command_buffer(lib):
    op = _copy_op(lib, "tests.gpu.stream_graph_safe", graph_safe=True)
    x = _on(0, jnp.arange(64.0, dtype=jnp.float32))

    def loop(x):
        return jax.lax.fori_loop(0, 10, lambda i, x: op(x)[0] + 1, x)

    text = jax.jit(loop).lower(x).as_text()
    assert "jaxbind_cuda_kernel" in text
    np.testing.assert_array_equal(np.asarray(jax.jit(loop)(x)), np.asarray(x) + 10)
