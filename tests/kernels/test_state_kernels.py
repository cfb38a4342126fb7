"""Kernels with a state (kernel ABI version 3, ``jaxbind_call.state``): a C kernel and a
numba kernel get the address of their op's state under jit, vmap, grad, transpose and
export; one setup per site group, teardowns equal setups; under "lock" no two calls use
the object at once (the parallel batch loop, several Python threads, ranges), under
"pool" each call has one of its own; and the refusals, with their messages."""

import ctypes
import gc
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.clib import compile_c_library
from support.processes import run_isolated
from support.threads import failures_at_once

import jaxbind
from jaxbind._runtime.state import live_states

numba = pytest.importorskip("numba")

_C_SOURCE = r"""
#include <stdio.h>
#include <time.h>
#include "jaxbind/kernel.h"

/* The state's object: a scale, and counts of its users. */
typedef struct {
  double scale;
  int64_t in_use, most_in_use, calls;
} plan;

static void busy(double ms) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do clock_gettime(CLOCK_MONOTONIC, &t);
  while ((t.tv_sec - t0.tv_sec) * 1e3 + (t.tv_nsec - t0.tv_nsec) * 1e-6 < ms);
}

/* out = state->scale * x (float32), counting the users of the object meanwhile */
int32_t scaled(const jaxbind_call *call) {
  if (call->abi_version < 3 || call->state == NULL) {
    snprintf(call->error, call->error_size, "version %ld, state %p", (long)call->abi_version,
             call->state);
    return 1;
  }
  plan *p = (plan *)call->state;
  int64_t now = __atomic_add_fetch(&p->in_use, 1, __ATOMIC_SEQ_CST);
  int64_t most = __atomic_load_n(&p->most_in_use, __ATOMIC_SEQ_CST);
  while (now > most &&
         !__atomic_compare_exchange_n(&p->most_in_use, &most, now, 0, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST)) {
  }
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  int64_t n = 1;
  for (int64_t d = 0; d < call->inputs[0].rank; ++d) n *= call->inputs[0].dims[d];
  for (int64_t i = 0; i < n; ++i) y[i] = (float)(p->scale * x[i]);
  busy(0.2);
  __atomic_sub_fetch(&p->in_use, 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&p->calls, 1, __ATOMIC_SEQ_CST);
  return 0;
}

/* version 2: out = x (it cannot see a state) */
int32_t copy_v2(const jaxbind_call *call) {
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  int64_t n = 1;
  for (int64_t d = 0; d < call->inputs[0].rank; ++d) n *= call->inputs[0].dims[d];
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
  return 0;
}
"""


class Plan(ctypes.Structure):
    _fields_ = [
        ("scale", ctypes.c_double),
        ("in_use", ctypes.c_int64),
        ("most_in_use", ctypes.c_int64),
        ("calls", ctypes.c_int64),
    ]


@pytest.fixture(scope="module")
def clib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "statekernels", _C_SOURCE)


class Made:
    """The objects a test's state set up, and how many it tore down."""

    def __init__(self):
        self.objects: list = []
        self.teardowns = 0

    def teardown(self, obj):
        self.teardowns += 1


def c_op(clib, name, made, **state_options):
    """x -> scale * x through the C kernel, its scale (and user counts) in a ctypes
    structure that the state's setup makes."""

    @jaxbind.state(teardown=made.teardown, **state_options)
    def plan(*, scale):
        obj = Plan(scale=scale)
        made.objects.append(obj)
        return obj

    k = jaxbind.kernel(clib.scaled, name="scaled")
    op = jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name=name, replace=True)(k)
    op.def_transpose(k)
    return op


def _freed():
    jax.clear_caches()
    gc.collect()


def test_c_kernel_gets_its_state_under_every_transformation(clib):
    made = Made()
    op = c_op(clib, "tests.state_kernel_c", made)
    x = jnp.arange(4.0)
    f = jax.jit(lambda x: op(x, scale=3.0))  # (kept: a program freed frees its state)
    v = jax.jit(jax.vmap(f))
    g = jax.jit(jax.grad(lambda x: op(x, scale=3.0).sum()))
    t = jax.jit(jax.linear_transpose(lambda x: op(x, scale=3.0), x))
    np.testing.assert_allclose(f(x), 3 * x)
    np.testing.assert_allclose(v(jnp.ones((5, 4))), np.full((5, 4), 3.0))
    np.testing.assert_allclose(g(x), [3.0] * 4)
    np.testing.assert_allclose(t(x)[0], 3 * x)
    assert len(made.objects) == 1  # one setup for every role and program with scale=3
    assert made.objects[0].calls >= 4
    del f, v, g, t
    _freed()
    assert made.teardowns == len(made.objects)
    assert live_states() == 0


