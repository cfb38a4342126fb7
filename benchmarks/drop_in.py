"""Every jaxducc0 op of JAXbind 1.3.1, timed side by side with JAXbind 1.3.1.

    python benchmarks/drop_in.py            # writes benchmarks/results/drop_in.{json,md}
    python benchmarks/drop_in.py --quick    # small sizes, 1 run, no file (the smoke test)
    python benchmarks/drop_in.py --no-jaxbind13   # this jaxbind only

Both run the same calls of ``jaxbind.contrib.jaxducc0`` (``c2c``, ``genuine_fht``,
``get_healpix_sht``, ``get_wgridder``: what 1.3.1 has), jitted, double precision, one
DUCC thread, with the same jax and ducc0: JAXbind 1.3.1 in its own venv
(compare_jaxbind13.sh), each in a worker process (this file, ``--serve``). Per run, two
fresh workers; per case, rounds in which the two take turns (the order alternating), each
timing a block of calls and answering the block's median call, in wall time and in the
CPU time of the process (all threads; on a shared machine, other processes lengthen the
wall time, hardly the CPU time). A round's ratio is jaxbind / 1.3.1 of that round's two
medians (below 1: jaxbind is faster); the table gives the median over rounds of each
side, and the median, min and max of the per-round ratios, per run: the spread on a
shared machine is part of the result.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

# name -> (op, size label, parameters); the sizes DUCC takes milliseconds on
CASES = {
    "c2c 128²": ("c2c", dict(shape=(128, 128))),
    "c2c 1024²": ("c2c", dict(shape=(1024, 1024))),
    "c2c vmap 16×128²": ("c2c_vmap", dict(shape=(16, 128, 128))),
    "genuine_fht 128²": ("genuine_fht", dict(shape=(128, 128))),
    "genuine_fht 1024²": ("genuine_fht", dict(shape=(1024, 1024))),
    "sht nside 64 lmax 128": ("sht", dict(nside=64, lmax=128, spin=0)),
    "sht adjoint nside 64 lmax 128": ("sht_adjoint", dict(nside=64, lmax=128, spin=0)),
    "sht spin 2 nside 32 lmax 64": ("sht", dict(nside=32, lmax=64, spin=2)),
    "wgridder 20k vis": ("wgridder", dict(nrows=20_000)),
    "wgridder adjoint 20k vis": ("wgridder_adjoint", dict(nrows=20_000)),
    "wgridder 100k vis": ("wgridder", dict(nrows=100_000)),
    "wgridder adjoint 100k vis": ("wgridder_adjoint", dict(nrows=100_000)),
}
QUICK = ["c2c 128²", "sht nside 64 lmax 128", "wgridder 20k vis", "wgridder adjoint 20k vis"]


# --- the worker (runs under either jaxbind) --------------------------------------------


def build(kind: str, p: dict):
    """(jitted function, its arguments) of one case; the same code under both jaxbinds."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxbind.contrib import jaxducc0

    rng = np.random.default_rng(0)
    if kind in ("c2c", "c2c_vmap", "genuine_fht"):
        shape = p["shape"]
        x = rng.normal(size=shape)
        x = jnp.asarray(x + 1j * rng.normal(size=shape) if kind != "genuine_fht" else x)
        op = jaxducc0.genuine_fht if kind == "genuine_fht" else jaxducc0.c2c
        f = lambda x: op(x)[0]
        return jax.jit(jax.vmap(f) if kind == "c2c_vmap" else f), (x,)
    if kind in ("sht", "sht_adjoint"):
        lmax, spin = p["lmax"], p["spin"]
        ncomp = 1 if spin == 0 else 2
        sht = jaxducc0.get_healpix_sht(p["nside"], lmax, lmax, spin)
        alm = jnp.asarray(rng.normal(size=(ncomp, 2 * jaxducc0.nalm(lmax, lmax) - lmax - 1)))
        if kind == "sht":
            return jax.jit(lambda a: sht(a)[0]), (alm,)
        m = jnp.asarray(rng.normal(size=(ncomp, 12 * p["nside"] ** 2)))
        adjoint = jax.linear_transpose(lambda a: sht(a)[0], alm)
        return jax.jit(lambda m: adjoint(m)[0]), (m,)
    if kind in ("wgridder", "wgridder_adjoint"):
        nrows, npix = p["nrows"], 128
        uvw = rng.uniform(-500, 500, (nrows, 3))
        uvw[:, 2] *= 0.1
        freq = np.array([1e9])
        op = jaxducc0.get_wgridder(
            pixsize_x=1e-4,
            pixsize_y=1e-4,
            npix_x=npix,
            npix_y=npix,
            epsilon=1e-5,
            do_wgridding=True,
        )
        image = jnp.asarray(rng.normal(size=(npix, npix)))
        uvw, freq = jnp.asarray(uvw), jnp.asarray(freq)
        if kind == "wgridder":
            return jax.jit(lambda u, f, im: op(u, f, im)[0]), (uvw, freq, image)
        vis = jnp.asarray(rng.normal(size=(nrows, 1)) + 1j * rng.normal(size=(nrows, 1)))

        def adjoint(u, f, v):
            return jax.linear_transpose(lambda im: op(u, f, im)[0], image)(v)[0]

        return jax.jit(adjoint), (uvw, freq, vis)
    raise KeyError(kind)


