"""A forward-only numba kernel with a JAX reference, and no derivative declared: its JVP,
VJP and second derivatives come from the reference, and jaxbind.testing.check runs them
(first order, Hessian-vector products, batching) and reports them as derived, in both
APIs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random
from support.dtypes import global_x64

import jaxbind

numba = pytest.importorskip("numba")


def sinsq_ref(x):  # y = sin(x) x², the pure-JAX function
    return jnp.sin(x) * x**2


@jaxbind.kernel
def _sinsq(out, x):
    for i in range(x.size):
        v = x.flat[i]
        out.flat[i] = np.sin(v) * v * v


sinsq = jaxbind.get_nonlinear_call(
    _sinsq,
    (None, None),
    lambda x, **kw: ((x.shape, x.dtype),),
    name="tests.kernel_reference.sinsq",
    reference=sinsq_ref,
)


@jaxbind.nonlinear_op(
    shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
    name="tests.kernel_reference.sinsq_native",
    reference=sinsq_ref,
)
@jaxbind.kernel
def sinsq_native(y, x):
    for i in range(x.size):
        v = x.flat[i]
        y.flat[i] = np.sin(v) * v * v


_DERIVATIVE_ROWS = {
    "jvp vs finite differences",
    "vjp vs finite differences",
    "vjp vs jvp (dot product)",
    "hessian symmetry",
    "hessian-vector product vs finite differences",
    "second-order jvp vs finite differences",
    "vmap(grad) vs loop",
    "native vs reference: forward",
    "native vs reference: vmap",
}


@pytest.mark.parametrize("op", [sinsq, sinsq_native], ids=["jaxbind13", "native"])
@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_a_forward_only_kernel_with_a_reference_passes_check_to_second_order(op, x64):
    with global_x64(x64):
        report = jaxbind.testing.check(op, random((2, 3), np.float64, 1), verbose=False)
    assert not report.failures()
    passed = {r.check for r in report if r.ok}
    assert _DERIVATIVE_ROWS <= passed, _DERIVATIVE_ROWS - passed
    assert {(r.target, r.detail) for r in report.derived()} == {
        ("the JVP", "no body declared: jax.jvp of the reference"),
        ("the VJP", "no body declared: jax.vjp of the reference"),
    }
    computed = "float64" if x64 else "float32"
    hvp = [r for r in report if r.check == "hessian-vector product vs finite differences"]
    assert hvp and all(r.dtype == computed for r in hvp)


@pytest.mark.parametrize("op", [sinsq, sinsq_native], ids=["jaxbind13", "native"])
def test_the_hessian_of_a_forward_only_kernel_is_the_pure_jax_one(enable_x64, op):
    x = random((5,), np.float64, 2)
    as_array = lambda y: y[0] if isinstance(y, (list, tuple)) else y  # JAXbind 1.3: a list
    loss = lambda f: lambda x: jnp.sum(as_array(f(x)) * jnp.cos(x))
    hessian, expected = jax.hessian(loss(op))(x), jax.hessian(loss(sinsq_ref))(x)
    np.testing.assert_allclose(hessian, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(jax.grad(loss(op))(x), jax.grad(loss(sinsq_ref))(x), rtol=1e-12)
