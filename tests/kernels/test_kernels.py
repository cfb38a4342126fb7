"""Compiled kernels (jaxbind.kernel): every transformation, mixed bodies, the ABI from C,
errors, export, and calls that run without the GIL."""

import ctypes
import pathlib
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random
from support.clib import c_kernel, compile_c_library
from support.dtypes import dtypes_and_x64
from support.ops import same_as_last
from support.processes import run_python
from support.threads import failures_at_once

import jaxbind
from jaxbind._kernels import abi
from jaxbind._kwargs import encode_kwargs

numba = pytest.importorskip("numba")


@jaxbind.kernel
def scale(out, x, factor):
    for i in range(x.size):
        out.flat[i] = factor * x.flat[i]


scale_op = jaxbind.get_linear_call(
    scale, scale, same_as_last, same_as_last, name="tests.kernel_scale"
)


@dtypes_and_x64([np.float32, np.float64, np.complex64], both=False)
def test_linear_kernel_every_transformation(x64, dtype):
    x = random((3, 4), dtype, 1)
    f = lambda x: scale_op(x, factor=2.5)[0]
    np.testing.assert_allclose(f(x), 2.5 * x, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(f)(x), 2.5 * x, rtol=1e-6)
    (t,) = jax.linear_transpose(f, x)(x)
    np.testing.assert_allclose(t, 2.5 * x, rtol=1e-6)
    _, tan = jax.jvp(f, (x,), (x,))
    np.testing.assert_allclose(tan, 2.5 * x, rtol=1e-6)
    xs = random((5, 3, 4), dtype, 2)
    np.testing.assert_allclose(jax.vmap(f)(xs), 2.5 * xs, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(f, in_axes=2)(xs), 2.5 * np.moveaxis(xs, 2, 0), rtol=1e-6)
    if np.dtype(dtype).kind == "f":
        g = jax.grad(lambda x: (f(x) ** 2).sum())(x)
        np.testing.assert_allclose(g, 2 * 2.5**2 * x, rtol=1e-5)


def test_testing_check_runs_a_kernel():
    x = random((6,), np.float32, 3)
    jaxbind.testing.check(scale_op, x, factor=1.5, verbose=False)


@jaxbind.kernel
def _sin(out, x):
    for i in range(x.size):
        out[i] = np.sin(x[i])


@jaxbind.kernel
def _sin_jvp(out, x, t):
    for i in range(x.size):
        out[i] = np.cos(x[i]) * t[i]


def _sin_vjp(out, args, kwargs_dump):  # a Python callable beside kernels
    x, ct = args
    out[0][...] = np.cos(x) * ct


sin_op = jaxbind.get_nonlinear_call(
    _sin, (_sin_jvp, _sin_vjp), same_as_last, name="tests.kernel_sin"
)


def test_nonlinear_with_mixed_bodies():
    x = random((7,), np.float32, 4)
    f = lambda x: sin_op(x)[0]
    np.testing.assert_allclose(jax.jit(f)(x), np.sin(x), rtol=1e-6)
    _, t = jax.jvp(f, (x,), (jnp.ones_like(x),))
    np.testing.assert_allclose(t, np.cos(x), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), np.cos(x), rtol=1e-6)
    xs = random((3, 7), np.float32, 5)
    g = jax.vmap(jax.grad(lambda x: f(x).sum()))(xs)
    np.testing.assert_allclose(g, np.cos(xs), rtol=1e-6)
    assert sin_op.binding.role("f").kind.value == "kernel"
    assert sin_op.binding.role("vjp").kind.value == "callable"


@jaxbind.kernel(batches=True)
def _rowsum(out, x):  # takes the whole batch: the leading axes of out are the batch
    n = x.shape[-1]
    flat = x.reshape(-1, n)
    res = out.reshape(-1)
    for b in range(flat.shape[0]):
        acc = 0.0
        for j in range(n):
            acc += flat[b, j]
        res[b] = acc


rowsum_op = jaxbind.get_linear_call(
    _rowsum, None, lambda x: (((), x.dtype),), name="tests.kernel_rowsum"
)


def test_batching_kernel_gets_the_whole_batch():
    xs = random((4, 3, 5), np.float32, 6)
    got = jax.vmap(jax.vmap(lambda x: rowsum_op(x)[0]))(xs)
    np.testing.assert_allclose(got, xs.sum(-1), rtol=1e-5)


@jaxbind.kernel
def _kwargs_kernel(out, x, n, w, flag, label, table):
    for i in range(x.size):
        out[i] = x[i] * n + w + (1.0 if flag else 0.0) + label.size + table[i % table.size]


kwargs_op = jaxbind.get_linear_call(_kwargs_kernel, None, same_as_last, name="tests.kernel_kwargs")


def test_static_keyword_arguments_of_every_type():
    x = random((4,), np.float64 if jax.config.read("jax_enable_x64") else np.float32, 7)
    table = np.array([1.0, 2.0, 3.0])
    got = jax.jit(lambda x: kwargs_op(x, n=3, w=0.5, flag=True, label="four", table=table)[0])(x)
    want = x * 3 + 0.5 + 1.0 + 4 + table[np.arange(4) % 3]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(Exception, match="tests.kernel_kwargs.*'n' is list"):
        jax.block_until_ready(kwargs_op(x, n=[1], w=0.5, flag=True, label="", table=table))
    masked = np.ma.MaskedArray(table, mask=[False, True, False])
    with pytest.raises(Exception, match="tests.kernel_kwargs.*cannot take the masked array"):
        jax.block_until_ready(kwargs_op(x, n=3, w=0.5, flag=True, label="", table=masked))


