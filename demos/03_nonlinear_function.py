# %% [markdown]
# # A nonlinear op with its JVP and VJP
#
# `jaxbind.get_nonlinear_call` binds a nonlinear function together with its
# Jacobian-vector product (JVP) and vector-Jacobian product (VJP). Here
# `f(x1, x2) = x1 * x2**2`. The JVP receives the primals followed by their
# tangents, `(x1, x2, dx1, dx2) -> x2**2 dx1 + 2 x1 x2 dx2`; the VJP receives the
# primals followed by the output cotangent `c` and writes one cotangent per
# input, `(x2**2 c, 2 x1 x2 c)`. With `first_n_args_fixed=1` the leading
# argument becomes a parameter, here the exponent `p` of `x1 * x2**p`: it is
# passed to every callable but cannot be differentiated, and trying raises a
# clear error. Everything is checked against the same function written in JAX.

# %%
import jax
import jax.numpy as jnp
import numpy as np

import jaxbind


def f(out, args, kwargs_dump):
    x1, x2 = args
    out[0][...] = x1 * x2**2


def f_jvp(out, args, kwargs_dump):
    x1, x2, dx1, dx2 = args
    out[0][...] = x2**2 * dx1 + 2 * x1 * x2 * dx2


def f_vjp(out, args, kwargs_dump):
    x1, x2, ct = args
    out[0][...] = x2**2 * ct
    out[1][...] = 2 * x1 * x2 * ct


def abstract(x1, x2, **kwargs):
    return ((x1.shape, x1.dtype),)


def abstract_T(x1, x2, ct, **kwargs):  # shapes of the VJP's outputs
    return ((x1.shape, x1.dtype), (x2.shape, x2.dtype))


op = jaxbind.get_nonlinear_call(f, (f_jvp, f_vjp), abstract, abstract_T, name="demo.nonlin")
fj = lambda x1, x2: op(x1, x2)[0]
ref = lambda x1, x2: x1 * x2**2

rng = np.random.default_rng(1)
x1, x2, t1, t2 = (jnp.asarray(rng.standard_normal(6), jnp.float32) for _ in range(4))


