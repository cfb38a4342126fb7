"""The pure-JAX references of the DUCC FFTs and NUFFTs against the native ops.

    python benchmarks/reference_fft_nufft.py          # writes results/reference_fft_nufft.*
    python benchmarks/reference_fft_nufft.py --quick  # the smallest size of each, not saved

Per op and size, the native op and its reference (`jaxbind.contrib.ducc.reference`) run
jit-compiled on the same inputs, in alternating rounds: the forward call, and ``grad``
of ``sum |y|^2`` with respect to the values (and, for jax-finufft's calls, whose op is
differentiable in them, the points too). The table gives each one's median, the ratio
reference / native (above 1: the reference is slower), and the relative l2 difference
of the results (forward; the largest over the gradients). Double precision, 2-D, one
thread; the NUFFTs at eps=1e-9, points uniform in [-pi, pi)^2 (type 3: 1000 targets
uniform in the grid's mode range).
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import alternating, arguments, run_line, run_meta, save  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402
from jaxbind.contrib.ducc.reference import fft as ref_fft  # noqa: E402
from jaxbind.contrib.ducc.reference import nufft as ref_nufft  # noqa: E402

FFT_SIZES = [64, 256, 1024]  # n x n
NUFFT_SIZES = [(10**3, 32), (10**4, 64), (3 * 10**4, 128)]  # points, n x n grid
EPS = 1e-9
TARGETS = 10**3  # type 3's target points: its direct sum is an exp per (point, target)


def _rng():
    return np.random.default_rng(0)


def _complex(rng, shape):
    return jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(size=shape))


def _fft_cases(n):
    """{op: (native, reference, args, argnums)} for an n x n input."""
    rng = _rng()
    x = jnp.asarray(rng.normal(size=(n, n)))
    z = _complex(rng, (n, n))
    h = _complex(rng, (n, n // 2 + 1))
    return {
        "c2c": (lambda z: jaxducc0.c2c(z)[0], lambda z: ref_fft.c2c(z)[0], (z,), 0),
        "genuine_fht": (
            lambda x: jaxducc0.genuine_fht(x)[0],
            lambda x: ref_fft.genuine_fht(x)[0],
            (x,),
            0,
        ),
        "r2c": (lambda x: jaxducc0.r2c(x)[0], lambda x: ref_fft.r2c(x, n=n)[0], (x,), 0),
        "c2r": (
            lambda h: jaxducc0.c2r(h, lastsize=n, forward=False)[0],
            lambda h: ref_fft.c2r(h, n=n, forward=False)[0],
            (h,),
            0,
        ),
    }


def _nufft_cases(m, n):
    """{op: (native, reference, args, argnums)} for m points and an n x n grid."""
    rng = _rng()
    grid = (n, n)
    x, y = (jnp.asarray(rng.uniform(-np.pi, np.pi, m)) for _ in range(2))
    s, t = (jnp.asarray(rng.uniform(-n / 2, n / 2, TARGETS)) for _ in range(2))
    c, f = _complex(rng, m), _complex(rng, grid)
    coord = jnp.stack([x, y], axis=1)
    opts = jaxducc0.Opts(nthreads=1)
    cases = {}
    for kind, v in ((1, c), (2, f)):
        op = jaxducc0.get_nufft(coord, grid, nufft_type=kind, epsilon=EPS, nthreads=1)
        cases[f"get_nufft type {kind}"] = (
            lambda v, op=op: op(v)[0],
            lambda v, kind=kind: ref_nufft.nufft(coord, v, grid_shape=grid, nufft_type=kind)[0],
            (v,),
            0,
        )
    pts = [np.asarray(p) for p in (x, y)]
    for kind, v in ((1, c), (2, f), (3, c)):
        extra = [np.asarray(p) for p in (s, t)] if kind == 3 else []
        plan = jaxducc0.NufftPlan(
            kind, None if kind == 3 else grid, *pts, *extra, eps=EPS, opts=opts
        )
        cases[f"NufftPlan type {kind}"] = (
            lambda v, plan=plan: plan(v),
            lambda v, kw=plan._kw: ref_nufft.nufft_plan(v[None], **kw)[0][0],
            (v,),
            0,
        )
    drop_in = dict(eps=EPS, opts=opts)
    cases["nufft1"] = (
        lambda c, x, y: jaxducc0.nufft1(grid, c, x, y, **drop_in),
        lambda c, x, y: ref_nufft.nufft1(grid, c, x, y),
        (c, x, y),
        (0, 1, 2),
    )
    cases["nufft2"] = (
        lambda f, x, y: jaxducc0.nufft2(f, x, y, **drop_in),
        lambda f, x, y: ref_nufft.nufft2(f, x, y),
        (f, x, y),
        (0, 1, 2),
    )
    cases["nufft3"] = (
        lambda c, x, y: jaxducc0.nufft3(c, x, y, s, t, **drop_in),
        lambda c, x, y: ref_nufft.nufft3(c, x, y, s, t),
        (c, x, y),
        (0, 1, 2),
    )
    return cases


def _relative(got, want) -> float:
    return max(
        float(jnp.linalg.norm(g - w) / jnp.linalg.norm(w))
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))
    )


def _measure(size, op, native, ref, args, argnums, rounds):
    rows = []
    loss = lambda fn: lambda *a: jnp.sum(jnp.abs(fn(*a)) ** 2)
    for case, wrap in (
        ("forward", lambda fn: fn),
        ("grad", lambda fn: jax.grad(loss(fn), argnums)),
    ):
        fns = {"native": jax.jit(wrap(native)), "reference": jax.jit(wrap(ref))}
        results = {name: jax.block_until_ready(fn(*args)) for name, fn in fns.items()}
        calls = {name: (lambda fn=fn: fn(*args)) for name, fn in fns.items()}
        med = {name: t.median for name, t in alternating(calls, rounds=rounds).items()}
        row = dict(
            op=op,
            size=size,
            case=case,
            rounds=rounds,
            native_s=med["native"],
            reference_s=med["reference"],
            ratio=med["reference"] / med["native"],
            agree=_relative(results["reference"], results["native"]),
        )
        rows.append(row)
        print(
            f"{op:<22} {size:<14} {case:<8} {row['native_s'] * 1e3:10.3f} ms "
            f"{row['reference_s'] * 1e3:10.3f} ms  ratio {row['ratio']:7.2f}  agree "
            f"{row['agree']:.1e}",
            flush=True,
        )
    return rows


def main():
    args = arguments(__doc__)
    fft_sizes = FFT_SIZES[:1] if args.quick else FFT_SIZES
    nufft_sizes = NUFFT_SIZES[:1] if args.quick else NUFFT_SIZES
    rows = []
    for n in fft_sizes:
        rounds = args.rounds or (2 if args.quick else 7)
        for op, case in _fft_cases(n).items():
            rows += _measure(f"{n}²", op, *case, rounds)
    for m, n in nufft_sizes:
        rounds = args.rounds or (2 if args.quick else 5 if m < 10**4 else 3)
        for op, case in _nufft_cases(m, n).items():
            rows += _measure(f"{m:.0e} pts, {n}²", op, *case, rounds)
    import importlib.metadata as md

    meta = run_meta(ducc0=md.version("ducc0"))
    lines = [
        f"{run_line(meta)}, ducc0 {meta['ducc0']}. Double precision, 2-D, one thread; "
        f"NUFFTs at eps={EPS}; medians of alternating rounds, jit-compiled. ratio = "
        "reference / native; agree = relative l2 difference (grad: the largest over the "
        "arguments; jax-finufft's calls: values and both point coordinates).",
        "",
        "| op | size | case | native | reference | ratio | agree |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['size']} | {r['case']} | {r['native_s'] * 1e3:.3f} ms | "
            f"{r['reference_s'] * 1e3:.3f} ms | {r['ratio']:.2f} | {r['agree']:.1e} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        save(args.out, "reference_fft_nufft", dict(meta=meta, results=rows), text)


if __name__ == "__main__":
    main()
