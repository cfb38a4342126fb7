"""Compiled kernels against Python bodies: per jitted call and per fori_loop iteration,
the GIL, concurrent calls, and a cloud-in-cell fit.

    python benchmarks/kernels.py               # writes benchmarks/results/kernels.{json,md}
    python benchmarks/kernels.py --blocks 10   # quicker
    python benchmarks/kernels.py --quick       # a few seconds, smaller sizes (not for the record)
    python benchmarks/kernels.py --report      # kernels.md again from kernels.json (no run)

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

Then, with a numba loop that runs for a given time as the body:

- GIL: the longest stall of a Python thread that ticks every millisecond while a 200 ms
  body runs on XLA's thread, as a kernel and called from a Python callable;
- threads: two Python threads that each call a jitted op with a 100 ms body, against the
  two calls one after the other; the same for a pure-XLA loop of similar cost, and for
  the numba loop called directly (no JAX), which shows what two threads get here;
- devices: a ``shard_map`` of each over two fake CPU devices, against both halves one
  after the other on one device. This part runs in a subprocess, which sets
  ``XLA_FLAGS`` before it imports jax.

Last, a cloud-in-cell (CIC) deposit of particle weights on a periodic 2-D grid, and its
transpose (interpolation back to the particles), in a gradient-descent fit of the weights:
as numba kernels, as NumPy callables (``np.add.at`` and a gather), and in pure JAX
(``.at[].add`` and a gather).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numba
import numpy as np

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

import _cases  # noqa: E402
from _harness import (  # noqa: E402
    HIDDEN,
    alternating,
    arguments,
    clock,
    flag,
    run_line,
    run_meta,
    save,
    time_it,
)

import jaxbind  # noqa: E402
from jaxbind._callformat import NO_LOOP, CallAttributes  # noqa: E402
from jaxbind._definition import record  # noqa: E402
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
    so = _cases._build_floor("_kernel_floor.cc", "libkernelfloor", jaxbind.kernel_include_dir())
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
    # every attribute a jaxbind call of this op carries (call format 4), and `fn`
    binding = jaxbind._binding.lookup("bench.kernel_affine")
    attrs = CallAttributes.of_call(
        binding.name,
        "f",
        encode_kwargs({}).blob,
        NO_LOOP,
        1,
        0,
        definition=record(binding.options, False),
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
    try:  # a buffer is (address, shape, XLA element type)
        address = kernel.address_for(((0, x.shape, 11),), ((0, x.shape, 11),), {})
    except ValueError:  # builds before the one described call (#37): (shape, type)
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


def _busy(out, x, turns):  # `turns` loop turns of arithmetic, then 2 x + 1
    acc = 0.0
    for t in range(turns):
        acc += t * 1e-9
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i] + 1.0 + acc * 0.0


def _turns_for(seconds: float) -> int:
    """Loop turns of _busy that take about `seconds` here."""
    busy = numba.njit(_busy)
    out, x = np.empty(N, np.float32), np.ones(N, np.float32)
    busy(out, x, 1000)
    took = time_it(lambda: busy(out, x, 10_000_000), warmup=0).median
    return int(10_000_000 * seconds / took)


_busy_ops: dict = {}


def busy_ops() -> dict:
    """name -> op(x, turns=...) running _busy: as a kernel (no GIL), and as the same numba
    function called from a Python callable (which holds the GIL)."""
    if not _busy_ops:
        busy = numba.njit(nogil=False)(_busy)

        def busy_callable(out, args, kwargs_dump):
            busy(out[0], args[0], jaxbind.load_kwargs(kwargs_dump)["turns"])

        _busy_ops["jaxbind kernel"] = jaxbind.get_linear_call(
            jaxbind.kernel(_busy), None, _shape, name="bench.kernel_busy"
        )
        _busy_ops["jaxbind callable"] = jaxbind.get_linear_call(
            busy_callable, None, _shape, name="bench.callable_busy"
        )
    return _busy_ops


def longest_stall(seconds: float) -> dict:
    """The longest time a Python thread that ticks every millisecond waits for the GIL
    while a body of `seconds` runs on XLA's thread (median of 3 calls for the time)."""
    turns = _turns_for(seconds)
    x = jnp.ones(N, jnp.float32)
    result = {}
    for name, op in busy_ops().items():
        f = jax.jit(lambda x, op=op: op(x, turns=turns)[0])
        jax.block_until_ready(f(x))
        gaps, stop = [], threading.Event()

        def tick(gaps=gaps, stop=stop):
            last = clock()
            while not stop.is_set():
                time.sleep(0.001)
                now = clock()
                gaps.append(now - last)
                last = now

        ticker = threading.Thread(target=tick)
        ticker.start()
        time.sleep(0.02)
        took = time_it(lambda f=f: f(x), warmup=0, rounds=3)
        stop.set()
        ticker.join()
        result[name] = dict(body_s=took.median, longest_stall_s=max(gaps))
    return result


