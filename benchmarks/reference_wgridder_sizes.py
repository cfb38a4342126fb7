"""The wgridder's reference at real sizes: DUCC and the pure-JAX reference side by side.

    python benchmarks/reference_wgridder_sizes.py          # results/reference_wgridder_sizes.*
    python benchmarks/reference_wgridder_sizes.py --quick  # a small case, one round, no file

Per case (image, visibilities, w-term), jit-compiled on the same inputs in alternating
rounds: ``jaxducc0.get_wgridder`` (DUCC at ``nthreads`` 1 and 2) and its reference
(`jaxbind.contrib.ducc.reference.wgridder.wgridder`: w-stacking on the spreading kernel,
`reference/wstacking.py`), both called as the op's callable is (uvw and freq are
arguments of the jitted function, as in a program). Two calls: the forward op (image ->
visibilities, DUCC's ``dirty2vis``) and its transpose (visibilities -> image, DUCC's
``vis2dirty``; for the reference, JAX's transpose of it). XLA runs on its default pool;
DUCC with the row's ``nthreads``. Double precision, epsilon 1e-6; uvw uniform up to the
image's highest frequency (4-degree field), w as large as u and v, one channel.
difference: max |reference - DUCC| / max |DUCC|, the measure jaxbind.testing.check uses.
"""

from __future__ import annotations

import os

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import alternating, arguments, run_line, run_meta, save  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402
from jaxbind.contrib.ducc.reference.wgridder import SPEED_OF_LIGHT, wgridder  # noqa: E402

EPS = 1e-6
FIELD = np.deg2rad(4.0)
# (npix, visibilities, do_wgridding)
CASES = [(1024, 10**6, False), (1024, 10**6, True)]
QUICK = [(64, 2000, True)]
CALLS = ("forward", "transpose")


def _inputs(npix, m):
    rng = np.random.default_rng(0)
    pixsize = FIELD / npix
    freq = np.array([1.0e9])
    uvw = (rng.random((m, 3)) - 0.5) / (pixsize * freq.max() / SPEED_OF_LIGHT)
    image = rng.standard_normal((npix, npix))
    vis = rng.standard_normal((m, 1)) + 1j * rng.standard_normal((m, 1))
    return pixsize, jnp.asarray(uvw), jnp.asarray(freq), jnp.asarray(image), jnp.asarray(vis)


def _variants(npix, pixsize, do_wgridding):
    ops = {
        name: jaxducc0.get_wgridder(
            pixsize_x=pixsize,
            pixsize_y=pixsize,
            npix_x=npix,
            npix_y=npix,
            epsilon=EPS,
            do_wgridding=do_wgridding,
            nthreads=threads,
        )
        for name, threads in (("ducc", 1), ("ducc 2 threads", 2))
    }
    kwargs = dict(ops["ducc"].keywords)
    fns = {name: (lambda u, f, x, op=op: op(u, f, x)[0]) for name, op in ops.items()}
    fns["reference"] = lambda u, f, x: wgridder(u, f, x, **kwargs)[0]
    return fns


def _call(fn, call, image):
    if call == "forward":
        return jax.jit(fn)
    return jax.jit(lambda u, f, v: jax.linear_transpose(lambda x: fn(u, f, x), image)(v)[0])


def main():
    args = arguments(__doc__, rounds=3)
    rounds = 1 if args.quick else args.rounds
    rows = []
    for npix, m, w in QUICK if args.quick else CASES:
        pixsize, uvw, freq, image, vis = _inputs(npix, m)
        fns = _variants(npix, pixsize, w)
        for call in CALLS:
            x = image if call == "forward" else vis
            jitted = {name: _call(fn, call, image) for name, fn in fns.items()}
            bound = {name: (lambda f=f: f(uvw, freq, x)) for name, f in jitted.items()}
            times = alternating(bound, rounds=rounds, warmup=1)
            base = times["ducc"].median
            got, want = (np.asarray(times[k].value) for k in ("reference", "ducc"))
            row = dict(
                npix=npix,
                visibilities=m,
                do_wgridding=w,
                call=call,
                eps=EPS,
                median_s={k: t.median for k, t in times.items()},
                ratio={k: t.median / base for k, t in times.items()},
                difference=float(np.max(np.abs(got - want)) / np.max(np.abs(want))),
            )
            rows.append(row)
            print(row, flush=True)
    meta = run_meta(
        ducc_threads="1 and 2 (nthreads)",
        xla_threads="XLA's default intra-op pool (every core)",
        cores=os.cpu_count(),
    )
    lines = [
        "# The wgridder's reference at real sizes",
        "",
        f"{run_line(meta)}; double precision, epsilon {EPS:g}, a 4-degree field, one "
        f"channel; medians of {rounds} alternating rounds (jitted). DUCC: "
        "`jaxducc0.get_wgridder` at nthreads=1 (ratios are to it) and 2; the reference "
        "(w-stacking, `reference/wstacking.py`) on XLA's default pool. transpose: "
        "visibilities -> image (DUCC's vis2dirty; JAX's transpose of the reference). "
        "difference: max |reference - DUCC| / max |DUCC|.",
        "",
        "| image | visibilities | w-term | call | DUCC (s) | DUCC 2 thr (s) | reference (s) "
        "| ref / DUCC | difference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, q = r["median_s"], r["ratio"]
        lines.append(
            f"| {r['npix']}² | {r['visibilities']} | {'yes' if r['do_wgridding'] else 'no'} "
            f"| {r['call']} | {s['ducc']:.3f} | {s['ducc 2 threads']:.3f} "
            f"| {s['reference']:.3f} | {q['reference']:.1f} | {r['difference']:.1e} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick and args.out:
        save(args.out, "reference_wgridder_sizes", dict(meta=meta, results=rows), text)


if __name__ == "__main__":
    main()
