"""Kernels on XLA's threads (issue 39): the ABI's parallel_for (version 2) and version 1
kernels beside it, numba kernels over ranges (with and without reduction="sum"), and the
parallel batch loop under vmap, ordered calls kept in order; under jit, grad, vmap,
export and testing.check, and with several Python threads calling at once. (shard_map:
tests/sharding/sharding_cases.py.)"""

import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random
from support.clib import compile_c_library
from support.ops import same_as_last
from support.threads import failures_at_once

import jaxbind
from jaxbind._kernels.abi import ABI_VERSION
from jaxbind.testing import check

numba = pytest.importorskip("numba")

_C_SOURCE = r"""
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "jaxbind/kernel.h"

static int64_t size_of(const jaxbind_buffer *b) {
  int64_t n = 1;
  for (int64_t d = 0; d < b->rank; ++d) n *= b->dims[d];
  return n;
}

static double kwarg(const jaxbind_call *call, const char *name, double otherwise) {
  for (int64_t k = 0; k < call->n_kwargs; ++k)
    if (strcmp(call->kwargs[k].name, name) == 0) return call->kwargs[k].float_value;
  return otherwise;
}

/* Version 1: out = 2 x, reading only the fields of version 1; refuses to run as any
   other version. */
int32_t v1_double(const jaxbind_call *call) {
  if (call->abi_version != 1) {
    snprintf(call->error, call->error_size, "called as version %ld", (long)call->abi_version);
    return 1;
  }
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  for (int64_t i = 0, n = size_of(&call->inputs[0]); i < n; ++i) y[i] = 2.0f * x[i];
  return 0;
}

struct scaling {
  const float *x;
  float *y;
  int64_t n, tasks;
  float factor;
};

static int32_t scale_task(void *context, int64_t t) {
  struct scaling *s = (struct scaling *)context;
  if (s->factor < 0) return 7;
  for (int64_t i = s->n * t / s->tasks; i < s->n * (t + 1) / s->tasks; ++i)
    s->y[i] = s->factor * s->x[i];
  return 0;
}

/* Version 2: out = factor * x, in 4 tasks per thread through parallel_for; a negative
   factor fails every task, and the kernel reports it. */
int32_t parallel_scale(const jaxbind_call *call) {
  if (call->abi_version != 2 || call->n_threads < 1 || call->parallel_for == 0) return 2;
  struct scaling s = {(const float *)call->inputs[0].data, (float *)call->outputs[0].data,
                      size_of(&call->inputs[0]), 4 * call->n_threads,
                      (float)kwarg(call, "factor", 1.0)};
  int32_t status = call->parallel_for(call, s.tasks, scale_task, &s);
  if (status != 0)
    snprintf(call->error, call->error_size, "a task failed with status %d", (int)status);
  return status;
}

/* out (int32, 0-d) = the threads the kernel is told of */
int32_t report_threads(const jaxbind_call *call) {
  *(int32_t *)call->outputs[0].data = (int32_t)call->n_threads;
  return 0;
}

static int64_t started = 0;

/* Busy for `ms` milliseconds; out (int32, 2 values) = (the order in which the call
   started, the thread it ran on, hashed). */
int32_t busy_sequence(const jaxbind_call *call) {
  int32_t *out = (int32_t *)call->outputs[0].data;
  out[0] = (int32_t)__atomic_fetch_add(&started, 1, __ATOMIC_SEQ_CST);
  uint64_t id = (uint64_t)(uintptr_t)pthread_self();
  out[1] = (int32_t)(id ^ (id >> 32) ^ (id >> 16));
  double ms = kwarg(call, "ms", 1.0);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do clock_gettime(CLOCK_MONOTONIC, &t);
  while ((t.tv_sec - t0.tv_sec) * 1e3 + (t.tv_nsec - t0.tv_nsec) * 1e-6 < ms);
  return 0;
}
"""


@pytest.fixture(scope="module")
def clib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "threads", _C_SOURCE)