def _side_by_side(sequential, concurrent, trials: int) -> dict:
    """Median times of both, and the median ratio concurrent/sequential, over `trials`
    alternating trials (one warm-up call of each first)."""
    sequential(), concurrent()
    t = alternating({"seq": sequential, "conc": concurrent}, rounds=trials)
    return dict(
        sequential_s=t["seq"].median,
        concurrent_s=t["conc"].median,
        ratio=statistics.median(c / s for c, s in zip(t["conc"].samples, t["seq"].samples)),
    )


XLA_LOOP = "pure XLA (a fori_loop of sin)"
WIDTH = {XLA_LOOP: 1024}  # input length per body (N otherwise)
DIRECT = "numba loop called directly (nogil, no JAX)"


def _xla_loop(y, steps):  # elementwise on 1024 values: one thread
    return jax.lax.fori_loop(0, steps, lambda i, y: jnp.sin(y) * 0.5 + 0.25, y)


def concurrency_bodies(seconds: float) -> dict:
    """name -> x -> y, each running about `seconds`: the busy op as a kernel and as a
    callable, and a pure-XLA loop of similar cost."""
    turns = _turns_for(seconds)
    bodies = {name: (lambda x, op=op: op(x, turns=turns)[0]) for name, op in busy_ops().items()}
    one = jax.jit(_xla_loop, static_argnums=1)
    y = jnp.ones(WIDTH[XLA_LOOP], jnp.float32)
    took = time_it(lambda: one(y, 1000), warmup=1).median
    steps = max(1, int(1000 * seconds / took))
    bodies[XLA_LOOP] = lambda y: _xla_loop(y, steps)
    return bodies


