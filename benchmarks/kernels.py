"""Compiled kernels against Python bodies: per jitted call and per fori_loop iteration.

    python benchmarks/kernels.py               # writes benchmarks/results/kernels.{json,md}
    python benchmarks/kernels.py --blocks 10   # quicker

The body is ``y = 2 x + 1`` on 16 float32 values, the same everywhere:

- kernel floor: ``ffi_call`` of a C++ FFI handler registered by hand (_kernel_floor.cc)
  that calls the numba cfunc of the kernel directly: no GIL, no lookup, no check;
- kernel floor, jaxbind's attributes: the same handler bound to a dictionary of
  attributes, called with every attribute a jaxbind call carries (what XLA spends on
  them, before jaxbind's handler does anything);
- jaxbind kernel: the numba function through ``jaxbind.kernel`` (the same cfunc);
- Python floor: _floor.cc, a handler that takes the GIL and calls the Python callable;
- jaxbind callable: the NumPy body as a Python callable through jaxbind;
- pure_callback: ``jax.pure_callback`` calling the numba function (njit) on NumPy arrays.

Every variant runs in alternating blocks in one process (A B C D E, then reversed, ...),
so all see the same machine state; each row is the median over blocks. "per call" is a
jitted function that calls the body once; "per iteration" is the time of a
``fori_loop`` of 1000 calls divided by 1000. "overhead" is the time above the kernel
floor's.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numba
import numpy as np

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

import _cases  # noqa: E402
from _report import run_line, run_meta, save  # noqa: E402

import jaxbind  # noqa: E402
from jaxbind._callformat import NO_LOOP, CallAttributes  # noqa: E402
from jaxbind._kwargs import encode_kwargs  # noqa: E402

N, ITERATIONS = 16, 1000


def affine(out, x):  # the kernel, as numba users write it
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i] + 1.0


affine_jit = numba.njit(nogil=True)(affine)


def affine_callable(out, args, kwargs_dump):
    np.multiply(args[0], 2.0, out=out[0])
    np.add(out[0], 1.0, out=out[0])


def _shape(x, **kwargs):
    return ((x.shape, x.dtype),)


def _kernel_floor(address: int):
    """ffi_call of _kernel_floor.cc, registered by hand, calling the kernel at `address`."""
    import sysconfig

    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-jax{jax.__version__}"
    so = HERE / ".build" / f"libkernelfloor-{tag}.so"
    if not so.exists():
        so.parent.mkdir(exist_ok=True)
        tmp = so.with_name(f"{so.name}.{os.getpid()}.tmp")
        subprocess.run(
            [
                "c++",
                "-O2",
                "-std=c++17",
                "-shared",
                "-fPIC",
                "-w",
                f"-I{jax.ffi.include_dir()}",
                f"-I{jaxbind.kernel_include_dir()}",
                f"-I{sysconfig.get_paths()['include']}",
                str(HERE / "_kernel_floor.cc"),
                "-o",
                str(tmp),
            ],
            check=True,
        )
        os.replace(tmp, so)
    import ctypes

    lib = ctypes.CDLL(str(so))
    jax.ffi.register_ffi_target(
        "jaxbind_bench_kernel_floor", jax.ffi.pycapsule(lib.kernel_floor_handler), platform="cpu"
    )
    jax.ffi.register_ffi_target(
        "jaxbind_bench_kernel_floor_dict",
        jax.ffi.pycapsule(lib.kernel_floor_dict_handler),
        platform="cpu",
    )
    out = jax.ShapeDtypeStruct((N,), jnp.float32)
    call = jax.ffi.ffi_call("jaxbind_bench_kernel_floor", out)
    dict_call = jax.ffi.ffi_call("jaxbind_bench_kernel_floor_dict", out)
    # every attribute a jaxbind call of this op carries (call format 3), and `fn`
    attrs = CallAttributes.of_call(
        "bench.kernel_affine", "f", encode_kwargs({}).blob, NO_LOOP, 1, 0
    ).ffi_attributes()
    return (
        lambda x: call(x, fn=np.int64(address)),
        lambda x: dict_call(x, fn=np.int64(address), **attrs),
    )


def bodies() -> dict:
    """name -> a JAX function x -> 2 x + 1 (one call of the body)."""
    kernel = jaxbind.kernel(affine)
    k_op = jaxbind.get_linear_call(kernel, None, _shape, name="bench.kernel_affine")
    py_op = jaxbind.get_linear_call(affine_callable, None, _shape, name="bench.callable_affine")
    x = np.ones(N, np.float32)
    address = kernel.address_for(((x.shape, 11),), ((x.shape, 11),), {})
    floor = _cases._floor_op(affine_callable, (np.empty(N, np.float32),), (x,))

    def pure(x):
        def host(x):
            out = np.empty_like(x)
            affine_jit(out, np.asarray(x))
            return out

        return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    floor_kernel, floor_kernel_attrs = _kernel_floor(address)
    return {
        "kernel floor": floor_kernel,
        "kernel floor, jaxbind's attributes": floor_kernel_attrs,
        "jaxbind kernel": lambda x: k_op(x)[0],
        "Python floor": lambda x: floor(x)[0],
        "jaxbind callable": lambda x: py_op(x)[0],
        "pure_callback": pure,
    }


def longest_stall(seconds: float = 0.1) -> dict:
    """The longest time a Python thread that ticks every millisecond waits for the GIL
    while a body of `seconds` runs on XLA's thread: as a kernel, and as the same numba
    function called from a Python callable (which holds the GIL)."""
    import threading

    busy = numba.njit(nogil=False)(_busy)
    kernel_op = jaxbind.get_linear_call(
        jaxbind.kernel(_busy_kernel), None, _shape, name="bench.kernel_busy"
    )

    def busy_callable(out, args, kwargs_dump):
        busy(out[0], args[0], jaxbind.load_kwargs(kwargs_dump)["turns"])

    callable_op = jaxbind.get_linear_call(busy_callable, None, _shape, name="bench.callable_busy")
    turns = _turns_for(seconds)
    x = jnp.ones(N, jnp.float32)
    result = {}
    for name, op in (("jaxbind kernel", kernel_op), ("jaxbind callable", callable_op)):
        f = jax.jit(lambda x, op=op: op(x, turns=turns)[0])
        jax.block_until_ready(f(x))
        gaps, stop = [], threading.Event()

        def tick(gaps=gaps, stop=stop):
            last = time.perf_counter()
            while not stop.is_set():
                time.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = threading.Thread(target=tick)
        ticker.start()
        time.sleep(0.02)
        start = time.perf_counter()
        for _ in range(3):
            jax.block_until_ready(f(x))
        took = (time.perf_counter() - start) / 3
        stop.set()
        ticker.join()
        result[name] = dict(body_s=took, longest_stall_s=max(gaps))
    return result


def _busy(out, x, turns):  # `turns` loop turns of arithmetic, then 2 x + 1
    acc = 0.0
    for t in range(turns):
        acc += t * 1e-9
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i] + 1.0 + acc * 0.0


_busy_kernel = _busy


def _turns_for(seconds: float) -> int:
    """Loop turns of _busy that take about `seconds` here."""
    busy = numba.njit(_busy)
    out, x = np.empty(N, np.float32), np.ones(N, np.float32)
    busy(out, x, 1000)
    start = time.perf_counter()
    busy(out, x, 10_000_000)
    return int(10_000_000 * seconds / (time.perf_counter() - start))


def _programs(body):
    once = jax.jit(body)
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, ITERATIONS, lambda i, y: body(y) * 0.5, x))
    return once, loop


def _block(fn, x, reps):
    jax.block_until_ready(fn(x))
    start = time.perf_counter()
    for _ in range(reps):
        y = fn(x)
    jax.block_until_ready(y)
    return (time.perf_counter() - start) / reps


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    x = jnp.linspace(0.0, 1.0, N, dtype=jnp.float32)
    programs = {name: _programs(body) for name, body in bodies().items()}
    for name, (once, _) in programs.items():  # every body computes the same
        if name != "Python floor":  # (which writes private arrays, not XLA's)
            np.testing.assert_allclose(once(x), 2 * x + 1, rtol=1e-6, err_msg=name)
    times = {name: {"call": [], "iteration": []} for name in programs}
    names = list(programs)
    for b in range(args.blocks):
        for name in names if b % 2 == 0 else reversed(names):
            once, loop = programs[name]
            times[name]["call"].append(_block(once, x, 200))
            loop_reps = 2 if name == "pure_callback" else 10
            times[name]["iteration"].append(_block(loop, x, loop_reps) / ITERATIONS)
    rows = []
    for name in names:
        rows.append(
            dict(
                path=name,
                call_s=statistics.median(times[name]["call"]),
                iteration_s=statistics.median(times[name]["iteration"]),
            )
        )
    floor = rows[0]
    for r in rows:
        r["call_overhead_s"] = r["call_s"] - floor["call_s"]
        r["iteration_overhead_s"] = r["iteration_s"] - floor["iteration_s"]
    by = {r["path"]: r for r in rows}
    stalls = longest_stall()
    ratio = by["jaxbind callable"]["iteration_overhead_s"] / max(
        by["jaxbind kernel"]["iteration_overhead_s"], 1e-9
    )
    meta = run_meta(numpy=np.__version__, numba=numba.__version__, jaxbind=jaxbind.__version__)
    lines = [
        f"{run_line(meta)}, numpy {meta['numpy']}, numba {meta['numba']}. y = 2x + 1 on {N} "
        f"float32; {args.blocks} alternating blocks, medians; a fori_loop of {ITERATIONS} "
        "calls for the per-iteration column. Overhead: above the kernel floor.",
        "",
        "| path | per jitted call | overhead | per fori_loop iteration | overhead |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['path']} | {r['call_s'] * 1e6:.2f} µs | {r['call_overhead_s'] * 1e6:+.2f} µs | "
            f"{r['iteration_s'] * 1e6:.3f} µs | {r['iteration_overhead_s'] * 1e6:+.3f} µs |"
        )
    lines += [
        "",
        f"Per iteration, the jaxbind kernel is "
        f"{by['jaxbind kernel']['iteration_overhead_s'] * 1e6:+.3f} µs from the kernel floor "
        "(target: within 0.1 µs), and the Python-callable path's overhead is "
        f"{ratio:.0f}x the kernel's (target: at least 20x).",
        "",
        "The longest wait of a Python thread that ticks every millisecond, while the body "
        "runs on XLA's thread (the same numba loop: as a kernel, and called from a Python "
        "callable, which holds the GIL):",
        "",
        "| body | time per call | longest stall of the Python thread |",
        "|---|---|---|",
    ]
    for name, r in stalls.items():
        lines.append(
            f"| {name} | {r['body_s'] * 1e3:.1f} ms | {r['longest_stall_s'] * 1e3:.1f} ms |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    payload = dict(meta=meta, results=rows, callable_over_kernel=ratio, stalls=stalls)
    save(args.out, "kernels", payload, text)


if __name__ == "__main__":
    main()
