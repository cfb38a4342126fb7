"""State (``state=``): what is set up, when, how often, and what it costs per call.

    python benchmarks/state.py          # writes benchmarks/results/state.{json,md}
    python benchmarks/state.py --quick  # fewer cycles and calls (CI smoke test)

Counts, each in a process of its own:

- **jit**: setups of a program with two call sites of one op and its gradient (three
  roles), run three times; teardowns after ``jax.clear_caches()``.
- **export**: the program exported, then loaded and run in a fresh process: setups there.
- **persistent cache**: the program compiled with JAX's persistent compilation cache
  in one process, then again in a fresh one (a cache hit): setups in each.
- **cycles**: 1000 compile/free cycles (a new jitted function each, three setup
  arguments in turn, JAX's caches cleared every 50): setups, teardowns, states and
  sites alive, and the resident memory before and after.
- **shard_map**: the op on 4 CPU devices (one call site per device thread, one state)
  under each concurrency policy: results against one device, and the most calls that
  used one object at once.

Per-call cost of a Python body with a state against the same body without, in a
``fori_loop`` (compiled kernels: benchmarks/state_kernels.py). The NUFFT and FINUFFT
targets of docs/state.md are measured by benchmarks/state_nufft.py and
benchmarks/finufft_ctypes.py; this report quotes their recorded results.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

HERE = pathlib.Path(__file__).parent

# An op with a state that counts its setups and teardowns in a file, as each process
# of this benchmark defines it (timing with the harness, from this directory).
OP = (
    f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
    + """
import os
from _harness import alternating, time_it
import jax, jax.numpy as jnp, numpy as np, jaxbind

LOG = os.environ.get("STATE_LOG")

def note(what):
    if LOG:
        with open(LOG, "a") as f:
            f.write(what + "\\n")

POLICY = os.environ.get("STATE_POLICY", "lock")

@jaxbind.state(concurrency=POLICY, teardown=lambda s: note("teardown"))
def plan(*, scale):
    note("setup")
    return {"scale": float(scale)}

@jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name="bench_state.scaled")
def scaled(x, *, state, scale):
    return x * state["scale"]

@scaled.def_transpose
def _(ct, *, state, scale):
    return ct * state["scale"]

@jaxbind.linear_op(shape=lambda x, **kw: x, name="bench_state.plain")
def plain(x, *, scale):
    return x * scale

@plain.def_transpose
def _(ct, *, scale):
    return ct * scale

def program(x):
    y = scaled(x, scale=2.0) + scaled(3 * x, scale=2.0)
    return y, jax.grad(lambda x: scaled(x, scale=2.0).sum())(x)