@jaxbind.kernel
def _fails(out, x):
    if x[0] < 0:
        raise ValueError("negative")
    out[0] = x[0]


fails_op = jaxbind.get_linear_call(_fails, None, same_as_last, name="tests.kernel_fails")


def test_a_failing_kernel_names_the_binding_and_role():
    assert float(fails_op(jnp.ones(1))[0][0]) == 1.0
    with pytest.raises(Exception, match=r"kernel of 'tests.kernel_fails' \(the function\) failed"):
        jax.block_until_ready(fails_op(-jnp.ones(1)))
    assert float(fails_op(2 * jnp.ones(1))[0][0]) == 2.0  # and the process goes on


def test_native_api_takes_kernels():
    @jaxbind.linear_op(
        shape=lambda x, *, factor: jax.ShapeDtypeStruct(x.shape, x.dtype),
        name="tests.kernel_native",
    )
    @jaxbind.kernel
    def native_scale(out, x, factor):
        for i in range(x.size):
            out[i] = factor * x[i]

    native_scale.def_transpose(scale)
    x = random((5,), np.float32, 8)
    np.testing.assert_allclose(native_scale(x, factor=3.0), 3 * x, rtol=1e-6)
    g = jax.grad(lambda x: native_scale(x, factor=3.0).sum())(x)
    np.testing.assert_allclose(g, np.full(5, 3.0), rtol=1e-6)


def test_kernel_refuses_func_can_batch_and_bad_inputs():
    with pytest.raises(TypeError, match="kernel bodies and func_can_batch"):
        jaxbind.get_linear_call(scale, None, same_as_last, func_can_batch=True, name="tests.kvec")
    with pytest.raises(TypeError, match="needs abi_version"):
        jaxbind.kernel(1234)
    with pytest.raises(ValueError, match="ABI version 99"):
        jaxbind.kernel(1234, abi_version=99)
    with pytest.raises(ValueError, match="address is 0"):
        jaxbind.kernel(0, abi_version=1)
    with pytest.raises(TypeError, match="numba-compilable Python function"):
        jaxbind.kernel("not a function")


def test_many_threads_call_kernels_at_once():
    f = jax.jit(lambda x, k: scale_op(x, factor=2.0)[0] + k)
    xs = [random((64,), np.float32, s) for s in range(8)]

    def work(i):
        for _ in range(50):
            np.testing.assert_allclose(f(xs[i], float(i)), 2 * xs[i] + i, rtol=1e-6)

    assert not failures_at_once(work, 8)


# --- the C ABI from C, through ctypes and as a raw address -------------------------------

_C_SOURCE = r"""
#include <string.h>
#include "jaxbind/kernel.h"

/* out = x + offset (float32); fails with a message for offset < 0 */
int32_t add_offset(const jaxbind_call *call) {
  if (call->abi_version != JAXBIND_KERNEL_ABI_VERSION) return 2;
  double offset = 0;
  for (int64_t k = 0; k < call->n_kwargs; ++k)
    if (strcmp(call->kwargs[k].name, "offset") == 0) offset = call->kwargs[k].float_value;
  if (offset < 0) {
    strncpy(call->error, "offset must not be negative", call->error_size);
    return 1;
  }
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  int64_t n = 1;
  for (int64_t d = 0; d < call->inputs[0].rank; ++d) n *= call->inputs[0].dims[d];
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + (float)offset;
  return 0;
}

/* out = factor * x (float32, any shape): linear, its own transpose */
int32_t scale_f32(const jaxbind_call *call) {
  if (call->abi_version != JAXBIND_KERNEL_ABI_VERSION) return 2;
  if (call->inputs[0].dtype != JAXBIND_FLOAT32 || call->outputs[0].dtype != JAXBIND_FLOAT32) {
    strncpy(call->error, "scale_f32 takes float32", call->error_size);
    return 1;
  }
  double factor = 1;
  for (int64_t k = 0; k < call->n_kwargs; ++k)
    if (strcmp(call->kwargs[k].name, "factor") == 0) factor = call->kwargs[k].float_value;
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  int64_t n = 1;
  for (int64_t d = 0; d < call->inputs[0].rank; ++d) n *= call->inputs[0].dims[d];
  for (int64_t i = 0; i < n; ++i) y[i] = (float)factor * x[i];
  return 0;
}

/* Returns the int keyword argument `status` (default -1) and writes no message. */
int32_t fails_silently(const jaxbind_call *call) {
  int64_t status = -1;
  for (int64_t k = 0; k < call->n_kwargs; ++k)
    if (strcmp(call->kwargs[k].name, "status") == 0) status = call->kwargs[k].int_value;
  return (int32_t)status;
}

/* Waits (up to about 10 s) until the int at address `flag` is set by another thread,
   then writes 1: it can only succeed if its caller does not hold the GIL. */
int32_t wait_for_flag(const jaxbind_call *call) {
  volatile int *flag = 0;
  for (int64_t k = 0; k < call->n_kwargs; ++k)
    if (strcmp(call->kwargs[k].name, "flag") == 0)
      flag = (volatile int *)(uintptr_t)call->kwargs[k].int_value;
  for (long spin = 0; flag && !*flag && spin < 2000000000L; ++spin) {}
  ((float *)call->outputs[0].data)[0] = flag && *flag ? 1.0f : 0.0f;
  return 0;
}
"""


@pytest.fixture(scope="module")
def clib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "k", _C_SOURCE)


