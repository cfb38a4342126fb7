"""Every jaxducc0 op's pure-JAX reference against its native op: time and agreement per size.

    python benchmarks/reference_ducc.py                      # every family; writes
                                                             # results/reference_ducc.*
    python benchmarks/reference_ducc.py --families sht       # one family; the others' rows
                                                             # in the results stay
    python benchmarks/reference_ducc.py --quick              # the smallest size, no file
                                                             # (the first and last op of each)

Per op and size, the native op (jaxducc0, one DUCC thread) and its reference
(`jaxbind.contrib.ducc.reference`) run jit-compiled and warmed up on the same inputs, in
alternating rounds: the forward call, and ``grad`` of a loss with respect to the values
(and, for jax-finufft's calls, whose op is differentiable in them, the points too). The
table gives each one's median, the ratio reference / native (above 1: the reference is
slower), and the relative l2 difference of the results (grad: the largest over the
arguments). Double precision. The families:

- fft: c2c, genuine_fht, r2c, c2r on n x n inputs; loss ``sum |y|^2``;
- nufft: 2-D, eps=1e-9, points uniform in [-pi, pi)^2 (type 3: 1000 targets uniform in the
  grid's mode range): get_nufft, NufftPlan, jax-finufft's nufft1/2/3; loss ``sum |y|^2``;
- wgridder: w-gridding on, ``epsilon=1e-6``, a 4-degree field of view, uvw reaching the
  image's highest frequencies (the reference: a direct sum, one complex exponential per
  pixel and visibility), and one row without w-gridding (a matrix product); loss
  ``sum |op(x) - d|^2`` (a forward and a transpose);
- sht: spin 0 with lmax = 2 nside, one spin-2 row (the reference: the ring-factored matrix
  synthesis, its matrices built at trace time, not timed); loss ``sum |op(x) - d|^2``.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import pathlib

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import arguments, flag, ms, publish, run_line, run_meta, side_by_side, table  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402
from jaxbind.contrib.ducc.reference import fft as ref_fft  # noqa: E402
from jaxbind.contrib.ducc.reference import nufft as ref_nufft  # noqa: E402
from jaxbind.contrib.ducc.reference.sht import healpix_sht  # noqa: E402
from jaxbind.contrib.ducc.reference.wgridder import SPEED_OF_LIGHT, wgridder  # noqa: E402

STEM = "reference_ducc"
EPS = 1e-9  # the NUFFTs'
TARGETS = 10**3  # type 3's target points: its direct sum is an exp per (point, target)
EPSILON = 1e-6  # the wgridder's


class Case:
    """One op at one size: its native and reference functions of `args`, and the loss
    whose gradient (in `argnums`) the grad row times (`data`: ``sum |y - data|^2``, else
    ``sum |y|^2``)."""

    def __init__(self, native, reference, args, argnums=0, data=None):
        self.fns = {"native": native, "reference": reference}
        self.args, self.argnums, self.data = args, argnums, data

    def loss(self, fn):
        off = 0.0 if self.data is None else self.data
        return lambda *a: jnp.sum(jnp.abs(fn(*a) - off) ** 2)


def _complex(rng, shape):
    return jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(size=shape))


def fft_cases(n):
    rng = np.random.default_rng(0)
    x, z, h = (
        jnp.asarray(rng.normal(size=(n, n))),
        _complex(rng, (n, n)),
        _complex(rng, (n, n // 2 + 1)),
    )
    return {
        "c2c": Case(lambda z: jaxducc0.c2c(z)[0], lambda z: ref_fft.c2c(z)[0], (z,)),
        "genuine_fht": Case(
            lambda x: jaxducc0.genuine_fht(x)[0], lambda x: ref_fft.genuine_fht(x)[0], (x,)
        ),
        "r2c": Case(lambda x: jaxducc0.r2c(x)[0], lambda x: ref_fft.r2c(x, n=n)[0], (x,)),
        "c2r": Case(
            lambda h: jaxducc0.c2r(h, lastsize=n, forward=False)[0],
            lambda h: ref_fft.c2r(h, n=n, forward=False)[0],
            (h,),
        ),
    }


def nufft_cases(m, n):
    rng = np.random.default_rng(0)
    grid = (n, n)
    x, y = (jnp.asarray(rng.uniform(-np.pi, np.pi, m)) for _ in range(2))
    s, t = (jnp.asarray(rng.uniform(-n / 2, n / 2, TARGETS)) for _ in range(2))
    c, f = _complex(rng, m), _complex(rng, grid)
    coord = jnp.stack([x, y], axis=1)
    opts = jaxducc0.Opts(nthreads=1)
    cases = {}
    for kind, v in ((1, c), (2, f)):
        op = jaxducc0.get_nufft(coord, grid, nufft_type=kind, epsilon=EPS, nthreads=1)
        cases[f"get_nufft type {kind}"] = Case(
            lambda v, op=op: op(v)[0],
            lambda v, kind=kind: ref_nufft.nufft(coord, v, grid_shape=grid, nufft_type=kind)[0],
            (v,),
        )
    pts = [np.asarray(p) for p in (x, y)]
    for kind, v in ((1, c), (2, f), (3, c)):
        extra = [np.asarray(p) for p in (s, t)] if kind == 3 else []
        plan = jaxducc0.NufftPlan(
            kind, None if kind == 3 else grid, *pts, *extra, eps=EPS, opts=opts
        )
        cases[f"NufftPlan type {kind}"] = Case(
            lambda v, plan=plan: plan(v),
            lambda v, kw=plan._kw: ref_nufft.nufft_plan(v[None], **kw)[0][0],
            (v,),
        )
    calls = {
        "nufft1": (lambda fn, c, x, y: fn(grid, c, x, y), c),
        "nufft2": (lambda fn, f, x, y: fn(f, x, y), f),
        "nufft3": (lambda fn, c, x, y: fn(c, x, y, s, t), c),
    }
    for name, (call, v) in calls.items():
        native, ref = getattr(jaxducc0, name), getattr(ref_nufft, name)
        cases[name] = Case(
            lambda *a, call=call, native=native: call(
                lambda *b: native(*b, eps=EPS, opts=opts), *a
            ),
            lambda *a, call=call, ref=ref: call(ref, *a),
            (v, x, y),
            (0, 1, 2),
        )
    return cases


def wgridder_cases(npix, nrows, nchan, do_wgridding):
    rng = np.random.default_rng(0)
    pixsize = np.deg2rad(4.0) / npix
    freq = np.linspace(1.0e9, 1.4e9, nchan)
    uvw = (rng.random((nrows, 3)) - 0.5) / (pixsize * freq.max() / SPEED_OF_LIGHT)
    uvw[:, 2] *= 10
    image = jnp.asarray(rng.standard_normal((npix, npix)))
    data = _complex(rng, (nrows, nchan))
    op = jaxducc0.get_wgridder(
        pixsize_x=pixsize,
        pixsize_y=pixsize,
        npix_x=npix,
        npix_y=npix,
        epsilon=EPSILON,
        do_wgridding=do_wgridding,
    )
    kwargs, uvw_j, freq_j = dict(op.keywords), jnp.asarray(uvw), jnp.asarray(freq)
    size = f"{npix}² image, {nrows}x{nchan} vis" + ("" if do_wgridding else ", no w")
    native, ref = (
        (lambda x: op(uvw, freq, x)[0]),
        (lambda x: wgridder(uvw_j, freq_j, x, **kwargs)[0]),
    )
    return size, {"wgridder": Case(native, ref, (image,), data=data)}


def sht_cases(nside, lmax, spin):
    rng = np.random.default_rng(0)
    op = jaxducc0.get_healpix_sht(nside, lmax, lmax, spin)
    kwargs, ncomp = dict(op.keywords), 1 if spin == 0 else 2
    alm = jnp.asarray(rng.standard_normal((ncomp, jaxducc0.realalm_size(lmax, lmax))))
    data = jnp.asarray(rng.standard_normal((ncomp, 12 * nside**2)))
    size = f"nside {nside}, lmax=mmax {lmax}, spin {spin}"
    case = Case(lambda x: op(x)[0], lambda x: healpix_sht(x, **kwargs)[0], (alm,), data=data)
    return size, {"SHT": case}


# family -> (sizes, cases of a size: (size label, {op: Case}), rounds of a size)
FAMILIES = {
    "fft": (
        [64, 256, 1024],  # n x n
        lambda n: (f"{n}²", fft_cases(n)),
        lambda n: 7,
    ),
    "nufft": (
        [(10**3, 32), (10**4, 64), (3 * 10**4, 128)],  # points, n x n grid
        lambda s: (f"{s[0]:.0e} pts, {s[1]}²", nufft_cases(*s)),
        lambda s: 5 if s[0] < 10**4 else 3,
    ),
    "wgridder": (
        [(32, 500, 2, True), (64, 2500, 4, True), (64, 2500, 4, False), (128, 2500, 4, True)],
        lambda s: wgridder_cases(*s),
        lambda s: 5,
    ),
    "sht": (
        [(8, 16, 0), (16, 32, 0), (16, 32, 2), (32, 64, 0)],  # nside, lmax, spin
        lambda s: sht_cases(*s),
        lambda s: 5,
    ),
}


def measure(family: str, op: str, size: str, case: Case, rounds: int) -> list[dict]:
    """The forward and grad rows of one case: native and reference side by side."""
    forward, grad = (lambda fn: fn), (lambda fn: jax.grad(case.loss(fn), case.argnums))
    rows = []
    for what, wrap in (("forward", forward), ("grad", grad)):
        jitted = {name: jax.jit(wrap(fn)) for name, fn in case.fns.items()}
        calls = {name: (lambda fn=fn: fn(*case.args)) for name, fn in jitted.items()}
        med, agree = side_by_side(calls, rounds=rounds, against="native")
        native, ref = med["native"], med["reference"]
        rows.append(
            dict(family=family, op=op, size=size, case=what, rounds=rounds, native_s=native,
                 reference_s=ref, ratio=ref / native, agree=agree["reference"])
        )  # fmt: skip
        print(
            f"{op:<22} {size:<34} {what:<8} {ms(native):>12} {ms(ref):>12}  ratio "
            f"{ref / native:7.2f}  agree {agree['reference']:.1e}",
            flush=True,
        )
    return rows


CAPTION = (
    "{run}, ducc0 {ducc0}: {families}. float64, native ops with 1 DUCC thread (NUFFTs at "
    f"eps={EPS}, the wgridder at epsilon={EPSILON}); jit-compiled, medians of alternating "
    "rounds. ratio = reference / native; agree = relative l2 difference (grad: the largest "
    "over the arguments; jax-finufft's calls: values and both point coordinates)."
)


def report(payload: dict) -> list[str]:
    """The table of every family's rows, under a caption per run that measured them."""
    captions = [
        CAPTION.format(run=run_line(meta), ducc0=meta["ducc0"], families=", ".join(families))
        for families, meta in _runs(payload)
    ]
    header = ("family", "op", "size", "case", "native", "reference", "ratio", "agree")
    rows = [
        (r["family"], r["op"], r["size"], r["case"], ms(r["native_s"]), ms(r["reference_s"]),
         f"{r['ratio']:.2f}", f"{r['agree']:.1e}")
        for r in payload["results"]
    ]  # fmt: skip
    return table("\n\n".join(captions), header, rows)


