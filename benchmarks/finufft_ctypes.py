"""FINUFFT's C library bound from Python alone (demo 07) beside jaxducc0, in one run.

    python benchmarks/finufft_ctypes.py          # writes benchmarks/results/finufft_ctypes.*
    python benchmarks/finufft_ctypes.py --quick  # small sizes, a few rounds (not for the record)

(``.json`` and ``.md``).

Needs numba, finufft and ducc0; without one, the script says so and exits 0. The op is the
one that demos/07_finufft_ctypes.py defines (ctypes functions of FINUFFT's guru interface
called from numba kernels), loaded by running the demo. Three implementations of the same
transforms, jitted:

- ctypes FINUFFT: the demo's ``nufft1`` / ``nufft2`` (jaxbind kernels, no GIL);
- jaxducc0: ``jaxbind.contrib.jaxducc0.nufft1`` / ``nufft2`` (DUCC, jax-finufft's calls);
- finufft callable: FINUFFT's own Python wrapper (``finufft.nufft2d1`` / ``nufft2d2``)
  called from jaxbind Python callables (the GIL held, a Python call per transform).

Problem: 2-D, 256 x 256 modes, 10^5 points uniform in [-pi, pi)^2, eps=1e-6, complex128.
Cases: type 1 and type 2 forward, and the gradient of ``sum |nufft|^2`` with respect to the
values (the forward transform plus its transpose, the other type). Each runs with one
thread everywhere (FINUFFT's ``opts.nthreads=1``, DUCC's ``nthreads=1``), then with each
library's default (FINUFFT: 0, all of OpenMP's threads; DUCC: 0, all hardware threads): like
with like both times. The implementations run in alternating rounds (A B C, then C B A,
...) on the same inputs; each row is the median over rounds.

Per call: on a tiny problem (2-D, 8 x 8 modes, 16 points, one thread), a ``fori_loop`` of
1000 round trips (type 1, then type 2) per implementation, per transform. The demo keeps
FINUFFT's plans in its ops' state (made, and their points set, once); the floor is
FINUFFT's own reused plans: 2000 ``execute`` calls on plans made once, from a numba loop,
without JAX. A transform's overhead is its time per transform above the floor's; the
target is at most 1.2 times the floor.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata as md
import io
import os
import pathlib
import runpy
import sys

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

from _harness import alternating, arguments, run_line, run_meta, save  # noqa: E402

import jaxbind  # noqa: E402

EPS = 1e-6
IMPLS = ("ctypes FINUFFT", "jaxducc0", "finufft callable")


def load_demo() -> dict:
    """demos/07_finufft_ctypes.py run once (its checks included, its output kept back)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return runpy.run_path(str(HERE.parent / "demos" / "07_finufft_ctypes.py"))


@functools.cache
def callable_ops():
    """type 1 and type 2 through finufft's Python wrapper, as jaxbind Python callables."""
    import finufft

    def run(kind, out, points, values, kwargs_dump):
        kw = jaxbind.load_kwargs(kwargs_dump)
        options = dict(eps=kw["eps"], isign=kw["iflag"], nthreads=kw["nthreads"])
        x, y = np.ascontiguousarray(points[0]), np.ascontiguousarray(points[1])
        if kind == 1:
            finufft.nufft2d1(x, y, values, out=out, **options)
        else:
            finufft.nufft2d2(x, y, values, out=out, **options)

    def type1(out, args, kwargs_dump):
        run(1, out[0], args[0], args[1], kwargs_dump)

    def type2(out, args, kwargs_dump):
        run(2, out[0], args[0], args[1], kwargs_dump)

    grid = lambda points, c, *, n_modes, **kw: ((tuple(int(n) for n in n_modes), c.dtype),)
    values = lambda points, f, **kw: (((points.shape[1],), f.dtype),)
    op1 = jaxbind.get_linear_call(type1, type2, grid, values, first_n_args_fixed=1, name="b.fi1")
    op2 = jaxbind.get_linear_call(type2, type1, values, grid, first_n_args_fixed=1, name="b.fi2")

    def nufft1(n_modes, c, x, y, *, iflag=1, eps=EPS, nthreads=0):
        kw = dict(n_modes=np.array(n_modes), iflag=iflag, eps=eps, nthreads=nthreads)
        return op1(jnp.stack([x, y]), c, **kw)[0]

    def nufft2(f, x, y, *, iflag=-1, eps=EPS, nthreads=0):
        kw = dict(n_modes=np.array(f.shape), iflag=iflag, eps=eps, nthreads=nthreads)
        return op2(jnp.stack([x, y]), f, **kw)[0]

    return nufft1, nufft2


