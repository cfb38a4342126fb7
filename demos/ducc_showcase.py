# %% [markdown]
# # Wiener filtering on the sphere with DUCC inside JAX
#
# A small inverse problem on the sphere. The truth is a random field given by its
# spherical-harmonic coefficients, drawn from a power spectrum. The data are that field
# on a HEALPix map, seen through a mask (the galactic band is cut out) with white
# noise. We reconstruct the coefficients with the Wiener filter: the posterior mean,
# which solves
#
#     (Y^T M^T N^-1 M Y + S^-1) a = Y^T M^T N^-1 d
#
# by conjugate gradients. `Y` is DUCC's spherical-harmonic synthesis, bound into JAX
# by `jaxbind.contrib.jaxducc0.get_healpix_sht`. Its transpose `Y^T` is never written
# here: JAX derives it from the binding with `jax.linear_transpose`. The whole solver
# runs under `jax.jit`, `jax.grad` checks it, and `jax.vmap` reconstructs several
# noise realisations at once.
#
# Run: `python demos/ducc_showcase.py` (writes `ducc_showcase.png` next to it).

# %%
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxbind
from jaxbind.contrib import jaxducc0

jax.config.update("jax_enable_x64", True)

NSIDE, LMAX = 32, 64
NPIX = 12 * NSIDE**2
NOISE_STD = 2.0
rng = np.random.default_rng(42)

sht = jaxducc0.get_healpix_sht(NSIDE, LMAX, LMAX, spin=0, nthreads=1)
n_real = jaxducc0.realalm_size(LMAX, LMAX)


def Y(a):
    """Real alm (1, n_real) -> map (1, NPIX)."""
    return sht(a)[0]


def Y_T(m):
    """The transpose of Y, derived by JAX from the binding's transpose."""
    return jax.linear_transpose(Y, jnp.zeros((1, n_real)))(m)[0]


# %% [markdown]
# ## Prior, truth and data

# %%
# The l of every real coefficient, in the real alm layout: m = 0 first (l = 0..LMAX),
# then (re, im) pairs for each m > 0 (l = m..LMAX).
ell = jaxducc0.realalm_ell(LMAX, LMAX)
power = 1.0 / (1.0 + (ell / 8.0) ** 2) ** 1.5  # smooth field, most power at l < 10
S = jnp.asarray(power)[None, :]

truth = jnp.asarray(np.sqrt(power) * rng.standard_normal(n_real))[None, :]
import ducc0  # noqa: E402  (pixel positions, and the pytree-API op at the end)

base = ducc0.healpix.Healpix_Base(NSIDE, "RING")
colat = base.pix2ang(np.arange(NPIX))[:, 0]
mask = jnp.asarray((np.abs(colat - np.pi / 2) > 0.25).astype(np.float64))[None, :]

signal = Y(truth)
data = mask * (signal + NOISE_STD * rng.standard_normal((1, NPIX)))
print(
    f"HEALPix nside={NSIDE} ({NPIX} pixels), lmax={LMAX} ({n_real} real coefficients), "
    f"{int(mask.sum())} unmasked pixels, noise std {NOISE_STD}"
)

# %% [markdown]
# ## Adjoint test: <Y a, m> = <a, Y^T m>

# %%
a_test = jnp.asarray(rng.standard_normal((1, n_real)))
m_test = jnp.asarray(rng.standard_normal((1, NPIX)))
lhs, rhs = jnp.vdot(Y(a_test), m_test), jnp.vdot(a_test, Y_T(m_test))
adjoint_error = float(abs(lhs - rhs) / abs(lhs))
print(f"adjoint test |<Ya,m> - <a,Y^T m>| / |<Ya,m>| = {adjoint_error:.1e}")
assert adjoint_error < 1e-10

# %% [markdown]
# ## The Wiener filter under jit


# %%
def curvature(a):
    return Y_T(mask * Y(a)) / NOISE_STD**2 + a / S


@jax.jit
def wiener_filter(d):
    j = Y_T(mask * d) / NOISE_STD**2
    a, _ = jax.scipy.sparse.linalg.cg(curvature, j, tol=1e-8, maxiter=300)
    return a


start = time.perf_counter()
rec = jax.block_until_ready(wiener_filter(data))
t_first = time.perf_counter() - start
start = time.perf_counter()
rec = jax.block_until_ready(wiener_filter(data))
t_solve = time.perf_counter() - start


# Time per application of the synthesis and of its transpose, jitted.
def timeit(f, x, n=20):
    jax.block_until_ready(f(x))
    start = time.perf_counter()
    for _ in range(n):
        jax.block_until_ready(f(x))
    return (time.perf_counter() - start) / n


t_Y, t_YT = timeit(jax.jit(Y), truth), timeit(jax.jit(Y_T), signal)
print(f"Y: {1e3 * t_Y:.2f} ms per application, Y^T: {1e3 * t_YT:.2f} ms per application")
print(
    f"Wiener filter (CG, jitted): first call {t_first:.2f} s with compilation, then {t_solve:.2f} s"
)


