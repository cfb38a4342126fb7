"""An in-place update of a 16M-element array, with and without input_output_aliases.

    python benchmarks/inplace.py           # writes benchmarks/results/inplace.{json,md}
    python benchmarks/inplace.py --quick   # 1M elements, 2 rounds (the CI smoke test)

The op adds 1 to every 1024th element of a float32 array of 16M elements (64 MB):
the work is tiny, so the time is what moving the array costs. Variants, timed
side by side in one process, interleaved round by round (medians of 15 rounds of
10 chained calls, y = f(y)):

- aliased, donated: ``input_output_aliases={0: 0}`` and ``donate_argnums=0``:
  the callable updates the caller's buffer; nothing is copied;
- aliased, not donated: XLA copies the input into the output first;
- not aliased: the callable copies the input into its fresh output, then updates;
- jnp (donated): ``x.at[::1024].add(1)`` in pure JAX, for reference;
- copy only: ``np.copyto`` of 64 MB inside a callable, the cost of one copy.

The run also checks, inside the callable, that the donated variant's output is
the input's memory (same address).
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from _harness import alternating, arguments, run_line, run_meta, save

import jaxbind

HERE = pathlib.Path(__file__).parent
N, STRIDE, CALLS, ROUNDS = 16 * 2**20, 1024, 10, 15
ADDRESSES = []


def _update_in_place(out, args, kwargs_dump):
    ADDRESSES.append((args[0].ctypes.data, out[0].ctypes.data))
    out[0][::STRIDE] += 1


def _update_with_copy(out, args, kwargs_dump):
    np.copyto(out[0], args[0])
    out[0][::STRIDE] += 1


def _copy_only(out, args, kwargs_dump):
    np.copyto(out[0], args[0])


def _same(x, **kwargs):
    return ((x.shape, x.dtype),)


def variants():
    aliased = jaxbind.get_linear_call(
        _update_in_place, None, _same, None, input_output_aliases={0: 0}, name="bench.inplace"
    )
    copying = jaxbind.get_linear_call(_update_with_copy, None, _same, None, name="bench.copying")
    copy = jaxbind.get_linear_call(_copy_only, None, _same, None, name="bench.copy")
    return {
        "aliased, donated": jax.jit(lambda x: aliased(x)[0], donate_argnums=0),
        "aliased, not donated": jax.jit(lambda x: aliased(x)[0]),
        "not aliased": jax.jit(lambda x: copying(x)[0]),
        "jnp (donated)": jax.jit(lambda x: x.at[::STRIDE].add(1), donate_argnums=0),
        "copy only": jax.jit(lambda x: copy(x)[0]),
    }


def chained(fn, state, name):
    """One call of y = f(y) on state[name], for `alternating` (CALLS of them per round)."""

    def call():
        state[name] = fn(state[name])
        return state[name]

    return call


def main():
    global N, ROUNDS
    opts = arguments(__doc__)
    if opts.quick:
        N, ROUNDS = 2**20, 2
    ROUNDS = opts.rounds or ROUNDS
    fns = variants()
    state = {name: jnp.zeros(N, jnp.float32) for name in fns}
    for name, fn in fns.items():  # compile and warm up
        state[name] = fn(state[name]).block_until_ready()
    calls = {name: chained(fn, state, name) for name, fn in fns.items()}
    timings = alternating(calls, rounds=ROUNDS, iters=CALLS)
    samples = {name: list(t.samples) for name, t in timings.items()}
    # the update is right, and the donated variant works in the caller's memory
    x = jnp.zeros(N, jnp.float32)
    address = x.unsafe_buffer_pointer()
    ADDRESSES.clear()
    y = fns["aliased, donated"](x)
    same_memory = ADDRESSES[-1] == (address, address) and y.unsafe_buffer_pointer() == address
    expected = np.zeros(N, np.float32)
    expected[::STRIDE] = 1
    assert np.array_equal(np.asarray(y), expected)
    assert same_memory, "the donated input was copied"

    med = {name: t.median for name, t in timings.items()}
    meta = run_meta(numpy=np.__version__)
    lines = [
        f"{run_line(meta)}. {N / 2**20:.0f}M float32 elements ({4 * N / 2**20:.0f} MB), every "
        f"1024th updated; medians of "
        f"{ROUNDS} rounds of {CALLS} chained calls.",
        "",
        "| variant | time per call | vs aliased, donated |",
        "|---|---|---|",
    ]
    base = med["aliased, donated"]
    for name, t in med.items():
        lines.append(f"| {name} | {t * 1e3:.3f} ms | {t / base:.1f}x |")
    lines += [
        "",
        f"Inside the callable, the donated variant's input and output are the "
        f"caller's buffer (same address): {same_memory}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    save(
        opts.out,
        "inplace",
        dict(meta=meta, median_s=med, samples=samples, same_memory=same_memory),
        text,
    )


if __name__ == "__main__":
    main()