def _at_once(*calls):
    threads = [threading.Thread(target=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def two_threads(seconds: float, trials: int) -> dict:
    """Two Python threads that each call a jitted function whose body runs `seconds`,
    against the same two calls one after the other; and, for reference, the numba loop
    called directly (nogil, no JAX) from two threads."""
    result = {}
    for name, body in concurrency_bodies(seconds).items():
        f = jax.jit(body)
        x = jnp.ones(WIDTH.get(name, N), jnp.float32)

        def call(f=f, x=x):
            jax.block_until_ready(f(x))

        result[name] = _side_by_side(
            lambda call=call: (call(), call()), lambda call=call: _at_once(call, call), trials
        )
    busy = numba.njit(nogil=True)(_busy)
    out, x = np.empty(N, np.float32), np.ones(N, np.float32)
    turns = _turns_for(seconds)

    def direct():
        busy(out, x, turns)

    result[DIRECT] = _side_by_side(
        lambda: (direct(), direct()), lambda: _at_once(direct, direct), trials
    )
    return result


def two_devices(seconds: float, trials: int) -> dict:
    """Runs this script with --devices-child in a subprocess with two fake CPU devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    ).strip()
    proc = subprocess.run(
        [sys.executable, __file__, "--devices-child", f"{seconds}", f"{trials}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the two-device run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _devices_child(seconds: float, trials: int) -> None:
    """In the subprocess: a shard_map over two devices of a body of `seconds` per shard,
    against the two halves one after the other on one device; prints JSON."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    assert len(devices) == 2, devices
    mesh = Mesh(np.array(devices), ("d",))
    result = {}
    for name, body in concurrency_bodies(seconds).items():
        width = WIDTH.get(name, N)
        whole = jax.device_put(jnp.ones((2, width), jnp.float32), NamedSharding(mesh, P("d")))
        halves = [jax.device_put(jnp.ones(width, jnp.float32), devices[0]) for _ in range(2)]
        sharded = jax.jit(
            jax.shard_map(
                lambda xs, body=body: body(xs[0])[None],
                mesh=mesh,
                in_specs=P("d"),
                out_specs=P("d"),
            )
        )
        single = jax.jit(body)

        def sequential(single=single, halves=halves):
            for h in halves:
                jax.block_until_ready(single(h))

        result[name] = _side_by_side(
            sequential,
            lambda sharded=sharded, whole=whole: jax.block_until_ready(sharded(whole)),
            trials,
        )
    print(json.dumps(result))


# --- XLA's threads: a parallel batch loop, and a kernel over ranges -------------------------


def _each(fn, x):
    """fn(x), waited for: each call of a timed block waits for the one before (JAX runs
    independent calls at once otherwise, as many as there are cores)."""
    return lambda: jax.block_until_ready(fn(x))


def _alternating(programs: dict, arg, blocks: int, reps: int) -> dict:
    """name -> median seconds per call, over `blocks` alternating blocks of `reps` calls."""
    calls = {name: _each(f, arg) for name, f in programs.items()}
    return {n: t.median for n, t in alternating(calls, rounds=blocks, iters=reps, warmup=1).items()}


def xla_threads() -> int:
    """The threads of XLA's intra-op pool, as a kernel's call reports them (n_threads)."""
    from jaxbind._kernels.abi import CALL
    from jaxbind._kernels.numba_codegen import _numba

    pointer = _numba()["pointer"]
    words, outputs, threads = CALL.words, CALL["outputs"], CALL["n_threads"]

    @numba.cfunc(numba.types.int32(numba.types.voidptr))
    def report(call):
        c = numba.carray(call, (words,), np.int64)
        out = numba.carray(pointer(c[outputs]), (4,), np.int64)
        numba.carray(pointer(out[0]), (1,), np.int32)[0] = c[threads]
        return 0

    op = jaxbind.get_linear_call(
        jaxbind.kernel(report), None, lambda x: (((), jnp.int32),), name="bench.xla_threads"
    )
    return int(jax.jit(lambda x: op(x)[0])(jnp.zeros(1, jnp.int32)))


def vmap_batch(batch: int, seconds: float, blocks: int) -> dict:
    """A vmap of `batch` kernel calls of about `seconds` each: jaxbind's batch loop on all
    of XLA's threads, and on one (the same kernel with threads=1)."""
    turns = _turns_for(seconds)
    programs = {}
    for name, threads in (("all threads", None), ("1 thread", 1)):
        op = jaxbind.get_linear_call(
            jaxbind.kernel(_busy, threads=threads),
            None,
            _shape,
            name=f"bench.vmap_{threads}",
            replace=True,
        )
        programs[name] = jax.jit(jax.vmap(lambda x, op=op: op(x, turns=turns)[0]))
    x = jnp.ones((batch, N), jnp.float32)
    for f in programs.values():
        np.testing.assert_allclose(f(x), 2 * x + 1)
    times = _alternating(programs, x, blocks, 2)
    return dict(
        batch=batch,
        element_s=seconds,
        rows=times,
        speedup=times["1 thread"] / times["all threads"],
    )


def _elementwise(begin, end, out, x):
    for i in range(begin, end):
        v = x[i]
        out[i] = math.sin(v) * math.exp(-v * v) + math.sqrt(abs(v))


def _elementwise_jax(x):
    return jnp.sin(x) * jnp.exp(-x * x) + jnp.sqrt(jnp.abs(x))


def elementwise(size: int, blocks: int) -> dict:
    """sin(x) exp(-x²) + sqrt|x| over `size` float32 values: a kernel over ranges with
    one thread and with all of XLA's, and pure JAX."""
    programs = {}
    for name, threads in (("kernel over ranges, all threads", None), ("… 1 thread", 1)):
        k = jaxbind.kernel(_elementwise, ranges=lambda out, x: out.shape[0], threads=threads)
        op = jaxbind.get_linear_call(
            k, None, _shape, name=f"bench.elementwise_{threads}", replace=True
        )
        programs[name] = jax.jit(lambda x, op=op: op(x)[0])
    programs["pure JAX"] = jax.jit(_elementwise_jax)
    x = jnp.linspace(-2.0, 2.0, size, dtype=jnp.float32)
    ref = programs["pure JAX"](x)
    for name, f in programs.items():
        np.testing.assert_allclose(f(x), ref, rtol=1e-5, atol=1e-6, err_msg=name)
    times = _alternating(programs, x, blocks, 3)
    return dict(
        size=size,
        rows=times,
        speedup=times["… 1 thread"] / times["kernel over ranges, all threads"],
    )


# --- a cloud-in-cell fit -----------------------------------------------------------------
# Particles at `pos` (grid units, in [0, n)) carry weights `w`; the deposit spreads each
# weight over the 4 nearest cells of a periodic n x n grid (bilinear weights); its
# transpose interpolates a grid back to the particles with the same weights.


@numba.njit(inline="always")
def cic_cell(pos, p, n0, n1):
    """The lower cell (i0, j0) of particle p, the next ones (i1, j1), and its offsets.
    (The modulo, for a particle outside the grid only: it costs a third of the loop.)"""
    fi, fj = np.floor(pos[p, 0]), np.floor(pos[p, 1])
    i0, j0 = int(fi), int(fj)
    i0 = i0 if 0 <= i0 < n0 else i0 % n0
    j0 = j0 if 0 <= j0 < n1 else j0 % n1
    i1 = i0 + 1 if i0 + 1 < n0 else 0
    j1 = j0 + 1 if j0 + 1 < n1 else 0
    return i0, j0, i1, j1, pos[p, 0] - fi, pos[p, 1] - fj


# The deposit and its transpose as kernels over ranges of particles, for XLA's threads:
# the interpolation writes each particle's value, independently; the deposit adds into
# the grid, so its ranges are summed (reduction="sum": each range deposits on a zeroed
# grid of its own; 50,000 particles a range, two for 100,000 whatever the threads). On
# one thread, each is called on the whole range (cic_deposit, cic_interp): inlined, with a
# start of 0 that numba sees.
@numba.njit(inline="always")
def cic_deposit_ranges(begin, end, out, pos, w):
    n0, n1 = out.shape
    for p in range(begin, end):
        i0, j0, i1, j1, fx, fy = cic_cell(pos, p, n0, n1)
        a, b = w[p] * (1 - fx), w[p] * fx
        out[i0, j0] += a * (1 - fy)
        out[i1, j0] += b * (1 - fy)
        out[i0, j1] += a * fy
        out[i1, j1] += b * fy


@numba.njit(inline="always")
def cic_interp_ranges(begin, end, out, pos, grid):
    n0, n1 = grid.shape
    for p in range(begin, end):
        i0, j0, i1, j1, fx, fy = cic_cell(pos, p, n0, n1)
        out[p] = (1 - fx) * ((1 - fy) * grid[i0, j0] + fy * grid[i0, j1]) + fx * (
            (1 - fy) * grid[i1, j0] + fy * grid[i1, j1]
        )


def cic_deposit(out, pos, w):  # the kernels, as numba users write them
    out[:, :] = 0.0
    cic_deposit_ranges(0, w.shape[0], out, pos, w)


def cic_interp(out, pos, grid):
    cic_interp_ranges(0, out.shape[0], out, pos, grid)


def _np_cells(pos, n):
    """The 4 cells of each particle and their weights, as arrays (NumPy and JAX)."""
    xp = np if isinstance(pos, np.ndarray) else jnp
    i = xp.floor(pos)
    f = pos - i
    i = i.astype(xp.int32) % n
    i1 = (i + 1) % n
    fx, fy = f[:, 0], f[:, 1]
    return (
        (i[:, 0], i[:, 1], (1 - fx) * (1 - fy)),
        (i1[:, 0], i[:, 1], fx * (1 - fy)),
        (i[:, 0], i1[:, 1], (1 - fx) * fy),
        (i1[:, 0], i1[:, 1], fx * fy),
    )


def cic_deposit_numpy(out, args, kwargs_dump):
    pos, w = args
    grid = out[0]
    grid[...] = 0
    for a, b, c in _np_cells(pos, grid.shape[0]):
        np.add.at(grid, (a, b), w * c)


def cic_interp_numpy(out, args, kwargs_dump):
    pos, grid = args
    out[0][...] = sum(grid[a, b] * c for a, b, c in _np_cells(pos, grid.shape[0]))


def cic_deposit_jax(pos, w, n):
    grid = jnp.zeros((n, n), w.dtype)
    for a, b, c in _np_cells(pos, n):
        grid = grid.at[a, b].add(w * c)
    return grid


def _cic_shape(pos, w, *, n):
    return (((n, n), w.dtype),)


PARALLEL_CIC = "jaxbind kernel over ranges (numba, XLA's threads)"


def cic_fit(n: int, particles: int, blocks: int, steps: int = 10) -> dict:
    """Gradient descent on the weights so that their deposit matches a target grid: time
    per jitted value_and_grad of the loss, and per step of a fori_loop of `steps` steps."""
    kernel_op = jaxbind.get_linear_call(
        jaxbind.kernel(cic_deposit),
        jaxbind.kernel(cic_interp),
        _cic_shape,
        first_n_args_fixed=1,
        name="bench.cic_kernel",
    )
    parallel_op = jaxbind.get_linear_call(
        jaxbind.kernel(
            cic_deposit_ranges,
            ranges=lambda out, pos, w: w.shape[0],
            reduction="sum",
            grain=50_000,  # (a reduction's default, the grid's size, would make one range)
        ),
        jaxbind.kernel(cic_interp_ranges, ranges=lambda out, pos, grid: out.shape[0]),
        _cic_shape,
        first_n_args_fixed=1,
        name="bench.cic_kernel_parallel",
    )
    numpy_op = jaxbind.get_linear_call(
        cic_deposit_numpy,
        cic_interp_numpy,
        _cic_shape,
        first_n_args_fixed=1,
        name="bench.cic_numpy",
    )
    deposits = {
        "jaxbind kernel (numba)": lambda pos, w: kernel_op(pos, w, n=n)[0],
        PARALLEL_CIC: lambda pos, w: parallel_op(pos, w, n=n)[0],
        "jaxbind callable (NumPy)": lambda pos, w: numpy_op(pos, w, n=n)[0],
        "pure JAX": lambda pos, w: cic_deposit_jax(pos, w, n),
    }
    rng = np.random.default_rng(0)
    pos = jnp.asarray(rng.uniform(0, n, (particles, 2)), jnp.float32)
    w_true = jnp.asarray(rng.uniform(0.5, 1.5, particles), jnp.float32)
    target = cic_deposit_jax(pos, w_true, n)
    w0 = jnp.ones(particles, jnp.float32)
    lr = 0.1
    programs = {}
    for name, deposit in deposits.items():
        # pos and target are arguments, not constants XLA could fold into the program

        def loss(w, pos, target, deposit=deposit):
            r = deposit(pos, w) - target
            return 0.5 * jnp.vdot(r, r)

        def descent(w, pos, target, loss=loss):
            step = lambda i, w: w - lr * jax.grad(loss)(w, pos, target)
            return jax.lax.fori_loop(0, steps, step, w)

        value_and_grad = jax.jit(jax.value_and_grad(loss))
        descent = jax.jit(descent)
        programs[name] = (
            lambda w, f=value_and_grad: f(w, pos, target),
            lambda w, f=descent: f(w, pos, target),
        )
    # the three agree: the deposit, the value and gradient, and the weights after the fit
    ref_v, ref_g = programs["pure JAX"][0](w0)
    ref_w = programs["pure JAX"][1](w0)
    for name, deposit in deposits.items():
        np.testing.assert_allclose(
            jax.jit(deposit)(pos, w_true), target, rtol=1e-4, atol=1e-4, err_msg=name
        )
        v, g = programs[name][0](w0)
        np.testing.assert_allclose(v, ref_v, rtol=1e-4, err_msg=name)
        np.testing.assert_allclose(g, ref_g, rtol=1e-4, atol=1e-4, err_msg=name)
        np.testing.assert_allclose(programs[name][1](w0), ref_w, rtol=1e-4, atol=1e-4, err_msg=name)
    fitted_loss = float(programs["pure JAX"][0](ref_w)[0])
    calls, iters = {}, {}
    for name, (value_and_grad, descent) in programs.items():
        calls[name, "value_and_grad"], iters[name, "value_and_grad"] = _each(value_and_grad, w0), 5
        calls[name, "step"], iters[name, "step"] = _each(descent, w0), 2
    t = alternating(calls, rounds=blocks, iters=iters, warmup=1)
    return dict(
        n=n,
        particles=particles,
        steps=steps,
        loss_start=float(ref_v),
        loss_after=fitted_loss,
        rows={
            name: dict(
                value_and_grad_s=t[name, "value_and_grad"].median,
                step_s=t[name, "step"].median / steps,
            )
            for name in programs
        },
    )


def _programs(body):
    once = jax.jit(body)
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, ITERATIONS, lambda i, y: body(y) * 0.5, x))
    return once, loop


