"""GPU benchmark: jaxbind on CUDA against jnp, pure_callback and buffer_callback, one process.

    python benchmarks/gpu.py [--rounds 7] [--out benchmarks/results]
    python benchmarks/gpu.py --quick   # 2 rounds

Every implementation is a jitted function timed per call (back-to-back calls, then one
wait; medians over rounds, implementations interleaved in a shuffled order):

- overhead: ``y = x`` on 1 float32, a trivial CuPy callable;
- throughput: ``y = 2*x`` on 16M float32 elements on the device buffers;
- host: the same 16M case with ``platform_mode="host"`` (NumPy on host copies).

jaxbind's callables take the buffers with ``cp.from_dlpack`` (the consumer names its
stream, XLA's, so nothing waits), as the ``buffer_callback`` callables do;
``jaxbind (cp.asarray)`` takes them through ``__cuda_array_interface__``.
``jaxbind (raw kernel)`` runs a hand-written vectorized kernel instead of CuPy's
``multiply``, to separate jaxbind's cost from the speed of CuPy's kernel. A second table
times the parts one call is made of, and a third the same work at 16M, 64M and 256M
elements. Writes gpu.json and gpu.md with the device and versions. Needs JAX with CUDA
and CuPy. ``--profile`` prints a profile of one call's Python work instead.
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import pathlib
import platform
import random
import threading

import _cuda_native
import jax
import jax.numpy as jnp
import numpy as np
from _harness import arguments, clock, flag, save, time_it

HERE = pathlib.Path(__file__).parent
N = 16_000_000

_DOUBLE4 = r"""
extern "C" __global__ void double4(const float4* x, float4* y, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
       i += (long long)gridDim.x * blockDim.x) {
    float4 v = x[i];
    y[i] = make_float4(2.f * v.x, 2.f * v.y, 2.f * v.z, 2.f * v.w);
  }
}"""


@functools.cache
def _raw_double():
    """y = 2x with float4 loads and stores (n a multiple of 4), on CuPy's current stream."""
    import cupy as cp

    kernel = cp.RawKernel(_DOUBLE4, "double4")

    def run(x, y):
        n4 = x.size // 4
        kernel((min((n4 + 255) // 256, 132 * 16),), (256,), (x, y, np.int64(n4)))

    return run


@functools.cache
def _ops():
    import cupy as cp

    import jaxbind

    def copy(out, args, kwargs_dump):
        cp.copyto(cp.from_dlpack(out[0]), cp.from_dlpack(args[0]))

    def double(out, args, kwargs_dump):
        cp.multiply(cp.from_dlpack(args[0]), 2, out=cp.from_dlpack(out[0]))

    def copy_cai(out, args, kwargs_dump):
        cp.copyto(cp.asarray(out[0]), cp.asarray(args[0]))

    def double_cai(out, args, kwargs_dump):
        cp.multiply(cp.asarray(args[0]), 2, out=cp.asarray(out[0]))

    def double_raw(out, args, kwargs_dump):
        _raw_double()(cp.from_dlpack(args[0]), cp.from_dlpack(out[0]))

    def double_host(out, args, kwargs_dump):
        np.multiply(args[0], 2, out=out[0])

    def empty(out, args, kwargs_dump):
        pass

    same = lambda x: ((x.shape, x.dtype),)
    make = lambda f, **kw: jaxbind.get_nonlinear_call(
        f, (None, None), same, None, name=f"bench.gpu_{f.__name__}", **kw
    )
    return dict(
        copy=make(copy),
        double=make(double),
        copy_cai=make(copy_cai),
        double_cai=make(double_cai),
        double_raw=make(double_raw),
        host=make(double_host, platform_mode="host"),
        empty=make(empty),
    )


def _buffer_callback(kind):
    """JAX's own FFI callback with the same CuPy work, or None where JAX lacks it."""
    try:
        from jax.experimental.buffer_callback import buffer_callback
    except ImportError:
        return None
    import cupy as cp

    from jaxbind._runtime.gpu import cupy_stream

    def cb(ctx, out, x):
        with cupy_stream(ctx.stream, 0):
            y, xx = cp.from_dlpack(out), cp.from_dlpack(x)
            if kind == "copy":
                cp.copyto(y, xx)
            elif kind == "double":
                cp.multiply(xx, 2, out=y)
            else:
                _raw_double()(xx, y)

    return lambda x: buffer_callback(cb, jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


IMPLS = {  # case -> implementations
    "overhead": (
        "jnp",
        "jaxbind",
        "jaxbind (cp.asarray)",
        "jaxbind (CUDA kernel)",
        "ffi_call (C++ handler)",
        "pure_callback",
        "buffer_callback",
    ),
    "throughput": (
        "jnp",
        "jaxbind",
        "jaxbind (cp.asarray)",
        "jaxbind (raw kernel)",
        "jaxbind (CUDA kernel)",
        "ffi_call (C++ handler)",
        "pure_callback",
        "buffer_callback",
        "buffer_callback (raw kernel)",
    ),
    "host": ("jaxbind", "pure_callback"),
}


def build(impl, case):
    n = 1 if case == "overhead" else N
    x = jax.device_put(jnp.ones(n, jnp.float32), jax.devices("cuda")[0])
    kind = "copy" if case == "overhead" else "double"
    ops = _ops()
    if impl == "jnp":
        f = (lambda x: x + 0) if kind == "copy" else (lambda x: 2 * x)
    elif impl in ("jaxbind (CUDA kernel)", "ffi_call (C++ handler)"):
        native = _cuda_native.ops()  # the same CUDA code, launched by jaxbind or by C++
        name = ("jaxbind " if impl.startswith("jaxbind") else "ffi_call ") + (
            "copy" if kind == "copy" else "twice4"
        )
        if native is None or name not in native:
            return None
        op = native[name]
        f = lambda x: op(x)[0]
    elif impl.startswith("jaxbind"):
        name = {
            "jaxbind": kind,
            "jaxbind (cp.asarray)": f"{kind}_cai",
            "jaxbind (raw kernel)": "double_raw",
        }[impl]
        op = ops["host" if case == "host" else name]
        f = lambda x: op(x)[0]
    elif impl == "pure_callback":
        fn = (lambda a: np.array(a)) if kind == "copy" else (lambda a: 2 * a)
        f = lambda x: jax.pure_callback(fn, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    elif impl.startswith("buffer_callback"):
        f = _buffer_callback("raw" if "raw" in impl else kind)
        if f is None:
            return None
    return jax.jit(f), x


def per_call(fn, x, reps):
    """Seconds per call of the jitted `fn` on `x`: back-to-back calls, then one wait."""
    return time_it(lambda: fn(x), iters=reps, warmup=1).median


def _loop(step, reps):
    """Per-call time of `step()` (which launches GPU work) in a Python loop, then a sync."""
    import cupy as cp

    return time_it(step, iters=reps, warmup=1, sync=cp.cuda.Device().synchronize).median


def decompose(reps=500):
    """Where one call's time goes, in seconds per call, and the thread the handler ran on."""
    import types

    import cupy as cp

    from jaxbind import _ext
    from jaxbind._runtime import gpu as _gpu

    parts = {}
    x, y = cp.ones(N, cp.float32), cp.empty(N, cp.float32)
    x1, y1 = cp.ones(1, cp.float32), cp.empty(1, cp.float32)
    parts["CuPy alone: cp.multiply, 16M"] = _loop(lambda: cp.multiply(x, 2, out=y), reps)
    parts["CuPy alone: raw kernel, 16M"] = _loop(lambda: _raw_double()(x, y), reps)
    parts["CuPy alone: cp.multiply, 1 element (launch cost)"] = _loop(
        lambda: cp.multiply(x1, 2, out=y1), 4 * reps
    )
    one = jax.device_put(jnp.ones(1, jnp.float32), jax.devices("cuda")[0])
    empty = _ops()["empty"]
    parts["jnp: x + 0, 1 element (JAX's dispatch)"] = per_call(
        jax.jit(lambda x: x + 0), one, 4 * reps
    )
    parts["jaxbind: empty callable, 1 element"] = per_call(
        jax.jit(lambda x: empty(x)[0]), one, 4 * reps
    )
    acc = dict(plan=0.0, callable=0.0, n=0, plans=0, threads=set())

    class TimedPlan:
        """A site's GPU plan, its calls timed (the trampoline points `views`, the same
        tuple, at each call's buffers)."""

        def __init__(self, plan):
            self.views, self.plan = plan.views, plan

        def __call__(self):
            t0 = clock()
            acc["threads"].add(threading.get_ident())
            self.plan()
            acc["plan"] += clock() - t0
            acc["n"] += 1

    def timed_plan(resolved, *rest):
        callable_ = resolved.callable

        def timed_callable(out, args, kwargs_dump):
            t1 = clock()
            callable_(out, args, kwargs_dump)
            acc["callable"] += clock() - t1

        site = types.SimpleNamespace(
            callable=timed_callable,
            platform_mode=resolved.platform_mode,
            kwargs_dump=resolved.kwargs_dump,
        )
        acc["plans"] += 1
        return TimedPlan(_gpu.plan(site, *rest))

    import jaxbind

    def double(out, args, kwargs_dump):
        cp.multiply(cp.from_dlpack(args[0]), 2, out=cp.from_dlpack(out[0]))

    # an op of its own: its site has no plan yet, so the timed maker makes it
    same = lambda x: ((x.shape, x.dtype),)
    op = jaxbind.get_nonlinear_call(double, (None, None), same, None, name="bench.gpu_timed")
    fn = jax.jit(lambda x: op(x)[0])
    xj = jax.device_put(jnp.ones(N, jnp.float32), jax.devices("cuda")[0])
    _ext.set_gpu_plan(timed_plan)
    try:
        parts["jaxbind double 16M: whole call, timers inside"] = per_call(fn, xj, reps)
    finally:
        _ext.set_gpu_plan(_gpu.plan)
    n = max(acc["n"], 1)
    parts["jaxbind double 16M: in jaxbind's plan, around the callable"] = (
        acc["plan"] - acc["callable"]
    ) / n
    parts["jaxbind double 16M: in the callable (2 from_dlpack, 1 multiply)"] = acc["callable"] / n
    where = (
        "the thread that calls the jitted function"
        if acc["threads"] == {threading.get_ident()}
        else f"{len(acc['threads'])} other thread(s)"
    )
    return parts, f"{where}; {acc['plans']} plan(s) made for {acc['n']} calls"


def sweep(sizes=(16_000_000, 64_000_000, 256_000_000), rounds=5):
    """y = 2x per call at growing sizes: when does the GPU, not the host, set the pace?

    Returns {size: {implementation: seconds per call}} (medians over rounds).
    """
    import cupy as cp

    ops = _ops()
    out = {}
    for n in sizes:
        x = jax.device_put(jnp.ones(n, jnp.float32), jax.devices("cuda")[0])
        fns = {
            "jnp": jax.jit(lambda x: 2 * x),
            "jaxbind (raw kernel)": jax.jit(lambda x: ops["double_raw"](x)[0]),
            "jaxbind": jax.jit(lambda x: ops["double"](x)[0]),
        }
        native = _cuda_native.ops()
        if native is not None:
            kernel = native["jaxbind twice4"]
            fns["jaxbind (CUDA kernel)"] = jax.jit(lambda x: kernel(x)[0])
        xc, yc = cp.ones(n, cp.float32), cp.empty(n, cp.float32)
        reps = max(10, 50 * 16_000_000 // n)
        samples = {k: [] for k in (*fns, "raw kernel alone")}
        for _ in range(rounds):
            for k, f in fns.items():
                samples[k].append(per_call(f, x, reps))
            samples["raw kernel alone"].append(_loop(lambda: _raw_double()(xc, yc), reps))
        out[n] = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
        del x, xc, yc
    return out


def _targets(med):
    """(what, ratio, target, met) for the issue's three targets, where both sides ran."""
    spec = [
        (
            "per-call overhead: jaxbind / buffer_callback",
            ("overhead", "jaxbind"),
            ("overhead", "buffer_callback"),
            1.0,
        ),
        ("16M elements: jaxbind / jnp", ("throughput", "jaxbind"), ("throughput", "jnp"), 1.1),
        (
            "16M elements, raw kernel in a Python callable: jaxbind (raw kernel) / jnp",
            ("throughput", "jaxbind (raw kernel)"),
            ("throughput", "jnp"),
            1.2,
        ),
        (
            "16M elements, the raw kernel as a CUDA kernel: jaxbind (CUDA kernel) / jnp",
            ("throughput", "jaxbind (CUDA kernel)"),
            ("throughput", "jnp"),
            1.2,
        ),
        (
            "per call, CUDA kernel: jaxbind (CUDA kernel) / ffi_call (C++ handler)",
            ("overhead", "jaxbind (CUDA kernel)"),
            ("overhead", "ffi_call (C++ handler)"),
            1.1,
        ),
        (
            "16M elements, raw kernel, JAX's own callback: buffer_callback (raw kernel) / jnp",
            ("throughput", "buffer_callback (raw kernel)"),
            ("throughput", "jnp"),
            1.1,
        ),
        (
            "host mode: jaxbind / pure_callback",
            ("host", "jaxbind"),
            ("host", "pure_callback"),
            "<1",
        ),
    ]
    out = []
    for what, a, b, goal in spec:
        if a in med and b in med:
            ratio = med[a] / med[b]
            met = ratio < 1 if goal == "<1" else ratio <= goal
            out.append((what, ratio, "< 1" if goal == "<1" else f"<= {goal}", met))
    return out


def profile(reps=2000):
    """Print where Python time goes in jaxbind's 1-element call and in CuPy's wrapping."""
    import cProfile
    import pstats

    import cupy as cp

    import jaxbind

    fn, x = build("jaxbind", "overhead")
    jax.block_until_ready(fn(x))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        y = fn(x)
    jax.block_until_ready(y)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    buf = cp.ones(16, cp.float32)
    view = jaxbind.CudaArray(buf.data.ptr, (16,), np.float32, True, 1, 0)
    for label, make in (
        ("cp.from_dlpack(CudaArray)", lambda: cp.from_dlpack(view)),
        ("cp.asarray(CudaArray)", lambda: cp.asarray(view)),
        ("cp.from_dlpack(cupy array)", lambda: cp.from_dlpack(buf)),
        ("CudaArray(...)", lambda: jaxbind.CudaArray(buf.data.ptr, (16,), np.float32, True, 1, 0)),
        ("CudaArray.__dlpack__(stream=1)", lambda: view.__dlpack__(stream=1)),
    ):
        took = time_it(make, iters=reps, warmup=0).median
        print(f"{label}: {took * 1e6:.2f} µs")


def main():
    args = arguments(
        __doc__,
        flag("--profile", action="store_true", help="print a profile of one call's Python work"),
        rounds=7,
    )
    if args.quick:
        args.rounds = 2
    if args.profile:
        return profile()
    plan = [(case, impl) for case, impls in IMPLS.items() for impl in impls]
    built = {k: build(k[1], k[0]) for k in plan}
    built = {k: v for k, v in built.items() if v is not None}
    samples = {k: [] for k in built}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(built)
        rng.shuffle(order)
        for key in order:
            reps = 2000 if key[0] == "overhead" else 50
            samples[key].append(per_call(*built[key], reps))
    med = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
    parts, where = decompose()
    sizes = sweep()
    graphs = _cuda_native.graphs() or {}
    checks = _targets(med)

    import cupy

    import jaxbind

    dev = jax.devices("cuda")[0]
    meta = dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        device=dev.device_kind,
        cpu=platform.machine(),
        jax=jax.__version__,
        jaxlib=importlib.metadata.version("jaxlib"),
        jaxbind=jaxbind.__version__,
        cupy=cupy.__version__,
        python=platform.python_version(),
        rounds=args.rounds,
    )
    lines = ["| case | implementation | per call | vs jnp |", "|---|---|---|---|"]
    for case, impl in plan:
        if (case, impl) in med:
            base = med.get((case if case != "host" else "throughput", "jnp"))
            lines.append(
                f"| {case} | {impl} | {med[case, impl] * 1e6:.1f} µs | "
                f"{med[case, impl] / base:.2f}x |"
            )
    lines += [
        "",
        f"Where the time goes (per call; jaxbind's handler runs on {where}):",
        "",
        "| part | µs |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v * 1e6:.1f} |" for k, v in parts.items()]
    impls = list(next(iter(sizes.values())))
    lines += [
        "",
        "y = 2x at growing sizes (per call; ratio to jnp):",
        "",
        "| elements | " + " | ".join(impls) + " |",
        "|---" * (len(impls) + 1) + "|",
    ]
    lines += [
        f"| {n // 1_000_000}M | "
        + " | ".join(f"{t[k] * 1e6:.0f} µs ({t[k] / t['jnp']:.2f}x)" for k in impls)
        + " |"
        for n, t in sizes.items()
    ]
    if graphs:
        lines += [
            "",
            "A program of 100 calls of a small kernel (256 elements), with XLA's command "
            "buffers (CUDA graphs) on (FUSION,CUSTOM_CALL) and off, each in its own process:",
            "",
            "| command buffers | implementation | per program | per call | handler launches "
            "per program | correct |",
            "|---|---|---|---|---|---|",
        ]
        for mode, found in graphs.items():
            if "error" in found:
                lines.append(f"| {mode} | (failed: {found['error'][-200:]!r}) | | | | |")
                continue
            for impl, r in found.items():
                t = r["per_program_s"]
                launches = r["launches_per_program"]
                lines.append(
                    f"| {mode} | {impl} | {t * 1e6:.1f} µs | {t * 1e4:.2f} µs | "
                    f"{'-' if launches is None else f'{launches:.2f}'} | "
                    f"{'yes' if r['correct'] else 'NO'} |"
                )
    lines += ["", "Targets (ratios of the medians above):", ""]
    lines += [
        f"- {what}: {ratio:.2f} (target {goal}): {'met' if ok else 'MISSED'}"
        for what, ratio, goal, ok in checks
    ]
    table = "\n".join(lines)
    print(table)
    payload = dict(
        meta=meta,
        median_s={" / ".join(k): v for k, v in med.items()},
        parts_s=parts,
        sizes_s={str(n): t for n, t in sizes.items()},
        command_buffers=graphs,
        targets=[dict(what=w, ratio=r, target=g, met=ok) for w, r, g, ok in checks],
    )
    save(
        args.out,
        "gpu",
        payload,
        f"Run {meta['date']} on an {meta['device']} ({meta['cpu']} host): jaxbind "
        f"{meta['jaxbind']}, jax {meta['jax']} (jaxlib {meta['jaxlib']}), cupy {meta['cupy']}, "
        f"Python {meta['python']}. Medians of {args.rounds} rounds.\n\n" + table + "\n",
    )


if __name__ == "__main__":
    main()
