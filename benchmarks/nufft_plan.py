"""50 conjugate-gradient iterations with the same NUFFT: planned once vs set up every call.

    python benchmarks/nufft_plan.py          # writes benchmarks/results/nufft_plan.{json,md}
    python benchmarks/nufft_plan.py --quick  # the smallest size, 2 rounds (CI smoke test)

Solves ``(A^H A + I) f = A^H c`` for a 2-D type-2 NUFFT ``A`` (grid to points,
complex128, eps=1e-6, one thread), with ``jax.scipy.sparse.linalg.cg`` and
exactly 50 iterations (tol=0): 51 applications of ``A`` and of ``A^H``
(``A^H y = conj(A^T conj(y))``, through ``jax.linear_transpose``). Variants,
in alternating rounds on the same data, whole solve jit-compiled:

- ``NufftPlan``: the points preprocessed by DUCC once, when the solve is compiled;
- ``nufft2``: the jax-finufft-style call (its points, closed over, plan once too: its
  plan is the op's state, keyed on the points; see benchmarks/state_nufft.py);
- ``jax-finufft`` (if installed): the same code with its ``nufft2``.
"""

from __future__ import annotations

import pathlib

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import alternating, arguments, ms, publish, run_line, run_meta, table, time_it  # noqa: E402
from jax.scipy.sparse.linalg import cg  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402

HERE = pathlib.Path(__file__).parent
SIZES = [(10**4, 100), (10**5, 256)]
ITERATIONS, EPS = 50, 1e-6


def _solver(forward, grid):
    """A jitted 50-iteration CG solve of (A^H A + I) f = A^H c for the linear map `forward`."""
    zeros = jnp.zeros(grid, jnp.complex128)

    def adjoint(y):
        (t,) = jax.linear_transpose(forward, zeros)(jnp.conj(y))
        return jnp.conj(t)

    @jax.jit
    def solve(c):
        f, _ = cg(
            lambda f: adjoint(forward(f)) + f, adjoint(c), tol=0.0, atol=0.0, maxiter=ITERATIONS
        )
        return f

    return solve


def main():
    args = arguments(__doc__)
    rows = []
    sizes = SIZES[:1] if args.quick else SIZES
    rounds = args.rounds or (2 if args.quick else 5)
    for n_points, n_grid in sizes:
        rng = np.random.default_rng(0)
        x, y = rng.uniform(-np.pi, np.pi, (2, n_points))
        c = jnp.asarray(rng.normal(size=n_points) + 1j * rng.normal(size=n_points))
        grid = (n_grid, n_grid)
        opts = jaxducc0.Opts(nthreads=1)
        xj, yj = jnp.asarray(x), jnp.asarray(y)

        def planned():  # DUCC plans when the program is compiled (its state)
            plan = jaxducc0.NufftPlan(2, grid, x, y, iflag=-1, eps=EPS, opts=opts)
            jax.jit(plan).lower(jnp.zeros(grid, jnp.complex128)).compile()
            return plan

        timed = time_it(planned, warmup=0)
        plan, plan_s = timed.value, timed.median
        variants = {
            "NufftPlan": _solver(plan, grid),
            "nufft2": _solver(lambda f: jaxducc0.nufft2(f, xj, yj, eps=EPS, opts=opts), grid),
        }
        try:
            import jax_finufft
            from jax_finufft.options import Opts

            fopts = Opts(nthreads=1)
            variants["jax-finufft"] = _solver(
                lambda f: jax_finufft.nufft2(f, xj, yj, eps=EPS, opts=fopts), grid
            )
        except ImportError:
            pass
        results = {name: solve(c) for name, solve in variants.items()}  # compile, warm up
        ref = results["nufft2"]
        calls = {name: (lambda solve=solve: solve(c)) for name, solve in variants.items()}
        med = {name: t.median for name, t in alternating(calls, rounds=rounds).items()}
        for name in variants:
            agree = float(jnp.linalg.norm(results[name] - ref) / jnp.linalg.norm(ref))
            rows.append(
                dict(
                    points=n_points,
                    grid=n_grid,
                    variant=name,
                    solve_s=med[name],
                    ratio_to_nufft2=med[name] / med["nufft2"],
                    agree=agree,
                    rounds=rounds,
                    plan_s=plan_s if name == "NufftPlan" else None,
                )
            )
            print(
                f"{n_points:>8} {n_grid:>4}² {name:<12} {med[name] * 1e3:9.1f} ms "
                f"x{med[name] / med['nufft2']:.2f}  agree {agree:.1e}",
                flush=True,
            )
    import importlib.metadata as md

    meta = run_meta(ducc0=md.version("ducc0"))
    planned = lambda r: f" (planned and compiled in {ms(r['plan_s'], 1)})" if r["plan_s"] else ""
    lines = table(
        f"{run_line(meta)}, ducc0 {meta['ducc0']}. {ITERATIONS} CG iterations of "
        f"(A^H A + I) f = A^H c, A a 2-D type-2 NUFFT, complex128, eps={EPS}, 1 thread; "
        f"medians of {rounds} alternating rounds.",
        ("points", "grid", "variant", "solve", "vs nufft2", "agree (rel. l2)"),
        [
            (f"{r['points']:.0e}", f"{r['grid']}²", f"{r['variant']}{planned(r)}",
             ms(r["solve_s"], 1), f"{r['ratio_to_nufft2']:.2f}", f"{r['agree']:.1e}")
            for r in rows
        ],
    )  # fmt: skip
    publish(args.out, "nufft_plan", dict(meta=meta, results=rows), lines, write=not args.quick)


if __name__ == "__main__":
    main()