class _NoDucc:
    """DUCC's functions that the ops call, replaced by ones that do no work: what is left of
    a call is the rest (XLA, the trampoline, the Python around DUCC), the same code under
    both jaxbinds but for jaxbind's own part. Both look the functions up at each call."""

    NAMES = (
        ("fft", "c2c"),
        ("fft", "genuine_fht"),
        ("sht", "synthesis"),
        ("sht", "adjoint_synthesis"),
        ("wgridder.experimental", "dirty2vis"),
        ("wgridder.experimental", "vis2dirty"),
    )

    def __enter__(self):
        import ducc0
        import numpy as np

        def nalm(lmax, mmax):
            return ((mmax + 1) * (mmax + 2)) // 2 + (mmax + 1) * (lmax - mmax)

        stubs = {
            "c2c": lambda a, out=None, **kw: out,
            "genuine_fht": lambda a, out=None, **kw: out,
            "synthesis": lambda map=None, **kw: map,
            "adjoint_synthesis": lambda map=None, lmax=0, mmax=0, **kw: np.zeros(
                (map.shape[0], nalm(lmax, mmax)), np.complex128
            ),
            "dirty2vis": lambda vis=None, **kw: vis,
            "vis2dirty": lambda dirty=None, **kw: dirty,
        }
        self.saved = []
        for module, name in self.NAMES:
            owner = ducc0
            for part in module.split("."):
                owner = getattr(owner, part)
            self.saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, stubs[name])
        return self

    def __exit__(self, *exc):
        for owner, name, fn in self.saved:
            setattr(owner, name, fn)


def serve():
    import contextlib

    import jax
    from _harness import time_it  # this directory is sys.path[0], in either Python

    jax.config.update("jax_enable_x64", True)
    built = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            name = req["case"]
            if name not in built:
                fn, args = build(*CASES[name])
                jax.block_until_ready(fn(*args))  # compile, warm up
                built[name] = fn, args
            fn, args = built[name]
            with _NoDucc() if req.get("no_ducc") else contextlib.nullcontext():
                # one untimed call settles caches after another case
                t = time_it(lambda: fn(*args), warmup=1, rounds=req["reps"])
            reply = {"t": t.median, "cpu": t.cpu_median, "min": t.min}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        print(json.dumps(reply), flush=True)


def versions() -> dict:
    import importlib.metadata as md

    return {d: md.version(d) for d in ("jax", "jaxlib", "ducc0", "numpy", "jaxbind")}


# --- the runner -------------------------------------------------------------------------


