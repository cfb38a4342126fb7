"""Per-call time of a JAX-native op (a dict in, keyword arguments), eager and jitted.

    python benchmarks/native_call.py
    python benchmarks/native_call.py --quick   # 3 blocks of 30 calls (the smoke test)

Prints the median over 15 blocks (--rounds) of 300 calls. The call's pytree structure is its own
field (call format 3): the trampoline's site binds it to the callable once, where
format 2 decoded it from the keyword arguments at every call.
"""

import jax
import jax.numpy as jnp
from _harness import arguments, time_it

import jaxbind


@jaxbind.linear_op(
    shape=lambda d, *, k=1.0: jax.ShapeDtypeStruct(d["a"].shape, d["a"].dtype), name="bench.pair"
)
def pair(d, *, k=1.0):
    return k * (d["a"] + d["b"])


def main():
    args = arguments(__doc__, out=None)
    rounds, calls = args.rounds or (3 if args.quick else 15), 30 if args.quick else 300
    x = {"a": jnp.ones(16), "b": jnp.ones(16)}
    f = jax.jit(lambda d: pair(d, k=2.0))
    for fn, name in ((lambda: pair(x, k=2.0), "eager"), (lambda: f(x), "jit")):
        each = lambda fn=fn: jax.block_until_ready(fn())
        t = time_it(each, iters=calls, warmup=20 if args.quick else 200, rounds=rounds)
        print(name, "%.1f us" % (t.median * 1e6))


if __name__ == "__main__":
    main()