def test_c_kernel_through_ctypes_and_raw_address(clib):
    assert (pathlib.Path(jaxbind.kernel_include_dir()) / "jaxbind" / "kernel.h").exists()
    by_ctypes = jaxbind.kernel(clib.add_offset)
    address = ctypes.cast(clib.add_offset, ctypes.c_void_p).value
    raw = jaxbind.kernel(address, abi_version=abi.ABI_VERSION, name="add_offset")
    for i, k in enumerate((by_ctypes, raw)):
        op = jaxbind.get_linear_call(k, None, same_as_last, name=f"tests.kernel_c{i}")
        x = random((2, 3), np.float32, 9)
        np.testing.assert_allclose(jax.jit(lambda x: op(x, offset=1.5)[0])(x), x + 1.5)
        np.testing.assert_allclose(jax.vmap(lambda x: op(x, offset=0.5)[0])(x), x + 0.5)
        with pytest.raises(Exception, match="kernel_c.*failed: offset must not be negative"):
            jax.block_until_ready(op(x, offset=-1.0))


@pytest.mark.parametrize("how", ["ctypes", "cffi", "raw address"])
def test_c_kernel_of_each_kind_under_every_transformation(clib, how):
    k = c_kernel(clib, how, "scale_f32")
    op = jaxbind.get_linear_call(
        k, k, same_as_last, same_as_last, name=f"tests.kernel_c_{how.replace(' ', '_')}"
    )
    f = lambda x: op(x, factor=3.0)[0]
    x = random((3, 4), np.float32, 11)
    np.testing.assert_allclose(jax.jit(f)(x), 3 * x, rtol=1e-6)
    np.testing.assert_allclose(jax.jvp(f, (x,), (x,))[1], 3 * x, rtol=1e-6)
    np.testing.assert_allclose(jax.linear_transpose(f, x)(x)[0], 3 * x, rtol=1e-6)
    g = jax.jit(jax.grad(lambda x: (f(x) ** 2).sum()))(x)
    np.testing.assert_allclose(g, 18 * x, rtol=1e-5)
    xs = random((2, 3, 4), np.float32, 12)
    np.testing.assert_allclose(jax.vmap(f, in_axes=1)(xs), 3 * np.moveaxis(xs, 1, 0), rtol=1e-6)
    np.testing.assert_allclose(jax.hessian(lambda x: f(x).sum())(x[0]), 0 * np.eye(4))
    exp = jax.export.deserialize(jaxbind.export(jax.grad(lambda x: f(x).sum()))(x).serialize())
    np.testing.assert_allclose(exp.call(x), np.full_like(x, 3.0))
    jaxbind.testing.check(op, x, factor=3.0, verbose=False)
    with pytest.raises(Exception, match="kernel_c_.*scale_f32 takes float32"):
        jax.block_until_ready(op(jnp.ones(3, jnp.int32), factor=1.0))


_ORIGINS = {
    "ctypes": "ctypes function",
    "cffi": "cffi function",
    "raw address": "kernel at a raw address",
    "numba cfunc": "numba cfunc",
}


@pytest.mark.parametrize("how", list(_ORIGINS))
def test_a_kernel_that_fails_without_a_message_is_named_for_what_it_is(clib, how):
    if how == "numba cfunc":

        @numba.cfunc(numba.types.int32(numba.types.voidptr))
        def fails_silently(call):
            return -1

        k, statuses = jaxbind.kernel(fails_silently), (-1,)
    else:
        k, statuses = c_kernel(clib, how, "fails_silently"), (-1, 3)
    name = f"tests.silent_{how.replace(' ', '_')}"
    op = jaxbind.get_linear_call(k, None, same_as_last, name=name)
    x = np.ones(4, np.float32)
    for status in statuses:
        kw = {} if how == "numba cfunc" else {"status": status}
        expected = (
            rf"kernel of '{name}' \(the function\)(, batched)? failed: the {_ORIGINS[how]} "
            rf"returned status {status} without writing a message into call->error(\n|$)"
        )
        f = lambda x: op(x, **kw)[0]
        for route, arg in ((f, x), (jax.jit(f), x), (jax.vmap(f), np.stack([x, x]))):
            with pytest.raises(Exception, match=expected) as raised:
                jax.block_until_ready(route(arg))
            assert "numba kernel raised" not in str(raised.value)
        with pytest.raises(RuntimeError, match=f"the {_ORIGINS[how]} returned status {status}"):
            k((np.empty(4, np.float32),), (x,), encode_kwargs(kw))