# --- the C ABI: version 1 beside version 2 --------------------------------------------


def test_version_1_kernel_is_called_as_version_1(clib):
    op = jaxbind.get_linear_call(
        jaxbind.kernel(clib.v1_double, abi_version=1),
        None,
        same_as_last,
        name="tests.threads_v1",
    )
    x = random((3, 5), np.float32, 1)
    np.testing.assert_allclose(jax.jit(lambda x: op(x)[0])(x), 2 * x)
    np.testing.assert_allclose(jax.vmap(lambda x: op(x)[0])(x), 2 * x)
    as_v2 = jaxbind.get_linear_call(
        jaxbind.kernel(clib.v1_double), None, same_as_last, name="tests.threads_v1_as_v2"
    )
    with pytest.raises(
        Exception, match=f"threads_v1_as_v2.*failed: called as version {ABI_VERSION}"
    ):
        jax.block_until_ready(as_v2(x))


def test_c_kernel_with_parallel_for_under_every_transformation(clib):
    k = jaxbind.kernel(clib.parallel_scale, abi_version=2, name="parallel_scale")
    op = jaxbind.get_linear_call(k, k, same_as_last, same_as_last, name="tests.threads_pfor")
    f = lambda x: op(x, factor=3.0)[0]
    for shape in ((1000,), (7,), (0,), (4, 33)):
        x = random(shape, np.float32, 2)
        np.testing.assert_allclose(jax.jit(f)(x), 3 * x, rtol=1e-6)
    x = random((4, 33), np.float32, 3)
    np.testing.assert_allclose(jax.vmap(f)(x), 3 * x, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), np.full_like(x, 3.0))
    (t,) = jax.linear_transpose(f, x)(x)
    np.testing.assert_allclose(t, 3 * x, rtol=1e-6)
    exported = jax.export.deserialize(jaxbind.export(jax.jit(f))(x).serialize())
    np.testing.assert_allclose(exported.call(x), 3 * x, rtol=1e-6)
    check(op, x, factor=3.0, verbose=False)
    with pytest.raises(Exception, match="threads_pfor.*failed: a task failed with status 7"):
        jax.block_until_ready(jax.jit(lambda x: op(x, factor=-1.0)[0])(x))


_told: dict = {}


def _threads_told(clib, threads=None) -> int:
    if threads not in _told:
        op = jaxbind.get_linear_call(
            jaxbind.kernel(clib.report_threads, threads=threads),
            None,
            lambda x: (((), jnp.int32),),
            name=f"tests.threads_told_{threads}",
        )
        _told[threads] = int(jax.jit(lambda x: op(x)[0])(jnp.zeros(1, jnp.int32)))
    return _told[threads]


def test_kernels_are_told_xla_s_threads_or_their_limit(clib):
    every = _threads_told(clib)
    assert 1 <= every <= 4096
    assert _threads_told(clib, threads=1) == 1
    assert _threads_told(clib, threads=10**6) == every


# --- the batch loop on several threads ---------------------------------------------------


def _busy_op(clib, name, **options):
    return jaxbind.get_linear_call(
        jaxbind.kernel(clib.busy_sequence, name="busy_sequence"),
        None,
        lambda x, **kw: (((2,), jnp.int32),),
        name=name,
        **options,
    )


def test_batch_loop_spreads_worthwhile_elements_over_threads(clib):
    if _threads_told(clib) < 2:
        pytest.skip("XLA's pool has one thread here")
    op = _busy_op(clib, "tests.threads_busy")
    out = np.asarray(jax.jit(jax.vmap(lambda x: op(x, ms=2.0)[0]))(jnp.zeros((24, 1))))
    order, threads = out[:, 0], out[:, 1]
    assert sorted(order - order.min()) == list(range(24))  # every element ran once
    assert len(set(threads.tolist())) >= 2  # 24 x 2 ms: a helper starts meanwhile