# What a run of a record that predates "settings" was run with: the defaults of main()
DEFAULT_SETTINGS = dict(blocks=20, stall_s=0.2, busy_s=0.1, trials=10)


def report(payload: dict) -> str:
    """The Markdown of a run (benchmarks/results/kernels.md) from its JSON: results, said
    as results, with every ratio the right way round (time over time: below 1 is faster)."""
    meta, by = payload["meta"], {r["path"]: r for r in payload["results"]}
    settings = {**DEFAULT_SETTINGS, **payload.get("settings", {})}
    blocks, stall_s, busy_s = settings["blocks"], settings["stall_s"], settings["busy_s"]
    load_before, load = meta["load_average_before"], meta["load_average_after"]
    pool, cores = payload["xla_threads"], payload["cores"]
    ratio = payload["callable_over_kernel"]
    kernel_iteration = by["jaxbind kernel"]["iteration_overhead_s"]
    kernel_stall = payload["stalls"]["jaxbind kernel"]["longest_stall_s"]
    callable_stall = payload["stalls"]["jaxbind callable"]["longest_stall_s"]
    lines = [
        f"{run_line(meta)}, numpy {meta['numpy']}, numba {meta['numba']}; 1-minute load "
        f"average {load_before[0]:.2f} before the run, {load[0]:.2f} at its end (this run "
        f"included). y = 2x + 1 on {N} "
        f"float32; {blocks} alternating blocks, medians; a fori_loop of {ITERATIONS} "
        "calls for the per-iteration column. Overhead: above the kernel floor.",
        "",
        "| path | per jitted call | overhead | per fori_loop iteration | overhead |",
        "|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        lines.append(
            f"| {r['path']} | {r['call_s'] * 1e6:.2f} µs | {r['call_overhead_s'] * 1e6:+.2f} µs | "
            f"{r['iteration_s'] * 1e6:.3f} µs | {r['iteration_overhead_s'] * 1e6:+.3f} µs |"
        )
    lines += [
        "",
        f"Per fori_loop iteration, a jaxbind kernel costs {kernel_iteration * 1e6:.3f} µs more "
        f"than the kernel floor ({'within' if kernel_iteration <= 0.1e-6 else 'over'} the "
        f"0.1 µs aimed for); a Python callable's overhead is {ratio:.0f}x the kernel's.",
        "",
        f"**GIL.** The longest wait of a Python thread that ticks every millisecond, while a "
        f"{stall_s * 1e3:.0f} ms body runs on XLA's thread (the same numba loop: as a kernel, "
        "and called from a Python callable, which holds the GIL):",
        "",
        "| body | time per call | longest stall of the Python thread |",
        "|---|---|---|",
    ]
    for name, r in payload["stalls"].items():
        lines.append(
            f"| {name} | {r['body_s'] * 1e3:.1f} ms | {r['longest_stall_s'] * 1e3:.1f} ms |"
        )
    lines += [
        "",
        f"While the kernel ran, the Python thread waited {kernel_stall * 1e3:.1f} ms at most; "
        f"while the callable ran, {callable_stall * 1e3:.0f} ms, the whole call.",
        "",
        f"**Concurrency.** Two calls of a body of about {busy_s * 1e3:.0f} ms, run at once "
        "and one after the other (medians of "
        f"{settings['trials']} alternating trials; on 2 cores the best ratio is 0.5, 1.0 means "
        "no overlap):",
        "",
        "| how | body | one after the other | at once | ratio |",
        "|---|---|---|---|---|",
    ]
    for how, results in (
        ("two Python threads, one jitted call each", payload["threads"]),
        ("`shard_map` over 2 fake CPU devices vs both halves on one", payload["devices"]),
    ):
        for name, r in results.items():
            lines.append(
                f"| {how} | {name} | {r['sequential_s'] * 1e3:.1f} ms | "
                f"{r['concurrent_s'] * 1e3:.1f} ms | {r['ratio']:.2f} |"
            )
    cic = payload["cic"]
    rows_cic = cic["rows"]
    jax_step = rows_cic["pure JAX"]["step_s"]
    lines += [
        "",
        f"**A cloud-in-cell fit.** {cic['particles']} particles at fixed random positions "
        f"deposit their weights on a periodic {cic['n']}x{cic['n']} float32 grid (4 cells "
        "each, bilinear); the weights are fitted by gradient descent on "
        "0.5 |deposit(w) - target|², whose gradient is the transpose of the deposit "
        "(interpolation from the grid to the particles). The deposit is a linear op with "
        "the positions fixed (first_n_args_fixed=1). Positions and target are arguments of "
        "the jitted functions, so XLA cannot precompute the cells as constants. The "
        "three agree (deposit, loss, "
        f"gradient and the weights after {cic['steps']} steps, to 1e-4) before they are "
        f"timed; the loss goes from {cic['loss_start']:.4g} to {cic['loss_after']:.4g} in "
        f"{cic['steps']} steps. {blocks} alternating blocks, medians; each call "
        "waits for the one before (JAX would run independent calls at once, one per core).",
        "",
        f"The kernels run on one thread; the kernels over ranges on XLA's {pool} "
        f"threads ({cores} cores).",
        "",
        "| deposit and transpose | jit(value_and_grad(loss)) | per step in a fori_loop "
        f"of {cic['steps']} | step / pure JAX's |",
        "|---|---|---|---|",
    ]
    for name, r in rows_cic.items():
        lines.append(
            f"| {name} | {r['value_and_grad_s'] * 1e3:.2f} ms | {r['step_s'] * 1e3:.2f} ms | "
            f"{r['step_s'] / jax_step:.2f} |"
        )
    k_step = rows_cic["jaxbind kernel (numba)"]["step_s"]
    p_step = rows_cic[PARALLEL_CIC]["step_s"]
    c_step = rows_cic["jaxbind callable (NumPy)"]["step_s"]
    if p_step > k_step:
        threads_said = (
            f"{p_step / k_step:.2f}x the time of the same kernels on one thread "
            f"({p_step * 1e3:.2f} ms against {k_step * 1e3:.2f} ms): slower, not faster; "
            "benchmarks/analyses/kernels-threads.md measures why"
        )
    else:
        threads_said = (
            f"{k_step / p_step:.2f}x faster than the same kernels on one thread "
            f"({p_step * 1e3:.2f} ms against {k_step * 1e3:.2f} ms)"
        )
    lines += [
        "",
        f"Per step, the kernels take {k_step / jax_step:.2f}x pure JAX's time and the NumPy "
        f"callables {c_step / jax_step:.2f}x: the kernels are {c_step / k_step:.1f}x faster "
        f"than the NumPy callables. On XLA's {pool} threads, the kernels over ranges take "
        f"{p_step / jax_step:.2f}x pure JAX's time per step, {threads_said}.",
    ]
    batch, wide = payload["vmap_batch"], payload["elementwise"]
    lines += [
        "",
        f"**XLA's threads.** XLA's intra-op pool has {pool} threads here "
        f"({cores} cores). A `vmap` of {batch['batch']} kernel calls of about "
        f"{batch['element_s'] * 1e3:.1f} ms each (the busy loop above), jaxbind's batch "
        "loop on all of the pool's threads and on one (the same kernel with threads=1); "
        f"and sin(x) exp(-x²) + sqrt|x| over {wide['size']} float32 values, as a kernel "
        "over ranges with all threads and with one, and in pure JAX. Medians of "
        "alternating blocks.",
        "",
        "| case | how | time per call |",
        "|---|---|---|",
    ]
    for case, result in ((f"vmap of {batch['batch']}", batch), ("elementwise", wide)):
        for name, t in result["rows"].items():
            lines.append(f"| {case} | {name} | {t * 1e3:.2f} ms |")
    lines += [
        "",
        f"On all of XLA's {pool} threads, the batch loop is {batch['speedup']:.2f}x faster than "
        f"on one, and the elementwise kernel over ranges {wide['speedup']:.2f}x faster.",
    ]
    return "\n".join(lines) + "\n"