def test_crafted_calls_never_reach_a_kernel_with_wrong_buffers(clib):
    """A program is a file: one that names a kernel op with buffers its abstract function
    does not declare, or names no registered op, fails with an error naming it, and the
    kernel never sees the buffers (it would read or write out of bounds)."""
    from jaxbind import _definition
    from jaxbind._callformat import NO_LOOP, CallAttributes
    from jaxbind._kwargs import encode_kwargs
    from jaxbind._rules.lowering import CPU_TARGET

    k = jaxbind.kernel(clib.scale_f32)
    op = jaxbind.get_linear_call(k, k, same_as_last, same_as_last, name="tests.kernel_crafted")
    cases = [  # (binding, inputs, outputs)
        ("tests.kernel_crafted", [((4,), np.float32)], [((64,), np.float32)]),  # bigger out
        # another width of the declared kind: let through by the trampoline (x64 may be
        # off on XLA's thread), refused by the kernel, which checks its element types
        ("tests.kernel_crafted", [((4,), np.float32)], [((4,), np.float64)]),
        ("tests.kernel_crafted", [], [((4,), np.float32)]),  # no input
        ("tests.no_such_kernel_op", [((4,), np.float32)], [((4,), np.float32)]),
    ]
    for name, ins, outs in cases:
        n = len(ins)
        found = jaxbind._binding.lookup(name)
        record = "{}" if found is None else _definition.record(found.options, False)
        attrs = CallAttributes.of_call(
            name, "f", encode_kwargs({"factor": 2.0}).blob, NO_LOOP, n, 0, definition=record
        ).ffi_attributes()
        call = jax.ffi.ffi_call(CPU_TARGET, [jax.ShapeDtypeStruct(s, d) for s, d in outs])
        args = [np.ones(s, d) for s, d in ins]
        with pytest.raises(Exception, match=f"jaxbind.*{name}") as info:
            jax.block_until_ready(jax.jit(lambda *a: call(*a, **attrs))(*args))
        assert ("no binding named" in str(info.value)) == ("no_such" in name)
    x = np.arange(4, dtype=np.float32)  # the op itself still runs
    np.testing.assert_allclose(jax.jit(lambda x: op(x, factor=2.0)[0])(x), 2 * x)


def test_a_kernel_keeps_its_library_loaded_after_the_user_drops_it(clib):
    """cffi closes a library when its object is collected; the binding keeps it loaded (a
    call through an unmapped kernel would crash the process: hence the subprocess)."""
    pytest.importorskip("cffi")
    script = textwrap.dedent(
        f"""
        import gc, cffi, jax, jax.numpy as jnp, numpy as np, jaxbind
        ffi = cffi.FFI()
        ffi.cdef("int32_t scale_f32(const void *call);")
        lib = ffi.dlopen({clib._name!r})
        k = jaxbind.kernel(lib.scale_f32)
        op = jaxbind.get_linear_call(k, None, lambda x, **kw: ((x.shape, x.dtype),), name="t.lib")
        f = jax.jit(lambda x: op(x, factor=2.0)[0])
        f(jnp.ones(3))
        del lib, ffi, k
        gc.collect()
        print(f(jnp.ones(3)).tolist(), op(jnp.ones(2), factor=3.0)[0].tolist())
        """
    )
    proc = run_python("-c", script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-2] == "[2.0, 2.0, 2.0] [3.0, 3.0]"


@jaxbind.kernel
def _rank_and_value(out, x, k):  # what the kernel sees: ranks, and the values
    if x.ndim == 0 and k.ndim == 0:
        out[()] = 100.0 + x[()] + k[()]
    else:
        out[()] = -1.0


def test_zero_dimensional_buffers_and_kwargs_stay_zero_dimensional():
    op = jaxbind.get_linear_call(
        _rank_and_value, None, lambda x, **kw: (((), x.dtype),), name="tests.kernel_rank0"
    )
    x, k = np.float32(2.0), np.array(3.0)
    assert float(jax.jit(lambda x: op(x, k=k)[0])(x)) == 105.0
    assert float(op(x, k=k)[0]) == 105.0
    out = np.zeros((), np.float32)  # from Python, as jaxbind.testing.check runs it
    _rank_and_value((out,), (np.asarray(x),), jaxbind._kwargs.encode_kwargs({"k": k}))
    assert float(out) == 105.0


def test_a_site_made_twice_without_a_slot_stays_one():
    """Two threads' first calls of one site where no slot keeps its Instance (the
    execute-only door) may both make it: they must end up with the same site, or the one
    the trampoline forgets stays alive in another thread's frame after replace=True (and
    keeps calling the replaced kernel)."""
    from jaxbind import _definition
    from jaxbind._callformat import NO_LOOP, CallAttributes
    from jaxbind._kwargs import encode_kwargs
    from jaxbind._runtime.sites import instantiate_site

    op = jaxbind.get_linear_call(scale, None, same_as_last, name="tests.kernel_made_twice")
    record = _definition.record(op.binding.options, False)
    blob = encode_kwargs({"factor": 2.0}).blob
    call = CallAttributes.of_call(op.name, "f", blob, NO_LOOP, 1, 0, definition=record)
    found = {"jaxbind_format": call.format, "binding": call.binding, "role": call.role}
    found.update(kwargs=call.kwargs, site=call.digest, loop_levels=call.levels)
    found.update(loop_batched=call.flags, n_fixed=call.n_fixed, trees=call.trees)
    found.update(definition=call.definition, platform="cpu", slot=False)
    first, owned = instantiate_site(found)
    second, owned_again = instantiate_site(found)
    assert first is second and not owned and not owned_again
    assert op.binding.sites.live()[call.digest] is first
    assert op.binding.sites.owners()[id(first)] == ["orphans"]


def test_cffi_function_pointer(clib):
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef("int32_t add_offset(const void *call);")
    lib = ffi.dlopen(clib._name)
    op = jaxbind.get_linear_call(
        jaxbind.kernel(lib.add_offset), None, same_as_last, name="tests.kcffi"
    )
    x = random((4,), np.float32, 10)
    np.testing.assert_allclose(op(x, offset=2.0)[0], x + 2.0)


