"""Kernels for CUDA (jaxbind.kernel(..., platform="cuda"), kernel ABI version 4), as far
as a machine without a GPU can check them: what jaxbind.kernel accepts and refuses, what
runs them on each platform (the lowering), and the CUDA handler's body on host memory
standing in for device memory (tests/runtime/test_gpu_plumbing.py does the same for
callables): the stream, the device and the batch loop reach the kernel, and the op's
state is set up once per device, told the device and the stream, and torn down with the
site. tests/gpu runs them on a GPU."""

import contextlib
import ctypes
import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.clib import compile_c_library
from support.gpu_sites import buffers as _buffers
from support.gpu_sites import site_on_cuda as _site_on_cuda

import jaxbind
from jaxbind import _ext
from jaxbind._callformat import Loop
from jaxbind._kernels import GraphSafeKernel, StreamKernel
from jaxbind._kernels.abi import PLATFORMS
from jaxbind._roles import Body
from jaxbind._runtime import state as _state

_C_SOURCE = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "jaxbind/kernel.h"

/* out0 (float32) = 2 * in0 + the state's offset; out1 (int64[4]) = where the call ran:
   platform, stream, device, and the device its state was set up for (-2: no state). On a
   GPU it would enqueue this on call->stream; here host memory stands in. */
typedef struct { double offset; int64_t platform, stream, device; } placed;

int32_t where_it_ran(const jaxbind_call *call) {
  if (call->abi_version < 4) {
    snprintf(call->error, (size_t)call->error_size, "called as version %ld",
             (long)call->abi_version);
    return 1;
  }
  if (call->outputs[1].dtype != JAXBIND_INT64 || call->outputs[0].dtype != JAXBIND_FLOAT32) {
    snprintf(call->error, (size_t)call->error_size, "takes float32 and writes int64 (x64)");
    return 1;
  }
  const placed *s = (const placed *)call->state;
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  int64_t n = 1;
  for (int64_t d = 0; d < call->outputs[0].rank; ++d) n *= call->outputs[0].dims[d];
  for (int64_t i = 0; i < n; ++i) y[i] = 2 * x[i] + (s ? (float)s->offset : 0.0f);
  int64_t *w = (int64_t *)call->outputs[1].data;
  w[0] = call->platform;
  w[1] = (int64_t)(intptr_t)call->stream;
  w[2] = call->device;
  w[3] = s ? s->device : -2;
  return 0;
}

int32_t placed_setup(const jaxbind_setup *setup, void **state) {
  placed *s = (placed *)calloc(1, sizeof(placed));
  if (s == NULL) return 1;
  for (int64_t k = 0; k < setup->n_kwargs; ++k)
    if (setup->kwargs[k].type == JAXBIND_KWARG_FLOAT) s->offset = setup->kwargs[k].float_value;
  s->platform = setup->platform;
  s->stream = (int64_t)(intptr_t)setup->stream;
  s->device = setup->device;
  *state = s;
  return 0;
}