def test_ordered_batch_keeps_its_order(clib):
    op = _busy_op(clib, "tests.threads_busy_ordered", ordered=True)
    out = np.asarray(jax.jit(jax.vmap(lambda x: op(x, ms=0.5)[0]))(jnp.zeros((12, 1))))
    order, threads = out[:, 0], out[:, 1]
    np.testing.assert_array_equal(order, order[0] + np.arange(12))
    assert len(set(threads.tolist())) == 1


# --- numba kernels over ranges -----------------------------------------------------------


def _affine(begin, end, out, x, a=2.0):
    for i in range(begin, end):
        out[i] = a * x[i] + 1.0


def _histogram(begin, end, out, x):
    for i in range(begin, end):
        out[int(x[i]) % out.shape[0]] += 1.0


def _total(begin, end, out, x):  # into a 0-d output
    for i in range(begin, end):
        out[()] += x[i]


def _deposit(begin, end, out, pos, w):  # 1-D linear deposit on a periodic grid
    n = out.shape[0]
    for p in range(begin, end):
        i = int(np.floor(pos[p]))
        f = pos[p] - np.floor(pos[p])
        out[i % n] += (1 - f) * w[p]
        out[(i + 1) % n] += f * w[p]


def _interpolate(begin, end, out, pos, grid):
    n = grid.shape[0]
    for p in range(begin, end):
        i = int(np.floor(pos[p]))
        f = pos[p] - np.floor(pos[p])
        out[p] = (1 - f) * grid[i % n] + f * grid[(i + 1) % n]


def _deposit_jax(pos, w, n):
    i = jnp.floor(pos)
    f = pos - i
    i = i.astype(jnp.int32) % n
    return jnp.zeros(n, w.dtype).at[i].add((1 - f) * w).at[(i + 1) % n].add(f * w)


_first = lambda out, *ins: out.shape[0]
_of_input = lambda out, x: x.shape[0]


@pytest.mark.parametrize("threads", [None, 1])
@pytest.mark.parametrize("grain", [1, 7, 10**6])
def test_kernel_over_ranges_every_transformation(threads, grain):
    k = jaxbind.kernel(_affine, ranges=_first, grain=grain, threads=threads)
    op = jaxbind.get_nonlinear_call(
        k, (None, None), same_as_last, name=f"tests.ranges_affine_{threads}_{grain}"
    )
    for n in (0, 1, 5, 1000):
        x = random((n,), np.float32, n)
        np.testing.assert_allclose(
            jax.jit(lambda x: op(x, a=3.0)[0])(x), 3 * x + 1, rtol=1e-5, atol=1e-6
        )
    x = random((6, 50), np.float32, 4)
    np.testing.assert_allclose(jax.vmap(lambda x: op(x)[0])(x), 2 * x + 1, rtol=1e-6)
    check(op, x[0], a=3.0, verbose=False)


@pytest.mark.parametrize("grain", [1, 3, 1000])
def test_reduction_sum_adds_up_the_ranges(grain):
    hist = jaxbind.get_linear_call(
        jaxbind.kernel(_histogram, ranges=_of_input, grain=grain, reduction="sum"),
        None,
        lambda x: (((8,), x.dtype),),
        name=f"tests.ranges_histogram_{grain}",
    )
    x = np.arange(100, dtype=np.float32)
    expected = np.bincount(np.arange(100) % 8, minlength=8).astype(np.float32)
    np.testing.assert_array_equal(jax.jit(lambda x: hist(x)[0])(x), expected)
    np.testing.assert_array_equal(hist(x[:0])[0], np.zeros(8))  # no iteration: zeros
    batch = np.stack([x, x + 1, x + 2])
    out = jax.vmap(lambda x: hist(x)[0])(batch)
    for r, row in enumerate(out):
        np.testing.assert_array_equal(row, np.roll(expected, r))
    total = jaxbind.get_linear_call(
        jaxbind.kernel(_total, ranges=_of_input, grain=grain, reduction="sum"),
        None,
        lambda x: (((), x.dtype),),
        name=f"tests.ranges_total_{grain}",
    )
    np.testing.assert_allclose(jax.jit(lambda x: total(x)[0])(x), x.sum(), rtol=1e-6)
    check(total, x, verbose=False)