def test_kernels_run_without_the_gil(clib):
    """The kernel spins until a Python thread sets a flag: that thread runs only if the
    handler released the GIL (held, the kernel gives up after ~10 s and writes 0)."""
    op = jaxbind.get_linear_call(
        jaxbind.kernel(clib.wait_for_flag),
        None,
        lambda x, **k: (((1,), x.dtype),),
        name="tests.kernel_gil",
    )
    flag = np.zeros(1, np.int32)
    f = jax.jit(lambda x: op(x, flag=flag.ctypes.data)[0])
    flag[0] = 1
    jax.block_until_ready(f(jnp.ones(1)))  # compiled and checked (this call holds the GIL)
    flag[0] = 0
    setter = threading.Timer(0.2, lambda: flag.__setitem__(0, 1))
    setter.start()
    out = f(jnp.ones(1))  # the known-signature path: no GIL
    setter.join()
    assert float(out[0]) == 1.0


# --- export: kernels are found by name in the loading process ------------------------------

_EXPORTER = """
import sys, numpy as np, jax, jaxbind
sys.path.insert(0, {tests!r})

@jaxbind.kernel
def scale(out, x, factor):
    for i in range(x.size):
        out.flat[i] = factor * x.flat[i]

def _same(*avals, **kwargs):
    return ((avals[-1].shape, avals[-1].dtype),)

op = jaxbind.get_linear_call(scale, scale, _same, _same, name="tests.kernel_export")
"""