def check(label, got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    print(f"{label:<28} ok  shape={tuple(np.shape(got))}")


# %%
check("f", fj(x1, x2), ref(x1, x2))
check("jit", jax.jit(fj)(x1, x2), ref(x1, x2))
check("jvp", jax.jvp(fj, (x1, x2), (t1, t2))[1], jax.jvp(ref, (x1, x2), (t1, t2))[1])
for got, want in zip(jax.vjp(fj, x1, x2)[1](t1), jax.vjp(ref, x1, x2)[1](t1)):
    check("vjp", got, want)
loss = lambda fn: lambda a, b: jnp.sum(jnp.tanh(fn(a, b)))
grads = jax.jit(jax.grad(loss(fj), (0, 1)))(x1, x2)
for got, want in zip(grads, jax.grad(loss(ref), (0, 1))(x1, x2)):
    check("grad w.r.t. (x1, x2)", got, want)
X1, X2 = jnp.stack([x1, t1]), jnp.stack([x2, t2])
check("vmap", jax.vmap(fj)(X1, X2), ref(X1, X2))
check("grad of vmap", jax.grad(loss(jax.vmap(fj)), 1)(X1, X2), jax.grad(loss(ref), 1)(X1, X2))

# %% [markdown]
# ## A fixed parameter: `g(p, x1, x2) = x1 * x2**p`
#
# The callables still receive `p` first; the JVP gets tangents of `x1` and `x2`
# only and the VJP writes cotangents of `x1` and `x2` only.


# %%
def g(out, args, kwargs_dump):
    p, x1, x2 = args
    out[0][...] = x1 * x2**p


def g_jvp(out, args, kwargs_dump):
    p, x1, x2, dx1, dx2 = args
    out[0][...] = x2**p * dx1 + p * x1 * x2 ** (p - 1) * dx2


def g_vjp(out, args, kwargs_dump):
    p, x1, x2, ct = args
    out[0][...] = x2**p * ct
    out[1][...] = p * x1 * x2 ** (p - 1) * ct


g_op = jaxbind.get_nonlinear_call(
    g,
    (g_jvp, g_vjp),
    lambda p, x1, x2, **kw: abstract(x1, x2),
    lambda p, x1, x2, ct, **kw: abstract_T(x1, x2, ct),
    first_n_args_fixed=1,
    name="demo.nonlin_fixed",
)
gj = lambda p, a, b: g_op(p, a, b)[0]
gref = lambda p, a, b: a * b**p
p = jnp.asarray(3.0, jnp.float32)
check("fixed p: g", jax.jit(gj)(p, x1, x2), gref(p, x1, x2))
check(
    "fixed p: jvp",
    jax.jvp(lambda a, b: gj(p, a, b), (x1, x2), (t1, t2))[1],
    jax.jvp(lambda a, b: gref(p, a, b), (x1, x2), (t1, t2))[1],
)
check(
    "fixed p: grad w.r.t. x2",
    jax.grad(lambda b: jnp.sum(gj(p, x1, b)))(x2),
    jax.grad(lambda b: jnp.sum(gref(p, x1, b)))(x2),
)
ps = jnp.asarray([1.0, 2.0, 3.0], jnp.float32)
check(
    "fixed p: vmap over p",
    jax.vmap(gj, (0, None, None))(ps, x1, x2),
    jax.vmap(gref, (0, None, None))(ps, x1, x2),
)
for name, attempt in [
    ("grad", lambda: jax.grad(lambda q: jnp.sum(gj(q, x1, x2)))(p)),
    ("jvp", lambda: jax.jvp(lambda q: gj(q, x1, x2), (p,), (p,))),
]:
    try:
        attempt()
        raise AssertionError(f"{name} w.r.t. the fixed argument should have failed")
    except TypeError as exc:
        print(f"{name} w.r.t. fixed p raises {type(exc).__name__}: {exc}")
print("All nonlinear checks passed.")

# %% [markdown]
# ## The same ops with the pytree API
#
# `jaxbind.nonlinear_op` with `def_jvp(primals, tangents)` and
# `def_vjp(primals, cotangent)`, in the style of `jax.custom_jvp` and
# `jax.custom_vjp`; `fixed=1` marks the parameter `p`.


# %%
@jaxbind.nonlinear_op(
    shape=lambda x1, x2: jax.ShapeDtypeStruct(x1.shape, x1.dtype), name="demo.nonlin_native"
)
def f_native(x1, x2):
    return x1 * x2**2


@f_native.def_jvp
def _(primals, tangents):
    (x1, x2), (dx1, dx2) = primals, tangents
    return x2**2 * dx1 + 2 * x1 * x2 * dx2


@f_native.def_vjp
def _(primals, ct):
    x1, x2 = primals
    return x2**2 * ct, 2 * x1 * x2 * ct


@jaxbind.nonlinear_op(
    shape=lambda p, x1, x2: jax.ShapeDtypeStruct(x1.shape, x1.dtype),
    fixed=1,
    name="demo.nonlin_fixed_native",
)
def g_native(p, x1, x2):
    return x1 * x2**p


@g_native.def_jvp
def _(primals, tangents):
    (p, x1, x2), (dx1, dx2) = primals, tangents
    return x2**p * dx1 + p * x1 * x2 ** (p - 1) * dx2


@g_native.def_vjp
def _(primals, ct):
    p, x1, x2 = primals
    return x2**p * ct, p * x1 * x2 ** (p - 1) * ct


check("native: f", jax.jit(f_native)(x1, x2), fj(x1, x2))
check("native: jvp", jax.jvp(f_native, (x1, x2), (t1, t2))[1], jax.jvp(fj, (x1, x2), (t1, t2))[1])
for got, want in zip(jax.grad(loss(f_native), (0, 1))(x1, x2), grads):
    check("native: grad w.r.t. (x1, x2)", got, want)
check(
    "native: grad of vmap",
    jax.grad(loss(jax.vmap(f_native)), 1)(X1, X2),
    jax.grad(loss(jax.vmap(fj)), 1)(X1, X2),
)
check(
    "native: fixed p, grad w.r.t. x2",
    jax.grad(lambda b: jnp.sum(g_native(p, x1, b)))(x2),
    jax.grad(lambda b: jnp.sum(gj(p, x1, b)))(x2),
)
check(
    "native: fixed p, vmap over p",
    jax.vmap(g_native, (0, None, None))(ps, x1, x2),
    jax.vmap(gj, (0, None, None))(ps, x1, x2),
)
names = {
    str(e.primitive) for e in jax.make_jaxpr(lambda a, b: (fj(a, b), f_native(a, b)))(x1, x2).eqns
}
assert names == {"jaxbind"}, names
print("The pytree-API ops match the JAXbind-protocol ops.")