def transforms(demo: dict, nthreads: int) -> dict:
    """(nufft1, nufft2) per implementation, each taking (n_modes, c, x, y) / (f, x, y)."""
    from jaxbind.contrib import jaxducc0

    py1, py2 = callable_ops()
    opts = jaxducc0.Opts(nthreads=nthreads)
    kw = dict(eps=EPS, nthreads=nthreads)
    return {
        "ctypes FINUFFT": (
            lambda n, c, x, y: demo["nufft1"](n, c, x, y, **kw),
            lambda f, x, y: demo["nufft2"](f, x, y, **kw),
        ),
        "jaxducc0": (
            lambda n, c, x, y: jaxducc0.nufft1(n, c, x, y, eps=EPS, opts=opts),
            lambda f, x, y: jaxducc0.nufft2(f, x, y, eps=EPS, opts=opts),
        ),
        "finufft callable": (
            lambda n, c, x, y: py1(n, c, x, y, **kw),
            lambda f, x, y: py2(f, x, y, **kw),
        ),
    }


def cases(impls: dict, n_points: int, n_grid: int) -> dict:
    """{case: {impl: (jitted function, arguments)}}."""
    rng = np.random.default_rng(0)
    x, y = (jnp.asarray(rng.uniform(-np.pi, np.pi, n_points)) for _ in range(2))
    c = jnp.asarray(rng.normal(size=n_points) + 1j * rng.normal(size=n_points))
    f = jnp.asarray(rng.normal(size=(n_grid,) * 2) + 1j * rng.normal(size=(n_grid,) * 2))
    shape = (n_grid, n_grid)
    out: dict = {}
    for name, (t1, t2) in impls.items():
        fwd1 = lambda c, x, y, t1=t1: t1(shape, c, x, y)
        fwd2 = lambda f, x, y, t2=t2: t2(f, x, y)
        for case, fn, v in (("type 1", fwd1, c), ("type 2", fwd2, f)):
            loss = lambda v, x, y, fn=fn: jnp.sum(jnp.abs(fn(v, x, y)) ** 2)
            out.setdefault(case, {})[name] = (jax.jit(fn), (v, x, y))
            out.setdefault(f"{case} grad values", {})[name] = (jax.jit(jax.grad(loss)), (v, x, y))
    return out


def side_by_side(fns: dict, rounds: int) -> dict:
    """{impl: median seconds} of {impl: (fn, args)}, alternating the order round by round."""
    calls = {name: (lambda fn=fn, args=args: fn(*args)) for name, (fn, args) in fns.items()}
    return {name: t.median for name, t in alternating(calls, rounds=rounds).items()}


def _agree(results: dict, ref: str = "jaxducc0") -> dict:
    want = np.asarray(results[ref])
    return {
        name: float(np.linalg.norm(np.asarray(got) - want) / np.linalg.norm(want))
        for name, got in results.items()
    }


def per_call(demo: dict, impls: dict, rounds: int, iterations: int = 1000) -> dict:
    """Seconds per transform on a tiny problem, inside a fori_loop, and the numba floor."""
    import numba

    rng = np.random.default_rng(1)
    shape, m = (8, 8), 16
    x, y = (jnp.asarray(rng.uniform(-np.pi, np.pi, m)) for _ in range(2))
    c = jnp.asarray(rng.normal(size=m) + 1j * rng.normal(size=m))
    fns = {}
    for name, (t1, t2) in impls.items():
        # c + 0 * (...): the values stay as they are, and XLA cannot drop the transforms
        trip = lambda i, c, t1=t1, t2=t2: c + 0.0 * t2(t1(shape, c, x, y), x, y)
        fns[name] = (jax.jit(lambda c, trip=trip: jax.lax.fori_loop(0, iterations, trip, c)), (c,))
    execute = demo["execute_double"]
    points = np.stack([x, y])
    # FINUFFT's own plans, made once (as the ops' state makes them: type 1 and type 2 for
    # each sign), executed by a numba loop
    plans = [demo["Plans"](points, shape, sign, EPS, 1, 0) for sign in (1, -1)]
    handles = (int(plans[0].handles[0]), int(plans[1].handles[1]))

    @numba.njit
    def floor(c, f, type1, type2, iterations):  # the same executes, from a numba loop
        for _ in range(iterations):
            execute(type1, c.ctypes.data, f.ctypes.data)
            execute(type2, c.ctypes.data, f.ctypes.data)

    cf, f = np.array(c), np.zeros(shape, np.complex128)
    fns["numba floor"] = (lambda: floor(cf, f, *handles, iterations), ())
    for fn, args in fns.values():
        jax.block_until_ready(fn(*args))  # compile, warm up
    med = side_by_side(fns, rounds)
    for p in plans:
        p.destroy()
    return {name: t / (2 * iterations) for name, t in med.items()}


