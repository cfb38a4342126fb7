"""NUFFT plans as op state: the state-backed paths against DUCC's own reused plan.

    python benchmarks/state_nufft.py          # writes benchmarks/results/state_nufft.{json,md}
    python benchmarks/state_nufft.py --quick  # small sizes, 1 round (CI smoke test)

A 2-D type-2 NUFFT, complex128, 256² modes, 10⁵ points, eps=1e-6, one thread. Every
variant runs in each round, in alternating order; the table gives medians.

(a) 100 type-2 transforms of one grid:

- ``NufftPlan``: a ``lax.fori_loop`` of 100 calls, jit-compiled; the DUCC plan is the op's
  state, made when the program is compiled;
- ``DUCC plan.u2nu``: ``ducc0.nufft.plan`` made once, ``u2nu`` called 100 times from Python
  (the floor: no JAX at all);
- ``nufft2 (points traced)``: the loop with the points as arguments of the jitted function;
  the plan is the op's state keyed on the points, made at the first call;
- ``nufft2 unplanned``: the same op with no plan (DUCC's ``u2nu`` sets the points up at
  every call), as nufft2 ran before its plan became state;
- ``jax-finufft``: its ``nufft2`` in the same loop, if it is installed.

Every loop multiplies the grid by a traced scalar (1) before each call, so that XLA cannot
take the call out of the loop, and sums the results (about 0.1 ms a call together); the
floor does the same in NumPy, so that the ratios compare the calls alone.

(b) 50 conjugate-gradient iterations of ``(A^H A + I) f = A^H c`` (as benchmarks/nufft_plan.py):
``nufft2`` with the points traced (arguments of the jitted solve, loop-invariant) against
``NufftPlan``. The setups of nufft2's state while it compiles and runs every round are
counted (DUCC plans made): one is the target.
"""

from __future__ import annotations

import gc
import pathlib

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import arguments, ms, publish, run_line, run_meta, side_by_side, table  # noqa: E402
from jax.scipy.sparse.linalg import cg  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402
from jaxbind.contrib.ducc import _common  # noqa: E402
from jaxbind.contrib.ducc.nufft_points import nufft_points  # noqa: E402

HERE = pathlib.Path(__file__).parent
EPS, CALLS, ITERATIONS = 1e-6, 100, 50
TARGET = 1.1


class PlanCount:
    """DUCC plans made (ducc0.nufft.plan called), by jaxbind's setups or anyone."""

    def __init__(self):
        self.count = 0
        self._real = _common.ducc0.nufft.plan
        _common.ducc0.nufft.plan = self._counting

    def _counting(self, **kw):
        self.count += 1
        return self._real(**kw)


def _finufft():
    try:
        import jax_finufft
        from jax_finufft.options import Opts
    except ImportError:
        return None
    return jax_finufft.nufft2, Opts(nthreads=1)


def _loop(call):
    """100 calls of `call(f, *points)` in a fori_loop, jitted: ``run(f, one, *points)``."""

    @jax.jit
    def run(f, one, *points):
        def body(i, carry):
            f, acc = carry
            f = f * one  # traced: keeps the call inside the loop
            return f, acc + call(f, *points)

        zeros = jnp.zeros_like(call(f, *points))
        return jax.lax.fori_loop(0, CALLS, body, (f, zeros))[1]

    return run


def case_a(x, y, f, grid, rounds: int) -> list[dict]:
    import ducc0

    opts = jaxducc0.Opts(nthreads=1)
    plan = jaxducc0.NufftPlan(2, grid, x, y, iflag=-1, eps=EPS, opts=opts)
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    one = jnp.asarray(1.0 + 0j)
    coord = np.ascontiguousarray(np.stack([x, y], axis=1))
    ducc = ducc0.nufft.plan(nu2u=False, coord=coord, grid_shape=grid, epsilon=EPS, nthreads=1)
    fn, one_np = np.asarray(f), np.complex128(1.0)
    out = np.empty(len(x), np.complex128)

    def floor():  # the loops' work around the call too: the grid scaled, the sum kept
        acc, g = np.zeros(len(x), np.complex128), fn
        for _ in range(CALLS):
            g = g * one_np
            ducc.u2nu(grid=g, forward=True, out=out)
            acc += out
        return acc

    def unplanned(f, x, y):
        kw = dict(nufft_type=2, sign=-1, eps=EPS, modeord=0, nthreads=1, grid=None)
        return nufft_points.op(f[None], jnp.stack([x, y]), **kw)[0][0]

    planned = _loop(lambda f: plan(f))
    traced = _loop(lambda f, x, y: jaxducc0.nufft2(f, x, y, eps=EPS, opts=opts))
    before = _loop(unplanned)
    variants = {
        "NufftPlan": lambda: planned(f, one),
        "DUCC plan.u2nu": floor,
        "nufft2 (points traced)": lambda: traced(f, one, xj, yj),
        "nufft2 unplanned": lambda: before(f, one, xj, yj),
    }
    finufft = _finufft()
    if finufft is not None:
        nufft2, fopts = finufft
        other = _loop(lambda f, x, y: nufft2(f, x, y, eps=EPS, opts=fopts))
        variants["jax-finufft"] = lambda: other(f, one, xj, yj)
    med, agree = side_by_side(variants, rounds=rounds, against="DUCC plan.u2nu")
    floor_s = med["DUCC plan.u2nu"]
    return [
        dict(
            case="a",
            variant=name,
            seconds=med[name],
            per_call_ms=med[name] / CALLS * 1e3,
            vs_floor=med[name] / floor_s,
            agree=agree[name],
            rounds=rounds,
        )
        for name in variants
    ]


