"""A pytree-API op's call takes a short path where it can (eager: one jitted program per set of
keyword arguments; run time: the site's callable without pytree or keyword-argument copies
it does not need). Whatever the path, a call gets what the general one gives: fresh keyword
arguments, the keyword arguments as passed (1 and 1.0 differ), pytrees, checked results.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind


def _like(x, **kw):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _loop(op, n=3, **kw):
    """`op` called n times in a jitted fori_loop (one call site, run n times)."""
    return jax.jit(lambda x: jax.lax.fori_loop(0, n, lambda i, y: op(y, **kw), x))


@pytest.mark.parametrize("form", ["out=", "returns"])
def test_each_call_gets_fresh_keyword_arguments_that_it_may_change(form):
    seen = []

    def record(x, opts, table, nested):
        seen.append((list(opts), dict(table), [list(v) for v in nested]))
        opts.append("changed")
        table["changed"] = True
        nested[0].append("changed")

    if form == "out=":

        @jaxbind.linear_op(shape=_like, name="tests.native_paths.fresh_out")
        def op(x, *, opts, table, nested, out):
            record(x, opts, table, nested)
            out[...] = x

    else:

        @jaxbind.linear_op(shape=_like, name="tests.native_paths.fresh_returns")
        def op(x, *, opts, table, nested):
            record(x, opts, table, nested)
            return np.asarray(x)

    kw = dict(opts=[1], table={"a": 1}, nested=([2],))
    x = jnp.ones(2)
    for _ in range(2):
        np.testing.assert_array_equal(op(x, **kw), x)
    np.testing.assert_array_equal(_loop(op, **kw)(x), x)
    assert seen == [([1], {"a": 1}, [[2]])] * 5
    assert kw == dict(opts=[1], table={"a": 1}, nested=([2],))  # the caller's are untouched


def test_eager_calls_keep_keyword_arguments_of_equal_value_and_other_types_apart():
    types = []

    @jaxbind.linear_op(shape=_like, name="tests.native_paths.kinds")
    def op(x, *, k):
        types.append(type(k))
        return np.asarray(x * k, x.dtype)

    x = jnp.arange(3.0)
    for k in (1, 1.0, True, 1, 2.0):
        np.testing.assert_array_equal(op(x, k=k), np.arange(3.0) * k)
    assert types == [int, float, bool, int, float]


def test_eager_pytree_calls_agree_with_jit_and_numpy():
    @jaxbind.nonlinear_op(
        shape=lambda d, s: {
            "sum": jax.ShapeDtypeStruct(d["a"].shape, d["a"].dtype),
            "prod": (jax.ShapeDtypeStruct(s.shape, s.dtype),),
        },
        name="tests.native_paths.tree_returns",
    )
    def returns(d, s):
        return {"sum": d["a"] + d["b"], "prod": (s * 2,)}

    @jaxbind.nonlinear_op(shape=returns.shape, name="tests.native_paths.tree_out")
    def writes(d, s, *, out):
        out["sum"][...] = d["a"] + d["b"]
        out["prod"][0][...] = s * 2

    d = {"a": jnp.arange(3.0), "b": jnp.ones(3)}
    s = jnp.arange(4, dtype=jnp.int32)
    want = {"sum": np.arange(3.0) + 1, "prod": (np.arange(4) * 2,)}
    for op in (returns, writes):
        for got in (op(d, s), op(d, s), jax.jit(op)(d, s)):
            jax.tree.map(np.testing.assert_array_equal, got, want)
            assert jax.tree.structure(got) == jax.tree.structure(want)


def test_results_not_exactly_the_outputs_arrays_are_converted_or_refused():
    @jaxbind.nonlinear_op(
        shape=lambda x: (_like(x), _like(x)), name="tests.native_paths.loose_results"
    )
    def loose(x):  # float64 into a float32 output, a list, as the general path takes them
        return np.asarray(x, np.float64) * 2, [float(v) for v in x]

    x = jnp.arange(3.0, dtype=jnp.float32)
    for got in (loose(x), jax.jit(loose)(x)):
        np.testing.assert_array_equal(got[0], 2 * np.arange(3.0))
        np.testing.assert_array_equal(got[1], np.arange(3.0))
        assert got[0].dtype == got[1].dtype == jnp.float32

    @jaxbind.linear_op(shape=_like, name="tests.native_paths.wrong_shape")
    def wrong(x):
        return np.zeros(x.shape[0] + 1, x.dtype)

    for call in (wrong, jax.jit(wrong)):
        with pytest.raises(Exception, match=r"returned output 0 with shape \(4,\)"):
            jax.block_until_ready(call(x))


def test_the_shape_function_runs_once_per_new_signature_of_eager_calls():
    shapes = []

    def shape(x, **kw):
        shapes.append((x.shape, tuple(sorted(kw))))
        return _like(x)

    @jaxbind.linear_op(shape=shape, name="tests.native_paths.shape_runs")
    def op(x, **kw):
        return np.asarray(x)

    def calls():
        op(jnp.ones(2))
        op(jnp.ones(3))
        op(jnp.ones(2), k=1)

    calls()  # new signatures: traced (the shape function declares, and the site checks)
    assert sorted(set(shapes)) == [((2,), ()), ((2,), ("k",)), ((3,), ())]
    first = len(shapes)
    calls()
    calls()
    assert len(shapes) == first


def test_eager_programs_are_dropped_with_jax_caches_and_made_again():
    @jaxbind.linear_op(shape=_like, name="tests.native_paths.cleared")
    def op(x, *, k=1.0):
        return np.asarray(x * k, x.dtype)

    x = jnp.ones(2)
    op(x), op(x, k=2.0)
    assert op.op._eager_calls
    jax.clear_caches()
    assert not op.op._eager_calls
    np.testing.assert_array_equal(op(x, k=3.0), [3.0, 3.0])


def test_arguments_that_are_not_jax_arrays_or_are_traced_take_the_general_path():
    @jaxbind.linear_op(shape=_like, name="tests.native_paths.general")
    def op(x):
        return 2 * np.asarray(x)

    np.testing.assert_array_equal(op(np.ones(2)), [2.0, 2.0])  # NumPy: converted
    jaxpr = str(jax.make_jaxpr(op)(jnp.ones(2)))  # traced: the primitive itself, no program
    assert "jaxbind[" in jaxpr and "pjit" not in jaxpr


def test_none_arguments_and_ops_without_outputs_keep_every_array_in_its_place():
    seen = []

    @jaxbind.linear_op(shape=lambda a, none, b: _like(b), name="tests.native_paths.none_arg")
    def skip_none(a, none, b):
        assert none is None
        return np.asarray(a) + 10 * np.asarray(b)

    @jaxbind.linear_op(
        shape=lambda x: None, has_side_effect=True, name="tests.native_paths.no_outputs"
    )
    def effect(x):
        seen.append(float(np.asarray(x)[0]))

    a, b = jnp.ones(2), jnp.full(2, 2.0)
    for got in (skip_none(a, None, b), jax.jit(skip_none)(a, None, b)):
        np.testing.assert_array_equal(got, [21.0, 21.0])
    assert effect(a) is None
    jax.jit(effect)(b)
    jax.effects_barrier()
    assert seen == [1.0, 2.0]
