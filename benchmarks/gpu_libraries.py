"""GPU: CUDA libraries through kernels for CUDA (jaxbind.contrib.cuda) against their own
loops, one process, side by side.

    python benchmarks/gpu_libraries.py [--rounds 5] [--out benchmarks/results]
    python benchmarks/gpu_libraries.py --quick   # small sizes, 2 rounds, nothing written

Rows (each a jitted function timed per call, implementations alternating by round):

- cufinufft, type 1, 2-D: a grid of 256², 10⁶ points, eps 1e-6, complex64, 100 transforms
  in a ``fori_loop`` (jaxbind: the plan made once per call site and device, the points set
  at each transform); cufinufft's own Python loop with a reused plan (plan and points set
  once, 100 executes); the same loop planning per transform (plan, points, execute,
  destroy: what jax-finufft does); the DUCC NUFFT's JAX reference on the GPU
  (jaxducc0.nufft1 under ``use_reference``);
- cufinufft, tiny: 32², 10³ points, per transform against cufinufft's bare execute, with
  the handlers' calls with Python per transform (``_ext.python_entries``);
- cuFFT (the same targets where cufinufft cannot run): 256² and 32² complex64, 100 FFTs
  in a ``fori_loop``, against ``jnp.fft.fftn`` and CuPy's cuFFT with a reused plan and
  with a plan per call, with the handlers' calls with Python while timed;
- plans: the states set up after the first call and left after ``jax.clear_caches()``;
- gradients with respect to the values and the points against jaxbind's CPU DUCC NUFFT.

Where cufinufft's library cannot load (its wheel links CUDA 12's libcudart.so.12 and
libcufft.so.11), its rows say why and the cuFFT rows are measured. Needs JAX with CUDA;
cufinufft's Python loops need CuPy. Writes gpu_libraries.json and .md.
"""

from __future__ import annotations

import ctypes
import gc

import jax
import jax.numpy as jnp
import numpy as np
from _harness import arguments, ms, publish, relative_difference, run_line, run_meta, side_by_side
from _harness import table as md_table

from jaxbind import _ext
from jaxbind._runtime import state as _state
from jaxbind.contrib import cuda


def _gpu(x):
    return jax.device_put(x, jax.devices("cuda")[0])


