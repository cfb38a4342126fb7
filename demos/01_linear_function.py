# %% [markdown]
# # SciPy's FFT as a linear JAX op
#
# `jaxbind.get_linear_call` turns a linear Python function and its transpose
# into a JAX primitive that works with `jit`, `jvp`, `vjp`/`grad`,
# `linear_transpose` and `vmap`. Here we bind `scipy.fft.fftn` (unnormalised,
# complex input). JAX transposes complex-linear maps without conjugation: the
# transpose of `x -> F x` is `y -> F^T y`, and the DFT matrix is symmetric, so
# the transpose is the forward FFT again. A keyword argument of the call
# (`workers=`) reaches SciPy through `jaxbind.load_kwargs`. A second op sets
# `func_can_batch=True` and maps `vmap` onto SciPy's `axes=` argument instead of
# calling SciPy once per batch element. Everything is checked against
# `jnp.fft.fftn`.

# %%
import jax
import jax.numpy as jnp
import numpy as np
import scipy.fft

import jaxbind


def fftn(out, args, kwargs_dump):
    (x,) = args
    kwargs = jaxbind.load_kwargs(kwargs_dump)
    batch_axes = kwargs.pop("batch_axes", None)  # only set for func_can_batch=True
    axes = None if not batch_axes else [i for i in range(x.ndim) if i not in batch_axes[0]]
    out[0][...] = scipy.fft.fftn(x, axes=axes, **kwargs)  # e.g. workers=1


def fftn_abstract(x, **kwargs):
    batch_axes = kwargs.get("batch_axes")
    out_axis = batch_axes[0][-1] if batch_axes else None  # output batched like the input
    return ((x.shape, x.dtype, out_axis),)


# F is symmetric (F^T = F), so the transpose and its abstract function are the same.
fft_op = jaxbind.get_linear_call(fftn, fftn, fftn_abstract, fftn_abstract, name="demo.fftn")
fft_batched_op = jaxbind.get_linear_call(
    fftn, fftn, fftn_abstract, fftn_abstract, func_can_batch=True, name="demo.fftn_batched"
)

rng = np.random.default_rng(42)
shape = (8, 6)
x = jnp.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape), jnp.complex64)
y = jnp.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape), jnp.complex64)
tol = dict(rtol=1e-5, atol=1e-5 * float(jnp.abs(jnp.fft.fftn(x)).max()))


def check(label, got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **tol)
    print(f"{label:<34} ok  shape={tuple(np.shape(got))} dtype={np.asarray(got).dtype}")


# %% [markdown]
# ## Applying, jitting and passing keyword arguments


# %%
def fft(x, **kwargs):
    return fft_op(x, **kwargs)[0]


check("fft_op(x)", fft(x), jnp.fft.fftn(x))
check("fft_op(x, workers=1)", fft(x, workers=1), jnp.fft.fftn(x))
check("jit(fft_op)", jax.jit(fft)(x), jnp.fft.fftn(x))

# %% [markdown]
# ## Transpose, VJP and gradient
#
# `jax.grad` of the real loss `sum |fft(x)|^2` = `N sum |x|^2` (Parseval); for a
# complex input JAX's `grad` returns the conjugate of the Wirtinger gradient.

# %%
(xt,) = jax.linear_transpose(fft, x)(y)
check("linear_transpose", xt, jax.linear_transpose(jnp.fft.fftn, x)(y)[0])
out, pullback = jax.vjp(fft, x)
check("vjp primal", out, jnp.fft.fftn(x))
check("vjp cotangent", pullback(y)[0], jax.vjp(jnp.fft.fftn, x)[1](y)[0])


def loss(f):
    return lambda x: jnp.sum(jnp.abs(f(x)) ** 2)


g = jax.jit(jax.grad(loss(fft)))(x)
check("grad of sum |fft(x)|^2", g, jax.grad(loss(jnp.fft.fftn))(x))
check("  ... equals 2 N conj(x)", g, 2 * x.size * jnp.conj(x))  # JAX's complex grad convention
check("jvp tangent", jax.jvp(fft, (x,), (y,))[1], jnp.fft.fftn(y))

