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


class _Model:
    """A user object that holds its op, whose callable is a method of the object: a cycle."""

    def __init__(self, k):
        self.k = k
        self.op = jaxbind.get_nonlinear_call(
            self.apply, (None, None), lambda x, **kw: ((x.shape, x.dtype),), None
        )

    def apply(self, out, args, kwargs_dump):
        out[0][...] = self.k * args[0]


def test_binding_in_a_cycle_through_its_op_is_freed():
    """The trampoline holds call sites weakly, and the garbage collector sees what they hold."""
    jax.clear_caches()
    gc.collect()
    names = len(_binding.registered_names())
    x = jnp.ones(3)
    refs = []
    for k in range(5):
        model = _Model(float(k))
        np.testing.assert_allclose(jax.jit(lambda x: model.op(x)[0])(x), k)
        np.testing.assert_allclose(model.op(x, scale=2)[0], k)  # eager, with kwargs
        assert _live_sites("_Model.apply") > 0
        refs.append(weakref.ref(model))
        del model
    jax.clear_caches()
    gc.collect()
    assert all(r() is None for r in refs)
    assert len(_binding.registered_names()) == names
    assert _live_sites("_Model.apply") == 0


def _live_sites(binding: str) -> int:
    """Call sites of bindings whose name contains `binding` alive: those the executables
    own (through XLA's per-site slot) and those programs or the orphan LRU hold."""
    # type(), not isinstance(): isinstance reads __class__, which a dead weakref.proxy
    # left by another test raises ReferenceError for
    return sum(type(o) is _ext.Site and binding in o.binding for o in gc.get_objects())


def test_closures_with_the_same_qualified_name_get_distinct_names():
    op1, _ = _make_local_op(1.0)
    op2, _ = _make_local_op(2.0)
    assert op1.name != op2.name and op2.name.startswith(op1.name.split("#")[0])
    x = jnp.ones(2)
    f = jax.jit(lambda x: op1(x)[0] + op2(x)[0])
    np.testing.assert_allclose(f(x), 3 * x)


class _Opaque:
    """A keyword-argument value that is not plain data (kept in this process only)."""

    def __init__(self, k):
        self.k = k

    def __eq__(self, other):
        return isinstance(other, _Opaque) and other.k == self.k

    def __hash__(self):
        return hash(self.k)


def test_kwargs_never_freeze_the_callers_arrays():
    from reference_ops import axpy

    weights = np.arange(3.0)
    x = jnp.ones(3)
    # with an opaque value beside it, the kwargs are kept in-process, not encoded as data
    jax.block_until_ready(jax.jit(lambda x: axpy(x, x, scale=2.0, w=weights, o=_Opaque(1))[0])(x))
    jax.block_until_ready(axpy(x, x, w=weights, o=_Opaque(2))[0])
    assert weights.flags.writeable
    weights[0] = 5.0  # still the caller's own array


def test_process_local_kwargs_live_only_as_long_as_their_call_sites():
    from jaxbind import _kwargs

    def _scaled(out, args, kd):
        out[0][...] = jaxbind.load_kwargs(kd)["o"].k * args[0]

    op = jaxbind.get_linear_call(
        _scaled,
        None,
        lambda x, **kw: ((x.shape, x.dtype),),
        None,
        name="tests.local_kwargs_lifetime",
    )
    x = jnp.ones(2)
    gc.collect()
    before = len(_kwargs._local)
    for k in range(50):
        np.testing.assert_allclose(jax.jit(lambda x, k=k: op(x, o=_Opaque(k))[0])(x), k * x)
        np.testing.assert_allclose(op(x, o=_Opaque(k))[0], k * x)  # eager
    assert len(_kwargs._local) >= before + 50
    del op
    jax.clear_caches()
    gc.collect()
    assert len(_kwargs._local) <= before  # (clear_caches may free other tests' too)