@pytest.mark.parametrize("policy", ["lock", "pool", "shared"])
def test_lock_and_pool_give_each_call_an_object_of_its_own(clib, policy):
    made = Made()
    options = {"pool_size": 3} if policy == "pool" else {}
    op = c_op(clib, f"tests.state_kernel_{policy}", made, concurrency=policy, **options)
    f = jax.jit(jax.vmap(lambda x: op(x, scale=2.0)))  # 0.2 ms each: the loop spreads them
    xs = jnp.ones((16, 8))

    def work(_):
        for _ in range(5):
            np.testing.assert_allclose(f(xs), 2 * np.ones((16, 8)))

    failures = failures_at_once(work, 3)
    assert not failures
    assert sum(p.calls for p in made.objects) == 3 * 5 * 16
    if policy == "lock":
        assert len(made.objects) == 1 and made.objects[0].most_in_use == 1
    elif policy == "pool":
        assert 1 <= len(made.objects) <= 3
        assert all(p.most_in_use == 1 for p in made.objects)
    else:
        assert len(made.objects) == 1
    f = None  # (the program freed)
    _freed()
    assert made.teardowns == len(made.objects)


def _numba_scale(out, x, state):
    p = numba.carray(state, (1,), np.float64)  # the plan's scale
    out[...] = p[0] * x


def test_numba_kernel_gets_the_address_of_its_state():
    made = Made()

    @jaxbind.state(teardown=made.teardown)
    def scale(*, factor):
        obj = np.array([factor], np.float64)  # the kernel gets its data's address
        made.objects.append(obj)
        return obj

    k = jaxbind.kernel(_numba_scale)
    op = jaxbind.linear_op(shape=lambda x, **kw: x, state=scale, name="tests.state_numba")(k)
    op.def_transpose(k)
    x = jnp.arange(3.0)
    f = jax.jit(lambda x: op(x, factor=5.0))  # (kept: a program freed frees its state)
    g = jax.jit(jax.grad(lambda x: op(x, factor=5.0).sum()))
    v = jax.jit(jax.vmap(lambda x: op(x, factor=5.0)))
    np.testing.assert_allclose(f(x), 5 * x)
    np.testing.assert_allclose(g(x), [5.0] * 3)
    np.testing.assert_allclose(v(jnp.ones((2, 3))), 5.0)
    assert len(made.objects) == 1  # every role and program: one object
    jaxbind.testing.check(op, x, factor=5.0)  # its direct calls set up states of their own
    del f, g, v
    _freed()
    assert made.teardowns == len(made.objects)


def _ranged(begin, end, out, x, state):
    plan = numba.carray(state, (2,), np.int64)
    plan[0] += 1  # in use: a race under "lock" would show as more than one
    if plan[0] > plan[1]:
        plan[1] = plan[0]
    for i in range(begin, end):
        out[i] = 2.0 * x[i]
    plan[0] -= 1


def test_ranges_of_a_lock_state_run_one_at_a_time():
    objects = []

    @jaxbind.state
    def counts():
        objects.append(np.zeros(2, np.int64))
        return objects[-1]

    k = jaxbind.kernel(_ranged, ranges=lambda out, x: out.shape[0], grain=10)
    op = jaxbind.linear_op(shape=lambda x: x, state=counts, name="tests.state_ranges")(k)
    x = jnp.arange(10_000.0)
    for _ in range(5):
        np.testing.assert_allclose(jax.jit(op)(x), 2 * x)
    assert objects[0][1] == 1


def _add_table(out, points, x, state):
    t = numba.carray(state, x.shape, np.float64)
    out[...] = x + t


def _table_op(name: str, setups: list):
    """x + 10 points as a numba kernel whose state, keyed on the points, holds 10 points
    (each setup appended to `setups`)."""

    @jaxbind.state(key=("points",))
    def table(*, points):
        setups.append(np.array(points))
        return np.ascontiguousarray(points, np.float64) * 10  # the kernel reads it

    return jaxbind.nonlinear_op(shape=lambda points, x: x, fixed=1, state=table, name=name)(
        jaxbind.kernel(_add_table)
    )


def test_key_state_is_set_up_again_only_when_the_key_changes(clib):
    setups: list = []
    f = jax.jit(_table_op("tests.state_key_numba", setups))
    p, x = jnp.arange(3.0), jnp.ones(3)
    for _ in range(3):
        np.testing.assert_allclose(f(p, x), 1 + 10 * np.arange(3.0))
    assert len(setups) == 1
    np.testing.assert_allclose(f(p + 1, x), 1 + 10 * (np.arange(3.0) + 1))
    np.testing.assert_allclose(f(p, x), 1 + 10 * np.arange(3.0))
    assert len(setups) == 2  # the first points' state is kept (the last few are)
    batched = jax.vmap(f)(jnp.stack([p, p + 2]), jnp.ones((2, 3)))
    np.testing.assert_allclose(batched[1], 1 + 10 * (np.arange(3.0) + 2))
    assert len(setups) == 3