def _cufinufft_why_not() -> str | None:
    try:
        ctypes.CDLL(cuda.library_path("cufinufft"))
        import cufinufft  # noqa: F401
    except (LookupError, OSError, ImportError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _nufft_rows(n, m, transforms, rounds, rows, payload):
    import cufinufft
    import cupy as cp

    rng = np.random.default_rng(0)
    x, y = (rng.uniform(-np.pi, np.pi, m).astype(np.float32) for _ in range(2))
    c = (rng.normal(size=m) + 1j * rng.normal(size=m)).astype(np.complex64)
    modes = (n, n)
    gx, gy, gc_ = _gpu(x), _gpu(y), _gpu(c)

    def loop(c, x, y):
        def body(i, acc):  # (the values depend on i: XLA cannot hoist the transform)
            return acc + cuda.nufft1(modes, c * (1.0 + 0.0 * i), x, y, eps=1e-6)

        return jax.lax.fori_loop(0, transforms, body, jnp.zeros(modes, jnp.complex64))

    compiled = jax.jit(loop)

    def ours():
        return compiled(gc_, gx, gy)

    cx, cy, cc = cp.asarray(x), cp.asarray(y), cp.asarray(c)
    plan = cufinufft.Plan(1, modes, eps=1e-6, dtype="complex64")
    plan.setpts(cx, cy)
    out = cp.zeros(modes, cp.complex64)

    def reused():
        for _ in range(transforms):
            plan.execute(cc, out=out)
        return out

    def per_call():
        for _ in range(transforms):
            p = cufinufft.Plan(1, modes, eps=1e-6, dtype="complex64")
            p.setpts(cx, cy)
            p.execute(cc, out=out)
            del p
        return out

    def sync(fn):
        return lambda: (fn(), cp.cuda.runtime.deviceSynchronize())[0]

    variants = {"jaxbind": ours, "cufinufft reused plan": sync(reused)}
    variants["cufinufft plan per call"] = sync(per_call)
    entries = _ext.python_entries()
    times, diffs = side_by_side(variants, rounds=rounds, against="cufinufft reused plan")
    per_transform = {k: t / transforms for k, t in times.items()}
    calls_in = _ext.python_entries() - entries
    base = per_transform["cufinufft reused plan"]
    for name, t in per_transform.items():
        rows.append((f"type 1, {n}², {m} points", name, ms(t, 4), f"{t / base:.2f}", "-"))
    payload[f"nufft_{n}_{m}"] = {"seconds_per_transform": per_transform, "differences": diffs}
    payload[f"nufft_{n}_{m}"]["python_entries_during_timing"] = calls_in
    return per_transform


def _fft_rows(n, x, rounds, rows, payload, transforms=100):
    """100 FFTs of n² complex64 in a loop: jaxbind (a cuFFT plan per site and device),
    jnp.fft (cuFFT through XLA), CuPy with a reused plan, CuPy planning per call."""
    import cupy as cp
    import cupyx.scipy.fftpack as fftpack

    def loop(f):
        compiled = jax.jit(lambda v: jax.lax.fori_loop(0, transforms, lambda i, v: f(v) / n, v))
        return lambda: compiled(x)

    a = cp.asarray(np.asarray(x))
    plan = fftpack.get_fft_plan(a, axes=(0, 1))
    cache = cp.fft.config.get_plan_cache()

    def cupy_loop(reuse):
        def run():
            v = a
            size = cache.get_size()
            if not reuse:
                cache.set_size(0)  # (CuPy then plans at every call)
            try:
                for _ in range(transforms):
                    if reuse:
                        with plan:
                            v = cp.fft.fftn(v, axes=(0, 1)) / n
                    else:
                        v = cp.fft.fftn(v, axes=(0, 1)) / n
            finally:
                cache.set_size(size)
            cp.cuda.runtime.deviceSynchronize()
            return v

        return run

    variants = {
        "jaxbind": loop(lambda v: cuda.fft(v, 2)),
        "jnp.fft.fftn": loop(lambda v: jnp.fft.fftn(v)),
        "CuPy, reused plan": cupy_loop(True),
        "CuPy, plan per call": cupy_loop(False),
    }
    entries = _ext.python_entries()
    times, diffs = side_by_side(variants, rounds=rounds, against="jnp.fft.fftn")
    entries = _ext.python_entries() - entries
    base = times["CuPy, reused plan"]
    for name, t in times.items():
        rows.append(
            (f"cuFFT {n}²", name, ms(t / transforms, 4), f"{t / base:.2f}", f"{diffs[name]:.1e}")
        )
    payload[f"cufft_{n}"] = {
        "seconds_per_fft": {k: t / transforms for k, t in times.items()},
        "differences": diffs,
        "python_entries_during_timing": entries,
        "targets": {
            "<= 1.10x reused plan": times["jaxbind"] / base,
            "<= 0.5x plan per call": times["jaxbind"] / times["CuPy, plan per call"],
        },
    }


def main():
    args = arguments(__doc__, rounds=5)
    if not any(d.platform == "gpu" for d in jax.devices()):
        print("gpu_libraries: no GPU here; nothing measured")
        return
    quick = args.quick
    rounds = 2 if quick else args.rounds
    meta = run_meta(device=str(jax.devices("cuda")[0].device_kind))
    payload: dict = {"meta": meta}
    rows: list = []

    # cuFFT: 100 FFTs in a loop (a reused plan's target), and a tiny one (the per-call cost)
    xf = None
    for n in (64, 16) if quick else (256, 32):
        xf = _gpu(jnp.ones((n, n), jnp.complex64))
        _fft_rows(n, xf, rounds, rows, payload)
    assert xf is not None

    # plans: set up once per site and device, torn down with the program
    jax.clear_caches()  # (the loops' programs above hold theirs)
    gc.collect()
    before = _state.live_states()
    f = jax.jit(lambda v: cuda.fft(v, 2))
    jax.block_until_ready(f(xf))
    made = _state.live_states() - before
    del f
    jax.clear_caches()
    gc.collect()
    payload["plans"] = {"made": made, "left_after_clear_caches": _state.live_states() - before}

    why = _cufinufft_why_not()
    payload["cufinufft"] = why or "loaded"
    if why is None:
        big = _nufft_rows(
            64 if quick else 256, 10_000 if quick else 1_000_000, 100, rounds, rows, payload
        )
        tiny = _nufft_rows(32, 1000, 100, rounds, rows, payload)
        payload["targets"] = {
            "<= 1.10x reused plan": big["jaxbind"] / big["cufinufft reused plan"],
            "<= 0.5x plan per call": big["jaxbind"] / big["cufinufft plan per call"],
            "tiny <= 1.2x bare execute": tiny["jaxbind"] / tiny["cufinufft reused plan"],
        }
        rng = np.random.default_rng(3)
        m, modes = 20_000, (64, 64)
        x, y = (rng.uniform(-np.pi, np.pi, m) for _ in range(2))
        c = rng.normal(size=m) + 1j * rng.normal(size=m)
        jax.config.update("jax_enable_x64", True)
        from jaxbind.contrib import jaxducc0

        def loss(fn):
            return lambda c, x, y: jnp.sum(jnp.abs(fn(modes, c, x, y, eps=1e-9)) ** 2)

        got = jax.grad(loss(cuda.nufft1), argnums=(0, 1, 2))(_gpu(c), _gpu(x), _gpu(y))
        with jax.default_device(jax.devices("cpu")[0]):
            want = jax.grad(loss(jaxducc0.nufft1), argnums=(0, 1, 2))(c, x, y)
        payload["grad_vs_cpu_ducc"] = [relative_difference(g, h) for g, h in zip(got, want)]
        jax.config.update("jax_enable_x64", False)
    lines = md_table(
        f"{run_line(meta)}, {meta['device']}. Seconds per transform (median of {rounds} "
        "rounds, implementations alternating); ratio to the library's own reused plan "
        "(cufinufft's, CuPy's cuFFT); relative "
        "difference from the row it is compared with.",
        ["case", "implementation", "per transform", "ratio", "difference"],
        rows,
    )
    lines += ["", f"cufinufft: {payload['cufinufft']}", f"plans: {payload['plans']}"]
    if "targets" in payload:
        lines.append(f"targets: {payload['targets']}")
        lines.append(f"grad vs CPU DUCC (values, x, y): {payload['grad_vs_cpu_ducc']}")
    publish(args.out, "gpu_libraries", payload, lines, write=not quick)


if __name__ == "__main__":
    main()
