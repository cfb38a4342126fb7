"""The NUFFT references at real sizes: DUCC, the pure-JAX reference and nufftax side by side.

    python benchmarks/reference_sizes.py           # writes results/reference_sizes.*
    python benchmarks/reference_sizes.py --quick   # the smallest sizes, one round, not saved

Per case (dimension, type, points, grid), jit-compiled on the same inputs in alternating
rounds: ``jaxducc0.nufft_points`` (DUCC, ``nthreads`` 1 and 2), its reference
(`jaxbind.contrib.ducc.reference.nufft.nufft_points`: spreading, FFT, deconvolution for
types 1 and 2; rescaling, spreading and type 2 for type 3, or the direct sum where
its grid would be too large) and, for types 1 and 2, nufftax (its own
spreading in JAX; its 2-D grids are transposed, so the benchmark transposes them). Three
calls each: the forward transform, ``grad`` of ``sum |y|^2`` in the values, and in the
points. XLA runs on every core (its default intra-op pool); DUCC with the ``nthreads`` of
the row. Double precision, eps 1e-6, points uniform in [-pi, pi)^d. The table gives each
median, the ratios reference / DUCC and nufftax / DUCC (DUCC at one thread), and the
largest difference between the reference and DUCC relative to DUCC's largest element
(the measure jaxbind.testing.check uses; both are within eps of the exact sum).
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import alternating, arguments, run_line, run_meta, save  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402
from jaxbind.contrib.ducc.reference import nufft as ref_nufft  # noqa: E402

try:  # optional: nufftax (pip install nufftax)
    import nufftax
except ImportError:  # pragma: no cover - not installed
    nufftax = None

EPS = 1e-6
# (d, type, points, modes per axis)
CASES = [
    (2, 1, 10**4, 64),
    (2, 2, 10**4, 64),
    (2, 1, 10**5, 128),
    (2, 2, 10**5, 128),
    (2, 1, 10**6, 256),
    (2, 2, 10**6, 256),
    (1, 1, 10**6, 4096),
    (1, 2, 10**6, 4096),
    (3, 1, 10**5, 32),
    (3, 2, 10**5, 32),
    # type 3: sources in [-pi, pi)^d to `modes` targets in [-S, S)^d (S in TARGETS)
    (1, 3, 10**6, 10**6),
    (2, 3, 10**5, 10**5),
    (3, 3, 10**4, 10**4),
    (2, 3, 10**4, 1000),  # a grid of 2008^2 would be needed: the direct sum
]
TARGETS = {1: 2048.0, 2: 64.0, 3: 12.0}  # S, per dimension (10^3 targets: 500)
QUICK = [(2, 1, 1000, 16), (2, 3, 100, 50)]  # the smoke test: a type 1 and a type 3
CALLS = ("forward", "grad values", "grad points")


def _inputs(d, kind, m, n):
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.uniform(-np.pi, np.pi, (d, m)))
    if kind == 2:
        values = rng.normal(size=(1,) + (n,) * d) + 1j * rng.normal(size=(1,) + (n,) * d)
    else:
        values = rng.normal(size=(1, m)) + 1j * rng.normal(size=(1, m))
    args = [jnp.asarray(values), xs]
    if kind == 3:
        half = n / 2 if n <= 1000 else TARGETS[d]
        args.append(jnp.asarray(rng.uniform(-half, half, (d, n))))  # n targets
    return args


def _nufftax(d, kind, n):
    """nufftax's call in nufft_points' layout ((1, ...) values, (d, M) points), or None."""
    if nufftax is None or kind == 3:
        return None
    fn = getattr(nufftax, f"nufft{d}d{kind}")
    grid = (n,) * d

    def call(values, xs):
        pts = list(xs)
        if kind == 1:
            out = fn(*pts, values[0], grid if d > 1 else n, eps=EPS, isign=-1)
            return (out.T if d > 1 else out)[None]
        f = values[0].T if d > 1 else values[0]
        return fn(*pts, f, eps=EPS, isign=-1)[None]

    return call


def _variants(d, kind, n):
    kw = dict(nufft_type=kind, sign=-1, grid=(n,) * d if kind == 1 else None)
    impls = {
        "ducc": lambda *a: jaxducc0.nufft_points(*a, eps=EPS, nthreads=1, **kw)[0],
        "ducc 2 threads": lambda *a: jaxducc0.nufft_points(*a, eps=EPS, nthreads=2, **kw)[0],
        "reference": lambda *a: ref_nufft.nufft_points(*a, eps=EPS, **kw)[0],
    }
    other = _nufftax(d, kind, n)
    if other is not None:
        impls["nufftax"] = other
    return impls


def _calls(fn, nargs):
    loss = lambda *a: jnp.sum(jnp.abs(fn(*a)) ** 2)
    return {
        "forward": jax.jit(fn),
        "grad values": jax.jit(jax.grad(loss, 0)),
        "grad points": jax.jit(jax.grad(loss, tuple(range(1, nargs)))),
    }


def _difference(got, want):
    got, want = (np.concatenate([np.ravel(v) for v in jax.tree.leaves(x)]) for x in (got, want))
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def main():
    args = arguments(__doc__, rounds=3)
    rounds = 1 if args.quick else args.rounds
    rows = []
    for d, kind, m, n in QUICK if args.quick else CASES:
        inputs = _inputs(d, kind, m, n)
        impls = _variants(d, kind, n)
        for call in CALLS:
            fns = {name: _calls(fn, len(inputs))[call] for name, fn in impls.items()}
            bound = {name: (lambda f=f: f(*inputs)) for name, f in fns.items()}
            times = alternating(bound, rounds=rounds, warmup=1)
            base = times["ducc"].median
            row = dict(
                d=d,
                type=kind,
                points=m,
                modes=n,
                call=call,
                eps=EPS,
                median_s={k: t.median for k, t in times.items()},
                ratio={k: t.median / base for k, t in times.items()},
                difference=_difference(times["reference"].value, times["ducc"].value),
            )
            rows.append(row)
            print(row, flush=True)
        jax.clear_caches()  # each case's programs freed before the next (memory)
    meta = run_meta(
        ducc_threads="1 and 2 (nthreads)",
        xla_threads="XLA's default intra-op pool (every core)",
        cores=__import__("os").cpu_count(),
    )
    lines = [
        "# NUFFT references at real sizes",
        "",
        f"{run_line(meta)}; double precision, eps {EPS:g}; medians of {rounds} alternating "
        "rounds (jitted). DUCC: `jaxducc0.nufft_points` at nthreads=1 (ratios are to it) "
        "and 2; XLA (reference, nufftax) on its default pool. Type 3: `modes` is the "
        "number of targets, in [-S, S)^d with S 2048 (1-D), 64 (2-D), 12 (3-D) or, for "
        "10^3 targets, 500 (the reference's direct sum: its grid would be too large). "
        "difference: "
        "max |reference - DUCC| / max |DUCC|.",
        "",
        "| d | type | points | modes | call | DUCC (s) | DUCC 2 thr (s) | reference (s) "
        "| ref / DUCC | nufftax (s) | nufftax / DUCC | difference |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, q = r["median_s"], r["ratio"]
        nx = f"{s['nufftax']:.4f} | {q['nufftax']:.1f}" if "nufftax" in s else "- | -"
        lines.append(
            f"| {r['d']} | {r['type']} | {r['points']} | {r['modes']} | {r['call']} "
            f"| {s['ducc']:.4f} | {s['ducc 2 threads']:.4f} | {s['reference']:.4f} "
            f"| {q['reference']:.1f} | {nx} | {r['difference']:.1e} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick and args.out:
        save(args.out, "reference_sizes", dict(meta=meta, results=rows), text)


if __name__ == "__main__":
    main()