def test_a_kernel_site_and_its_lease_keep_the_same_number_of_key_values():
    """The trampoline keeps the last few key values' cells (cpp/state_keys.h), and the
    lease as many of their states: cycling through that many values sets each up once,
    and one value more than that sets them up again."""
    kept = jaxbind._ext.state_keys_kept
    setups: list = []
    f = jax.jit(_table_op("tests.state_keys_kept", setups))
    p, x = jnp.arange(3.0), jnp.ones(3)
    for _ in range(3):
        for k in range(kept):
            np.testing.assert_allclose(f(p + k, x), 1 + 10 * (np.arange(3.0) + k))
    assert len(setups) == kept  # each value set up once, and kept
    for k in range(kept + 1):  # one value more: the oldest is dropped, and so on
        np.testing.assert_allclose(f(p + k, x), 1 + 10 * (np.arange(3.0) + k))
    np.testing.assert_allclose(f(p, x), 1 + 10 * np.arange(3.0))
    assert len(setups) == kept + 2


def test_an_exported_kernel_op_sets_up_its_state_again_by_name(tmp_path, clib):
    module = f"""
    import ctypes, os
    import jax, jaxbind
    clib = ctypes.CDLL({clib._name!r})

    class Plan(ctypes.Structure):
        _fields_ = [("scale", ctypes.c_double), ("in_use", ctypes.c_int64),
                    ("most_in_use", ctypes.c_int64), ("calls", ctypes.c_int64)]

    @jaxbind.state
    def plan(*, scale):
        with open(os.environ["STATE_COUNT_FILE"], "a") as f:
            f.write("setup\\n")
        return Plan(scale=scale)

    k = jaxbind.kernel(clib.scaled)
    op = jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name="tests.state_kernel_export")(k)
    op.def_transpose(k)
    """
    (tmp_path / "kernel_state_module.py").write_text(textwrap.dedent(module))
    count = tmp_path / "count.txt"
    code = """
    import os, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["STATE_COUNT_FILE"] = sys.argv[2]
    import jax, jax.numpy as jnp, numpy as np, jaxbind
    from kernel_state_module import op
    x = jnp.arange(3.0)
    path = os.path.join(os.path.dirname(sys.argv[2]), "grad.bin")
    if sys.argv[1] == "export":
        exp = jaxbind.export(jax.jit(jax.grad(lambda x: op(x, scale=3.0).sum())))(x)
        open(path, "wb").write(exp.serialize())
    else:
        from jax import export
        exp = export.deserialize(bytearray(open(path, "rb").read()))
        for _ in range(3):
            np.testing.assert_allclose(exp.call(x), [3.0, 3.0, 3.0])
    print("ok")
    """
    done = run_isolated(tmp_path, textwrap.dedent(code), "export", count)
    assert done.returncode == 0, done.stderr
    done = run_isolated(tmp_path, textwrap.dedent(code), "load", count)
    assert done.returncode == 0, done.stderr
    assert count.read_text().count("setup") == 1


# --- what is refused -------------------------------------------------------------------


def test_a_version_2_kernel_on_an_op_with_state_is_refused_when_the_op_is_made(clib):
    @jaxbind.state
    def plan(*, scale=1.0):
        return Plan(scale=scale)

    v2 = jaxbind.kernel(clib.copy_v2, abi_version=2, name="copy_v2")
    with pytest.raises(TypeError, match=r"copy_v2, registered for kernel ABI version 2.*abi_"):
        jaxbind.linear_op(shape=lambda x: x, state=plan, name="tests.state_v2")(v2)
    with pytest.raises(TypeError, match="version 2, which has no state field"):
        jaxbind.get_linear_call(
            v2, v2, lambda x: ((x.shape, x.dtype),), state=plan, name="tests.state_v2_13"
        )
    # without a state, it runs as before
    op = jaxbind.linear_op(shape=lambda x: x, name="tests.state_v2_plain")(v2)
    np.testing.assert_allclose(jax.jit(op)(jnp.arange(3.0)), np.arange(3.0))


def test_a_numba_kernel_without_a_state_parameter_is_refused():
    @jaxbind.state
    def plan():
        return np.zeros(1)

    def no_state(out, x):
        out[...] = x

    with pytest.raises(TypeError, match="takes no 'state' parameter.*add one"):
        jaxbind.linear_op(shape=lambda x: x, state=plan, name="tests.state_no_param")(
            jaxbind.kernel(no_state)
        )