def test_scatter_and_gather_over_ranges_are_a_linear_op_and_its_transpose():
    op = jaxbind.get_linear_call(
        jaxbind.kernel(_deposit, ranges=lambda out, pos, w: w.shape[0], reduction="sum", grain=16),
        jaxbind.kernel(_interpolate, ranges=_first, grain=16),
        lambda pos, w, *, n: (((n,), w.dtype),),
        first_n_args_fixed=1,
        name="tests.ranges_deposit",
    )
    rng = np.random.default_rng(5)
    n, particles = 32, 500
    pos = rng.uniform(0, n, particles).astype(np.float32)
    w = rng.uniform(size=particles).astype(np.float32)
    f = lambda w: op(pos, w, n=n)[0]
    np.testing.assert_allclose(jax.jit(f)(w), _deposit_jax(pos, w, n), rtol=1e-5, atol=1e-5)
    grid = rng.uniform(size=n).astype(np.float32)
    (t,) = jax.linear_transpose(f, w)(grid)
    (t_ref,) = jax.linear_transpose(lambda w: _deposit_jax(pos, w, n), w)(grid)
    np.testing.assert_allclose(t, t_ref, rtol=1e-5, atol=1e-5)
    g = jax.grad(lambda w: jnp.sum(f(w) ** 2))(w)
    g_ref = jax.grad(lambda w: jnp.sum(_deposit_jax(pos, w, n) ** 2))(w)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-4)
    ws = np.stack([w, 2 * w, 3 * w])
    np.testing.assert_allclose(
        jax.vmap(f)(ws), jax.vmap(lambda w: _deposit_jax(pos, w, n))(ws), rtol=1e-5, atol=1e-5
    )
    exported = jax.export.deserialize(
        jaxbind.export(jax.jit(jax.grad(lambda w: jnp.sum(f(w) ** 2))))(w).serialize()
    )
    np.testing.assert_allclose(exported.call(w), g_ref, rtol=1e-4, atol=1e-4)
    check(op, pos, w, n=n, verbose=False)


def _fails_past(begin, end, out, x):
    for i in range(begin, end):
        if x[i] > 100.0:
            raise ValueError("too big")
        out[i] = x[i]


def test_a_range_that_raises_fails_the_call_with_the_binding_s_name():
    op = jaxbind.get_linear_call(
        jaxbind.kernel(_fails_past, ranges=_first, grain=4),
        None,
        same_as_last,
        name="tests.ranges_raises",
    )
    x = np.arange(64, dtype=np.float32)
    np.testing.assert_allclose(op(x)[0], x)
    with pytest.raises(Exception, match="ranges_raises.*failed: the numba kernel raised"):
        jax.block_until_ready(op(x * 10)[0])


def test_several_python_threads_call_parallel_kernels_at_once(clib):
    ranges = jaxbind.get_nonlinear_call(
        jaxbind.kernel(_affine, ranges=_first, grain=8),
        (None, None),
        same_as_last,
        name="tests.ranges_stress",
    )
    hist = jaxbind.get_linear_call(
        jaxbind.kernel(_histogram, ranges=_of_input, grain=8, reduction="sum"),
        None,
        lambda x: (((8,), x.dtype),),
        name="tests.ranges_stress_histogram",
    )
    pfor = jaxbind.get_linear_call(
        jaxbind.kernel(clib.parallel_scale, abi_version=2),
        None,
        same_as_last,
        name="tests.threads_stress",
    )
    f = jax.jit(lambda x: (ranges(x, a=3.0)[0], hist(x)[0], pfor(x, factor=2.0)[0]))
    g = jax.jit(jax.vmap(lambda x: (ranges(x)[0], hist(x)[0])))

    def work(seed):
        x = np.arange(1000, dtype=np.float32) + seed
        xs = np.stack([x] * 4)
        expected = np.bincount((np.arange(1000) + seed) % 8, minlength=8)
        for _ in range(20):
            a, h, p = f(x)
            np.testing.assert_allclose(a, 3 * x + 1, rtol=1e-6)
            np.testing.assert_array_equal(h, expected)
            np.testing.assert_allclose(p, 2 * x, rtol=1e-6)
            a, h = g(xs)
            np.testing.assert_allclose(a, 2 * xs + 1, rtol=1e-6)
            np.testing.assert_array_equal(h, np.stack([expected] * 4))

    errors = failures_at_once(work, 6)
    assert not errors, errors[0]