void placed_teardown(void *state) { free(state); }
"""


@pytest.fixture(scope="module")
def clib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "stream", _C_SOURCE)


def _abstract(x, **kw):
    return ((x.shape, x.dtype), ((4,), np.dtype(np.int64)))


def _op(clib, name, *, state=None, reference=None, graph_safe=False):
    k = jaxbind.kernel(clib.where_it_ran, platform="cuda", graph_safe=graph_safe)
    return jaxbind.get_nonlinear_call(
        k, (None, None), _abstract, None, state=state, reference=reference, name=name,
        replace=True,
    )  # fmt: skip


def _reference(x, **kw):
    return [2 * x, jnp.array([PLATFORMS["cpu"], 0, -1, -2], jnp.int64)]


# --- what jaxbind.kernel makes and refuses --------------------------------------------------


def test_a_kernel_for_cuda_is_its_own_kind_of_body(clib):
    k = jaxbind.kernel(clib.where_it_ran, platform="cuda")
    assert isinstance(k, StreamKernel) and Body.of(k) is Body.STREAM_KERNEL
    assert k.platform == "cuda" and "for CUDA" in repr(k)
    g = jaxbind.kernel(clib.where_it_ran, platform="cuda", graph_safe=True)
    assert isinstance(g, GraphSafeKernel) and Body.of(g) is Body.GRAPH_SAFE_KERNEL
    assert Body.of(jaxbind.kernel(clib.where_it_ran)) is Body.KERNEL
    assert jaxbind.kernel(k, platform="cuda") is k
    # the table: both run in GPU programs only; a graph-safe one's calls may be captured
    assert Body.STREAM_KERNEL.platforms == Body.GRAPH_SAFE_KERNEL.platforms == ("cuda",)
    assert (Body.STREAM_KERNEL.calls, Body.GRAPH_SAFE_KERNEL.calls) == ("plain", "kernel")
    assert Body.KERNEL.platforms == ("cpu",)


def test_what_a_kernel_for_cuda_cannot_be_is_refused_with_the_fix(clib):
    def numba_style(out, x):
        out[0] = x[0]

    with pytest.raises(TypeError, match="numba Python function for the CPU.*cuda_kernel"):
        jaxbind.kernel(numba_style, platform="cuda")
    address = ctypes.cast(clib.where_it_ran, ctypes.c_void_p).value
    with pytest.raises(ValueError, match=f"at {address:#x}: .*from kernel ABI version 4 on"):
        jaxbind.kernel(address, abi_version=3, platform="cuda")  # (an address, in hex)
    with pytest.raises(ValueError, match="threads= is for CPU kernels"):
        jaxbind.kernel(clib.where_it_ran, platform="cuda", threads=2)
    with pytest.raises(ValueError, match="platform must be 'cpu' or 'cuda', not 'gpu'"):
        jaxbind.kernel(clib.where_it_ran, platform="gpu")
    with pytest.raises(ValueError, match="graph_safe=True .* needs platform='cuda'"):
        jaxbind.kernel(clib.where_it_ran, graph_safe=True)
    with pytest.raises(ValueError, match="is a kernel for cpu already"):
        jaxbind.kernel(jaxbind.kernel(clib.where_it_ran), platform="cuda")
    state = jaxbind.c_state(clib.placed_setup, clib.placed_teardown)
    with pytest.raises(TypeError, match="graph-safe kernel .* state=.*drop graph_safe=True"):
        _op(clib, "tests.stream.graph_safe_state", state=state, graph_safe=True)
    k = jaxbind.kernel(clib.where_it_ran, platform="cuda", graph_safe=True)
    assert "(graph-safe)" in repr(k)
    with pytest.raises(ValueError, match="is a kernel already.*threads= would be dropped"):
        jaxbind.kernel(jaxbind.kernel(clib.where_it_ran), threads=2)
    with pytest.raises(ValueError, match="platform must be 'cpu' or 'cuda'"):
        jaxbind.kernel(platform="gpu")  # (the decorator form checks at once)
    with pytest.raises(TypeError, match="grain= needs ranges="):
        jaxbind.kernel(numba_style, grain=10)


# --- what runs it on each platform ------------------------------------------------------------


def test_a_cpu_program_runs_its_reference_or_refuses_naming_the_op(clib, enable_x64):
    x = np.arange(4, dtype=np.float32)
    with_ref = _op(clib, "tests.stream.with_reference", reference=_reference)
    y, where = jax.jit(with_ref)(x)
    np.testing.assert_array_equal(y, 2 * x)
    assert where[0] == PLATFORMS["cpu"]  # the reference's answer: the kernel never ran
    without = _op(clib, "tests.stream.without_reference")
    with pytest.raises(NotImplementedError, match="without_reference.*runs on cuda only"):
        jax.jit(without)(x)


def test_a_cpu_kernel_in_a_gpu_program_is_refused_when_lowered_not_when_run(clib):
    cpu = jaxbind.get_nonlinear_call(
        jaxbind.kernel(clib.where_it_ran), (None, None), _abstract, None,
        name="tests.stream.cpu_kernel", replace=True,
    )  # fmt: skip
    x = jnp.ones(3, jnp.float32)
    with pytest.raises(NotImplementedError, match="cpu_kernel.*cannot be lowered for cuda"):
        jax.jit(cpu).trace(x).lower(lowering_platforms=("cuda",))


def test_gpu_programs_call_it_through_the_cuda_targets(clib):
    x = jnp.ones(3, jnp.float32)
    plain = _op(clib, "tests.stream.lowered")
    text = jax.jit(plain).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert 'custom_call_target = "jaxbind_cuda"' in text or "@jaxbind_cuda(" in text
    assert "jaxbind_cuda_kernel" not in text
    safe = _op(clib, "tests.stream.lowered_graph_safe", graph_safe=True)
    text = jax.jit(safe).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "jaxbind_cuda_kernel" in text  # (the handler XLA may capture in command buffers)
    vm = jax.jit(jax.vmap(plain)).trace(jnp.ones((2, 3), jnp.float32))
    assert 'num_batch_dims = "1"' in vm.lower(lowering_platforms=("cuda",)).as_text()


def test_a_bundle_refuses_it_saying_the_c_runtime_runs_cpu_programs(clib):
    op = _op(clib, "tests.stream.bundled")
    from jaxbind._where import not_carried

    why = not_carried(op.binding, op.binding.role("f"))
    assert why is not None and "kernel for CUDA" in why and "CPU programs" in why


# --- the CUDA handler's body, on host memory --------------------------------------------------


def test_the_kernel_gets_the_stream_and_the_device_of_each_call(clib):
    site = _site_on_cuda(_op(clib, "tests.stream.placed"))
    x = np.arange(4, dtype=np.float32)
    for stream, device in ((7, 0), (9, 1), (7, 3)):
        y, where = np.zeros(4, np.float32), np.zeros(4, np.int64)
        _ext.gpu_call_for_tests(site, stream, device, _buffers(x), _buffers(y, where))
        np.testing.assert_array_equal(y, 2 * x)
        assert where.tolist() == [PLATFORMS["cuda"], stream, device, -2]


def test_the_batch_loop_calls_it_once_per_element_with_the_elements_pointers(clib):
    site = _site_on_cuda(_op(clib, "tests.stream.batched"), loop=Loop(1, (True,)))
    x = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    y, where = np.zeros((3, 4), np.float32), np.zeros((3, 4), np.int64)
    _ext.gpu_call_for_tests(site, 5, 2, _buffers(x), _buffers(y, where))
    np.testing.assert_array_equal(y, 2 * x)
    assert where.tolist() == [[PLATFORMS["cuda"], 5, 2, -2]] * 3


def test_a_signature_the_op_refuses_is_an_error_naming_it(clib):
    site = _site_on_cuda(_op(clib, "tests.stream.refused"))
    x = np.arange(4, dtype=np.float32)
    y, where = np.zeros(5, np.float32), np.zeros(4, np.int64)  # a wrong output shape
    with pytest.raises(ValueError, match="tests.stream.refused"):
        _ext.gpu_call_for_tests(site, 7, 0, _buffers(x), _buffers(y, where))


def test_a_c_state_is_set_up_once_per_device_told_its_device_and_stream(clib):
    state = jaxbind.c_state(clib.placed_setup, clib.placed_teardown, params=("offset",))
    op = _op(clib, "tests.stream.c_state", state=state)
    before = _state.live_states()
    site = _site_on_cuda(op, {"offset": 0.5})
    assert _state.live_states() == before  # nothing at instantiate: no device, no stream
    x = np.arange(4, dtype=np.float32)
    for stream, device in ((7, 0), (8, 1), (9, 0), (10, 1)):
        y, where = np.zeros(4, np.float32), np.zeros(4, np.int64)
        _ext.gpu_call_for_tests(site, stream, device, _buffers(x), _buffers(y, where))
        np.testing.assert_array_equal(y, 2 * x + 0.5)
        assert where.tolist() == [PLATFORMS["cuda"], stream, device, device]
    assert _state.live_states() == before + 2  # one per device
    del site
    gc.collect()
    assert _state.live_states() == before  # torn down with the site


def test_a_python_state_sees_the_device_and_stream_it_is_set_up_for(clib):
    made = []

    @jaxbind.state
    def recorded(*, offset=0.0):
        made.append(jaxbind.current_call())
        return ctypes.addressof(_keep.setdefault(len(made), _Placed(offset, 0, 0, -5)))

    op = _op(clib, "tests.stream.python_state", state=recorded)
    site = _site_on_cuda(op, {"offset": 1.0})
    x = np.arange(4, dtype=np.float32)
    for device in (2, 2, 3):
        y, where = np.zeros(4, np.float32), np.zeros(4, np.int64)
        _ext.gpu_call_for_tests(site, 11, device, _buffers(x), _buffers(y, where))
        np.testing.assert_array_equal(y, 2 * x + 1)
    assert [(c.platform, c.stream, c.device) for c in made] == [("cuda", 11, 2), ("cuda", 11, 3)]
    assert jaxbind.current_call().platform == "cpu"  # only during the setup
    del site


def test_a_state_is_torn_down_with_its_device_current(clib, monkeypatch):
    """Set up inside a call on its device, torn down when the site goes, where no device
    need be current: jaxbind makes the device's primary context current (as XLA has it)
    around each teardown. A stand-in for the CUDA driver records it here."""
    from jaxbind._runtime import gpu as _gpu

    current: list = []

    class _Driver:
        @staticmethod
        @contextlib.contextmanager
        def current(device):
            current.append(device)
            try:
                yield
            finally:
                current.pop()

    monkeypatch.setattr(_gpu, "_driver", _Driver)
    torn = []

    @jaxbind.state(teardown=lambda obj: torn.append((obj, list(current))))
    def per_device(*, offset=0.0):
        placed = _Placed(offset, 0, 0, -5)
        _keep[id(placed)] = placed
        return ctypes.addressof(placed)

    site = _site_on_cuda(_op(clib, "tests.stream.torn_down", state=per_device), {"offset": 2.0})
    x = np.arange(4, dtype=np.float32)
    for device in (1, 3):
        y, where = np.zeros(4, np.float32), np.zeros(4, np.int64)
        _ext.gpu_call_for_tests(site, 11, device, _buffers(x), _buffers(y, where))
    assert torn == []
    del site
    gc.collect()
    assert sorted(devices for _, devices in torn) == [[1], [3]] and current == []


def test_a_keyed_state_is_refused_naming_the_op(clib):
    @jaxbind.state(key=("x",))
    def keyed(*, x):
        return 1

    with pytest.raises(TypeError, match="tests.stream.keyed.*key=.*device memory"):
        _op(clib, "tests.stream.keyed", state=keyed)  # (when the op is made)

    def shape(x, **kw):
        return jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((4,), jnp.int64)

    body = jaxbind.kernel(clib.where_it_ran, platform="cuda")
    with pytest.raises(TypeError, match="key=.*device memory"):  # (the pytree API alike)
        op = jaxbind.nonlinear_op(shape=shape, state=keyed, name="tests.stream.keyed2")(body)
        jax.eval_shape(op, jax.ShapeDtypeStruct((3,), jnp.float32))


class _Placed(ctypes.Structure):
    _fields_ = [
        ("offset", ctypes.c_double),
        ("platform", ctypes.c_int64),
        ("stream", ctypes.c_int64),
        ("device", ctypes.c_int64),
    ]


_keep: dict = {}


def test_the_gpu_tests_kernel_compiles_and_refuses_a_cpu_call(tmp_path_factory):
    """tests/gpu's kernel for CUDA (the driver through dlopen, no CUDA toolkit) builds
    here, and on host memory says that it runs in GPU programs rather than touch it."""
    from support import stream_kernels

    from jaxbind._kernels import abi

    lib = compile_c_library(tmp_path_factory, "gpu_stream", stream_kernels.SOURCE)
    address = ctypes.cast(lib.copy_on_stream, ctypes.c_void_p).value
    x, y, where = np.ones(3, np.float32), np.zeros(3, np.float32), np.zeros(2, np.int32)
    status, message = abi.call_kernel(address, [x], [y, where], [])
    assert status == 1 and message == "copy_on_stream runs in GPU programs"
    state = jaxbind.c_state(lib.placed_setup, lib.placed_teardown)
    with pytest.raises(Exception, match="set up outside a GPU call"):
        state.setup()


def test_the_handlers_count_their_calls_with_python_and_their_kernel_for_cuda_calls(
    clib, enable_x64
):
    """What the GPU benchmark reads to show no Python per call: a CPU kernel's calls after
    its site's first come without Python, a callable's each take it; and each batch
    element of a kernel for CUDA's call is counted."""
    from support.ops import doubling

    k = jaxbind.get_nonlinear_call(
        jaxbind.kernel(clib.where_it_ran), (None, None), _abstract, None,
        name="tests.stream.counted_cpu", replace=True,
    )  # fmt: skip
    callable_op = doubling("tests.stream.counted_callable")
    x = np.arange(4, dtype=np.float32)
    kernel_f, callable_f = jax.jit(lambda x: k(x)[0]), jax.jit(lambda x: callable_op(x)[0])
    jax.block_until_ready((kernel_f(x), callable_f(x)))
    before = _ext.python_entries()
    for _ in range(5):
        jax.block_until_ready(kernel_f(x))
    assert _ext.python_entries() == before
    for _ in range(5):
        jax.block_until_ready(callable_f(x))
    assert _ext.python_entries() == before + 5
    site = _site_on_cuda(_op(clib, "tests.stream.counted"), loop=Loop(1, (True,)))
    xs = np.ones((3, 4), np.float32)
    y, where = np.zeros((3, 4), np.float32), np.zeros((3, 4), np.int64)
    calls = _ext.stream_kernel_calls()
    _ext.gpu_call_for_tests(site, 5, 0, _buffers(xs), _buffers(y, where))
    assert _ext.stream_kernel_calls() == calls + 3
