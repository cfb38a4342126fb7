"""The HEALPix SHT's JAX reference at real sizes, against DUCC and s2fft.

    python benchmarks/reference_sht.py          # nside 256, lmax = mmax = 512, spins 0 and 2
    python benchmarks/reference_sht.py --quick  # nside 16, lmax 32 (the smoke test); no file

Per spin, side by side in alternating rounds, jit-compiled and warmed up, float64:

- native: ``jaxducc0.get_healpix_sht`` (DUCC's synthesis, ``--ducc-threads`` threads, 1 by
  default, the op's default);
- reference: its JAX reference (``jaxbind.contrib.ducc.reference.sht.healpix_sht``:
  Legendre recurrences on the fly, FFTs and chirp-z transforms along the rings), called
  as jaxbind calls it;
- s2fft: ``s2fft.inverse(..., sampling="healpix", method="jax")`` at band-limit
  L = lmax + 1, no precomputes (``reality=True`` for spin 0; spin 2 is one complex
  spin-2 field), where s2fft is installed.

Cases: the synthesis, and the transpose (adjoint synthesis: DUCC's adjoint, the
reference's ``jax.linear_transpose``). The table gives each one's median wall time and CPU
time per call, the ratio to native, the agreement with native (largest difference relative
to the largest element), and the peak memory of a fresh process per (implementation, spin,
case) that imports, compiles and runs it twice (maximum RSS; and over the same process's
RSS once its inputs exist).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import HIDDEN, alternating, arguments, flag, run_line, run_meta, save  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402
from jaxbind.contrib.ducc.reference.sht import healpix_sht  # noqa: E402

SPINS = (0, 2)
CASES = ("synthesis", "transpose")


def _has_s2fft() -> bool:
    try:
        import s2fft  # noqa: F401
    except ImportError:
        return False
    return True


def _functions(nside: int, lmax: int, spin: int, threads: int):
    """impl -> (case -> (jitted function, its input)), for one spin."""
    rng = np.random.default_rng(spin)
    op = jaxducc0.get_healpix_sht(nside, lmax, lmax, spin, nthreads=threads)
    kwargs = dict(op.keywords)
    ncomp = 1 if spin == 0 else 2
    alm = jnp.asarray(rng.standard_normal((ncomp, jaxducc0.realalm_size(lmax, lmax))))
    maps = jnp.asarray(rng.standard_normal((ncomp, 12 * nside**2)))

    def native(x):
        return op(x)[0]

    def reference(x):
        return healpix_sht(x, **kwargs)[0]

    out = {
        name: {
            "synthesis": (jax.jit(fn), alm),
            "transpose": (jax.jit(lambda y, fn=fn: jax.linear_transpose(fn, alm)(y)[0]), maps),
        }
        for name, fn in (("native", native), ("reference", reference))
    }
    if _has_s2fft():
        import s2fft

        size = lmax + 1
        flm = rng.standard_normal((size, 2 * size - 1)) + 1j * rng.standard_normal(
            (size, 2 * size - 1)
        )
        ell, m = np.arange(size)[:, None], np.arange(-lmax, size)[None, :]
        flm = np.where((np.abs(m) <= ell) & (ell >= spin), flm, 0)
        if spin == 0:  # a real map: f_{l,-m} = (-1)^m conj(f_{lm})
            flm = np.where(m < 0, ((-1.0) ** m) * np.conj(flm[:, ::-1]), flm)
            flm[:, lmax] = flm[:, lmax].real

        def inverse(f):
            return s2fft.inverse(
                f, size, spin=spin, nside=nside, sampling="healpix", method="jax",
                reality=spin == 0,
            )  # fmt: skip

        out["s2fft"] = {"synthesis": (jax.jit(inverse), jnp.asarray(flm))}
    return out


def _agree(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _status_mb(field: str) -> float:
    """A memory field of /proc/self/status (Linux: VmRSS now, VmHWM its peak), in MB. (Not
    getrusage's ru_maxrss: a child process starts with its parent's.)"""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise OSError(f"no {field} in /proc/self/status")


def _memory(args) -> None:
    """Child process: one (impl, spin, case); print its RSS once the inputs exist and its
    peak RSS after compiling and running the case twice (MB)."""
    impl, spin, case = args.memory.split(":")
    fns = _functions(args.nside, args.lmax, int(spin), args.ducc_threads)
    fn, x = fns[impl][case]
    x = jax.block_until_ready(x)
    before = _status_mb("VmRSS")
    for _ in range(2):
        jax.block_until_ready(fn(x))
    peak = _status_mb("VmHWM")
    print(json.dumps(dict(before_mb=before, peak_mb=peak)))


def _measure_memory(args, impl, spin, case) -> dict:
    command = [
        sys.executable, __file__, "--memory", f"{impl}:{spin}:{case}",
        "--nside", str(args.nside), "--lmax", str(args.lmax),
        "--ducc-threads", str(args.ducc_threads),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return dict(error=done.stderr[-500:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    args = arguments(
        __doc__,
        flag("--nside", type=int, default=None, help="HEALPix nside (default 256; quick 16)"),
        flag("--lmax", type=int, default=None, help="lmax = mmax (default 2 nside)"),
        flag("--ducc-threads", type=int, default=1, help="DUCC's threads (default 1)"),
        flag("--no-memory", action="store_true", help="skip the peak-memory processes"),
        flag("--memory", default=None, help=HIDDEN),
    )
    args.nside = args.nside or (16 if args.quick else 256)
    args.lmax = args.lmax or 2 * args.nside
    if args.memory:
        return _memory(args)
    rounds = args.rounds or (1 if args.quick else 3)
    rows = []
    for spin in SPINS:
        fns = _functions(args.nside, args.lmax, spin, args.ducc_threads)
        for case in CASES:
            calls = {impl: per[case] for impl, per in fns.items() if case in per}
            outs = {impl: jax.block_until_ready(fn(x)) for impl, (fn, x) in calls.items()}
            timings = alternating(
                {impl: (lambda fn=fn, x=x: fn(x)) for impl, (fn, x) in calls.items()},
                rounds=rounds,
            )
            for impl, t in timings.items():
                row = dict(
                    spin=spin,
                    case=case,
                    impl=impl,
                    rounds=rounds,
                    median_s=t.median,
                    cpu_s=t.cpu_median,
                    ratio=t.median / timings["native"].median,
                    agree=None if impl == "s2fft" else _agree(outs[impl], outs["native"]),
                )
                if not args.no_memory:
                    row.update(_measure_memory(args, impl, spin, case))
                rows.append(row)
                print(json.dumps(row), flush=True)
    meta = run_meta(
        ducc0=md.version("ducc0"),
        s2fft=md.version("s2fft") if _has_s2fft() else None,
        nside=args.nside,
        lmax=args.lmax,
        ducc_threads=args.ducc_threads,
    )
    lines = [
        f"{run_line(meta)}, ducc0 {meta['ducc0']}, s2fft {meta['s2fft'] or 'not installed'}. "
        f"HEALPix nside {args.nside}, lmax = mmax {args.lmax}, float64, jit-compiled; "
        f"native = jaxducc0 with {args.ducc_threads} DUCC thread(s); medians of {rounds} "
        "alternating rounds (wall, and this process's CPU time); ratio = wall / native's; "
        "agree = largest difference from native relative to its largest element; peak = "
        "maximum RSS of a fresh process that compiles and runs the case twice (over = above "
        "its RSS once the inputs exist; at small sizes the peak is the imports').",
        "",
        "| spin | case | impl | wall | CPU | ratio | agree | peak | over |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        agree = "" if r["agree"] is None else f"{r['agree']:.1e}"
        peak = over = ""
        if "peak_mb" in r:
            peak = f"{r['peak_mb']:.0f} MB"
            over = f"{r['peak_mb'] - r['before_mb']:.0f} MB"
        lines.append(
            f"| {r['spin']} | {r['case']} | {r['impl']} | {r['median_s'] * 1e3:.1f} ms | "
            f"{r['cpu_s'] * 1e3:.1f} ms | {r['ratio']:.1f} | {agree} | {peak} | {over} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        save(args.out, "reference_sht", dict(meta=meta, results=rows), text)


if __name__ == "__main__":
    main()
