import jax, jax.numpy as jnp, numpy as np, gc
import jaxbind._ext as e
jax.ffi.register_ffi_target("jaxbind_proto", e.handlers(), platform="cpu")
def call(x):
    return jax.ffi.ffi_call("jaxbind_proto", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
f = jax.jit(lambda x: call(x) + call(2 * x))
x = jnp.ones(3)
for _ in range(5): f(x).block_until_ready()
print("after 5 calls (made, freed, executed, found):", e.counts())
g = jax.jit(lambda x: call(x))
g(x).block_until_ready()
print("second program:", e.counts())
del f, g
jax.clear_caches(); gc.collect()
print("after clear_caches:", e.counts())