def _solver(forward, grid):
    """A jitted 50-iteration CG solve of (A^H A + I) f = A^H c; ``forward(f, *points)``."""
    zeros = jnp.zeros(grid, jnp.complex128)

    @jax.jit
    def solve(c, *points):
        def a(f):
            return forward(f, *points)

        def adjoint(y):
            (t,) = jax.linear_transpose(a, zeros)(jnp.conj(y))
            return jnp.conj(t)

        f, _ = cg(lambda f: adjoint(a(f)) + f, adjoint(c), tol=0.0, atol=0.0, maxiter=ITERATIONS)
        return f

    return solve


def case_b(x, y, c, grid, rounds: int, plans: PlanCount) -> list[dict]:
    opts = jaxducc0.Opts(nthreads=1)
    plan = jaxducc0.NufftPlan(2, grid, x, y, iflag=-1, eps=EPS, opts=opts)
    static = _solver(lambda f: plan(f), grid)
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    jax.block_until_ready(static(c))  # NufftPlan's own plan, made now
    plans.count = 0
    traced = _solver(lambda f, x, y: jaxducc0.nufft2(f, x, y, eps=EPS, opts=opts), grid)
    variants = {"NufftPlan": lambda: static(c), "nufft2 (points traced)": lambda: traced(c, xj, yj)}
    med, agree = side_by_side(variants, rounds=rounds, against="NufftPlan")
    setups = plans.count
    return [
        dict(
            case="b",
            variant=name,
            seconds=med[name],
            vs_nufftplan=med[name] / med["NufftPlan"],
            agree=agree[name],
            setups=setups if name != "NufftPlan" else None,
            rounds=rounds,
        )
        for name in variants
    ]


def main():
    args = arguments(__doc__)
    n_points, n = (10**3, 32) if args.quick else (10**5, 256)
    rounds = args.rounds or (1 if args.quick else 7)
    grid = (n, n)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-np.pi, np.pi, (2, n_points))
    f = jnp.asarray(rng.normal(size=grid) + 1j * rng.normal(size=grid))
    c = jnp.asarray(rng.normal(size=n_points) + 1j * rng.normal(size=n_points))
    plans = PlanCount()
    rows = case_a(x, y, f, grid, rounds)
    jax.clear_caches()  # case (a)'s programs and their plans go: (b) counts its own setups
    gc.collect()
    rows += case_b(x, y, c, grid, rounds, plans)

    import importlib.metadata as md

    extra = {"ducc0": md.version("ducc0")}
    if _finufft() is not None:
        extra["jax_finufft"] = md.version("jax-finufft")
    meta = run_meta(**extra)
    versions = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in extra.items())
    a = [r for r in rows if r["case"] == "a"]
    b = [r for r in rows if r["case"] == "b"]
    state_a = next(r for r in a if r["variant"] == "NufftPlan")["vs_floor"]
    state_b = b[1]["vs_nufftplan"]
    lines = [
        f"{run_line(meta)}, {versions}. A 2-D type-2 NUFFT, complex128, {n}² modes, "
        f"{n_points:.0e} points, eps={EPS}, 1 thread; medians of {rounds} alternating rounds.",
        "",
        *table(
            f"(a) {CALLS} calls of one grid (a jitted `lax.fori_loop`; the floor: DUCC's plan "
            "called from Python):",
            ("variant", "100 calls", "per call", "vs DUCC plan.u2nu", "agree (rel. l2)"),
            [
                (r["variant"], ms(r["seconds"], 1), f"{r['per_call_ms']:.2f} ms",
                 f"{r['vs_floor']:.2f}", f"{r['agree']:.1e}")
                for r in a
            ],
        ),
        "",
        *table(
            f"(b) {ITERATIONS} CG iterations of (A^H A + I) f = A^H c, the points traced but "
            "loop-invariant for nufft2:",
            ("variant", "solve", "vs NufftPlan", "setups", "agree (rel. l2)"),
            [
                (r["variant"], ms(r["seconds"], 1), f"{r['vs_nufftplan']:.2f}",
                 "-" if r["setups"] is None else str(r["setups"]), f"{r['agree']:.1e}")
                for r in b
            ],
        ),
    ]  # fmt: skip
    lines += [
        "",
        f"Targets: NufftPlan ≤ {TARGET}× DUCC's reused plan in (a): {state_a:.2f}×; nufft2 "
        f"with traced points ≤ {TARGET}× NufftPlan in (b), with one setup: {state_b:.2f}×, "
        f"{b[1]['setups']} setup(s).",
    ]
    publish(args.out, "state_nufft", dict(meta=meta, results=rows), lines, write=not args.quick)


if __name__ == "__main__":
    main()
