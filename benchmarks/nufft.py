"""jaxducc0's NUFFTs against jax-finufft, with the same calls, side by side in one process.

    python benchmarks/nufft.py            # writes benchmarks/results/nufft.{json,md}
    python benchmarks/nufft.py --quick    # the smallest size only (the CI smoke test)

jax-finufft is optional: without it, the script says so and exits 0. Both run
one thread (``Opts(nthreads=1)``), double precision, 2-D, ``eps=1e-6``, points
uniform in [-pi, pi)^2 (type 3: targets uniform in the grid's mode range). Per
size and case, the two implementations run in alternating rounds on the same
inputs (jit-compiled, warmed up); the table gives each one's median and the
ratio jaxbind / jax-finufft (below 1: jaxbind is faster). Cases:

- type 1, 2, 3 forward;
- grad of ``sum |nufft|^2`` with respect to the values, and with respect to the
  points (type 3: the source points), which includes the forward transform.
"""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import arguments, ms, publish, run_line, run_meta, side_by_side, table  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402

HERE = pathlib.Path(__file__).parent
SIZES = [(10**3, 32), (10**4, 100), (10**5, 256), (10**6, 512)]
EPS = 1e-6


def _cases(lib, n_points, n_grid):
    rng = np.random.default_rng(0)
    x, y = (jnp.asarray(rng.uniform(-np.pi, np.pi, n_points)) for _ in range(2))
    s, t = (jnp.asarray(rng.uniform(-n_grid / 2, n_grid / 2, n_points)) for _ in range(2))
    c = jnp.asarray(rng.normal(size=n_points) + 1j * rng.normal(size=n_points))
    f = jnp.asarray(rng.normal(size=(n_grid, n_grid)) + 1j * rng.normal(size=(n_grid, n_grid)))
    opts = lib.Opts(nthreads=1)
    t1 = lambda c, x, y: lib.nufft1((n_grid, n_grid), c, x, y, eps=EPS, opts=opts)
    t2 = lambda f, x, y: lib.nufft2(f, x, y, eps=EPS, opts=opts)
    t3 = lambda c, x, y: lib.nufft3(c, x, y, s, t, eps=EPS, opts=opts)
    loss = lambda fn: lambda v, x, y: jnp.sum(jnp.abs(fn(v, x, y)) ** 2)
    out = {}
    for kind, fn, v in (("type 1", t1, c), ("type 2", t2, f), ("type 3", t3, c)):
        out[f"{kind}"] = (jax.jit(fn), (v, x, y))
        out[f"{kind} grad values"] = (jax.jit(jax.grad(loss(fn), argnums=0)), (v, x, y))
        out[f"{kind} grad points"] = (jax.jit(jax.grad(loss(fn), argnums=(1, 2))), (v, x, y))
    return out


def _ducc():
    return SimpleNamespace(
        nufft1=jaxducc0.nufft1, nufft2=jaxducc0.nufft2, nufft3=jaxducc0.nufft3, Opts=jaxducc0.Opts
    )


def _finufft():
    import jax_finufft
    from jax_finufft.options import Opts

    return SimpleNamespace(
        nufft1=jax_finufft.nufft1, nufft2=jax_finufft.nufft2, nufft3=jax_finufft.nufft3, Opts=Opts
    )


def main():
    args = arguments(__doc__)
    try:
        libs = {"jaxbind": _ducc(), "jax-finufft": _finufft()}
    except ImportError:
        print("jax-finufft is not installed (pip install jax-finufft): nothing to compare")
        return
    import importlib.metadata as md

    sizes = SIZES[:1] if args.quick else SIZES
    rows = []
    for n_points, n_grid in sizes:
        rounds = args.rounds or (2 if args.quick else max(3, min(15, int(3e6 / n_points))))
        built = {name: _cases(lib, n_points, n_grid) for name, lib in libs.items()}
        for case in built["jaxbind"]:
            fns = {name: built[name][case] for name in libs}
            calls = {name: (lambda fn=fn, a=a: fn(*a)) for name, (fn, a) in fns.items()}
            med, agree = side_by_side(calls, rounds=rounds, against="jax-finufft")
            row = dict(
                points=n_points,
                grid=n_grid,
                case=case,
                rounds=rounds,
                agree=agree["jaxbind"],
                jaxbind_s=med["jaxbind"],
                finufft_s=med["jax-finufft"],
                ratio=med["jaxbind"] / med["jax-finufft"],
            )
            rows.append(row)
            print(
                f"{n_points:>8} {n_grid:>4}² {case:<20} {row['jaxbind_s'] * 1e3:9.3f} ms "
                f"{row['finufft_s'] * 1e3:9.3f} ms  ratio {row['ratio']:.2f}  agree "
                f"{row['agree']:.1e}",
                flush=True,
            )
    meta = run_meta(jax_finufft=md.version("jax-finufft"), ducc0=md.version("ducc0"))
    lines = table(
        f"{run_line(meta)}, jax-finufft {meta['jax_finufft']}, ducc0 {meta['ducc0']}. "
        f"2-D, complex128, eps={EPS}, 1 thread each; medians of alternating rounds.",
        ("points", "grid", "case", "jaxbind", "jax-finufft", "ratio", "agree (rel. l2)"),
        [
            (f"{r['points']:.0e}", f"{r['grid']}²", r["case"], ms(r["jaxbind_s"]),
             ms(r["finufft_s"]), f"{r['ratio']:.2f}", f"{r['agree']:.1e}")
            for r in rows
        ],
    )  # fmt: skip
    publish(args.out, "nufft", dict(meta=meta, results=rows), lines, write=not args.quick)


if __name__ == "__main__":
    main()
