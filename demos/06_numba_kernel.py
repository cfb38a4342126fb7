# %% [markdown]
# # A numba kernel as a JAX op: cloud-in-cell deposit
#
# The cloud-in-cell (CIC) deposit spreads the weights `w` of particles at positions `pos`
# (grid units) over the 4 nearest cells of a periodic 2-D grid, with bilinear weights. It
# is linear in `w`; its transpose interpolates a grid back to the particles. Both are numba
# functions that write their outputs in place; `jaxbind.kernel` compiles them to kernels
# that run without the GIL and without Python, and `first_n_args_fixed=1` makes them one
# linear op in `w`. Checked against pure JAX under `jit`, `linear_transpose`, `grad` and
# `vmap`. Needs numba (`pip install ".[kernels]"` in the clone).

# %%
import jax
import jax.numpy as jnp
import numpy as np

import jaxbind


@jaxbind.kernel
def deposit(out, pos, w):  # out: the (n, n) grid
    n0, n1 = out.shape
    out[:, :] = 0.0  # outputs arrive uninitialized
    for p in range(w.shape[0]):
        fi, fj = np.floor(pos[p, 0]), np.floor(pos[p, 1])
        fx, fy = pos[p, 0] - fi, pos[p, 1] - fj
        i0, j0 = int(fi) % n0, int(fj) % n1
        i1, j1 = (i0 + 1) % n0, (j0 + 1) % n1
        out[i0, j0] += w[p] * (1 - fx) * (1 - fy)
        out[i1, j0] += w[p] * fx * (1 - fy)
        out[i0, j1] += w[p] * (1 - fx) * fy
        out[i1, j1] += w[p] * fx * fy


@jaxbind.kernel
def interpolate(out, pos, grid):  # the transpose; out: one value per particle
    n0, n1 = grid.shape
    for p in range(out.shape[0]):
        fi, fj = np.floor(pos[p, 0]), np.floor(pos[p, 1])
        fx, fy = pos[p, 0] - fi, pos[p, 1] - fj
        i0, j0 = int(fi) % n0, int(fj) % n1
        i1, j1 = (i0 + 1) % n0, (j0 + 1) % n1
        out[p] = (
            grid[i0, j0] * (1 - fx) * (1 - fy)
            + grid[i1, j0] * fx * (1 - fy)
            + grid[i0, j1] * (1 - fx) * fy
            + grid[i1, j1] * fx * fy
        )


def shape(pos, w, *, n):  # the kernels ignore `n`: they read the grid's shape
    return (((n, n), w.dtype),)


cic_op = jaxbind.get_linear_call(deposit, interpolate, shape, first_n_args_fixed=1, name="demo.cic")


def cic(pos, w, n=64):
    return cic_op(pos, w, n=n)[0]


def cic_ref(pos, w, n=64):  # pure JAX: the same cells and weights, scattered with .at[].add
    i = jnp.floor(pos)
    fx, fy = (pos - i).T
    (i0, j0), (i1, j1) = (i.astype(jnp.int32) % n).T, ((i.astype(jnp.int32) + 1) % n).T
    grid = jnp.zeros((n, n), w.dtype)
    cells = [(i0, j0, (1 - fx) * (1 - fy)), (i1, j0, fx * (1 - fy))]
    cells += [(i0, j1, (1 - fx) * fy), (i1, j1, fx * fy)]
    for a, b, c in cells:
        grid = grid.at[a, b].add(w * c)
    return grid


rng = np.random.default_rng(0)
pos = jnp.asarray(rng.uniform(0, 64, (5000, 2)), jnp.float32)
w = jnp.asarray(rng.uniform(0.5, 1.5, 5000), jnp.float32)


def check(label, got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    print(f"{label:<32} ok  shape={tuple(np.shape(got))}")


# %% jit, transpose and grad
check("deposit", cic(pos, w), cic_ref(pos, w))
check("jit(deposit)", jax.jit(cic)(pos, w), cic_ref(pos, w))
transpose = jax.linear_transpose(lambda w: cic(pos, w), w)
target = cic_ref(pos, jnp.asarray(rng.uniform(0.5, 1.5, 5000), jnp.float32))
check("linear_transpose", transpose(target)[0], jax.vjp(lambda w: cic_ref(pos, w), w)[1](target)[0])


def loss(dep, target):
    return lambda w: 0.5 * jnp.sum((dep(pos, w) - target) ** 2)


g_ref = jax.grad(loss(cic_ref, target))(w)
check("grad", jax.jit(jax.grad(loss(cic, target)))(w), g_ref)

# %% vmap: jaxbind's C++ loop calls the kernel once per batch element
ws = jnp.stack([w, 2 * w, w**2])
check("vmap over w", jax.vmap(cic, (None, 0))(pos, ws), jax.vmap(cic_ref, (None, 0))(pos, ws))
poss = jnp.stack([pos, (pos + 0.5) % 64, pos[::-1]])
check("vmap over pos and w", jax.vmap(cic)(poss, ws), jax.vmap(cic_ref)(poss, ws))


# %% Fitting the weights by gradient descent
def fit(dep, steps=20, lr=0.1):
    step = lambda i, w: w - lr * jax.grad(loss(dep, target))(w)
    return jax.jit(lambda w: jax.lax.fori_loop(0, steps, step, w))(jnp.ones_like(w))


w_fit = fit(cic)
check("20 descent steps", w_fit, fit(cic_ref))
print(f"loss {loss(cic, target)(jnp.ones_like(w)):.1f} -> {loss(cic, target)(w_fit):.1f}")

# %% The same op with the pytree API: `fixed=1` marks the positions as a parameter
cic_native = jaxbind.linear_op(
    shape=lambda pos, w, *, n: jax.ShapeDtypeStruct((n, n), w.dtype), fixed=1, name="demo.cic_n"
)(deposit)
cic_native.def_transpose(interpolate)
check("native: jit", jax.jit(lambda p, w: cic_native(p, w, n=64))(pos, w), cic_ref(pos, w))
check("native: grad", jax.grad(loss(lambda p, w: cic_native(p, w, n=64), target))(w), g_ref)
print("All CIC checks passed.")
