"""GPU benchmark: jaxbind on CUDA against pure_callback and buffer_callback, one process.

    python benchmarks/gpu.py [--rounds 7] [--out benchmarks/results]

Cases, each timed per jitted call (medians over rounds, implementations interleaved):
- overhead: a trivial CuPy callable (`y = x`, 1 float32) on the GPU;
- throughput: `y = 2*x` on 16M float32 elements, in CuPy on the device buffers;
- host: the same 16M case with platform_mode="host" (NumPy on host copies);
against `jnp`, `jax.pure_callback` (host copies by design) and
`jax.experimental.buffer_callback` (where the installed JAX has it).
Writes gpu.json and gpu.md with the machine and versions. Needs JAX with CUDA and CuPy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import random
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = pathlib.Path(__file__).parent


def _ops():
    import cupy as cp

    import jaxbind

    def copy(out, args, kwargs_dump):
        cp.copyto(cp.asarray(out[0]), cp.asarray(args[0]))

    def double(out, args, kwargs_dump):
        cp.multiply(cp.asarray(args[0]), 2, out=cp.asarray(out[0]))

    def double_host(out, args, kwargs_dump):
        np.multiply(args[0], 2, out=out[0])

    same = lambda x: ((x.shape, x.dtype),)  # noqa: E731
    return dict(
        copy=jaxbind.get_nonlinear_call(copy, (None, None), same, None, name="bench.gpu_copy"),
        double=jaxbind.get_nonlinear_call(double, (None, None), same, None,
                                          name="bench.gpu_double"),
        host=jaxbind.get_nonlinear_call(double_host, (None, None), same, None,
                                        platform_mode="host", name="bench.gpu_host"))


def _buffer_callback(kind):
    try:
        from jax.experimental.buffer_callback import buffer_callback
    except ImportError:
        return None
    import cupy as cp

    def cb(ctx, out, x):
        with cp.cuda.ExternalStream(ctx.stream):
            y, xx = cp.from_dlpack(out), cp.from_dlpack(x)
            if kind == "copy":
                cp.copyto(y, xx)
            else:
                cp.multiply(xx, 2, out=y)
    return lambda x: buffer_callback(cb, jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def build(impl, case):
    n = 1 if case == "overhead" else 16_000_000
    x = jax.device_put(jnp.ones(n, jnp.float32), jax.devices("cuda")[0])
    kind = "copy" if case == "overhead" else "double"
    if impl == "jnp":
        f = (lambda x: x + 0) if kind == "copy" else (lambda x: 2 * x)
    elif impl == "jaxbind":
        op = _ops()["host" if case == "host" else kind]
        f = lambda x: op(x)[0]  # noqa: E731
    elif impl == "pure_callback":
        fn = (lambda a: np.array(a)) if kind == "copy" else (lambda a: 2 * a)
        f = lambda x: jax.pure_callback(fn, jax.ShapeDtypeStruct(x.shape, x.dtype), x)  # noqa
    elif impl == "buffer_callback":
        f = _buffer_callback(kind)
        if f is None:
            return None
    return jax.jit(f), x


def time_it(fn, x, reps):
    jax.block_until_ready(fn(x))
    start = time.perf_counter()
    for _ in range(reps):
        y = fn(x)
    jax.block_until_ready(y)
    return (time.perf_counter() - start) / reps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    plan = [(c, i) for c in ("overhead", "throughput", "host")
            for i in ("jnp", "jaxbind", "pure_callback", "buffer_callback")]
    built = {k: build(k[1], k[0]) for k in plan}
    built = {k: v for k, v in built.items() if v is not None}
    samples = {k: [] for k in built}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(built)
        rng.shuffle(order)
        for key in order:
            reps = 2000 if key[0] == "overhead" else 50
            samples[key].append(time_it(*built[key], reps))
    med = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
    import cupy
    dev = jax.devices("cuda")[0]
    meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"),
                machine=f"{platform.node()} {dev.device_kind}", jax=jax.__version__,
                cupy=cupy.__version__, rounds=args.rounds)
    rows = ["| case | jnp | jaxbind | pure_callback | buffer_callback |", "|---|---|---|---|---|"]
    for case in ("overhead", "throughput", "host"):
        cells = [med.get((case, i)) for i in ("jnp", "jaxbind", "pure_callback",
                                              "buffer_callback")]
        rows.append(f"| {case} | " + " | ".join(
            "-" if c is None else f"{c * 1e6:.1f} µs" for c in cells) + " |")
    table = "\n".join(rows)
    print(table)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(dict(meta=meta, median_s={
        "/".join(k): v for k, v in med.items()}), indent=1))
    (out / "gpu.md").write_text(f"Run {meta['date']} on {meta['machine']}, jax {meta['jax']}, "
                                f"cupy {meta['cupy']}, {args.rounds} rounds, medians.\n\n"
                                + table + "\n")


if __name__ == "__main__":
    main()
