"""jaxbind.testing.check's state rows: setup once per site, a fresh object against a
reused one, two threads under the declared policy, teardowns equal setups; each row
fails on an op built to break it."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind
from jaxbind._runtime import state as runtime


def _rows(report, check):
    return [r for r in report if r.check == check]


def scaled(name, setup_kwargs=None, concurrency="lock", **state_options):
    """x -> x * scale, its scale from its state; `setup_kwargs` replaces the setup."""
    made = []

    @jaxbind.state(concurrency=concurrency, **state_options)
    def plan(*, scale):
        made.append(scale)
        return (setup_kwargs or Scale)(scale)

    return scaling(name, plan), made


def scaling(name, plan):
    """The linear op `name`, x -> state(x), its own transpose, with the state `plan`."""

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name=name, replace=True)
    def op(x, *, state, scale):
        return state(x)

    @op.def_transpose
    def _(ct, *, state, scale):
        return state(ct)

    return op


class Scale:
    def __init__(self, scale):
        self.scale = scale

    def __call__(self, x):
        return x * self.scale


@pytest.mark.parametrize("concurrency", ["lock", "pool", "shared"])
def test_a_sound_state_passes_every_state_row(concurrency):
    op, made = scaled(f"check_state.sound_{concurrency}", concurrency=concurrency)
    report = jaxbind.testing.check(op, np.arange(4.0), scale=3.0, verbose=False)
    once = _rows(report, "state: set up once per site")
    assert [r.status for r in once] == ["ok"]
    assert once[0].detail.startswith("1 setup(s)") and "1 object(s) used" in once[0].detail
    assert [r.status for r in _rows(report, "state: fresh vs reused object")] == ["ok"]
    threads = _rows(report, "state: two threads")
    assert threads and all(r.ok for r in threads)
    (user,) = _rows(report, "state: two threads, one user per object")
    assert user.ok
    (freed,) = _rows(report, "state: teardowns equal setups")
    assert freed.ok and "still alive" not in freed.detail
    assert made  # set up by the program, and by the direct calls
    assert jaxbind._state.watchers == []  # the watch ends with the check


def test_an_object_that_changes_with_use_fails_fresh_vs_reused():
    class Drifting(Scale):
        def __call__(self, x):
            self.scale += 1e-3  # a plan that is not reusable
            return x * self.scale

    op, _ = scaled("check_state.drifting", setup_kwargs=Drifting)
    with pytest.raises(AssertionError, match="state: fresh vs reused object"):
        jaxbind.testing.check(op, np.arange(4.0), scale=3.0, verbose=False)


class Exclusive(Scale):
    """An object that two calls must not use at once: a second user gets garbage."""

    def __init__(self, scale):
        super().__init__(scale)
        self.users = 0
        self.mu = threading.Lock()

    def __call__(self, x):
        with self.mu:
            self.users += 1
            alone = self.users == 1
        time.sleep(0.003)  # the GIL is free: another thread's call can run now
        with self.mu:
            self.users -= 1
        return x * self.scale if alone else x * np.nan


def test_an_object_that_is_not_thread_safe_fails_when_declared_shared():
    op, _ = scaled("check_state.unsafe", setup_kwargs=Exclusive, concurrency="shared")
    with pytest.raises(AssertionError) as failed:
        jaxbind.testing.check(op, np.arange(4.0), scale=3.0, verbose=False)
    assert "state: two threads [2 threads, 'shared', output 0" in str(failed.value)


@pytest.mark.parametrize("concurrency", ["lock", "pool"])
def test_the_same_object_passes_under_a_policy_that_gives_one_user(concurrency):
    op, _ = scaled(f"check_state.exclusive_{concurrency}", Exclusive, concurrency)
    report = jaxbind.testing.check(op, np.arange(4.0), scale=3.0, verbose=False)
    (user,) = _rows(report, "state: two threads, one user per object")
    assert user.ok and "at most 1 call(s) at once" in user.detail


def test_a_shared_object_reports_how_many_calls_used_it_at_once():
    op, _ = scaled("check_state.overlap", setup_kwargs=Slow, concurrency="shared")
    report = jaxbind.testing.check(op, np.arange(4.0), scale=3.0, verbose=False)
    (user,) = _rows(report, "state: two threads, one user per object")
    assert user.ok and "at most 2 call(s) at once" in user.detail


class Slow(Scale):
    def __call__(self, x):
        time.sleep(0.003)
        return x * self.scale


def test_a_leaked_object_fails_teardowns_equal_setups(monkeypatch):
    # The run time itself keeping an object alive (a bug this row is there to catch):
    # a close that forgets its objects.
    monkeypatch.setattr(runtime.StateObjects, "close", lambda self: None)
    op, _ = scaled("check_state.leak")
    with pytest.raises(AssertionError, match="still alive after jax.clear_caches"):
        jaxbind.testing.check(op, np.arange(4.0), scale=3.0, verbose=False)


def test_a_keyed_state_is_set_up_once_for_unchanged_inputs():
    made = []

    @jaxbind.state(key=("table",))
    def plan(*, table):
        made.append(table.copy())
        return np.cumsum(table)

    @jaxbind.linear_op(
        shape=lambda t, x: x, fixed=1, state=plan, name="check_state.keyed", replace=True
    )
    def op(table, x, *, state):
        return x * state[-1]

    @op.def_transpose
    def _(table, ct, *, state):
        return ct * state[-1]

    report = jaxbind.testing.check(op, np.arange(1.0, 4.0), np.arange(5.0), verbose=False)
    (once,) = _rows(report, "state: set up once per site")
    assert once.ok and once.detail.startswith("1 setup(s)")
    assert any(np.array_equal(t, [1.0, 2.0, 3.0]) for t in made)  # (vmap rows draw others)


def test_ops_without_state_have_no_state_rows():
    op = jaxbind.get_linear_call(
        lambda out, args, kw: out[0].__setitem__(..., 2 * args[0]),
        lambda out, args, kw: out[0].__setitem__(..., 2 * args[0]),
        lambda x, **kw: ((x.shape, x.dtype),),
        lambda x, **kw: ((x.shape, x.dtype),),
        name="check_state.none",
        replace=True,
    )
    report = jaxbind.testing.check(op, jnp.arange(3.0), verbose=False)
    assert not [r for r in report if r.check.startswith("state")]


class Staging(Scale):
    """Stages each input in a buffer of its own before scaling it: not thread-safe, since a
    second call at once overwrites the first one's input."""

    def __call__(self, x):
        self.staged = np.array(x)
        time.sleep(0.003)  # the GIL is free: another thread's call can stage its input now
        return self.staged * self.scale