def _runs(payload: dict) -> list[tuple[list[str], dict]]:
    """(families, meta) per run, in the order of the families."""
    runs: dict[str, tuple[list[str], dict]] = {}
    for family, meta in payload["meta"].items():
        runs.setdefault(meta["date"], ([], meta))[0].append(family)
    return list(runs.values())


def main():
    args = arguments(
        __doc__,
        flag("--families", default=",".join(FAMILIES), help="comma-separated: fft,nufft,..."),
    )
    families = [f for f in args.families.split(",") if f]
    meta = run_meta(ducc0=md.version("ducc0"))
    rows = []
    for family in families:
        sizes, cases, rounds = FAMILIES[family]
        for s in sizes[:1] if args.quick else sizes:
            size, ops = cases(s)
            if args.quick:  # the smoke test: the first and last op of each family
                ops = {k: ops[k] for k in dict.fromkeys([next(iter(ops)), next(reversed(ops))])}
            for op, case in ops.items():
                rows += measure(
                    family, op, size, case, args.rounds or (1 if args.quick else rounds(s))
                )
    # the other families' rows stay as the results hold them (a quick run: its own alone)
    path = pathlib.Path(args.out) / f"{STEM}.json"
    fresh = args.quick or not path.exists()
    payload = dict(meta={}, results=[]) if fresh else json.loads(path.read_text())
    kept = [r for r in payload["results"] if r["family"] not in families]
    payload = dict(
        meta={
            **{f: m for f, m in payload["meta"].items() if f not in families},
            **{f: meta for f in families},
        },
        results=sorted(kept + rows, key=lambda r: list(FAMILIES).index(r["family"])),
    )
    publish(args.out, STEM, payload, report(payload), write=not args.quick)


if __name__ == "__main__":
    main()
