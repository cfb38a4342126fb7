# %% [markdown]
# # A bilinear op: the matrix product
#
# A multilinear function is linear in each argument separately, like the matrix
# product `f(A, B) = A @ B`. Passing `get_linear_call` a *tuple* of transposes,
# one per argument, makes such an op. The transpose with respect to argument
# `i` receives all the other arguments followed by the output cotangent and
# writes the cotangent of argument `i`: `T0(B, C) = C @ B.T` and
# `T1(A, C) = A.T @ C`. JAX derives forward mode from the product rule (one
# call of `f` per argument with a tangent) and reverse mode from the
# transposes. We check `jvp`, `grad` with respect to each argument and both,
# and `vmap` against `jnp.matmul`.

# %%
import jax
import jax.numpy as jnp
import numpy as np

import jaxbind


def matmul(out, args, kwargs_dump):
    a, b = args
    out[0][...] = a @ b


def matmul_T0(out, args, kwargs_dump):  # cotangent of A from (B, C)
    b, ct = args
    out[0][...] = ct @ b.T


def matmul_T1(out, args, kwargs_dump):  # cotangent of B from (A, C)
    a, ct = args
    out[0][...] = a.T @ ct


def abstract(a, b, **kwargs):
    return (((a.shape[0], b.shape[1]), a.dtype),)


def abstract_T0(b, ct, **kwargs):
    return (((ct.shape[0], b.shape[0]), ct.dtype),)


def abstract_T1(a, ct, **kwargs):
    return (((a.shape[1], ct.shape[1]), ct.dtype),)


matmul_op = jaxbind.get_linear_call(
    matmul, (matmul_T0, matmul_T1), abstract, (abstract_T0, abstract_T1), name="demo.matmul"
)


def mm(a, b):
    return matmul_op(a, b)[0]


rng = np.random.default_rng(0)
A, dA = (jnp.asarray(rng.standard_normal((4, 3)), jnp.float32) for _ in range(2))
B, dB = (jnp.asarray(rng.standard_normal((3, 5)), jnp.float32) for _ in range(2))


def check(label, got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    print(f"{label:<30} ok  shape={tuple(np.shape(got))}")


# %% [markdown]
# ## Evaluation, JIT and forward mode

# %%
check("A @ B", mm(A, B), A @ B)
check("jit", jax.jit(mm)(A, B), A @ B)
check("jvp, tangent in A only", jax.jvp(mm, (A, B), (dA, jnp.zeros_like(B)))[1], dA @ B)
check("jvp, product rule", jax.jvp(mm, (A, B), (dA, dB))[1], dA @ B + A @ dB)

# %% [markdown]
# ## Reverse mode
#
# A scalar loss `sum(sin(A @ B))`, differentiated with respect to `A`, `B` and
# both; the cotangent flows through the transposes `T0` and `T1`.


# %%
def loss(f):
    return lambda a, b: jnp.sum(jnp.sin(f(a, b)))


for argnums in (0, 1, (0, 1)):
    got = jax.jit(jax.grad(loss(mm), argnums=argnums))(A, B)
    want = jax.grad(loss(jnp.matmul), argnums=argnums)(A, B)
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        check(f"grad argnums={argnums} [{i}]", g, w)

C = jnp.ones((4, 5), jnp.float32)
check("vjp w.r.t. B", jax.vjp(lambda b: mm(A, b), B)[1](C)[0], A.T @ C)
check("linear_transpose w.r.t. A", jax.linear_transpose(lambda a: mm(a, B), A)(C)[0], C @ B.T)
check(
    "hessian-vector (A)",
    jax.jvp(jax.grad(loss(mm)), (A, B), (dA, dB))[1],
    jax.jvp(jax.grad(loss(jnp.matmul)), (A, B), (dA, dB))[1],
)

# %% [markdown]
# ## Batching
#
# `vmap` over a stack of `A`s with a shared `B`, over both, and its gradient.

# %%
As = jnp.stack([A, dA, A - dA])
Bs = jnp.stack([B, dB, B + dB])
check("vmap over A", jax.vmap(mm, (0, None))(As, B), jnp.matmul(As, B))
check("vmap over A and B", jax.vmap(mm)(As, Bs), jnp.matmul(As, Bs))
check(
    "grad of vmap (w.r.t. B)",
    jax.grad(loss(jax.vmap(mm, (0, None))), argnums=1)(As, B),
    jax.grad(loss(jax.vmap(jnp.matmul, (0, None))), argnums=1)(As, B),
)
print("All bilinear checks passed.")

# %% [markdown]
# ## The same op with the pytree API
#
# `jaxbind.multilinear_op` with one `def_transpose(argnum=i)` per argument; the
# transposes' shapes come from the primals, so only the forward shape is given.


# %%
@jaxbind.multilinear_op(
    shape=lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
    name="demo.matmul_native",
)
def mm_native(a, b):
    return a @ b


@mm_native.def_transpose(argnum=0)
def _(b, ct):
    return ct @ b.T


@mm_native.def_transpose(argnum=1)
def _(a, ct):
    return a.T @ ct


check("native: A @ B", mm_native(A, B), mm(A, B))
check(
    "native: jvp, product rule",
    jax.jvp(mm_native, (A, B), (dA, dB))[1],
    jax.jvp(mm, (A, B), (dA, dB))[1],
)
for argnums in (0, 1, (0, 1)):
    got = jax.jit(jax.grad(loss(mm_native), argnums=argnums))(A, B)
    want = jax.grad(loss(mm), argnums=argnums)(A, B)
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        check(f"native: grad argnums={argnums} [{i}]", g, w)
check("native: vmap over A and B", jax.vmap(mm_native)(As, Bs), jax.vmap(mm)(As, Bs))
check(
    "native: hessian-vector",
    jax.jvp(jax.grad(loss(mm_native)), (A, B), (dA, dB))[1],
    jax.jvp(jax.grad(loss(mm)), (A, B), (dA, dB))[1],
)
names = {
    str(e.primitive) for e in jax.make_jaxpr(lambda a, b: (mm(a, b), mm_native(a, b)))(A, B).eqns
}
assert names == {"jaxbind"}, names
print("The pytree-API op matches the JAXbind-protocol op.")