"""
)


def _run(code: str, env: dict | None = None, timeout: int = 900) -> str:
    """`code` after OP in a fresh Python process; its standard output."""
    full = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-c", OP + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"a benchmark process failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _log_counts(path: pathlib.Path) -> dict:
    text = path.read_text() if path.exists() else ""
    return {"setups": text.count("setup"), "teardowns": text.count("teardown")}


def counts_jit(tmp: pathlib.Path) -> dict:
    log = tmp / "jit.log"
    _run(
        """
        import gc
        f = jax.jit(program)
        for _ in range(3):
            jax.block_until_ready(f(jnp.arange(4.0)))
        print(open(LOG).read().count("setup"), flush=True)
        del f
        jax.clear_caches(); gc.collect()
        """,
        {"STATE_LOG": str(log)},
    )
    return dict(_log_counts(log), runs=3)


def counts_export(tmp: pathlib.Path) -> dict:
    blob = tmp / "program.bin"
    _run(
        f"""
        exp = jaxbind.export(jax.jit(program))(jax.ShapeDtypeStruct((4,), jnp.float32))
        open({str(blob)!r}, "wb").write(exp.serialize())
        """
    )
    log = tmp / "export.log"
    _run(
        f"""
        from jax import export
        exp = export.deserialize(bytearray(open({str(blob)!r}, "rb").read()))
        for _ in range(3):
            jax.block_until_ready(exp.call(jnp.arange(4.0, dtype=jnp.float32)))
        """,
        {"STATE_LOG": str(log)},
    )
    return _log_counts(log)


def counts_persistent_cache(tmp: pathlib.Path) -> dict:
    cache = tmp / "cache"
    code = f"""
        jax.config.update("jax_compilation_cache_dir", {str(cache)!r})
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        print(time_it(lambda: jax.jit(program)(jnp.arange(4.0)), warmup=0).median)
        """
    result = {}
    for run in ("first", "hit"):
        log = tmp / f"cache-{run}.log"
        seconds = float(_run(code, {"STATE_LOG": str(log)}).split()[-1])
        result[run] = dict(_log_counts(log), seconds=round(seconds, 4))
    result["entries"] = len(list(cache.iterdir())) if cache.exists() else 0
    return result


def counts_cycles(tmp: pathlib.Path, n: int) -> dict:
    log = tmp / "cycles.log"
    out = _run(
        f"""
        import gc, json
        from jaxbind import _ext
        from jaxbind._runtime.state import live_states

        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

        x = jnp.arange(4.0)
        def cycle(i):
            jax.jit(lambda x: scaled(x, scale=1.0 + i % 3))(x).block_until_ready()
        for i in range(50):  # warm: JAX's own caches and allocations settle
            cycle(i)
        jax.clear_caches(); gc.collect()
        before = dict(rss=rss(), states=live_states(), sites=_ext.site_count(),
                      objects=len(gc.get_objects()))
        for i in range({n}):
            cycle(i)
            if i % 50 == 49:
                jax.clear_caches(); gc.collect()
        jax.clear_caches(); gc.collect()
        after = dict(rss=rss(), states=live_states(), sites=_ext.site_count(),
                     objects=len(gc.get_objects()))
        print(json.dumps(dict(before=before, after=after)))
        """,
        {"STATE_LOG": str(log)},
    )
    result = json.loads(out.strip().splitlines()[-1])
    return dict(result, cycles=n, **_log_counts(log))


def counts_shard_map() -> dict:
    result = {}
    for policy in ("lock", "pool", "shared"):
        out = _run(
            """
            import json, time
            import numpy as np
            from jax.sharding import Mesh, PartitionSpec as P
            from jaxbind.testing.watch import watching
            shard_map = getattr(jax, "shard_map", None)
            if shard_map is None:  # jax < 0.6
                from jax.experimental.shard_map import shard_map

            mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
            x = jnp.arange(4 * 256.0)

            @jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name="bench_state.slow")
            def slow_op(x, *, state, scale):
                time.sleep(0.002)  # the GIL is free: calls overlap if the policy lets them
                return x * state["scale"]

            f = jax.jit(shard_map(lambda x: slow_op(x, scale=2.0), mesh=mesh,
                                  in_specs=P("d"), out_specs=P("d")))
            one = jax.jit(lambda x: slow_op(x, scale=2.0))(x)
            with watching(plan) as w:
                got = [f(x) for _ in range(10)]
                jax.block_until_ready(got)
            same = all(bool(jnp.array_equal(g, one)) for g in got)
            print(json.dumps(dict(devices=len(jax.devices()), equal=same,
                                  objects=len({o for o, *_ in w.uses}),
                                  most_at_once=w.most_at_once(), calls=len(w.uses))))
            """,
            {
                "STATE_POLICY": policy,
                "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
            },
        )
        result[policy] = json.loads(out.strip().splitlines()[-1])
    return result


def per_call(iterations: int, rounds: int) -> dict:
    out = _run(
        f"""
        import json
        from jax import lax
        loops = {{
            name: jax.jit(lambda x, op=op: lax.fori_loop(0, {iterations},
                          lambda i, y: op(y, scale=1.0), x))
            for name, op in (("state", scaled), ("plain", plain))
        }}
        x = jnp.arange(8.0)
        for f in loops.values():
            f(x).block_until_ready()
        calls = {{name: (lambda f=f: f(x)) for name, f in loops.items()}}
        times = alternating(calls, rounds={rounds})
        print(json.dumps({{name: t.median / {iterations} * 1e6 for name, t in times.items()}}))
        """
    )
    us = json.loads(out.strip().splitlines()[-1])
    return dict(us, iterations=iterations, rounds=rounds, extra=us["state"] - us["plain"])


def _quoted(stem: str) -> dict | None:
    path = HERE / "results" / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _markdown(meta, r) -> str:
    from _harness import run_line

    j, e, c, cy = r["jit"], r["export"], r["cache"], r["cycles"]
    lines = [
        "# State: setups, lifetimes and the per-call cost",
        "",
        f"{run_line(meta)}. Each count in a process of its own (`benchmarks/state.py`).",
        "",
        "| count | result |",
        "|---|---|",
        f"| jit: 2 sites of f and its gradient, 3 runs | {j['setups']} setup, "
        f"{j['teardowns']} teardown after `jax.clear_caches()` |",
        f"| `jax.export`, loaded in a fresh process, 3 runs | {e['setups']} setup |",
        f"| persistent cache: first process / fresh process (hit) | {c['first']['setups']} / "
        f"{c['hit']['setups']} setup ({c['first']['seconds']} s / {c['hit']['seconds']} s "
        "to the first result) |",
        f"| {cy['cycles']} compile/free cycles (after 50 to warm up) | {cy['setups']} setups, "
        f"{cy['teardowns']} teardowns in all; "
        f"states alive {cy['before']['states']} → {cy['after']['states']}, "
        f"sites {cy['before']['sites']} → {cy['after']['sites']}, Python objects "
        f"{cy['before']['objects']} → {cy['after']['objects']}, resident memory "
        f"{cy['before']['rss'] / 2**20:.1f} → {cy['after']['rss'] / 2**20:.1f} MiB |",
    ]
    for policy, s in r["shard_map"].items():
        lines.append(
            f"| `shard_map` on {s['devices']} CPU devices, {policy!r}, 10 runs | results "
            f"{'equal to' if s['equal'] else 'DIFFERENT from'} one device; {s['objects']} "
            f"object(s), at most {s['most_at_once']} call(s) at once on one |"
        )
    p = r["per_call"]
    lines += [
        "",
        f"Per call of a Python body in a `fori_loop` of {p['iterations']} iterations "
        f"(median of {p['rounds']} rounds): {p['plain']:.2f} µs without a state, "
        f"{p['state']:.2f} µs with one: **+{p['extra']:.2f} µs** (the object taken under "
        "its policy and made current, in Python). Compiled kernels take theirs in C++: "
        "benchmarks/results/state_kernels.md.",
    ]
    for stem, title in (
        ("state_nufft", "NUFFT (benchmarks/state_nufft.py)"),
        ("state_kernels", "Kernels (benchmarks/state_kernels.py)"),
        ("finufft_ctypes", "FINUFFT through ctypes (benchmarks/finufft_ctypes.py)"),
    ):
        md = HERE / "results" / f"{stem}.md"
        if md.exists():
            lines += ["", f"## {title}", "", f"See [{stem}.md]({stem}.md)."]
    return "\n".join(lines) + "\n"


def main():
    from _harness import arguments, run_meta, save, time_it

    args = arguments(__doc__)  # --quick: fewer cycles and calls; --rounds: of per_call
    rounds = args.rounds or (3 if args.quick else 15)

    def measure() -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            return dict(
                jit=counts_jit(pathlib.Path(tmp)),
                export=counts_export(pathlib.Path(tmp)),
                cache=counts_persistent_cache(pathlib.Path(tmp)),
                cycles=counts_cycles(pathlib.Path(tmp), 100 if args.quick else 1000),
                shard_map=counts_shard_map(),
                per_call=per_call(200 if args.quick else 2000, rounds),
            )

    run = time_it(measure, warmup=0)
    results = run.value
    meta = run_meta(seconds=round(run.median, 1))
    text = _markdown(meta, results)
    stem = "state-quick" if args.quick else "state"
    save(args.out, stem, dict(meta=meta, results=results), text)
    print(text)


if __name__ == "__main__":
    main()