class Worker:
    def __init__(self, python: str):
        env = dict(os.environ, JAXBIND_SILENCE_JAX_VERSION_WARNING="1", JAX_PLATFORMS="cpu")
        env.pop("PYTHONPATH", None)
        cmd = [python, str(HERE / "drop_in.py")]
        self.versions = json.loads(
            subprocess.run(
                [*cmd, "--versions"], capture_output=True, text=True, check=True, env=env, cwd="/"
            ).stdout
        )
        self.proc = subprocess.Popen(
            [*cmd, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",  # not the checkout: 1.3.1's worker must not import the checkout's jaxbind
        )

    def ask(self, **req) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _reps(seconds_per_call: float, budget: float) -> int:
    return max(3, min(200, int(budget / max(seconds_per_call, 1e-6))))


def measure(pythons: dict, names: list, rounds: int, budget: float) -> tuple[list, dict]:
    """One run: fresh workers, every case; per case and side the block medians of each
    round, and the paired per-round ratios."""
    from _harness import alternation

    workers = {side: Worker(py) for side, py in pythons.items()}
    rows = []
    try:
        for name in names:
            first = {side: w.ask(case=name, reps=3) for side, w in workers.items()}
            errors = {side: r["error"] for side, r in first.items() if "error" in r}
            if errors:
                rows.append(dict(case=name, errors=errors))
                continue
            reps = _reps(max(r["t"] for r in first.values()), budget)
            samples: dict = {side: [] for side in workers}
            cpu: dict = {side: [] for side in workers}
            for side in alternation(workers, rounds):
                reply = workers[side].ask(case=name, reps=reps)
                samples[side].append(reply["t"])
                cpu[side].append(reply["cpu"])
            # The rest without DUCC: the fastest of many calls (robust to other processes)
            rest = {
                side: min(w.ask(case=name, reps=200, no_ducc=True)["min"] for _ in range(3))
                for side, w in workers.items()
            }
            row = dict(case=name, reps=reps, samples=samples, cpu_samples=cpu)
            row.update({f"{side}_rest_s": t for side, t in rest.items()})
            row.update({f"{side}_s": statistics.median(ts) for side, ts in samples.items()})
            row.update({f"{side}_cpu_s": statistics.median(ts) for side, ts in cpu.items()})
            if "jaxbind13" in samples:
                for key, data in (("ratio", samples), ("cpu_ratio", cpu)):
                    ratios = [a / b for a, b in zip(data["jaxbind"], data["jaxbind13"])]
                    row.update(
                        {
                            key: statistics.median(ratios),
                            f"{key}_min": min(ratios),
                            f"{key}_max": max(ratios),
                            f"{key}s": ratios,
                        }
                    )
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)
        versions = {side: w.versions for side, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    return rows, versions


def _line(row: dict) -> str:
    if "errors" in row:
        return f"{row['case']:<32} errors: {row['errors']}"
    text = f"{row['case']:<32} jaxbind {row['jaxbind_s'] * 1e3:8.3f} ms"
    text += f"  (without DUCC {row['jaxbind_rest_s'] * 1e6:.1f} us"
    if "ratio" in row:
        text += f" / {row['jaxbind13_rest_s'] * 1e6:.1f} us)"
        text += (
            f"  1.3.1 {row['jaxbind13_s'] * 1e3:8.3f} ms  ratio {row['ratio']:.3f} "
            f"[{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]  cpu ratio "
            f"{row['cpu_ratio']:.3f} [{row['cpu_ratio_min']:.3f}, {row['cpu_ratio_max']:.3f}]"
        )
    return text


def main():
    from _harness import arguments, flag

    args = arguments(  # --quick: four cases, 1 run, 3 rounds; --rounds: per case and run
        __doc__,
        flag("--runs", type=int, default=3, help="runs, each with fresh workers"),
        flag("--budget", type=float, default=0.1, help="seconds per timed block"),
        flag("--cases", default="", help="comma-separated names (default: all)"),
        flag("--no-jaxbind13", action="store_true"),
        flag(
            "--aa",
            action="store_true",
            help="JAXbind 1.3.1 on both sides (an A/A run: the spread between two processes "
            "running the same code), written as results/drop_in_aa.*",
        ),
        flag("--report", default="", help="only print the tables of a saved .json"),
        rounds=9,
    )
    if args.report:
        saved = json.loads(pathlib.Path(args.report).read_text())
        names = [r["case"] for r in saved["runs"][0]]
        print(_table(saved["meta"], names, saved["runs"]), end="")
        return
    names = [n for n in args.cases.split(",") if n] or (QUICK if args.quick else list(CASES))
    runs, rounds = (1, 3) if args.quick else (args.runs, args.rounds)

    pythons = {"jaxbind": sys.executable}
    if not args.no_jaxbind13:
        pythons["jaxbind13"] = subprocess.run(
            ["bash", str(HERE / "compare_jaxbind13.sh"), sys.executable],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    if args.aa:
        pythons["jaxbind"] = pythons["jaxbind13"]
    all_runs = []
    for run in range(runs):
        print(f"run {run + 1}/{runs}", file=sys.stderr, flush=True)
        rows, versions = measure(pythons, names, rounds, args.budget)
        all_runs.append(rows)

    from _harness import run_meta, save

    meta = run_meta(
        aa=args.aa,
        versions=versions,
        runs=runs,
        rounds=rounds,
        budget_s=args.budget,
        settings="jit, x64, 1 DUCC thread; wgridder 128x128, 1 channel, epsilon 1e-5, "
        "w-gridding, |u|, |v| <= 500 m, |w| <= 50 m at 1 GHz; sht mmax = lmax",
    )
    text = _table(meta, names, all_runs)
    print(text)
    if not args.quick:
        save(args.out, "drop_in_aa" if args.aa else "drop_in", dict(meta=meta, runs=all_runs), text)


def _table(meta, names, all_runs) -> str:
    from _harness import run_line, table

    ours = meta["versions"]["jaxbind"]
    against = (
        "itself (an A/A run: both columns are JAXbind 1.3.1)" if meta["aa"] else "JAXbind 1.3.1"
    )
    runs = [f"run {i + 1}" for i in range(len(all_runs))]
    rows, rests = [], []
    for name in names:
        found = [next(r for r in rows_ if r["case"] == name) for rows_ in all_runs]
        pooled = [x for row in found for x in row.get("ratios", ())]
        overall = f"**{statistics.median(pooled):.3f}**" if pooled else "-"
        rows.append((name, overall, *map(_with_ducc, found)))
        rests.append((name, *map(_without_ducc, found)))
    lines = table(
        f"{run_line(meta)}; ducc0 {ours['ducc0']}, jaxbind {ours['jaxbind']} against "
        f"{against}. {meta['settings']}. Per run: fresh worker processes, {meta['rounds']} "
        "alternating rounds per case; the ratio is jaxbind / 1.3.1 of each round's block "
        "medians (below 1: jaxbind faster): median [min, max] over the rounds; wall time "
        "per call (jaxbind / 1.3.1 ms), then the same for the CPU time the process spent "
        "per call (all its threads: less sensitive to other processes on a shared machine); "
        "'all runs': the median ratio of all rounds of all runs. "
        "On a shared machine a single run of the large FFTs can be off by tens of per cent "
        "either way, in an A/A run too (drop_in_aa.md): the placement of their 8-16 MB "
        "buffers differs from process to process; read the runs together, and the table "
        "without DUCC below for what jaxbind itself adds.",
        ("case", "all runs", *runs),
        rows,
    )
    lines += [""] + table(
        "Without DUCC (its functions replaced by ones that do nothing): the fastest of 600 "
        "calls, jaxbind / 1.3.1 µs, and jaxbind's extra time as a share of 1.3.1's median "
        "call with DUCC. This is all that differs between the two (DUCC is the same), and "
        "is robust to other processes.",
        ("case", *runs),
        rests,
    )
    return "\n".join(lines) + "\n"


def _with_ducc(row) -> str:
    """One run's cell of a case: times and ratios with DUCC."""
    if "errors" in row:
        return f"error: {row['errors']}"
    if "ratio" not in row:
        return f"{row['jaxbind_s'] * 1e3:.3f} ms"
    return (
        f"{row['jaxbind_s'] * 1e3:.3f} / {row['jaxbind13_s'] * 1e3:.3f} ms: "
        f"**{row['ratio']:.3f}** [{row['ratio_min']:.2f}, {row['ratio_max']:.2f}]; "
        f"CPU **{row['cpu_ratio']:.3f}** [{row['cpu_ratio_min']:.2f}, "
        f"{row['cpu_ratio_max']:.2f}]"
    )


def _without_ducc(row) -> str:
    """One run's cell of a case without DUCC: the fastest call, jaxbind's extra share."""
    if "errors" in row:
        return "error"
    if "jaxbind13_rest_s" not in row:
        return f"{row['jaxbind_rest_s'] * 1e6:.1f}"
    extra = (row["jaxbind_rest_s"] - row["jaxbind13_rest_s"]) / row["jaxbind13_s"]
    return (
        f"{row['jaxbind_rest_s'] * 1e6:.1f} / {row['jaxbind13_rest_s'] * 1e6:.1f}: "
        f"{extra * 100:+.2f}%"
    )


if __name__ == "__main__":
    if "--serve" in sys.argv:
        serve()
    elif "--versions" in sys.argv:
        print(json.dumps(versions()))
    else:
        main()
