"""jaxbind's cost per call above the floor, measured in pairs (robust on a noisy machine).

    python benchmarks/overhead.py              # writes benchmarks/results/overhead.{json,md}
    python benchmarks/overhead.py --blocks 20  # quicker (--blocks is --rounds)
    python benchmarks/overhead.py --quick      # 4 blocks of 20 calls (the smoke test)

The floor (_floor.cc) is a custom call that only takes the GIL and calls the same
callable on private NumPy arrays: what any Python-calling custom call costs at
least. For each case, the floor and jaxbind run in alternating short blocks in
one process (A B B A ...), so both see the same machine state; the result is the
median over blocks of (jaxbind block - floor block), with its interquartile
range, beside each one's median. The target (README, Performance) is a median
difference within 0.3 µs on `empty`, `double` and `grad`.
"""

from __future__ import annotations

import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

import _cases  # noqa: E402
import jax  # noqa: E402
from _harness import alternating, arguments, flag, publish, run_line, run_meta, table, us  # noqa: E402

CASES = [("empty", 1), ("empty", 1_000), ("double", 1), ("double", 1_000), ("grad", 1_000)]


def measure(case, size, blocks, reps):
    built = {impl: _cases.build(impl, case, size) for impl in ("floor", "jaxbind")}
    for fn, arg in built.values():
        jax.block_until_ready(fn(arg))
    variants = {impl: (lambda fn=fn, arg=arg: fn(arg)) for impl, (fn, arg) in built.items()}
    # one untimed call per block settles allocations after switching variants
    times = alternating(variants, rounds=blocks, iters=reps, warmup=1)
    diffs = [j - f for f, j in zip(times["floor"].samples, times["jaxbind"].samples)]
    q = statistics.quantiles(diffs, n=4)
    return dict(
        case=case,
        size=size,
        floor_s=times["floor"].median,
        jaxbind_s=times["jaxbind"].median,
        diff_s=statistics.median(diffs),
        diff_q1_s=q[0],
        diff_q3_s=q[2],
        blocks=blocks,
        reps=reps,
    )


def main():
    args = arguments(
        __doc__,
        flag("--blocks", type=int, dest="rounds", help="alternating blocks (= --rounds)"),
        flag("--reps", type=int, default=None, help="calls per block"),
    )
    args.blocks = args.rounds or (4 if args.quick else 60)
    args.reps = args.reps or (20 if args.quick else 400)
    rows = [measure(c, s, args.blocks, args.reps) for c, s in CASES]
    import importlib.metadata as md

    import numpy as np

    meta = run_meta(numpy=np.__version__, jaxbind=md.version("jaxbind"))
    lines = table(
        f"{run_line(meta)}, numpy {meta['numpy']}. {args.blocks} alternating blocks of "
        f"{args.reps} calls per case; medians over blocks.",
        ("case", "size", "floor", "jaxbind", "jaxbind - floor (median)", "IQR of the difference"),
        [
            (r["case"], r["size"], us(r["floor_s"]), us(r["jaxbind_s"]),
             f"{r['diff_s'] * 1e6:+.2f} µs",
             f"{r['diff_q1_s'] * 1e6:+.2f} to {r['diff_q3_s'] * 1e6:+.2f} µs")
            for r in rows
        ],
    )  # fmt: skip
    publish(args.out, "overhead", dict(meta=meta, results=rows), lines)


if __name__ == "__main__":
    main()