def test_threads_row_gives_each_thread_its_own_inputs():
    # On equal inputs both threads stage the same values, and the race is invisible.
    op, _ = scaled("check_state.staging_shared", setup_kwargs=Staging, concurrency="shared")
    with pytest.raises(AssertionError) as failed:
        jaxbind.testing.check(op, np.arange(1.0, 5.0), scale=3.0, verbose=False)
    assert "state: two threads [2 threads, 'shared', output 0" in str(failed.value)


@pytest.mark.parametrize("concurrency", ["lock", "pool"])
def test_threads_row_passes_a_staging_object_under_one_user_policies(concurrency):
    op, _ = scaled(f"check_state.staging_{concurrency}", Staging, concurrency)
    report = jaxbind.testing.check(op, np.arange(1.0, 5.0), scale=3.0, verbose=False)
    threads = _rows(report, "state: two threads")
    assert threads and all(r.ok for r in threads)
    assert "each thread on its inputs" in threads[0].detail


def _check_while_a_program_holds_the_state(name):
    """check of the op `name` while a program compiled before the check (outside JAX's
    caches) holds its state: the report, and that program (alive until the caller drops it)."""
    op, _ = scaled(name)
    x = np.arange(4.0)
    kept = jax.jit(lambda x: op(x, scale=3.0)).lower(x).compile()  # outside JAX's caches
    kept(x)
    report = jaxbind.testing.check(op, x, scale=3.0, verbose=False)
    return report, kept


def test_teardown_row_names_the_program_that_still_holds_the_state():
    report, kept = _check_while_a_program_holds_the_state("check_state.kept_program")
    (freed,) = _rows(report, "state: teardowns equal setups")
    assert freed.status == "not checked", freed
    assert "still held by 'check_state.kept_program' (the function): 1 call site(s)" in (
        freed.detail
    )
    del kept