def test_exported_program_finds_its_kernel_by_name(tmp_path):
    tests = str(pathlib.Path(__file__).parent)
    ns: dict = {}
    exec(_EXPORTER.format(tests=tests), ns)
    fn = jax.grad(lambda x: (ns["op"](x, factor=3.0)[0] ** 2).sum())
    blob = jaxbind.export(fn)(np.ones(4, np.float32)).serialize()
    assert b"0x" not in blob  # no address in the artifact
    (tmp_path / "k.bin").write_bytes(blob)
    script = _EXPORTER.format(tests=tests) + textwrap.dedent(
        f"""
        exp = jax.export.deserialize(open({str(tmp_path / "k.bin")!r}, "rb").read())
        print(exp.call(np.arange(4, dtype=np.float32)).tolist())
        """
    )
    proc = run_python("-c", script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str([18.0 * i for i in range(4)])
    missing = textwrap.dedent(
        f"""
        import jax, numpy as np, jaxbind
        exp = jax.export.deserialize(open({str(tmp_path / "k.bin")!r}, "rb").read())
        try:
            exp.call(np.ones(4, np.float32))
        except Exception as e:
            print("ERROR", e)
        """
    )
    proc = run_python("-c", missing)
    assert "no binding named 'tests.kernel_export' is registered" in proc.stdout


@jaxbind.kernel
def _add_one_in_place(out, x):
    for i in range(out.size):
        out[i] += 1.0  # out shares x's memory (input_output_aliases)


def test_aliasing_and_side_effects_with_kernels():
    op = jaxbind.get_linear_call(
        _add_one_in_place,
        None,
        same_as_last,
        input_output_aliases={0: 0},
        has_side_effect=True,
        name="tests.kernel_inplace",
    )
    x = jnp.arange(4.0, dtype=jnp.float32)
    np.testing.assert_allclose(jax.jit(lambda x: op(x)[0])(x), np.arange(4.0) + 1)
    jax.jit(lambda x: (op(x), None)[1])(x)  # kept although its result is unused
    ordered = jaxbind.get_linear_call(
        scale, None, same_as_last, ordered=True, name="tests.kordered"
    )
    f = jax.jit(lambda x: ordered(x, factor=2.0)[0] + ordered(x, factor=3.0)[0])
    for _ in range(3):  # the token is not a buffer of the kernel's (fast path included)
        np.testing.assert_allclose(f(x), 5 * np.arange(4.0))


def test_symbolic_export_of_a_kernel_op():
    (n,) = jax.export.symbolic_shape("n")
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    exp = jaxbind.export(lambda x: scale_op(x, factor=4.0)[0])(spec)
    for size in (3, 7):
        x = random((size,), np.float32, size)
        np.testing.assert_allclose(exp.call(x), 4 * x, rtol=1e-6)


# --- inputs are read-only (issue 36) ---------------------------------------------------

_INPUT_WRITES = {
    "flat": "x.flat[0] = 9.0",
    "index": "x[0] = 9.0",
    "slice": "x[:] = 9.0",
    "fill": "x.fill(9.0)",
    "reshaped view": "x.reshape(-1)[0] = 9.0",
    "transposed view": "x.T[0] = 9.0",
    "ufunc out=": "np.add(x, 1.0, x)",
    "in-place operator": "x += 1.0",
    "np.nditer": "for v in np.nditer(x):\n        v[()] = 9.0",
    "inner njit function": "_write_first(x)",
    "np.ascontiguousarray": "np.ascontiguousarray(x)[0] = 9.0",
    "np.asfortranarray": "np.asfortranarray(x)[0] = 9.0",
    "np.ascontiguousarray in an inner njit function": "_contiguous(x)[0] = 9.0",
    "np.dot(a, b, out)": "np.dot(np.ones((6, 6), np.float32), out, x)",
}


def _write_first(a):
    a[0] = 9.0


@numba.njit
def _contiguous(a):
    return np.ascontiguousarray(a)


def _writing_kernel(route):
    """A kernel that fills its output, then writes its input by `route`."""
    env = {"np": np, "_write_first": numba.njit(_write_first), "_contiguous": _contiguous}
    exec(f"def writes(out, x):\n    out[:] = 1.0\n    {_INPUT_WRITES[route]}\n", env)
    return jaxbind.kernel(env["writes"], name=f"writes by {route}")


@pytest.mark.parametrize("route", list(_INPUT_WRITES))
def test_numba_kernel_writing_its_input_is_a_compile_error(route):
    op = jaxbind.get_nonlinear_call(
        _writing_kernel(route), (None, None), same_as_last, name=f"tests.writes_input_{route}"
    )
    x = jnp.arange(6.0, dtype=jnp.float32)
    for call in (op, jax.jit(op)):
        with pytest.raises(Exception, match=r"'tests.writes_input_.*' \(the function\).*read-only"):
            jax.block_until_ready(call(x))
        np.testing.assert_array_equal(x, np.arange(6.0))  # the JAX array is unchanged


# numba returns an array that already has the layout asked for itself (typed writable)
_LAYOUT_WRITES = {
    "0-d, C": ((), "np.ascontiguousarray(x)[0] = 9.0"),
    "0-d, F": ((), "np.asfortranarray(x)[0] = 9.0"),
    "2-d, C": ((2, 3), "np.ascontiguousarray(x)[0, 0] = 9.0"),
    "2-d transposed, F": ((2, 3), "np.asfortranarray(x.T)[0, 0] = 9.0"),
    "a row, C": ((2, 3), "np.ascontiguousarray(x[1])[0] = 9.0"),
    "2-d, C, reshaped": ((2, 3), "np.ascontiguousarray(x).reshape(-1)[0] = 9.0"),
}


@pytest.mark.parametrize("route", list(_LAYOUT_WRITES))
def test_layout_conversions_of_an_input_stay_read_only(route):
    shape, write = _LAYOUT_WRITES[route]
    env = {"np": np}
    exec(f"def writes(out, x):\n    out[...] = 1.0\n    {write}\n", env)
    op = jaxbind.get_linear_call(
        jaxbind.kernel(env["writes"]), None, same_as_last, name=f"tests.layout_write_{route}"
    )
    x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
    with pytest.raises(Exception, match=r"\(the function\).*it writes into an input"):
        jax.block_until_ready(jax.jit(lambda x: op(x)[0])(x))
    np.testing.assert_array_equal(x, np.arange(np.prod(shape)).reshape(shape))


def test_layout_conversions_and_dot_still_read_inputs_and_write_outputs():
    @jaxbind.kernel
    def reads(out, x):
        np.dot(np.ascontiguousarray(x), np.eye(x.shape[1], dtype=x.dtype), out)  # out = x
        out += np.asfortranarray(x.T).T

    op = jaxbind.get_linear_call(reads, None, same_as_last, name="tests.layout_reads")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(jax.jit(lambda x: op(x)[0])(x), 2 * x)


def test_a_write_through_an_input_s_address_is_the_route_left_and_testing_check_finds_it():
    """numba cannot see what a foreign function does with an address (``x.ctypes.data``):
    the route docs/kernels.md names as open, which testing.check's inputs row catches."""
    memset = ctypes.CDLL(None).memset
    memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    memset.restype = ctypes.c_void_p

    @jaxbind.kernel
    def zeroes_its_input(out, x):
        out[:] = x
        memset(x.ctypes.data, 0, x.nbytes)

    op = jaxbind.get_linear_call(zeroes_its_input, None, same_as_last, name="tests.by_address")
    with pytest.raises(AssertionError, match="inputs unchanged"):
        jaxbind.testing.check(op, np.arange(1.0, 7.0, dtype=np.float32), verbose=False)


# --- a kernel's function writes its results, and returns nothing (issue 46) -----------------


def _returns_double(out, x):
    return 2 * x


def _returns_on_one_path(out, x):
    if x.shape[0] > 100:
        return 1
    out[:] = x


def _range_returns(begin, end, out, x):
    for i in range(begin, end):
        out[i] = x[i]
    return end


_RETURNING = {
    "a result": lambda: jaxbind.kernel(_returns_double),
    "a value on one path": lambda: jaxbind.kernel(_returns_on_one_path),
    "@njit": lambda: jaxbind.kernel(numba.njit(_returns_double)),
    "over ranges": lambda: jaxbind.kernel(_range_returns, ranges=lambda out, x: x.shape[0]),
}


@pytest.mark.parametrize("what", list(_RETURNING))
def test_a_kernel_that_returns_its_result_is_refused_when_compiled(what):
    k = _RETURNING[what]()
    name = f"tests.returns_{what.replace(' ', '_')}"
    op = jaxbind.get_linear_call(k, k, same_as_last, same_as_last, name=name)
    x = np.arange(4, dtype=np.float32)
    message = (
        r"kernel \S+ returns a value \(.+\) instead of writing its results: a kernel's "
        r"function writes each result into its output argument \(out\), as in "
        r"out\[\.\.\.\] = 2 \* x, and returns nothing"
    )
    with pytest.raises(Exception, match=rf"'{name}' \(the function\): {message}"):
        jax.block_until_ready(jax.jit(lambda x: op(x)[0])(x))
    with pytest.raises(Exception, match=rf"'{name}' \(the transpose\): {message}"):
        jax.linear_transpose(lambda x: op(x)[0], x)(x)
    with pytest.raises(TypeError, match=message):
        k((np.empty(4, np.float32),), (x,), None)


def test_a_native_kernel_that_returns_its_result_is_refused_when_compiled():
    @jaxbind.linear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.returns_native"
    )
    @jaxbind.kernel
    def doubled(out, x):
        return 2 * x

    with pytest.raises(Exception, match=r"'tests.returns_native' \(the function\): kernel "):
        jax.block_until_ready(doubled(np.ones(3, np.float32)))


