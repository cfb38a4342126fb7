"""What a kernel's state costs per call: a trivial kernel with a state under each
concurrency policy, against the same kernel without one.

    python benchmarks/state_kernels.py           # writes benchmarks/results/state_kernels.*
    python benchmarks/state_kernels.py --quick   # fewer blocks (not for the record)

(``.json`` and ``.md``; ``--quick`` writes only where ``--out`` says.)

The body is ``y = 2 x + 1`` on 16 float32 values, a numba kernel (as in kernels.py); the
stateful variants' function takes ``state`` too and ignores it, so every variant runs the
same work and differs only in how the trampoline reaches the state (cpp/state.h):

- no state: the kernel on an op without ``state=``;
- "lock": a mutex taken around each call; "shared": a count of the calls using the
  object; "pool" (pool_size=4): a slot taken from the pool's free list and given back;
- key ("lock"): a state with ``key=`` on a fixed input of 16 float32 values that stays the
  same: each call compares the input's bytes with the cached key's (no GIL), then locks.

Each variant is a jitted ``fori_loop`` of ``--iterations`` calls; the variants run in
alternating blocks in one process (A B C ..., then reversed), so all see the same machine
state, and each row is the median over blocks of the time per iteration. "above no state"
is the difference to the kernel without state. Target: within 0.05 µs.
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

from _harness import alternating, arguments, flag, run_line, run_meta, save  # noqa: E402

import jaxbind  # noqa: E402

N = 16
VARIANTS = ("no state", "lock", "shared", "pool", "key (lock)")


def affine(out, x):
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i] + 1.0


def affine_with_state(out, x, state):  # the same work; the state is only reached
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i] + 1.0


def keyed_affine(out, points, x, state):
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i] + 1.0


def ops() -> dict:
    """{variant: a function of x (and the key input), jitted in a fori_loop by `looped`}."""
    shape = lambda x, **kw: jax.ShapeDtypeStruct(x.shape, x.dtype)
    plain = jaxbind.nonlinear_op(shape=shape, name="bench.state_none")(jaxbind.kernel(affine))
    made = {"no state": lambda x, p: plain(x)}
    stateful = jaxbind.kernel(affine_with_state)
    for policy in ("lock", "shared", "pool"):
        options = {"pool_size": 4} if policy == "pool" else {}

        @jaxbind.state(concurrency=policy, **options)
        def buffer():
            return np.zeros(4, np.float64)

        op = jaxbind.nonlinear_op(shape=shape, state=buffer, name=f"bench.state_{policy}")(stateful)
        made[policy] = lambda x, p, op=op: op(x)

    @jaxbind.state(key=("points",))
    def keyed(*, points):
        return np.array(points, np.float64)

    key_op = jaxbind.nonlinear_op(
        shape=lambda points, x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        fixed=1,
        state=keyed,
        name="bench.state_key",
    )(jaxbind.kernel(keyed_affine))
    made["key (lock)"] = lambda x, p: key_op(p, x)
    return made


def looped(fn, iterations: int):
    # x * 0 + y: the loop carries the result, and XLA keeps every call
    step = lambda i, x, p: fn(x, p) * 0.0 + x
    return jax.jit(lambda x, p: jax.lax.fori_loop(0, iterations, lambda i, x: step(i, x, p), x))


def measure(blocks: int, iterations: int, reps: int) -> dict:
    """{variant: [seconds per iteration, one per block]}."""
    x = jnp.linspace(0.0, 1.0, N, dtype=jnp.float32)
    p = jnp.arange(N, dtype=jnp.float32)
    fns = {name: looped(fn, iterations) for name, fn in ops().items()}
    for fn in fns.values():
        jax.block_until_ready(fn(x, p))  # compile, set up, warm up
    calls = {name: (lambda fn=fn: fn(x, p)) for name, fn in fns.items()}
    timings = alternating(calls, rounds=blocks, best_of=reps)
    return {name: [t / iterations for t in timing.samples] for name, timing in timings.items()}


def main():
    args = arguments(
        __doc__,
        flag("--blocks", type=int, dest="rounds", help="alternating blocks (= --rounds)"),
        flag("--iterations", type=int, default=None, help="calls in each block's loop"),
        out=None,
    )
    try:
        import numba  # noqa: F401
    except ImportError:
        print("numba is not installed (pip install numba): nothing to measure")
        return
    blocks = args.rounds or (3 if args.quick else 21)
    iterations = args.iterations or (2_000 if args.quick else 100_000)
    reps = 2 if args.quick else 3
    times = measure(blocks, iterations, reps)
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med["no state"]
    meta = run_meta(
        cpu_count=os.cpu_count(),
        load_average=round(os.getloadavg()[0], 2),
        blocks=blocks,
        iterations=iterations,
        reps=reps,
    )
    lines = [
        f"{run_line(meta)}; os.cpu_count() = {meta['cpu_count']}, load average "
        f"{meta['load_average']}. A numba kernel y = 2 x + 1 on {N} float32 values in a jitted "
        f"fori_loop of {iterations} calls; per iteration, the median over {blocks} "
        f"alternating blocks (each the best of {reps} runs). The stateful variants' sites "
        "are kept by XLA's instantiate stage; the kernel without state finds its site by "
        "digest.",
        "",
        "| state | per iteration | above no state |",
        "|---|---|---|",
    ]
    for name in VARIANTS:
        above = "-" if name == "no state" else f"{(med[name] - base) * 1e6:+.3f} µs"
        lines.append(f"| {name} | {med[name] * 1e6:.3f} µs | {above} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or (None if args.quick else str(HERE / "results"))
    if out is not None:
        payload = dict(meta=meta, per_iteration=times, median=med)
        save(out, "state_kernels", payload, text)


if __name__ == "__main__":
    main()