def test_teardown_row_counts_objects_of_programs_made_before_the_check_apart():
    op, _ = scaled("check_state.earlier_program")
    x = np.arange(4.0)
    earlier = jax.jit(lambda x: op(x, scale=3.0))
    earlier(x)  # its program is in JAX's caches: the check frees it
    report = jaxbind.testing.check(op, x, scale=3.0, verbose=False)
    (freed,) = _rows(report, "state: teardowns equal setups")
    assert freed.ok, freed
    assert "1 set up, 1 of them torn down" in freed.detail
    assert "1 set up before it, by programs it freed" in freed.detail


def _tearing_down(name, teardown):
    @jaxbind.state(teardown=teardown)
    def plan(*, scale):
        return Scale(scale)

    return scaling(name, plan)


def test_a_teardown_that_raises_fails_its_own_row_and_the_other_rows_run():
    def teardown(obj):
        raise RuntimeError("the plan was already freed")

    op = _tearing_down("check_state.raising_teardown", teardown)
    with pytest.warns(RuntimeWarning, match="the teardown of its state"):
        with pytest.raises(AssertionError) as failed:
            jaxbind.testing.check(op, np.arange(4.0), scale=3.0, verbose=False)
    text = str(failed.value)
    assert "failed 1 check(s)" in text
    assert "state: teardown runs [teardown" in text
    assert "plan' failed: RuntimeError: the plan was already freed" in text
    assert "failed when called directly" not in text
    # the rows ran: none is "not checked" but the one saying the op has no reference
    skipped = [line for line in text.splitlines() if "  not checked  " in line]
    assert len(skipped) == 1 and "the op has no reference" in skipped[0]


def test_a_teardown_that_runs_passes_its_row():
    torn = []
    op = _tearing_down("check_state.sound_teardown", torn.append)
    report = jaxbind.testing.check(op, np.arange(4.0), scale=3.0, verbose=False)
    (row,) = _rows(report, "state: teardown runs")
    assert row.ok and torn


def test_one_user_per_object_counts_each_key_values_state_apart():
    # The threads' inputs differ, so a keyed state gives each its own lock; both setups
    # return None (nothing to plan), which is one Python object but not one shared plan.
    @jaxbind.state(key=("x",))
    def plan(*, x):
        return None

    @jaxbind.nonlinear_op(
        shape=lambda x: x, state=plan, name="check_state.keyed_none", replace=True
    )
    def op(x, *, state):
        time.sleep(0.003)  # long enough for the two threads' calls to overlap
        return x**2

    @op.def_jvp
    def _(primals, tangents, *, state):
        return 2 * primals[0] * tangents[0]

    @op.def_vjp
    def _(primals, cotangents, *, state):
        return (2 * primals[0] * cotangents,)

    report = jaxbind.testing.check(op, np.arange(1.0, 5.0), verbose=False)
    (user,) = _rows(report, "state: two threads, one user per object")
    assert user.ok, user


# --- a program kept from before the check; fixed key inputs; kernels ------------------


def test_setup_row_is_not_checked_while_a_program_from_before_the_check_holds_the_state():
    # The kept program's state is the one the check's program leases: no setup to count.
    report, kept = _check_while_a_program_holds_the_state("check_state.kept_setup")
    (once,) = _rows(report, "state: set up once per site")
    assert once.status == "not checked", once
    assert "set up before the check, by 'check_state.kept_setup' (the function)" in once.detail
    del kept


class Workspace:
    """A scratch object that stages the table a call is given: not thread-safe."""

    def __call__(self, table, x):
        self.table = np.array(table)
        time.sleep(0.003)  # the GIL is free: another thread's call can stage its table now
        return x * self.table[0]


def keyed_on_fixed(name, setup, concurrency):
    @jaxbind.state(key=("table",), concurrency=concurrency)
    def plan(*, table):
        return setup(table)

    @jaxbind.linear_op(shape=lambda t, x: x, fixed=1, state=plan, name=name, replace=True)
    def op(table, x, *, state):
        return state(table, x)

    @op.def_transpose
    def _(table, ct, *, state):
        return state(table, ct)

    return op