def test_the_example_of_issue_36_no_longer_changes_a_jax_array():
    @jaxbind.kernel
    def k(x, out, a):  # outputs come first: `x` is the output, `out` the input
        for i in range(out.size):
            out.flat[i] = 7.0
            x.flat[i] = a * out.flat[i]

    op = jaxbind.get_linear_call(k, k, same_as_last, same_as_last, name="tests.issue36_example")
    x = jnp.arange(6.0, dtype=jnp.float32)
    with pytest.raises(Exception, match=r"the outputs are \(x\) and the inputs \(out\)"):
        jax.block_until_ready(op(x, a=3.0))
    # the transpose is the same kernel, reached by another rule
    with pytest.raises(Exception, match=r"'tests.issue36_example' \(the transpose\).*read-only"):
        jax.linear_transpose(lambda v: op(v, a=3.0)[0], x)(x)
    np.testing.assert_array_equal(x, np.arange(6.0))


def test_array_keyword_arguments_are_read_only_in_numba_kernels():
    @jaxbind.kernel
    def writes_weights(out, x, w):
        w[0] = 0.0
        out[:] = x * w

    op = jaxbind.get_nonlinear_call(
        writes_weights, (None, None), same_as_last, name="tests.ro_kwarg"
    )
    w = np.ones(4, np.float32)
    with pytest.raises(Exception, match="read-only"):
        jax.block_until_ready(op(jnp.ones(4, jnp.float32), w=w))
    np.testing.assert_array_equal(w, 1.0)


def test_numba_kernels_still_write_their_outputs_every_way():
    @jaxbind.kernel
    def writes_out(out, x):
        out[:] = x
        out += 1.0
        out.flat[0] = 5.0
        for v in np.nditer(out):
            v[()] = v[()] * 2.0

    op = jaxbind.get_nonlinear_call(writes_out, (None, None), same_as_last, name="tests.rw_outputs")
    x = np.arange(4.0, dtype=np.float32)
    expected = 2 * (x + 1)
    expected[0] = 10.0
    np.testing.assert_array_equal(op(jnp.asarray(x))[0], expected)


# --- keyword arguments of numba kernels (issue 36) --------------------------------------


@jaxbind.kernel
def _scaled(out, x, a=2.0):
    for i in range(x.size):
        out.flat[i] = a * x.flat[i]


def test_keyword_argument_a_numba_kernel_does_not_take_is_a_trace_time_error():
    op = jaxbind.get_linear_call(_scaled, _scaled, same_as_last, same_as_last, name="tests.kw_typo")
    x = jnp.ones(3, jnp.float32)
    np.testing.assert_array_equal(op(x, a=3.0)[0], 3.0)
    np.testing.assert_array_equal(op(x)[0], 2.0)  # a default stays a default
    expected = r"'tests.kw_typo' \(the function\).*keyword argument 'aa'.*neither kernel"
    with pytest.raises(TypeError, match=expected):
        op(x, aa=5.0)
    with pytest.raises(TypeError, match=expected):
        jax.jit(lambda x: op(x, aa=5.0))(x)
    with pytest.raises(TypeError, match=expected):  # no program was run: trace time
        jax.jit(lambda x: op(x, aa=5.0)).lower(x)

    # a Python callable takes any keyword argument; its transpose kernel does not
    def f(out, args, kwargs):
        out[0][...] = args[0]

    mixed = jaxbind.get_linear_call(f, _scaled, same_as_last, same_as_last, name="tests.kw_typo_T")
    np.testing.assert_array_equal(mixed(x, aa=5.0)[0], 1.0)
    with pytest.raises(TypeError, match=r"'tests.kw_typo_T' \(the transpose\).*'aa'"):
        jax.linear_transpose(lambda v: mixed(v, aa=5.0)[0], x)(x)


def test_keyword_argument_a_native_kernel_op_does_not_take_is_an_error():
    @jaxbind.nonlinear_op(
        shape=lambda x, **kw: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.kw_native"
    )
    @jaxbind.kernel
    def native(out, x, factor):
        out[:] = factor * x

    x = jnp.ones(3, jnp.float32)
    np.testing.assert_array_equal(native(x, factor=2.0), 2.0)
    with pytest.raises(TypeError, match=r"'tests.kw_native'.*'fctor'.*neither kernel"):
        native(x, factor=2.0, fctor=3.0)
    with pytest.raises(TypeError, match=r"'tests.kw_native'.*takes keyword argument 'factor'"):
        native(x)


def test_keyword_argument_only_a_shape_function_takes_need_not_reach_the_kernel():
    @jaxbind.kernel
    def fill(out, x):
        out[:] = x[0]

    def shape(x, *, n, **kwargs):  # `n` sets the output's size; the kernel reads it from `out`
        return (((n,), x.dtype),)

    op = jaxbind.get_nonlinear_call(fill, (None, None), shape, name="tests.kw_shape_only")
    np.testing.assert_array_equal(op(jnp.ones(2, jnp.float32), n=4)[0], np.ones(4))
    with pytest.raises(TypeError, match=r"'m', which neither kernel .*fill nor"):
        op(jnp.ones(2, jnp.float32), n=4, m=1)  # a name neither takes is still an error


# --- @numba.njit functions are kernels (issue 36) ----------------------------------------