# --- kernels over ranges: their count, their errors, their sums (issue 46) ------------------


def _copy_range(begin, end, out, x):
    for i in range(begin, end):
        out[i] = x[i]


def _divides_by_zero(out, x):
    return x.shape[0] // (x.shape[0] - x.shape[0])


def _raises(out, x):
    if x.shape[0] > 2:
        raise ValueError("too many")
    return x.shape[0]


def _routes(op):
    """The ways a test calls a kernel op on x of shape (8,) (vmap: (3, 8))."""
    return {
        "eager": lambda x: op(x)[0],
        "jit": jax.jit(lambda x: op(x)[0]),
        "vmap": lambda x: jax.vmap(lambda x: op(x)[0])(np.stack([x] * 3)),
    }


@pytest.mark.parametrize("ranges", [_divides_by_zero, _raises], ids=["ZeroDivisionError", "raise"])
def test_a_ranges_function_that_raises_fails_the_call_naming_the_op(ranges, capfd):
    k = jaxbind.kernel(_copy_range, ranges=ranges)
    name = f"tests.ranges_fn_raises{ranges.__name__}"
    op = jaxbind.get_linear_call(k, None, same_as_last, name=name)
    x = np.arange(8, dtype=np.float32)
    for f in _routes(op).values():
        with pytest.raises(
            Exception,
            match=rf"kernel of '{name}' \(the function\)(, batched)? failed: its ranges function "
            "raised an exception",
        ):
            jax.block_until_ready(f(x))
    with pytest.raises(RuntimeError, match="failed: its ranges function raised an exception"):
        k((np.empty(8, np.float32),), (x,), None)  # (as testing.check calls it)
    assert "Exception ignored" not in capfd.readouterr().err  # numba's, for escaped errors


def test_a_negative_count_of_iterations_fails_the_call_naming_the_op():
    k = jaxbind.kernel(_copy_range, ranges=lambda out, x: x.shape[0] - 11)
    op = jaxbind.get_linear_call(k, None, same_as_last, name="tests.ranges_negative")
    x = np.arange(8, dtype=np.float32)
    for f in _routes(op).values():
        with pytest.raises(
            Exception,
            match=r"kernel of 'tests.ranges_negative' \(the function\)(, batched)? failed: its "
            "ranges function gave -3 iterations; the number of iterations must be a "
            "non-negative integer",
        ):
            jax.block_until_ready(f(x))
    with pytest.raises(RuntimeError, match="gave -3 iterations"):
        k((np.empty(8, np.float32),), (x,), None)
    x = np.arange(11, dtype=np.float32)
    np.testing.assert_array_equal(jax.jit(lambda x: op(x)[0])(x)[:0], x[:0])  # 0: no error


_NOT_INTEGERS = {
    "float": lambda out, x: 9.99,
    "quotient": lambda out, x: x.shape[0] / 2,
    "bool": lambda out, x: x.shape[0] > 0,
}


