"""Per-call time of a JAX-native op (a dict in, keyword arguments), eager and jitted.

    python benchmarks/native_call.py

Prints the median over 15 blocks of 300 calls. The call's pytree structure is its own
field (call format 3): the trampoline's site binds it to the callable once, where
format 2 decoded it from the keyword arguments at every call.
"""

import statistics
import time

import jax
import jax.numpy as jnp

import jaxbind


@jaxbind.linear_op(
    shape=lambda d, *, k=1.0: jax.ShapeDtypeStruct(d["a"].shape, d["a"].dtype), name="bench.pair"
)
def pair(d, *, k=1.0):
    return k * (d["a"] + d["b"])


x = {"a": jnp.ones(16), "b": jnp.ones(16)}
f = jax.jit(lambda d: pair(d, k=2.0))
for fn, name in ((lambda: pair(x, k=2.0), "eager"), (lambda: f(x), "jit")):
    for _ in range(200):
        jax.block_until_ready(fn())
    ts = []
    for _ in range(15):
        t = time.perf_counter()
        for _ in range(300):
            jax.block_until_ready(fn())
        ts.append((time.perf_counter() - t) / 300)
    print(name, "%.1f us" % (statistics.median(ts) * 1e6))