# %% [markdown]
# ## Batching
#
# Without `func_can_batch`, `vmap` calls SciPy once per batch element. With it,
# the callables see `batch_axes` and transform only the other axes in one call.

# %%
xs = jnp.stack([x, y, 2 * x - y], axis=1)  # batch axis 1, FFT over axes 0 and 2
ref = jax.vmap(jnp.fft.fftn, in_axes=1, out_axes=1)(xs)
check("vmap (one call per element)", jax.vmap(fft, in_axes=1, out_axes=1)(xs), ref)


def fft_b(x, **kwargs):
    return fft_batched_op(x, **kwargs)[0]


check("vmap, vectorized batching", jax.jit(jax.vmap(fft_b, 1, 1))(xs), ref)
xss = jnp.stack([xs, 1j * xs])  # two vmap levels: FFT over the 2D "image" axes only
check(
    "vmap of vmap, native, workers=1",
    jax.vmap(jax.vmap(lambda v: fft_b(v, workers=1), 1, 1))(xss),
    jax.vmap(jax.vmap(jnp.fft.fftn, 1, 1))(xss),
)
check(
    "grad of vmap, native",
    jax.grad(loss(jax.vmap(fft_b, 1, 1)))(xs),
    jax.grad(loss(jax.vmap(jnp.fft.fftn, 1, 1)))(xs),
)
cts = jnp.conj(xs)
check(
    "vjp of vmap, native",
    jax.vjp(jax.vmap(fft_b, 1, 1), xs)[1](cts)[0],
    jax.vjp(jax.vmap(jnp.fft.fftn, 1, 1), xs)[1](cts)[0],
)
print("All FFT checks passed.")

# %% [markdown]
# ## The same op with the pytree API
#
# `jaxbind.linear_op` defines the same binding machinery with JAX's vocabulary:
# the function returns its result (or writes into `out=` if it takes one), the
# shape is a `jax.ShapeDtypeStruct`, keyword arguments are plain Python values,
# and one output comes back as an array. `vectorized=True` is the native
# batching: batched arrays arrive with their batch axes in front.


# %%
@jaxbind.linear_op(
    shape=lambda x, **kw: jax.ShapeDtypeStruct(x.shape, x.dtype), name="demo.fftn_native"
)
def fft_native(x, **kwargs):
    return scipy.fft.fftn(x, **kwargs)


@fft_native.def_transpose
def _(ct, **kwargs):  # symmetric: the transpose is the FFT again
    return scipy.fft.fftn(ct, **kwargs)


@jaxbind.linear_op(
    shape=lambda x, **kw: jax.ShapeDtypeStruct(x.shape, x.dtype),
    vectorized=True,
    name="demo.fftn_native_batched",
)
def fft_native_b(x, *, out, **kwargs):  # batch axes (if any) lead: transform the last two
    out[...] = scipy.fft.fftn(x, axes=(-2, -1), **kwargs)


fft_native_b.def_transpose(lambda ct, *, out, **kw: fft_native_b.fn(ct, out=out, **kw))

for label, got, want in [
    ("native: apply", fft_native(x), fft(x)),
    ("native: jit, workers=1", jax.jit(lambda v: fft_native(v, workers=1))(x), fft(x)),
    ("native: linear_transpose", jax.linear_transpose(fft_native, x)(y)[0], xt),
    ("native: grad", jax.grad(loss(fft_native))(x), g),
    ("native: vmap", jax.vmap(fft_native, 1, 1)(xs), ref),
    ("native: vmap, vectorized", jax.jit(jax.vmap(fft_native_b, 1, 1))(xs), ref),
    (
        "native: grad of vmap, vectorized",
        jax.grad(loss(jax.vmap(fft_native_b, 1, 1)))(xs),
        jax.grad(loss(jax.vmap(fft_b, 1, 1)))(xs),
    ),
]:
    check(label, got, want)
# both forms bind the same primitive
names = {str(e.primitive) for e in jax.make_jaxpr(lambda v: (fft(v), fft_native(v)))(x).eqns}
assert names == {"jaxbind"}, names
print("The pytree-API op matches the JAXbind-protocol op.")