def finufft_threads(demo: dict) -> int | None:
    """OpenMP's thread count as FINUFFT sees it (its default, nthreads=0)."""
    try:
        return int(demo["LIB"].omp_get_max_threads())
    except AttributeError:  # a FINUFFT without OpenMP
        return None


def main():
    args = arguments(__doc__)
    for package in ("numba", "finufft", "ducc0"):
        try:
            __import__(package)
        except ImportError:
            print(f"{package} is not installed (pip install {package}): nothing to measure")
            return
    demo = load_demo()
    n_points, n_grid = (10**4, 64) if args.quick else (10**5, 256)
    rounds = args.rounds or (3 if args.quick else 15)
    omp = finufft_threads(demo)
    rows = []
    for nthreads in (1, 0):
        impls = transforms(demo, nthreads)
        for case, fns in cases(impls, n_points, n_grid).items():
            results = {name: fn(*a) for name, (fn, a) in fns.items()}  # compile, warm up
            agree = _agree(results)
            med = side_by_side(fns, rounds)
            row = dict(case=case, nthreads=nthreads, rounds=rounds, agree=agree, seconds=med)
            rows.append(row)
            print(
                f"nthreads={nthreads} {case:<18} "
                + "  ".join(f"{n} {med[n] * 1e3:8.3f} ms" for n in IMPLS),
                flush=True,
            )
    calls = per_call(demo, transforms(demo, 1), rounds)
    for name, t in calls.items():
        print(f"per transform, tiny problem: {name:<18} {t * 1e6:8.2f} µs", flush=True)

    meta = run_meta(
        cpu_count=os.cpu_count(),
        load_average=round(os.getloadavg()[0], 2),  # the last minute's, at the end of the run
        finufft=md.version("finufft"),
        finufft_default_threads=omp,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        ducc0=md.version("ducc0"),
        numba=md.version("numba"),
        points=n_points,
        grid=n_grid,
        eps=EPS,
    )
    threads = "all" if omp is None else f"{omp}"
    lines = [
        f"{run_line(meta)}, finufft {meta['finufft']}, ducc0 {meta['ducc0']}, numba "
        f"{meta['numba']}; os.cpu_count() = {meta['cpu_count']}, load average "
        f"{meta['load_average']}. 2-D, {n_grid}² modes, "
        f"{n_points:.0e} points, complex128, eps={EPS}; jitted; medians of {rounds} "
        "alternating rounds. nthreads=1: one thread for each library; nthreads=0: each "
        f"library's default (FINUFFT: OpenMP's {threads} threads; DUCC: all hardware threads). "
        "Ratio: ctypes FINUFFT / jaxducc0 (below 1: the ctypes binding is faster).",
        "",
        "| threads | case | ctypes FINUFFT | jaxducc0 | finufft callable | ratio "
        "| agree (rel. l2) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["seconds"]
        lines.append(
            f"| {r['nthreads']} | {r['case']} | {s['ctypes FINUFFT'] * 1e3:.2f} ms | "
            f"{s['jaxducc0'] * 1e3:.2f} ms | {s['finufft callable'] * 1e3:.2f} ms | "
            f"{s['ctypes FINUFFT'] / s['jaxducc0']:.2f} | "
            f"{max(v for k, v in r['agree'].items() if k != 'jaxducc0'):.1e} |"
        )
    floor = calls["numba floor"]
    lines += [
        "",
        "Per transform on a tiny problem (2-D, 8² modes, 16 points, one thread), in a "
        "`fori_loop` of 1000 round trips. ctypes FINUFFT keeps its plans in its ops' state "
        "(set up once, with the points); the floor is FINUFFT's own reused plans, executed "
        "by a numba loop without JAX (the finufft callable plans at every call).",
        "",
        "| implementation | per transform | above the floor | / floor |",
        "|---|---|---|---|",
    ]
    for name, t in calls.items():
        same_work = name not in ("numba floor", "jaxducc0")  # DUCC's work is not FINUFFT's
        above = f"{(t - floor) * 1e6:.2f} µs" if same_work else "-"
        ratio = f"{t / floor:.2f}" if same_work else "-"
        lines.append(f"| {name} | {t * 1e6:.2f} µs | {above} | {ratio} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        save(args.out, "finufft_ctypes", dict(meta=meta, results=rows, per_call=calls), text)


if __name__ == "__main__":
    main()
