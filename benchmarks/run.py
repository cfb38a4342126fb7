"""Benchmark jaxbind against pure JAX, pure_callback, buffer_callback and JAXbind 1.3.1.

    python benchmarks/run.py            # full run (a few minutes), writes benchmarks/results/
    python benchmarks/run.py --quick    # smallest sizes, few rounds (the CI smoke test)
    python benchmarks/run.py --no-jaxbind13
    python benchmarks/run.py --cases double,vmap   # a subset, written as results/subset.*
    python benchmarks/run.py --baseline /path/to/venv/bin/python   # old build against new

With --baseline, a second worker runs jaxbind from another Python (for example a
virtual environment holding an earlier build of this project), interleaved with
this one, and its column "baseline" sits beside "jaxbind" (results/subset.*).

Every implementation runs in a worker process (benchmarks/_cases.py): this
project's jaxbind, jnp, pure_callback and buffer_callback in this Python, and
JAXbind 1.3.1 in its own virtual environment (made by compare_jaxbind13.sh,
with the same jax), since both are imported as `jaxbind`. The runner drives the
workers round by round, interleaving implementations, and reports medians.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import random
import subprocess
import sys

HERE = pathlib.Path(__file__).parent

from _harness import arguments, flag, save  # noqa: E402  (this directory is sys.path[0])

# (case, sizes, implementations); "jaxbind13" is JAXbind 1.3.1's worker. "floor" is
# a custom call that only takes the GIL and calls the same callable on private
# NumPy arrays (_floor.cc): what any Python-calling custom call costs at least.
FULL = [
    (
        "double",
        [1, 1_000, 1_000_000, 16_000_000],
        ["jnp", "floor", "jaxbind", "jaxbind13", "pure_callback", "buffer_callback"],
    ),
    ("traffic", [1_000_000, 16_000_000], ["jaxbind"]),
    ("empty", [1, 1_000], ["floor", "jaxbind", "jaxbind13"]),
    ("io4", [1_000], ["jnp", "jaxbind", "jaxbind13", "pure_callback", "buffer_callback"]),
    ("grad", [1_000], ["jnp", "floor", "jaxbind", "jaxbind13", "pure_callback"]),
    ("vmap", [1_000], ["jnp", "jaxbind", "jaxbind13", "pure_callback"]),
    ("vmap_native", [1_000], ["jnp", "jaxbind", "jaxbind13", "pure_callback"]),
    ("vmap_kernel", [1_000], ["jnp", "jaxbind"]),  # a numba kernel, jaxbind's C++ loop
    ("eager", [1_000], ["jnp", "jaxbind", "jaxbind13", "pure_callback"]),
    ("first_call", [1_000], ["jnp", "jaxbind", "jaxbind13"]),
    ("import", [0], ["jnp", "jaxbind", "jaxbind13"]),
]


class Worker:
    def __init__(self, python, env=None):
        self.proc = subprocess.Popen(
            [python, str(HERE / "_cases.py"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=HERE,
        )
        self.versions = json.loads(
            subprocess.run(
                [python, str(HERE / "_cases.py"), "--versions"],
                capture_output=True,
                text=True,
                check=True,
                env=env,
                cwd=HERE,
            ).stdout
        )

    def ask(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _reps(case, size, quick):
    if case in ("first_call", "import"):
        return 1
    if quick:
        return 20
    budget = 0.05  # seconds per measurement, roughly
    per_call = {1: 10e-6, 1_000: 12e-6, 1_000_000: 4e-4, 16_000_000: 2e-2}.get(size, 1e-4)
    if case in ("vmap", "vmap_native", "vmap_kernel"):
        per_call *= 64
    if case == "eager":
        per_call = 2e-4
    if case == "traffic":
        per_call = {1_000_000: 4e-4, 16_000_000: 2e-2}.get(size, 1e-4)
    return max(10, int(budget / per_call))


def main():
    args = arguments(  # --quick: the smallest sizes, 3 rounds
        __doc__,
        flag("--no-jaxbind13", action="store_true"),
        flag("--cases", default="", help="comma-separated subset of the cases"),
        flag(
            "--baseline",
            default="",
            help="a Python whose jaxbind (an earlier build) runs beside this one",
        ),
        rounds=7,
    )
    rounds = 3 if args.quick else args.rounds

    env = dict(os.environ, JAXBIND_SILENCE_JAX_VERSION_WARNING="1", PYTHONPATH="")
    workers = {"ours": Worker(sys.executable, env)}
    if not args.no_jaxbind13:
        py13 = subprocess.run(
            ["bash", str(HERE / "compare_jaxbind13.sh"), sys.executable],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        workers["jaxbind13"] = Worker(py13, env)
    if args.baseline:
        workers["baseline"] = Worker(args.baseline, env)

    plan = []
    wanted = set(filter(None, args.cases.split(",")))
    for case, sizes, impls in FULL:
        if wanted and case not in wanted:
            continue
        if args.quick:
            sizes = sizes[:1]
        for size in sizes:
            for impl in impls:
                if impl == "jaxbind13" and "jaxbind13" not in workers:
                    continue
                plan.append((case, size, impl))
                if impl == "jaxbind" and "baseline" in workers:
                    plan.append((case, size, "baseline"))

    samples = {key: [] for key in plan}
    inside = {key: [] for key in plan}
    errors = {}
    rng = random.Random(0)
    for r in range(rounds):
        # Within each case and size, a new order every round: what ran just before
        # (e.g. the allocator state a large case leaves) must not favour anyone.
        order = []
        for key in dict.fromkeys((c, s) for c, s, _ in plan):
            group = [p for p in plan if p[:2] == key]
            rng.shuffle(group)
            order += group
        for case, size, impl in order:
            worker = workers[impl if impl in ("jaxbind13", "baseline") else "ours"]
            reply = worker.ask(
                impl="jaxbind" if impl in ("jaxbind13", "baseline") else impl,
                case=case,
                size=size,
                reps=_reps(case, size, args.quick),
            )
            if "error" in reply:
                errors[(case, size, impl)] = reply["error"]
                continue
            samples[(case, size, impl)].append(reply["t"])
            if reply["inside"] is not None:
                inside[(case, size, impl)].append(reply["inside"])
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    for w in workers.values():
        w.close()

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else None

    results = []
    for (case, size, impl), ts in samples.items():
        if not ts:
            continue
        results.append(
            dict(
                case=case,
                size=size,
                impl=impl,
                median_s=med(ts),
                inside_s=med(inside[(case, size, impl)]),
                samples=ts,
            )
        )
    meta = dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=f"{platform.node()} {platform.machine()} {os.cpu_count()} cores "
        f"{platform.processor() or ''}".strip(),
        versions={k: w.versions for k, w in workers.items()},
        rounds=rounds,
        malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        quick=args.quick,
        errors={"/".join(map(str, k)): v for k, v in errors.items()},
    )
    table = _table(results)
    print(table)
    out = pathlib.Path(args.out)
    stem = "quick" if args.quick else "latest" if not (wanted or args.baseline) else "subset"
    save(out, stem, dict(meta=meta, results=results), _header(meta) + "\n" + table + "\n")
    _plot(results, out / f"{stem}.png", meta)
    print(f"wrote {out / stem}.{{json,md,png}}", file=sys.stderr)


def _fmt(t):
    if t is None:
        return "-"
    return f"{t * 1e6:.1f} µs" if t < 1e-3 else f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.2f} s"


def _table(results):
    by = {(r["case"], r["size"], r["impl"]): r for r in results}
    impls = ["jnp", "floor", "jaxbind", "baseline", "jaxbind13", "buffer_callback", "pure_callback"]
    rows = [
        "| case | size | " + " | ".join(impls) + " | jaxbind/jaxbind13 | floor/jaxbind13 "
        "| jaxbind inside callable | jaxbind outside callable | floor outside callable |",
        "|---|---|" + "---|" * (len(impls) + 5),
    ]
    for case, sizes, _ in FULL:
        for size in sizes:
            cells = [by.get((case, size, i)) for i in impls]
            if not any(cells):
                continue
            ours, old = by.get((case, size, "jaxbind")), by.get((case, size, "jaxbind13"))
            ratio = f"{ours['median_s'] / old['median_s']:.2f}" if ours and old else "-"
            floor = by.get((case, size, "floor"))
            floor_ratio = f"{floor['median_s'] / old['median_s']:.2f}" if floor and old else "-"
            share = outside = "-"
            if ours and ours["inside_s"]:
                share = f"{100 * ours['inside_s'] / ours['median_s']:.0f}%"
                outside = _fmt(ours["median_s"] - ours["inside_s"])
            floor_outside = "-"
            if floor and floor["inside_s"]:
                floor_outside = _fmt(floor["median_s"] - floor["inside_s"])
            rows.append(
                f"| {case} | {size} | "
                + " | ".join(_fmt(c["median_s"]) if c else "-" for c in cells)
                + f" | {ratio} | {floor_ratio} | {share} | {outside} | {floor_outside} |"
            )
    rows += [
        "",
        "Ratios to pure JAX (jnp), per implementation:",
        "",
        "| case | size | " + " | ".join(impls[1:]) + " |",
        "|---|---|" + "---|" * (len(impls) - 1),
    ]
    for case, sizes, _ in FULL:
        for size in sizes:
            base = by.get((case, size, "jnp"))
            if not base:
                continue
            cells = [by.get((case, size, i)) for i in impls[1:]]
            rows.append(
                f"| {case} | {size} | "
                + " | ".join(f"{c['median_s'] / base['median_s']:.2f}" if c else "-" for c in cells)
                + " |"
            )
    return "\n".join(rows)


def _header(meta):
    v = meta["versions"]
    lines = [
        f"Run {meta['date']} on {meta['machine']}, {meta['rounds']} rounds, medians."
        + (f" Environment: {meta['malloc_env']}." if meta.get("malloc_env") else ""),
        "Versions: "
        + "; ".join(f"{k}: " + ", ".join(f"{a} {b}" for a, b in d.items()) for k, d in v.items()),
    ]
    return "\n\n".join(lines) + "\n"


def _plot(results, path, meta):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    if not any(r["case"] == "double" for r in results):
        return  # the plot shows `double` only
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for impl in ["jnp", "floor", "jaxbind", "jaxbind13", "buffer_callback", "pure_callback"]:
        pts = sorted(
            (r["size"], r["median_s"])
            for r in results
            if r["case"] == "double" and r["impl"] == impl
        )
        if pts:
            ax.loglog(*zip(*pts), marker="o", label=impl)
    ax.set_xlabel("float32 elements")
    ax.set_ylabel("time per jitted call of 2*x [s]")
    ax.set_title(f"jitted 2*x, {meta['machine'].split()[0]}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=90, bbox_inches="tight")


if __name__ == "__main__":
    main()
