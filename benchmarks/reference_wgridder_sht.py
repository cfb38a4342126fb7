"""The pure-JAX references of the wgridder and the HEALPix SHT against the native DUCC ops.

    python benchmarks/reference_wgridder_sht.py          # writes results/reference_wgridder_sht.*
    python benchmarks/reference_wgridder_sht.py --quick  # the smallest sizes only, no file

Per op and size, the native op (jaxducc0, one DUCC thread) and its reference
(jaxbind.contrib.ducc.reference) run on the same inputs, jit-compiled and warmed up, in
alternating rounds; the table gives each one's median, the ratio reference / native
(above 1: the reference is slower) and their relative l2 difference. Double precision.
Cases: the forward op, and ``grad`` of ``sum |op(x) - d|^2`` (a forward and a transpose).

- wgridder: w-gridding on, ``epsilon=1e-6``, a 4-degree field of view, uvw reaching the
  image's highest frequencies; the reference is a direct sum (one complex exponential per
  pixel and visibility). One row without w-gridding, where the reference factors the
  phase into a matrix product.
- SHT: spin 0 with lmax = 2 nside, one spin-2 row; the reference is the ring-factored
  matrix synthesis, its matrices built at trace time (not timed: compilation is warm-up).
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import alternating, arguments, run_line, run_meta, save  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402
from jaxbind.contrib.ducc.reference.sht import healpix_sht  # noqa: E402
from jaxbind.contrib.ducc.reference.wgridder import SPEED_OF_LIGHT, wgridder  # noqa: E402

# (npix, nrows, nchan, do_wgridding)
WGRIDDER = [(32, 500, 2, True), (64, 2500, 4, True), (64, 2500, 4, False), (128, 2500, 4, True)]
# (nside, lmax, spin)
SHT = [(8, 16, 0), (16, 32, 0), (16, 32, 2), (32, 64, 0)]
EPSILON = 1e-6


def _wgridder_cases(npix, nrows, nchan, do_wgridding):
    rng = np.random.default_rng(0)
    pixsize = np.deg2rad(4.0) / npix
    freq = np.linspace(1.0e9, 1.4e9, nchan)
    uvw = (rng.random((nrows, 3)) - 0.5) / (pixsize * freq.max() / SPEED_OF_LIGHT)
    uvw[:, 2] *= 10
    image = jnp.asarray(rng.standard_normal((npix, npix)))
    data = jnp.asarray(
        rng.standard_normal((nrows, nchan)) + 1j * rng.standard_normal((nrows, nchan))
    )
    op = jaxducc0.get_wgridder(
        pixsize_x=pixsize,
        pixsize_y=pixsize,
        npix_x=npix,
        npix_y=npix,
        epsilon=EPSILON,
        do_wgridding=do_wgridding,
    )
    kwargs = dict(op.keywords)
    uvw_j, freq_j = jnp.asarray(uvw), jnp.asarray(freq)
    fns = {
        "native": lambda x: op(uvw, freq, x)[0],
        "reference": lambda x: wgridder(uvw_j, freq_j, x, **kwargs)[0],
    }
    return fns, image, data


def _sht_cases(nside, lmax, spin):
    rng = np.random.default_rng(0)
    op = jaxducc0.get_healpix_sht(nside, lmax, lmax, spin)
    kwargs = dict(op.keywords)
    ncomp = 1 if spin == 0 else 2
    alm = jnp.asarray(rng.standard_normal((ncomp, jaxducc0.realalm_size(lmax, lmax))))
    data = jnp.asarray(rng.standard_normal((ncomp, 12 * nside**2)))
    fns = {"native": lambda x: op(x)[0], "reference": lambda x: healpix_sht(x, **kwargs)[0]}
    return fns, alm, data


def _measure(label, size, fns, x, data, rounds):
    rows = []
    for case in ("forward", "grad"):
        if case == "forward":
            jitted = {name: jax.jit(fn) for name, fn in fns.items()}
        else:
            jitted = {
                name: jax.jit(jax.grad(lambda x, fn=fn: jnp.sum(jnp.abs(fn(x) - data) ** 2)))
                for name, fn in fns.items()
            }
        out = {name: fn(x) for name, fn in jitted.items()}  # compile, warm up
        agree = float(
            jnp.linalg.norm(out["reference"] - out["native"]) / jnp.linalg.norm(out["native"])
        )
        calls = {name: (lambda fn=fn: fn(x)) for name, fn in jitted.items()}
        med = {name: t.median for name, t in alternating(calls, rounds=rounds).items()}
        row = dict(
            op=label,
            size=size,
            case=case,
            rounds=rounds,
            agree=agree,
            native_s=med["native"],
            reference_s=med["reference"],
            ratio=med["reference"] / med["native"],
        )
        rows.append(row)
        print(
            f"{label:<9} {size:<34} {case:<8} {row['native_s'] * 1e3:9.3f} ms "
            f"{row['reference_s'] * 1e3:9.3f} ms  ratio {row['ratio']:7.1f}  agree {agree:.1e}",
            flush=True,
        )
    return rows


def main():
    args = arguments(__doc__)
    import importlib.metadata as md

    rounds = args.rounds or (1 if args.quick else 5)
    rows = []
    for npix, nrows, nchan, w in WGRIDDER[:1] if args.quick else WGRIDDER:
        fns, x, data = _wgridder_cases(npix, nrows, nchan, w)
        size = f"{npix}² image, {nrows}x{nchan} vis" + ("" if w else ", no w")
        rows += _measure("wgridder", size, fns, x, data, rounds)
    for nside, lmax, spin in SHT[:1] if args.quick else SHT:
        fns, x, data = _sht_cases(nside, lmax, spin)
        size = f"nside {nside}, lmax=mmax {lmax}, spin {spin}"
        rows += _measure("SHT", size, fns, x, data, rounds)
    meta = run_meta(ducc0=md.version("ducc0"))
    lines = [
        f"{run_line(meta)}, ducc0 {meta['ducc0']}. float64, native ops with 1 DUCC thread, "
        f"wgridder epsilon={EPSILON}; jit-compiled, medians of {rounds} alternating rounds. "
        "ratio = reference / native; agree = relative l2 difference of the outputs.",
        "",
        "| op | size | case | native | reference | ratio | agree (rel. l2) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['size']} | {r['case']} | {r['native_s'] * 1e3:.3f} ms | "
            f"{r['reference_s'] * 1e3:.3f} ms | {r['ratio']:.1f} | {r['agree']:.1e} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        save(args.out, "reference_wgridder_sht", dict(meta=meta, results=rows), text)


if __name__ == "__main__":
    main()