@pytest.mark.parametrize("what", list(_NOT_INTEGERS))
def test_a_count_that_is_not_an_integer_is_refused_when_compiled(what):
    k = jaxbind.kernel(_copy_range, ranges=_NOT_INTEGERS[what], name="copies")
    op = jaxbind.get_linear_call(k, None, same_as_last, name=f"tests.ranges_not_integer_{what}")
    x = np.arange(8, dtype=np.float32)
    message = (
        r"'tests.ranges_not_integer_.*' \(the function\)(, batched)?: the ranges function of "
        r"kernel copies gives (float64|bool), but it must give the number of iterations, a "
        r"non-negative integer \(use // rather than /"
    )
    for f in _routes(op).values():
        with pytest.raises(Exception, match=message):
            jax.block_until_ready(f(x))
    with pytest.raises(TypeError, match="the ranges function of kernel copies gives"):
        k((np.empty(8, np.float32),), (x,), None)


def _fold(begin, end, out, x):  # out[j] = sum of x[i] with i % out.size == j
    for i in range(begin, end):
        out[i % out.shape[0]] += x[i]


def test_a_reduction_into_an_output_that_shares_an_input_is_refused_when_the_op_is_made():
    k = jaxbind.kernel(_fold, ranges=lambda out, x: x.shape[0], reduction="sum", name="fold")
    message = (
        r"jaxbind: 'tests.reduce_aliased': input_output_aliases=\{0: 0\} lets outputs share "
        r"inputs' memory, but the function is kernel fold with reduction='sum', which zeroes "
        r"its outputs .* Drop input_output_aliases"
    )
    with pytest.raises(ValueError, match=message):
        jaxbind.get_linear_call(
            k, None, same_as_last, input_output_aliases={0: 0}, name="tests.reduce_aliased"
        )
    with pytest.raises(ValueError, match=message):
        jaxbind.get_nonlinear_call(
            k, (None, None), same_as_last, input_output_aliases={0: 0}, name="tests.reduce_aliased"
        )
    shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
    for decorator in (jaxbind.linear_op, jaxbind.nonlinear_op):
        with pytest.raises(ValueError, match=message):
            decorator(shape=shape, input_output_aliases={0: 0}, name="tests.reduce_aliased")(k)
    # a reduction without aliases, or as a transpose (aliases concern the function only)
    x = np.ones(8, np.float32)
    op = jaxbind.get_linear_call(k, None, same_as_last, name="tests.reduce_not_aliased")
    np.testing.assert_array_equal(op(x)[0], x)
    jaxbind.get_linear_call(
        lambda out, args, kw: None,
        k,
        same_as_last,
        input_output_aliases={0: 0},
        name="tests.reduce_as_transpose",
    )


def _total_of(begin, end, out, x):  # into a 0-d output, in iteration order
    for i in range(begin, end):
        out[()] += x[i]