def test_njit_function_is_a_kernel_with_its_options():
    @jaxbind.kernel
    @numba.njit(fastmath=True)
    def fast(out, x, a):
        for i in range(x.size):
            out[i] = a * x[i]

    op = jaxbind.get_linear_call(fast, fast, same_as_last, same_as_last, name="tests.njit_kernel")
    x = random((5,), np.float32, 4)
    np.testing.assert_allclose(op(x, a=2.0)[0], 2 * x, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: op(x, a=2.0)[0].sum())(x), 2.0, rtol=1e-6)

    # boundscheck=True is kept: reading past the end fails instead of reading memory
    @jaxbind.kernel
    @numba.njit(boundscheck=True)
    def past_the_end(out, x):
        out[0] = x[x.size]

    checked = jaxbind.get_nonlinear_call(
        past_the_end, (None, None), same_as_last, name="tests.njit_bc"
    )
    with pytest.raises(Exception, match=r"'tests.njit_bc' \(the function\) failed"):
        jax.block_until_ready(checked(jnp.ones(3, jnp.float32)))


def test_numba_jit_in_object_mode_is_refused_with_what_to_pass():
    with pytest.raises(TypeError, match=r"object mode.*Use @numba.njit"):
        jaxbind.kernel(numba.jit(forceobj=True)(lambda out, x: None))


def test_abi_layout_table_is_the_headers():
    """One table of the ABI's layout (jaxbind/_kernels/abi.py): the header declares each
    struct's fields in the table's order, each one 8-byte word (a kwarg's array a whole
    jaxbind_buffer); the packing and the numba code generator read the same table."""
    import re

    header = (pathlib.Path(jaxbind.kernel_include_dir()) / "jaxbind" / "kernel.h").read_text()
    header = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    for struct in (abi.BUFFER, abi.KWARG, abi.CALL, abi.SETUP):
        body = re.search(rf"typedef struct {struct.name} \{{(.*?)\}}", header, re.S).group(1)
        assert tuple(re.findall(r"(\w+)\s*;", body)) == struct.fields, struct.name
    assert f"#define JAXBIND_KERNEL_ABI_VERSION {abi.ABI_VERSION}" in header
    assert abi.KWARG["array.dims"] == abi.KWARG["array"] + abi.BUFFER["dims"]
    assert (abi.BUFFER.words, abi.KWARG.words, abi.CALL.words, abi.SETUP.words) == (4, 10, 18, 8)
    platforms = dict(re.findall(r"JAXBIND_PLATFORM_(\w+) = (\d+)", header))
    assert {k.lower(): int(v) for k, v in platforms.items()} == abi.PLATFORMS


def test_a_keyword_argument_a_kernel_cannot_take_names_the_binding_once():
    op = jaxbind.get_linear_call(
        scale, None, lambda x, *, n, **kw: ((x.shape, x.dtype),), name="tests.kernel_tuple_kwarg"
    )
    x = np.ones(3, np.float32)
    with pytest.raises(Exception, match="'n' is tuple") as info:
        jax.block_until_ready(jax.jit(lambda x: op(x, factor=2.0, n=(3,))[0])(x))
    assert str(info.value).count("tests.kernel_tuple_kwarg") == 1, str(info.value)


# --- the generated source (issue 46) -------------------------------------------------------


def _user_calls_outside_a_guard(text: str) -> list:
    """The calls of the user's functions (`user`, `ranges`) in `text` that no ``try`` block
    holds (whose handlers all return), and the functions that do not end in ``return 0``."""
    import ast

    tree = ast.parse(text)
    found = [
        f"{fn.name}: does not end in return 0"
        for fn in tree.body
        if not (isinstance(fn.body[-1], ast.Return) and ast.literal_eval(fn.body[-1].value) == 0)
    ]
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and all(
            h.body and isinstance(h.body[-1], ast.Return) for h in node.handlers
        ):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("user", "ranges"):
            if id(node) not in guarded:
                found.append(ast.unparse(node))
    return found


def _range_kernel(begin, end, out, x, a=1.0, w=None):
    for i in range(begin, end):
        out[i % out.shape[0]] += a * x[i]


@pytest.mark.parametrize("form", ["plain", "over ranges", "reduction"])
def test_every_generated_function_runs_the_user_s_code_inside_the_error_guard(form):
    from jaxbind._kernels.numba_codegen import sources

    if form == "plain":
        k = jaxbind.kernel(lambda out, x, a=1.0, w=None: None)
    else:
        reduction = "sum" if form == "reduction" else None
        k = jaxbind.kernel(_range_kernel, ranges=lambda out, x: x.shape[0], reduction=reduction)
    f32 = 11  # XLA's float32
    values = {"a": 2.0, "w": np.ones(3, np.float32)}
    texts, dtypes = sources(k, [(0, (7,), f32)], [(0, (), f32)], values, "test")
    assert set(texts) == ({"wrapper"} if form == "plain" else {"wrapper", "task"})
    assert {"t_o0", "t_i0", "t_k1"} <= set(dtypes)
    for name, text in texts.items():
        assert _user_calls_outside_a_guard(text.text()) == [], (name, text.text())
    every = "".join(t.text() for t in texts.values())
    assert "user(" in every and ("ranges(" in every) == (form != "plain")
    # the check itself sees an unguarded call, and the builder refuses to write one
    assert _user_calls_outside_a_guard("def f(call):\n    user(1)\n    return 0\n")
    from jaxbind._kernels.source import Source

    src = Source()
    with src.function("f", "call"):
        with pytest.raises(ValueError, match="calls user code outside a guard"):
            src("count = ranges(o0)")
        with src.guarded("return -1"):
            src("count = ranges(o0)")
    assert _user_calls_outside_a_guard(src.text()) == []