def main():
    args = arguments(  # --quick: 2 blocks, shorter bodies
        __doc__,
        flag("--blocks", type=int, dest="rounds", help="alternating blocks (= --rounds)"),
        flag(
            "--report",
            action="store_true",
            help="rewrite <out>/kernels.md from <out>/kernels.json, without running anything",
        ),
        flag("--devices-child", nargs=2, help=HIDDEN),
        rounds=20,
    )
    args.blocks = args.rounds
    if args.report:
        out = pathlib.Path(args.out)
        (out / "kernels.md").write_text(report(json.loads((out / "kernels.json").read_text())))
        return
    if args.devices_child:
        _devices_child(float(args.devices_child[0]), int(args.devices_child[1]))
        return
    load_before = os.getloadavg()
    if args.quick:
        args.blocks = 2
    stall_s, busy_s = (0.05, 0.02) if args.quick else (0.2, 0.1)
    trials = max(3, args.blocks // 2)
    cic_n, cic_particles = (64, 5000) if args.quick else (256, 100_000)

    x = jnp.linspace(0.0, 1.0, N, dtype=jnp.float32)
    programs = {name: _programs(body) for name, body in bodies().items()}
    for name, (once, _) in programs.items():  # every body computes the same
        if name != "Python floor":  # (which writes private arrays, not XLA's)
            np.testing.assert_allclose(once(x), 2 * x + 1, rtol=1e-6, err_msg=name)
    calls, iters = {}, {}
    for name, (once, loop) in programs.items():
        calls[name, "call"], iters[name, "call"] = (lambda f=once: f(x)), 200
        calls[name, "iteration"] = lambda f=loop: f(x)
        iters[name, "iteration"] = 2 if name == "pure_callback" else 10
    times = alternating(calls, rounds=args.blocks, iters=iters, warmup=1)
    rows = []
    for name in programs:
        rows.append(
            dict(
                path=name,
                call_s=times[name, "call"].median,
                iteration_s=times[name, "iteration"].median / ITERATIONS,
            )
        )
    floor = rows[0]
    for r in rows:
        r["call_overhead_s"] = r["call_s"] - floor["call_s"]
        r["iteration_overhead_s"] = r["iteration_s"] - floor["iteration_s"]
    by = {r["path"]: r for r in rows}
    stalls = longest_stall(stall_s)
    threads = two_threads(busy_s, trials)
    devices = two_devices(busy_s, trials)
    cic = cic_fit(cic_n, cic_particles, args.blocks)
    pool = xla_threads()
    batch = vmap_batch(64, 2e-4 if args.quick else 1e-3, args.blocks)
    wide = elementwise(1 << 20 if args.quick else 1 << 24, max(2, args.blocks // 2))
    load = os.getloadavg()
    ratio = by["jaxbind callable"]["iteration_overhead_s"] / max(
        by["jaxbind kernel"]["iteration_overhead_s"], 1e-9
    )
    meta = run_meta(
        numpy=np.__version__,
        numba=numba.__version__,
        jaxbind=jaxbind.__version__,
        load_average_before=[round(v, 2) for v in load_before],
        load_average_after=[round(v, 2) for v in load],
    )

    payload = dict(
        meta=meta,
        settings=dict(blocks=args.blocks, stall_s=stall_s, busy_s=busy_s, trials=trials),
        results=rows,
        callable_over_kernel=ratio,
        stalls=stalls,
        threads=threads,
        devices=devices,
        cic=cic,
        xla_threads=pool,
        cores=os.cpu_count(),
        vmap_batch=batch,
        elementwise=wide,
    )
    text = report(payload)
    print(text)
    save(args.out, "kernels", payload, text)


if __name__ == "__main__":
    main()
