"""A callable that keeps its arrays after returning: whatever route, nothing breaks.

The arrays a callable receives are views of XLA's buffers, valid only during the
call. When one outlives the call, jaxbind gives it its own copy of what the buffer
held at the end of the call (read-only), so it never reads memory XLA has reused,
never writes into later results and never crashes the process. Arrays derived from a
view (slices, reshapes, transposes) are moved into that copy too; a memoryview is
released. A JAX array made from a view with ``jax.device_put`` (which aliases NumPy
memory on the CPU) cannot be moved, and gets a warning naming the binding. Arrays
passed to JAX inside the callable (``jax.jit(g)(args[0])``) are not "kept".
"""

import gc
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import simple_op
from support.processes import run_script

BIG = 4 * 1024 * 1024  # float32 elements: 16 MB buffers, which XLA unmaps when freed


def _reuse_xla_memory():
    """Free and reallocate XLA buffers of the same size, so stale memory changes."""
    gc.collect()
    for i in range(3):
        (jnp.zeros(BIG, jnp.float32) + 100 + i).block_until_ready()


class _Holder:
    pass


ROUTES = {
    "list of the input": lambda out, args, keep: keep.append(args[0]),
    "list of the output": lambda out, args, keep: keep.append(out[0]),
    "the tuples": lambda out, args, keep: keep.append((out, args)),
    "an attribute": lambda out, args, keep: keep.append(setattr(h := _Holder(), "x", args[0]) or h),
    "a closure": lambda out, args, keep: keep.append(lambda x=args[0]: x),
    "a slice of the input": lambda out, args, keep: keep.append(args[0][::2]),
    "a slice of the output": lambda out, args, keep: keep.append(out[0][1:]),
    "a reshape": lambda out, args, keep: keep.append(args[0].reshape(-1, 2)),
    "a transpose of a slice": lambda out, args, keep: keep.append(args[0][2:].reshape(2, -1).T),
}