def _rounding_values(n=100_000):
    """float32 values of many magnitudes, whose sum rounds differently when grouped
    differently."""
    rng = np.random.default_rng(46)
    return (rng.uniform(size=n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)


def _bits(a) -> bytes:
    return np.ascontiguousarray(np.asarray(a)).tobytes()


def _summing_ops(grain=None):
    ops = {}
    for threads in (None, 1, 3):
        k = jaxbind.kernel(
            _total_of, ranges=_of_input, reduction="sum", grain=grain, threads=threads
        )
        ops[threads] = jaxbind.get_linear_call(
            k, None, lambda x: (((), x.dtype),), name=f"tests.reduce_bits_{threads}_{grain}"
        )
    return ops


@pytest.mark.parametrize("grain", [None, 7])
def test_a_reduction_gives_the_same_bits_whatever_the_threads_and_the_batch(grain):
    x = _rounding_values()
    ops = _summing_ops(grain)
    reference = _bits(jax.jit(lambda x: ops[None](x)[0])(x))
    assert np.isclose(np.frombuffer(reference, np.float32)[0], x.sum(dtype=np.float64), rtol=1e-5)
    for threads, op in ops.items():
        f = jax.jit(lambda x, op=op: op(x)[0])
        for _ in range(3):
            assert _bits(f(x)) == reference, f"threads={threads}, unbatched"
        for batch in (1, 3, 16):  # identical rows: every row the unbatched value
            rows = jax.jit(jax.vmap(lambda x, op=op: op(x)[0]))(np.stack([x] * batch))
            assert {_bits(r) for r in np.asarray(rows)} == {reference}, (threads, batch)
    k = ops[None].binding.f
    out = np.zeros((), np.float32)
    k((out,), (x,), None)  # from Python: told of 3 threads, the ranges run in order
    assert _bits(out) == reference
    from jaxbind import _ext
    from jaxbind._kernels import abi

    address = k.address_for([(0, x.shape, abi.xla_code(x.dtype))], [(0, (), 11)], {})
    for told in (1, 2, 7, 64):  # the thread count a kernel is told does not change its split
        out = np.zeros((), np.float32)
        status, message = abi.call_kernel(
            address, [x], [out], [], threads=told, parallel_for=_ext.parallel_for_address()
        )
        assert status == 0, message
        assert _bits(out) == reference, f"told of {told} threads"


def test_a_reduction_gives_the_same_bits_on_a_pool_of_one_thread(tmp_path):
    """XLA's pool has as many threads as the CPUs the process may use: a process on one
    CPU sums as this one does."""
    from support.processes import run_script

    script = """
        import os, sys
        if sys.argv[1] == "one":
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        import jax, numpy as np, jaxbind
        sys.path.insert(0, sys.argv[2])
        from test_kernel_threads import _of_input, _rounding_values, _total_of
        k = jaxbind.kernel(_total_of, ranges=_of_input, reduction="sum", grain=1000)
        op = jaxbind.get_linear_call(k, None, lambda x: (((), x.dtype),), name="t.sum")
        x = _rounding_values()
        rows = jax.jit(jax.vmap(lambda x: op(x)[0]))(np.stack([x] * 3))
        print(jax.jit(lambda x: op(x)[0])(x).tobytes().hex(), np.asarray(rows).tobytes().hex())
    """
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity here")
    tests = str(pathlib.Path(__file__).parent)
    runs = {}
    for cpus in ("one", "all"):
        proc = run_script(tmp_path, script, cpus, tests, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[cpus] = proc.stdout.split()
    one, rows = runs["one"]
    assert runs["all"] == [one, rows] and rows == one * 3


# --- what is refused -----------------------------------------------------------------


def test_bad_thread_and_range_options_are_refused_with_what_was_wrong(clib):
    with pytest.raises(ValueError, match="_affine: threads must be a positive integer"):
        jaxbind.kernel(_affine, threads=0)
    with pytest.raises(TypeError, match="reduction= needs ranges="):
        jaxbind.kernel(_affine, reduction="sum")
    with pytest.raises(TypeError, match="ranges= takes a function of the kernel's arrays"):
        jaxbind.kernel(_affine, ranges=3)
    with pytest.raises(TypeError, match="cannot take whole batches"):
        jaxbind.kernel(_affine, ranges=_first, batches=True)
    with pytest.raises(ValueError, match="grain must be a positive integer"):
        jaxbind.kernel(_affine, ranges=_first, grain=0)
    with pytest.raises(ValueError, match="reduction must be None or 'sum'"):
        jaxbind.kernel(_affine, ranges=_first, reduction="max")
    with pytest.raises(TypeError, match="splits its work itself"):
        jaxbind.kernel(clib.parallel_scale, ranges=_first)
    with pytest.raises(
        ValueError, match=f"compiles a numba function for ABI version {ABI_VERSION}"
    ):
        jaxbind.kernel(_affine, abi_version=1)
    with pytest.raises(ValueError, match="ABI version 5"):
        jaxbind.kernel(clib.parallel_scale, abi_version=5)


def test_a_kernel_over_ranges_without_begin_and_end_is_refused_at_trace_time():
    def no_range(out, x):
        out[0] = x[0]

    op = jaxbind.get_linear_call(
        jaxbind.kernel(no_range, ranges=_first), None, same_as_last, name="tests.ranges_layout"
    )
    with pytest.raises(TypeError, match="takes its range's begin and end, then its 1 output"):
        op(np.ones(3, np.float32))