def rel_err(m, where):
    return float(jnp.linalg.norm(where * (m - signal)) / jnp.linalg.norm(where * signal))


seen, cut = mask, 1 - mask
print(
    f"relative error where observed: data {rel_err(data, seen):.3f}, "
    f"reconstruction {rel_err(Y(rec), seen):.3f}; in the masked band: "
    f"reconstruction {rel_err(Y(rec), cut):.3f} (no data there)"
)
assert rel_err(Y(rec), seen) < rel_err(data, seen) and rel_err(Y(rec), cut) < 1.0

# %% [markdown]
# ## The solution is a stationary point: grad of the posterior energy is ~0


# %%
def energy(a, d):
    r = mask * (d - Y(a))
    return 0.5 * jnp.sum(r**2) / NOISE_STD**2 + 0.5 * jnp.sum(a**2 / S)


g_rec = jax.jit(jax.grad(energy))(rec, data)
g_zero = jax.grad(energy)(jnp.zeros_like(rec), data)
print(
    f"|grad energy| at the solution: {float(jnp.linalg.norm(g_rec)):.2e} "
    f"(at zero: {float(jnp.linalg.norm(g_zero)):.2e})"
)
assert float(jnp.linalg.norm(g_rec)) < 1e-5 * float(jnp.linalg.norm(g_zero))

# %% [markdown]
# ## Several noise realisations at once with vmap

# %%
batch = 4
datas = mask[None] * (signal[None] + NOISE_STD * rng.standard_normal((batch, 1, NPIX)))
start = time.perf_counter()
recs = jax.block_until_ready(jax.jit(jax.vmap(wiener_filter))(datas))
t_batch = time.perf_counter() - start
errs = [rel_err(Y(r), seen) for r in recs]
print(
    f"vmap over {batch} noise realisations: {t_batch:.2f} s with compilation, errors "
    + ", ".join(f"{e:.3f}" for e in errs)
)
single = wiener_filter(datas[1])
assert float(jnp.max(jnp.abs(single - recs[1]))) < 1e-6 * float(jnp.max(jnp.abs(single)))

# %% [markdown]
# ## Figure: truth, data, reconstruction (equirectangular projection)

# %%
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
    print("matplotlib not installed (pip install '.[demo]' in the clone): no figure written")

if plt is not None:
    th, ph = np.meshgrid(
        np.linspace(0.01, np.pi - 0.01, 180), np.linspace(0, 2 * np.pi, 360), indexing="ij"
    )
    pix = base.ang2pix(np.stack([th, ph], axis=-1))
    panels = [("truth", signal), ("data (masked, noisy)", data), ("Wiener filter", Y(rec))]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.0), layout="constrained")
    vmax = float(jnp.max(jnp.abs(signal)))
    for ax, (title, m) in zip(axes, panels):
        im = ax.imshow(
            np.asarray(m)[0][pix], cmap="RdBu_r", vmin=-vmax, vmax=vmax, extent=(0, 360, -90, 90)
        )
        ax.set_title(title)
        ax.set_xlabel("longitude [deg]")
    axes[0].set_ylabel("latitude [deg]")
    cbar = fig.colorbar(im, ax=axes, shrink=0.72, pad=0.01, aspect=15)
    cbar.set_label("field value [arbitrary units]")
    out = pathlib.Path(__file__).with_suffix(".png")
    fig.savefig(out, dpi=90, bbox_inches="tight")
    print(f"figure written to {out}")

# %% [markdown]
# ## The same transform with the pytree API
#
# The SHT defined directly on DUCC with `jaxbind.linear_op`, converting between
# the real layout and DUCC's complex alm with the public helpers of `jaxducc0`.
# It gives the same map, the same transpose and the same primitive.

# %%
GEOMETRY = base.sht_info()


@jaxbind.linear_op(shape=lambda a: jax.ShapeDtypeStruct((1, NPIX), a.dtype), name="demo.sht_native")
def sht_native(a):
    alm = jaxducc0.realalm_to_alm(a, LMAX)
    return ducc0.sht.synthesis(alm=alm, lmax=LMAX, mmax=LMAX, spin=0, **GEOMETRY)


@sht_native.def_transpose
def _(m):
    alm = ducc0.sht.adjoint_synthesis(map=m, lmax=LMAX, mmax=LMAX, spin=0, **GEOMETRY)
    return jaxducc0.alm_to_realalm(alm, LMAX)


np.testing.assert_allclose(sht_native(a_test), Y(a_test), rtol=1e-10, atol=1e-10)
np.testing.assert_allclose(
    jax.linear_transpose(sht_native, a_test)(m_test)[0], Y_T(m_test), rtol=1e-10, atol=1e-10
)
names = {str(e.primitive) for e in jax.make_jaxpr(lambda a: (Y(a), sht_native(a)))(a_test).eqns}
assert names == {"jaxbind"}, names
print("pytree-API SHT matches jaxducc0's: map, transpose and primitive")
