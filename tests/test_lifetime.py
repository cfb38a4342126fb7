"""Callables stay alive while a compiled program can call them, and are freed after."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np

import jaxbind
from jaxbind import _binding, _ext


def _make_local_op(scale):
    def f(out, args, kwargs_dump):
        out[0][...] = scale * args[0]

    def f_T(out, args, kwargs_dump):
        out[0][...] = scale * args[0]

    def abstract(x, **kwargs):
        return ((x.shape, x.dtype),)

    return jaxbind.get_linear_call(f, f_T, abstract, abstract), weakref.ref(f)


def _programs():
    """Jitted functions over a binding made here; the caller gets no reference to it."""
    op, f_ref = _make_local_op(3.0)
    x = jnp.arange(4.0)
    before = jax.jit(lambda x: op(x)[0])
    np.testing.assert_allclose(before(x), 3 * x)
    compiled = jax.jit(lambda x: jax.grad(lambda y: jnp.sum(op(y)[0] ** 2))(x)).lower(x).compile()
    after = jax.jit(lambda x: op(x)[0] + 1)  # traced and compiled only later
    return before, compiled, after, f_ref


def test_bindings_survive_dropping_every_user_reference():
    before, compiled, after, f_ref = _programs()
    x = jnp.arange(4.0)
    gc.collect()
    assert f_ref() is not None  # the jitted functions still reach it
    np.testing.assert_allclose(before(x), 3 * x)
    np.testing.assert_allclose(after(x), 3 * x + 1)
    np.testing.assert_allclose(compiled(x), 18 * x)


def test_compiled_program_keeps_its_binding_alive():
    op, f_ref = _make_local_op(2.0)
    x = jnp.arange(3.0)
    compiled = jax.jit(lambda x: op(x)[0]).lower(x).compile()
    del op
    gc.collect()
    assert f_ref() is not None
    np.testing.assert_allclose(compiled(x), 2 * x)
    del compiled
    jax.clear_caches()  # JAX's own trace caches hold jaxprs, and so the binding
    gc.collect()
    assert f_ref() is None  # freed once nothing can call it


def test_dropped_bindings_leave_no_sites_or_names():
    jax.clear_caches()
    gc.collect()
    names, sites = len(_binding.registered_names()), _ext.site_count()
    x = jnp.ones(5)
    refs = []
    for k in range(50):
        op, f_ref = _make_local_op(float(k))
        refs.append(f_ref)
        assert float(jax.jit(lambda x: op(x)[0])(x)[0]) == k
        del op
    jax.clear_caches()
    gc.collect()
    assert all(r() is None for r in refs)
    assert len(_binding.registered_names()) == names
    assert _ext.site_count() == sites


def test_closures_with_the_same_qualified_name_get_distinct_names():
    op1, _ = _make_local_op(1.0)
    op2, _ = _make_local_op(2.0)
    assert op1.name != op2.name and op2.name.startswith(op1.name.split("#")[0])
    x = jnp.ones(2)
    f = jax.jit(lambda x: op1(x)[0] + op2(x)[0])
    np.testing.assert_allclose(f(x), 3 * x)