def test_threads_row_gives_each_thread_its_own_value_of_a_fixed_key():
    # One workspace per table size, whatever the key value: two key values' states lend
    # it at once. With one key value for both threads, every call stages the same table.
    spaces: dict = {}
    op = keyed_on_fixed(
        "check_state.one_workspace", lambda t: spaces.setdefault(t.shape, Workspace()), "shared"
    )
    with pytest.raises(AssertionError) as failed:
        jaxbind.testing.check(op, np.arange(1.0, 4.0), np.arange(1.0, 5.0), verbose=False)
    text = str(failed.value)
    assert "state: two threads [2 threads, 'shared', output 0" in text
    assert "key input 'table' reversed for thread 1" in text


@pytest.mark.parametrize("concurrency", ["lock", "pool"])
def test_threads_row_passes_a_fixed_key_with_an_object_per_key_value(concurrency):
    op = keyed_on_fixed(f"check_state.workspace_{concurrency}", lambda t: Workspace(), concurrency)
    report = jaxbind.testing.check(op, np.arange(1.0, 4.0), np.arange(1.0, 5.0), verbose=False)
    threads = _rows(report, "state: two threads")
    assert threads and all(r.ok for r in threads), threads
    assert "then again with the key input 'table' reversed for thread 1" in threads[0].detail


def test_threads_row_is_not_checked_for_a_fixed_key_with_no_second_value():
    spaces: dict = {}
    op = keyed_on_fixed(
        "check_state.one_value", lambda t: spaces.setdefault(t.shape, Workspace()), "shared"
    )
    report = jaxbind.testing.check(op, np.full(3, 2), np.arange(1.0, 5.0), verbose=False)
    (threads,) = _rows(report, "state: two threads")
    assert threads.status == "not checked", threads
    assert "key input 'table' (argument 0) has no second value" in threads.detail


def test_threads_row_is_not_checked_when_the_op_refuses_the_second_key_value():
    def sorted_only(table):
        if np.any(np.diff(table) < 0):
            raise ValueError("the table must be sorted")
        return Workspace()

    op = keyed_on_fixed("check_state.sorted_key", sorted_only, "lock")
    report = jaxbind.testing.check(op, np.arange(1.0, 4.0), np.arange(1.0, 5.0), verbose=False)
    (threads,) = _rows(report, "state: two threads")
    assert threads.status == "not checked", threads
    assert "the key cannot vary" in threads.detail and "sorted" in threads.detail


def kernel_op(name):
    numba = pytest.importorskip("numba")

    def scale_by_state(out, x, state):
        out[...] = numba.carray(state, (1,), np.float64)[0] * x

    @jaxbind.state
    def plan(*, factor):
        return np.array([factor], np.float64)  # the kernel gets its data's address

    k = jaxbind.kernel(scale_by_state)
    op = jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name=name, replace=True)(k)
    op.def_transpose(k)
    return op


def test_kernel_op_rows_name_the_program_from_before_the_check_that_holds_its_state():
    # A kernel uses its state unseen by Python: the sites' leases name the holder.
    op = kernel_op("check_state.kernel_kept")
    x = np.arange(3.0, dtype=np.float32)
    kept = jax.jit(lambda x: op(x, factor=5.0)).lower(x).compile()
    kept(x)
    report = jaxbind.testing.check(op, x, factor=5.0, verbose=False)
    (once,) = _rows(report, "state: set up once per site")
    (freed,) = _rows(report, "state: teardowns equal setups")
    assert once.status == "not checked" and freed.status == "not checked", (once, freed)
    assert "'check_state.kernel_kept' (the function)" in once.detail
    assert "still held by 'check_state.kernel_kept' (the function): 1 call site" in freed.detail
    del kept


def test_kernel_op_checked_in_a_fresh_state_passes_the_state_rows():
    op = kernel_op("check_state.kernel_fresh")
    report = jaxbind.testing.check(op, np.arange(3.0, dtype=np.float32), factor=5.0, verbose=False)
    (once,) = _rows(report, "state: set up once per site")
    (freed,) = _rows(report, "state: teardowns equal setups")
    assert once.ok and once.detail.startswith("1 setup(s)"), once
    assert freed.ok, freed