def _kept_values(kept):
    item = kept[0]
    if isinstance(item, _Holder):
        return item.x
    if callable(item):
        return item()
    if isinstance(item, tuple):
        return item[1][0]
    return item


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_kept_array_holds_the_values_of_its_call(route, jit):
    kept = []

    def f(out, args, kd):
        out[0][...] = args[0] + 1
        ROUTES[route](out, args, kept)

    op = simple_op(f, f"reliability.keeps_{route.replace(' ', '_')}_{jit}")
    call = jax.jit(lambda x: op(x)[0]) if jit else (lambda x: op(x)[0])
    x = jnp.arange(BIG, dtype=jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # keeping is safe now: no warning
        first = call(x).block_until_ready()
    del x
    _reuse_xla_memory()
    values = _kept_values(kept)
    want = np.arange(BIG, dtype=np.float32)
    if "output" in route:
        want = want + 1
    if "slice of the input" in route:
        want = want[::2]
    elif "slice of the output" in route:
        want = want[1:]
    elif "transpose" in route:
        want = want[2:].reshape(2, -1).T
    elif "reshape" in route:
        want = want.reshape(-1, 2)
    np.testing.assert_array_equal(values, want)
    assert not values.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        values[0] = 99.0
    # later calls are unaffected
    again = call(jnp.ones(BIG, jnp.float32))
    np.testing.assert_array_equal(again[:3], [2, 2, 2])
    np.testing.assert_array_equal(first[:3], [1, 2, 3])


def test_a_kept_memoryview_is_released_rather_than_read():
    kept = []

    def f(out, args, kd):
        out[0][...] = args[0]
        kept.append(memoryview(args[0]))

    op = simple_op(f, "reliability.keeps_memoryview")
    jax.jit(lambda x: op(x)[0])(jnp.ones(1000)).block_until_ready()
    with pytest.raises(ValueError, match="released"):
        kept[0][0]


def test_views_kept_by_a_raising_callable_hold_copies():
    kept = []

    def f(out, args, kd):
        kept.append(out[0])
        out[0][...] = 7
        raise KeyError("after keeping its output view")

    op = simple_op(f, "reliability.keeps_then_raises")
    with pytest.raises(Exception, match="after keeping its output view"):
        jax.block_until_ready(jax.jit(lambda x: op(x)[0])(jnp.zeros(BIG, jnp.float32)))
    _reuse_xla_memory()
    view = kept.pop()
    assert not view.flags.writeable and np.all(view == 7)


def test_jax_inside_the_callable_is_not_taken_for_a_kept_reference():
    g = jax.jit(lambda a: a * 2)

    def f(out, args, kd):
        out[0][...] = np.asarray(g(args[0]))

    op = simple_op(f, "reliability.calls_jit")
    fn = jax.jit(lambda x: op(x)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            np.testing.assert_array_equal(fn(jnp.arange(8.0)), 2 * np.arange(8.0))


def test_a_jax_array_aliasing_a_view_is_named_in_a_warning():
    made = []

    def f(out, args, kd):
        out[0][...] = args[0]
        made.append(jax.device_put(out[0]))

    op = simple_op(f, "reliability.device_put_of_a_view")
    with pytest.warns(
        RuntimeWarning,
        match=r"'reliability.device_put_of_a_view' \(the function"
        r"\) made a JAX array .* jnp.array\(view, copy=True",
    ):
        jax.jit(lambda x: op(x * 2)[0])(jnp.ones(1000)).block_until_ready()


def test_a_dead_weak_proxy_elsewhere_does_not_break_the_search():
    """Finding what derives from a kept view walks every object; a dead weakref.proxy
    among them (here in a list) must not turn the call into a ReferenceError."""
    import weakref

    class Thing:
        pass

    thing = Thing()
    holder = [weakref.proxy(thing)]
    del thing
    gc.collect()
    kept = []

    def f(out, args, kd):
        out[0][...] = args[0]
        kept.append(args[0][:10])  # a slice: the search for derived arrays runs

    op = simple_op(f, "reliability.keeps_beside_dead_proxy")
    got = jax.jit(lambda x: op(x)[0])(jnp.arange(1000.0, dtype=jnp.float32))
    np.testing.assert_array_equal(np.asarray(got)[:3], [0, 1, 2])
    np.testing.assert_array_equal(kept[0][:3], [0, 1, 2])
    assert len(holder) == 1


# --- views reached without a reference count (issue 36) ---------------------------------

WEAK_ROUTES = {
    "weakref.ref of the input": lambda out, args, keep: keep.append(weakref.ref(args[0])),
    "weakref.ref of the output": lambda out, args, keep: keep.append(weakref.ref(out[0])),
    "a WeakValueDictionary": lambda out, args, keep: keep.append(
        weakref.WeakValueDictionary({"x": args[0]})
    ),
    "weakref.ref with a callback": lambda out, args, keep: keep.append(
        weakref.ref(out[0], lambda ref: keep.append("called back"))
    ),
    "weakref.finalize": lambda out, args, keep: keep.append(
        weakref.finalize(args[0], keep.append, "finalized")
    ),
    "a weakref.proxy": lambda out, args, keep: keep.append(weakref.proxy(args[0])),
}


def _weakly_reached(item):
    """The array a weak route still reaches, or None."""
    if type(item) is weakref.ProxyType:  # (isinstance would dereference a dead proxy)
        try:
            return np.asarray(item)
        except ReferenceError:
            return None
    if isinstance(item, weakref.ref):
        return item()
    if isinstance(item, weakref.WeakValueDictionary):
        return item.get("x")
    assert isinstance(item, weakref.finalize)
    return item.peek()[0] if item.alive else None


@pytest.mark.parametrize("route", list(WEAK_ROUTES))
def test_a_weakly_held_view_never_shows_a_later_call(route):
    kept = []

    def f(out, args, kwargs):
        out[0][...] = args[0] + 1
        WEAK_ROUTES[route](out, args, kept)

    op = simple_op(f, f"reliability.weak_{route.replace(' ', '_')}")
    n = 1024
    first = np.arange(n, dtype=np.float32)
    np.testing.assert_array_equal(op(jnp.asarray(first))[0], first + 1)
    for i in range(3):  # later calls, same shapes: views would be reused
        op(jnp.full(n, 1000.0 + i, jnp.float32))[0].block_until_ready()
    _reuse_xla_memory()
    reached = _weakly_reached(kept[0])
    if reached is not None:  # if anything is still reachable, it holds the first call's data
        assert np.array_equal(reached, first) or np.array_equal(reached, first + 1)
    if route == "weakref.finalize":
        assert "finalized" in kept  # the view died with its call


def test_cached_views_are_not_reachable_through_the_garbage_collector():
    seen = {}

    def f(out, args, kwargs):
        out[0][...] = args[0]
        seen["input"] = args[0].__array_interface__["data"][0]
        seen["output"] = out[0].__array_interface__["data"][0]

    op = simple_op(f, "reliability.gc_objects")
    gc.collect()
    gc.disable()  # (a collection untracks tuples of untracked objects, which hides them too)
    try:
        op(jnp.arange(8.0, dtype=jnp.float32) + 1)[0].block_until_ready()
        objects = gc.get_objects()
    finally:
        gc.enable()
    leftovers = [
        item
        for obj in objects
        if type(obj) is tuple
        for item in obj
        if type(item) is np.ndarray
        and item.__array_interface__["data"][0] in (seen["input"], seen["output"])
    ]
    assert leftovers == []


def test_weakly_held_view_read_after_xla_frees_its_memory_does_not_crash(tmp_path):
    run = run_script(
        tmp_path,
        """
            import gc, weakref
            import jax.numpy as jnp, numpy as np, jaxbind
            refs = []
            def f(out, args, kwargs):
                out[0][...] = args[0]
                refs.append((float(args[0][0]), weakref.ref(args[0])))
            op = jaxbind.get_nonlinear_call(
                f, (None, None), lambda x: ((x.shape, x.dtype),), name="weak_crash")
            for i in range(5):
                op(jnp.full(4 * 1024 * 1024, float(i), jnp.float32))[0].block_until_ready()
            gc.collect()
            for _ in range(3):
                (jnp.zeros(4 * 1024 * 1024, jnp.float32) + 7).block_until_ready()
            for value, ref in refs:  # whatever is still reachable holds its own call's data
                view = ref()
                assert view is None or (view == value).all(), (value, view[:3])
            print("ok")
            """,
        name="weak.py",
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("ok")