@pytest.mark.parametrize(
    "returned, what",
    [
        (lambda: {"a": 1}, "a builtins.dict object"),
        (lambda: None, "returned None"),
        (lambda: np.zeros((3, 3))[:, 0], "not C-contiguous"),
        (lambda: 0, "NULL pointer"),
    ],
)
def test_a_setup_whose_object_gives_no_address_fails_naming_the_op(clib, returned, what):
    @jaxbind.state
    def bad():
        return returned()

    k = jaxbind.kernel(clib.scaled, name="scaled")
    op = jaxbind.linear_op(
        shape=lambda x: x, state=bad, name="tests.state_bad_address", replace=True
    )(k)
    with pytest.raises(Exception, match=rf"state_bad_address.*{what}"):
        jax.block_until_ready(jax.jit(op)(jnp.arange(3.0)))


def test_objects_give_their_address_in_the_documented_ways(clib):
    from jaxbind._kernels import state_address

    plan = Plan(scale=1.0)
    array = np.zeros(3)

    class Handle:
        jaxbind_address = 0x1234

    class Method:
        def jaxbind_address(self):
            return 0x5678

    assert state_address(0x10, "op", "s") == 0x10
    assert state_address(plan, "op", "s") == ctypes.addressof(plan)
    assert state_address(ctypes.pointer(plan), "op", "s") == ctypes.addressof(plan)
    assert state_address(ctypes.c_void_p(0x20), "op", "s") == 0x20
    assert state_address(array, "op", "s") == array.ctypes.data
    assert state_address(Handle(), "op", "s") == 0x1234
    assert state_address(Method(), "op", "s") == 0x5678
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    buffer = ffi.new("double[2]")
    assert state_address(buffer, "op", "s") == int(ffi.cast("uintptr_t", buffer))
    with pytest.raises(TypeError, match="'op'.*setup 's' returned a bool.*jaxbind_address"):
        state_address(True, "'op'", "s")


def test_more_key_values_than_are_kept_under_vmap_on_several_threads():
    """Eight sets of points at once, more than the last few a key state keeps: states
    dropped while other calls look for theirs are set up again, never used freed."""
    setups = []

    @jaxbind.state(key=("points",))
    def table(*, points):
        setups.append(1)
        return np.ascontiguousarray(points, np.float64) * 10

    def add_table(out, points, x, state):
        t = numba.carray(state, x.shape, np.float64)
        for i in range(x.shape[0]):
            out[i] = x[i] + t[i]
            for _ in range(2000):  # worth spreading over the batch loop's threads
                out[i] = out[i] * 1.0

    op = jaxbind.nonlinear_op(
        shape=lambda points, x: x, fixed=1, state=table, name="tests.state_key_many"
    )(jaxbind.kernel(add_table))
    f = jax.jit(jax.vmap(op))
    ps = jnp.arange(8.0)[:, None] + jnp.arange(3.0)
    xs = jnp.ones((8, 3))

    def work(_):
        for _ in range(5):
            np.testing.assert_allclose(f(ps, xs), 1 + 10 * np.asarray(ps))

    failures = failures_at_once(work, 3)
    assert not failures, failures[0]
    assert len(setups) >= 8


def test_a_numba_kernel_with_a_state_parameter_on_an_op_without_state_says_so():
    def uses_state(out, x, state):
        out[...] = x

    op = jaxbind.linear_op(shape=lambda x: x, name="tests.state_param_no_state")(
        jaxbind.kernel(uses_state)
    )
    with pytest.raises(TypeError, match="'state'.*give the op state="):
        jax.jit(op)(jnp.ones(3))


def test_a_kernel_and_a_python_body_of_one_op_keep_to_one_lock(clib):
    made = Made()

    @jaxbind.state(teardown=made.teardown)
    def plan(*, scale):
        made.objects.append(Plan(scale=scale))
        return made.objects[-1]

    def transpose(ct, *, state, scale):  # a Python body using the same object
        state.in_use += 1
        state.most_in_use = max(state.most_in_use, state.in_use)
        time.sleep(0.0002)
        state.in_use -= 1
        return ct * state.scale

    k = clib.scaled
    op = jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name="tests.state_mixed")(
        jaxbind.kernel(k, name="scaled")
    )
    op.def_transpose(transpose)
    x = jnp.ones((16, 4))
    f = jax.jit(jax.vmap(lambda x: op(x, scale=2.0)))
    t = jax.jit(jax.vmap(jax.linear_transpose(lambda x: op(x, scale=2.0), x[0])))
    failures = []

    def work(fn):
        try:
            for _ in range(5):
                fn(x)
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(fn,)) for fn in (f, t, f, t)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, failures[0]
    assert len(made.objects) == 1 and made.objects[0].most_in_use == 1
