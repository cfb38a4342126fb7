"""Ops pickle by reference, as functions do: a module-level op of either API (and
jaxducc0's) is its module and name, so multiprocessing, joblib and dask can send
functions that hold ops to other processes, which import the module and call the op
defined there. An op no module holds by name fails to pickle with an error naming it."""

import copy
import multiprocessing
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_ops
from support import ops
from support.skips import importable

import jaxbind

A = np.arange(6.0, dtype=np.float32).reshape(2, 3)
X = np.array([1.0, -2.0, 0.5], np.float32)
PAIR = {"a": np.ones(2, np.float32), "b": np.arange(2.0, dtype=np.float32)}


def _module_level_ops():
    found = [reference_ops.matvec, reference_ops.nonlinear, reference_ops.native_pair]
    if importable("ducc0"):
        from jaxbind.contrib import jaxducc0

        found.append(jaxducc0.c2c)
    return found


@pytest.mark.parametrize("op", _module_level_ops(), ids=lambda op: op.name)
def test_a_module_level_op_pickles_as_its_module_and_name(op):
    data = pickle.dumps(op)
    assert pickle.loads(data) is op
    assert b"reference_ops" in data or b"jaxbind.contrib.ducc.fft" in data
    assert len(data) < 200  # the name, none of its callables
    assert copy.copy(op) is op and copy.deepcopy({"op": op})["op"] is op


def _local_ops():
    def f(out, args, kd):
        out[0][...] = 2 * args[0]

    made13 = jaxbind.get_linear_call(f, f, ops.same_as_first, name="tests.pickling.local13")

    @jaxbind.linear_op(shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype))
    def local_native(x):
        return 2 * np.asarray(x)

    return made13, local_native


@pytest.mark.parametrize("which", [0, 1], ids=["jaxbind13", "native"])
def test_an_op_no_module_holds_fails_to_pickle_naming_it(which):
    op = _local_ops()[which]
    with pytest.raises(pickle.PicklingError, match=rf"'{op.name}' cannot be pickled.*top level"):
        pickle.dumps(op)
    with pytest.raises(pickle.PicklingError, match=rf"'{op.name}' cannot be pickled"):
        pickle.dumps({"held": [op]})  # inside what a user pickles


def test_a_name_that_holds_another_object_when_unpickled_is_a_clean_error():
    load, (module, name) = reference_ops.matvec.__reduce__()
    assert load(module, name) is reference_ops.matvec
    with pytest.raises(pickle.UnpicklingError, match="reference_ops.matvec_ref is not a jaxbind"):
        load(module, "matvec_ref")  # (a function there now)


def _call_in_child(op, *args, **kwargs):
    """Run in a spawned process: the op arrives by reference and runs there."""
    result = op(*args, **kwargs)
    return [np.asarray(r) for r in jax.tree.leaves(result)]


def test_ops_called_in_a_spawned_process_give_the_parents_results():
    calls = [
        (reference_ops.matvec, (A, X), {}),
        (reference_ops.native_pair, (PAIR,), {"k": 3.0}),
    ]
    if importable("ducc0"):
        from jaxbind.contrib import jaxducc0

        calls.append((jaxducc0.c2c, (X.astype(np.complex64),), {"axes": (0,)}))
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        got = [pool.apply(_call_in_child, (op, *args), kwargs) for op, args, kwargs in calls]
    for (op, args, kwargs), child in zip(calls, got):
        want = [np.asarray(r) for r in jax.tree.leaves(op(*args, **kwargs))]
        assert len(child) == len(want)
        for c, w in zip(child, want):
            np.testing.assert_allclose(c, w, rtol=1e-6)
    np.testing.assert_allclose(got[0][0], A @ X, rtol=1e-6)
    np.testing.assert_allclose(got[1][1], 6.0 * PAIR["b"], rtol=1e-6)
    assert jnp.allclose(jnp.asarray(got[0][0]), reference_ops.matvec_ref(A, X))
