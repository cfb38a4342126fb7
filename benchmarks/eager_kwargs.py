"""Eager calls with a large NumPy array as a keyword argument, against what must be paid.

    python benchmarks/eager_kwargs.py          # writes benchmarks/results/eager_kwargs.{json,md}
    python benchmarks/eager_kwargs.py --quick

Keyword arguments are static: each eager call must see the array as it is now, so it
reads all of it at least once. The floors, measured in the same process in
alternating blocks: hashing the array (SHA-256, what jaxbind does), copying it, and
the same op jitted with the array closed over (no per-call work on the array).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import pathlib
import sys

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import alternating, arguments, ms, publish, run_line, run_meta, table  # noqa: E402

import jaxbind  # noqa: E402


def _scale(out, args, kw):
    out[0][...] = args[0] * jaxbind.load_kwargs(kw)["w"][0]


def _shape(x, **kw):
    return ((x.shape, x.dtype),)


def measure(mbytes, blocks, reps):
    op = jaxbind.get_linear_call(_scale, None, _shape, None, name="bench.eager_kwargs")
    w = np.ones(mbytes * 1024 * 1024 // 8)
    x = jnp.ones(16)
    jitted = jax.jit(lambda x: op(x, w=w)[0])
    cases = {
        "eager": lambda: op(x, w=w)[0].block_until_ready(),
        "jit": lambda: jitted(x).block_until_ready(),
        "sha256": lambda: hashlib.sha256(w.view(np.uint8)).digest(),
        "copy": lambda: w.copy(),
    }
    times = alternating(cases, rounds=blocks, iters=reps, warmup=1)
    return dict(
        mbytes=mbytes,
        **{f"{k}_s": t.median for k, t in times.items()},
        blocks=blocks,
        reps=reps,
    )


def main():
    args = arguments(__doc__)
    blocks, reps = args.rounds or (3 if args.quick else 10), 2 if args.quick else 5
    rows = [measure(mb, blocks, reps) for mb in ((8,) if args.quick else (1, 8, 64))]
    meta = run_meta(numpy=np.__version__, jaxbind=md.version("jaxbind"))
    lines = table(
        f"{run_line(meta)}. {blocks} alternating blocks of {reps} calls; medians.",
        ("array", "eager call", "SHA-256 of it", "copy of it", "jitted call", "eager / SHA-256"),
        [
            (f"{r['mbytes']} MB", ms(r["eager_s"], 2), ms(r["sha256_s"], 2), ms(r["copy_s"], 2),
             ms(r["jit_s"]), f"{r['eager_s'] / r['sha256_s']:.2f}")
            for r in rows
        ],
    )  # fmt: skip
    publish(args.out, "eager_kwargs", dict(meta=meta, results=rows), lines)


if __name__ == "__main__":
    main()
