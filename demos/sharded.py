# %% [markdown]
# # A batched DUCC transform on a 4-device mesh
#
# JAX scales a computation out with meshes and shardings; jaxbind ops take part
# without anything of their own. Here a batch of 2-D complex FFTs (DUCC's
# `c2c`, bound in `jaxbind.contrib.jaxducc0`) is `vmap`ped and `jit`ted with its
# input sharded along the batch axis over 4 CPU devices. XLA then runs the
# callable once per device on that device's slice of the batch: the compiled
# program has no all-gather, and the output keeps the input's sharding.
#
# The devices are simulated with `--xla_force_host_platform_device_count=4`,
# which must be set before JAX is imported. Each device runs on its own XLA
# thread; DUCC releases the GIL while it transforms, so the shards run in
# parallel on as many cores as the machine has. The speed-up printed at the end
# is bounded by the number of cores, not devices.

# %%
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxbind.contrib import jaxducc0

mesh = Mesh(np.array(jax.devices()), ("batch",))
print(f"{len(jax.devices())} devices, {os.cpu_count()} cores")

# %% A batch of 64 complex 256x256 images, once on one device, once sharded.
rng = np.random.default_rng(0)
batch = rng.standard_normal((64, 256, 256)) + 1j * rng.standard_normal((64, 256, 256))
batch = batch.astype(np.complex64)
on_one = jax.device_put(batch, jax.devices()[0])
sharded = jax.device_put(batch, NamedSharding(mesh, P("batch")))

fft2 = jax.jit(jax.vmap(lambda img: jaxducc0.c2c(img, axes=(0, 1))[0]))
print("input sharding: ", sharded.sharding.spec, "over", sharded.sharding.mesh.shape)
out = fft2(sharded)
print("output sharding:", out.sharding.spec)

compiled = fft2.lower(sharded).compile().as_text()
print("all-gather in the compiled program:", "all-gather" in compiled)
local = [
    line.split("=")[1].split("custom-call(")[0].strip()
    for line in compiled.splitlines()
    if "custom-call(" in line
]
print("per-device custom call:", local)

np.testing.assert_allclose(np.asarray(out), np.fft.fft2(batch), rtol=2e-4, atol=2e-2)
print("matches numpy.fft.fft2")

# %% Gradients keep the sharding too.
loss = jax.jit(jax.grad(lambda x: jnp.sum(jnp.abs(fft2(x)) ** 2)))
g = loss(sharded)
print("grad sharding:  ", g.sharding.spec)
np.testing.assert_allclose(np.asarray(g), 2 * 256 * 256 * batch.conj(), rtol=2e-3, atol=2)


# %% Speed-up over one device.
def timed(fn, x, reps=10):
    jax.block_until_ready(fn(x))
    best = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            y = fn(x)
        jax.block_until_ready(y)
        best.append((time.perf_counter() - start) / reps)
    return min(best)


t_one, t_mesh = timed(fft2, on_one), timed(fft2, sharded)
t_quarter = timed(fft2, jax.device_put(batch[:16], jax.devices()[0]))
print(
    f"one device, 64 images: {t_one * 1e3:.1f} ms; 4-device mesh: {t_mesh * 1e3:.1f} ms; "
    f"speed-up {t_one / t_mesh:.2f}x on {os.cpu_count()} cores"
)
# Part of that is memory: one device transforms 32 MB in one call, each device of
# the mesh 8 MB. Against 4 calls of 16 images on one device (the same work in
# blocks of the same size), the speed-up is the parallel part alone:
print(
    f"one device, 16 images: {t_quarter * 1e3:.1f} ms; "
    f"4 x that / mesh: {4 * t_quarter / t_mesh:.2f}x (bounded by the {os.cpu_count()} cores)"
)

# %% [markdown]
# ## The same with the pytree API
#
# A `vectorized` op receives the whole batch with the batch axis in front; under
# the mesh each device gets its share, as with `jaxducc0.c2c`.

# %%
import ducc0  # noqa: E402

import jaxbind  # noqa: E402


@jaxbind.linear_op(
    shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), vectorized=True, name="demo.fft2_native"
)
def fft2_native(x, *, out):
    ducc0.fft.c2c(x, axes=(-2, -1), out=out)


fft2_native.def_transpose(lambda ct, *, out: fft2_native.fn(ct, out=out))  # symmetric
fft2n = jax.jit(jax.vmap(fft2_native))
out_native = fft2n(sharded)
print("pytree-API output sharding:", out_native.sharding.spec)
np.testing.assert_allclose(np.asarray(out_native), np.asarray(out), rtol=1e-6, atol=1e-4)
names = {
    str(e.primitive)
    for e in jax.make_jaxpr(jax.vmap(lambda x: (jaxducc0.c2c(x, axes=(0, 1))[0], fft2_native(x))))(
        batch
    ).eqns
}
assert names == {"jaxbind"}, names
print("pytree-API op matches jaxducc0.c2c, with the same primitive")
