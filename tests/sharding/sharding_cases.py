"""Sharding checks, run in a subprocess with 4 CPU devices (see test_sharding.py).

`python sharding_cases.py` runs every case and prints one JSON line per case:
{"case": name, "ok": bool, "detail": str}. The device-count flag is set here,
before JAX is imported, so it never reaches the other tests.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support.ops import same_as_first
from support.processes import run_case_functions, run_python
from support.skips import importable

import jaxbind

jax.config.update("jax_enable_x64", True)

mesh = Mesh(np.array(jax.devices()), ("b",))
batch_sharded = NamedSharding(mesh, P("b"))
try:
    shard_map = jax.shard_map  # jax >= 0.7 (public)
except AttributeError:  # pragma: no cover
    from jax.experimental.shard_map import shard_map

seen = []  # shapes the callables were called with, from every device thread
lock = threading.Lock()


def _record(x):
    with lock:
        seen.append(tuple(x.shape))


# --- ops ---------------------------------------------------------------------


def _scale_rows(out, args, kwargs_dump):  # linear: y = A ⊙ x row by row (A fixed)
    a, x = args
    _record(x)
    np.multiply(a, x, out=out[0])


scale = jaxbind.get_linear_call(
    _scale_rows,
    _scale_rows,
    lambda a, x: ((x.shape, x.dtype),),
    lambda a, y: ((y.shape, y.dtype),),
    first_n_args_fixed=1,
    name="sharding.scale",
)


def _fft(out, args, kwargs_dump):  # complex FFT along the last axis: linear, is vectorized
    (x,) = args
    _record(x)
    out[0][...] = np.fft.fft(x, axis=-1)


def _fft_abstract(x, batch_axes=None):
    return ((x.shape, x.dtype, batch_axes[0][-1] if batch_axes else None),)


fft_native = jaxbind.get_linear_call(
    _fft, _fft, _fft_abstract, _fft_abstract, func_can_batch=True, name="sharding.fft_native"
)
fft_loop = jaxbind.get_linear_call(
    _fft,
    _fft,
    same_as_first,
    same_as_first,
    name="sharding.fft_loop",
)


def _cube(out, args, kwargs_dump):
    _record(args[0])
    out[0][...] = args[0] ** 3


def _cube_jvp(out, args, kwargs_dump):
    x, dx = args
    out[0][...] = 3 * x**2 * dx


def _cube_vjp(out, args, kwargs_dump):
    x, ct = args
    out[0][...] = 3 * x**2 * ct


cube = jaxbind.get_nonlinear_call(
    _cube,
    (_cube_jvp, _cube_vjp),
    same_as_first,
    same_as_first,
    name="sharding.cube",
)


def _calls_jax(out, args, kwargs_dump):  # a callable that itself runs JAX computations
    _record(args[0])
    y = jax.jit(lambda v: jnp.sin(v) + 1.0)(jnp.asarray(args[0]))
    out[0][...] = np.asarray(y)


calls_jax = jaxbind.get_nonlinear_call(
    _calls_jax, (None, None), same_as_first, None, name="sharding.calls_jax"
)


# --- helpers -----------------------------------------------------------------


def _collectives(fn, *args):
    """The cross-device collectives in the compiled HLO of `fn`."""
    text = fn.lower(*args).compile().as_text()
    kinds = ("all-gather", "all-to-all", "all-reduce", "collective-permute", "reduce-scatter")
    return [
        line.strip()[:120]
        for line in text.splitlines()
        if any(f" {k}(" in line or f"{k}-start(" in line for k in kinds)
    ]


def _close(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


rng = np.random.default_rng(0)
X = rng.standard_normal((8, 16))
A = rng.standard_normal((8, 16))
Z = rng.standard_normal((8, 16)) + 1j * rng.standard_normal((8, 16))


# --- cases -------------------------------------------------------------------


def case_shard_map_forward_jvp_grad_vmap():
    def local(a, x):
        return scale(a, cube(x)[0])[0]

    sm = shard_map(local, mesh=mesh, in_specs=(P("b"), P("b")), out_specs=P("b"))
    ref = lambda a, x: A * x**3
    _close(jax.jit(sm)(A, X), ref(A, X))
    t = rng.standard_normal(X.shape)
    _close(jax.jvp(lambda x: sm(A, x), (X,), (t,))[1], 3 * A * X**2 * t)
    _close(
        jax.grad(lambda x: jnp.sum(jnp.sin(sm(A, x))))(X),
        jax.grad(lambda x: jnp.sum(jnp.sin(ref(A, x))))(X),
    )
    # vmap over a leading axis of the local blocks
    xs = jnp.stack([X, 2 * X])
    _close(jax.vmap(lambda x: sm(A, x))(xs), jnp.stack([ref(A, X), ref(A, 2 * X)]))
    return "forward, jvp, grad and vmap inside shard_map match the unsharded computation"


def _per_shard_case(op, z, expected, grad_ref):
    f = jax.jit(jax.vmap(lambda v: op(v)[0]))
    zs = jax.device_put(z, batch_sharded)
    gathers = _collectives(f, zs)
    assert not gathers, f"collectives in the compiled vmapped op: {gathers}"
    seen.clear()
    y = jax.block_until_ready(f(zs))
    _close(y, expected)
    assert y.sharding.is_equivalent_to(batch_sharded, y.ndim), y.sharding
    forward_calls = list(seen)
    g = jax.jit(jax.grad(lambda v: jnp.sum(jnp.abs(jax.vmap(lambda w: op(w)[0])(v)) ** 2)))
    assert not _collectives(g, zs), "collectives in the compiled grad"
    _close(g(zs), grad_ref)
    return y.sharding, forward_calls


def case_batch_sharded_vmap_native_runs_per_shard():
    fft_ref = np.fft.fft(Z, axis=-1)
    grad_ref = jax.grad(lambda v: jnp.sum(jnp.abs(jnp.fft.fft(v, axis=-1)) ** 2))(Z)
    sharding, calls = _per_shard_case(fft_native, Z, fft_ref, grad_ref)
    shapes = sorted(set(calls))
    assert shapes == [(2, 16)], f"native callable saw {shapes}, expected the (2, 16) shards"
    return f"output sharding {sharding.spec}; callable saw per-device batches {shapes}"


def case_batch_sharded_vmap_fallback_runs_per_shard():
    fft_ref = np.fft.fft(Z, axis=-1)
    grad_ref = jax.grad(lambda v: jnp.sum(jnp.abs(jnp.fft.fft(v, axis=-1)) ** 2))(Z)
    sharding, calls = _per_shard_case(fft_loop, Z, fft_ref, grad_ref)
    assert len(calls) == 8 and set(calls) == {(16,)}, calls
    return f"output sharding {sharding.spec}; 8 elements over 4 devices"


def case_batch_sharded_grad_has_no_gather():
    f = jax.jit(jax.grad(lambda v: jnp.sum(jnp.abs(jax.vmap(lambda w: fft_native(w)[0])(v)) ** 2)))
    zs = jax.device_put(Z, batch_sharded)
    found = _collectives(f, zs)
    assert not found, found
    return "grad of the vmapped op compiles with no collective"


def case_unbatched_fixed_argument_is_replicated_and_correct():
    # `A` is shared by the whole batch (not vmapped): the call is not split, but correct.
    f = jax.jit(jax.vmap(lambda x: scale(A[0], x)[0]))
    xs = jax.device_put(X, batch_sharded)
    _close(f(xs), A[0] * X)
    return "a call with an unbatched fixed argument runs replicated and is correct"


def case_callable_calling_jax_from_four_device_threads():
    f = jax.jit(jax.vmap(lambda x: calls_jax(x)[0]))
    xs = jax.device_put(X, batch_sharded)
    for _ in range(5):
        _close(f(xs), np.sin(X) + 1.0)
    return "a callable that runs jax.jit inside, called from 4 device threads: no deadlock"


def case_sharded_pipeline_with_collective():
    # A jaxbind op between JAX ops that need communication (a global sum).
    f = jax.jit(lambda x: jnp.sum(jax.vmap(lambda w: cube(w)[0])(x), axis=0))
    xs = jax.device_put(X, batch_sharded)
    _close(f(xs), np.sum(X**3, axis=0))
    return "global reduction of a per-shard jaxbind result"


# --- side effects: once per real element, on one device ---------------------------

effect_rows = []
marks = []  # the order in which effects ran


def _log_rows(out, args, kwargs_dump):
    (x,) = args
    with lock:
        effect_rows.append(np.array(x))
        marks.append("jaxbind")
    out[0][...] = 2 * x


logged = jaxbind.get_linear_call(
    _log_rows,
    _log_rows,
    same_as_first,
    same_as_first,
    name="sharding.logged",
    has_side_effect=True,
)
logged_in_order = jaxbind.get_linear_call(
    _log_rows,
    _log_rows,
    same_as_first,
    same_as_first,
    name="sharding.logged_in_order",
    ordered=True,
)


def _log_native(x):  # the pytree-API form of _log_rows
    with lock:
        effect_rows.append(np.array(x))
        marks.append("native")
    return 2 * x


logged_native = jaxbind.linear_op(
    shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
    name="sharding.logged_native",
    has_side_effect=True,
)(_log_native)
logged_native.def_transpose(_log_native)
logged_native_in_order = jaxbind.linear_op(
    shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
    name="sharding.logged_native_in_order",
    ordered=True,
)(_log_native)
logged_native_in_order.def_transpose(_log_native)
EFFECT_OPS = {
    "has_side_effect": logged,
    "ordered": logged_in_order,
    "native has_side_effect": logged_native,
    "native ordered": logged_native_in_order,
}


def _result(op, x):  # the first output, whichever API made the op
    out = op(x)
    return out[0] if isinstance(out, (list, tuple)) else out


def _partitioners(fn):
    """Run `fn` under Shardy (JAX's default) and under GSPMD."""
    old = jax.config.jax_use_shardy_partitioner
    try:
        for shardy in (True, False):
            jax.config.update("jax_use_shardy_partitioner", shardy)
            try:
                fn()
            except BaseException as exc:
                raise AssertionError(f"{'Shardy' if shardy else 'GSPMD'}: {exc!r}") from exc
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def _uneven_vmap(op, rows):
    effect_rows.clear()
    x = jnp.arange(rows * 2.0).reshape(rows, 2) + 1

    def f(x):
        x = jax.lax.with_sharding_constraint(x, batch_sharded)  # XLA pads to 4 ways
        return jax.vmap(lambda r: _result(op, r))(x)

    _close(jax.jit(f)(x), 2 * np.asarray(x))
    jax.effects_barrier()
    got = sorted(tuple(r) for r in effect_rows)
    want = sorted(tuple(r) for r in np.asarray(x))
    assert got == want, (op.name, rows, got)


def case_effectful_vmap_on_an_uneven_batch_runs_once_per_real_row():
    for op in EFFECT_OPS.values():
        for rows in (1, 3, 6, 8):
            _partitioners(lambda: _uneven_vmap(op, rows))
    return (
        "has_side_effect and ordered ops (both APIs) under vmap on a batch sharded over 4 "
        "devices, padded or not: once per real row, under Shardy and GSPMD; never on padding"
    )


def _sharded_once(op):
    effect_rows.clear()
    xs = jax.device_put(X, batch_sharded)
    _close(jax.jit(lambda x: _result(op, x))(xs), 2 * X)
    jax.effects_barrier()
    assert len(effect_rows) == 1 and effect_rows[0].shape == X.shape, [r.shape for r in effect_rows]


def case_effectful_op_on_a_sharded_input_runs_once():
    for op in EFFECT_OPS.values():
        _partitioners(lambda: _sharded_once(op))
    return (
        "an unbatched effectful op (both APIs) on a sharded input: once, over the whole "
        "array, under Shardy and GSPMD"
    )


def _grad_once(op):
    effect_rows.clear()
    xs = jax.device_put(X, batch_sharded)
    g = jax.jit(jax.grad(lambda x: jnp.sum(_result(op, x) * x)))(xs)
    _close(g, 4 * X)  # d/dx sum(2x * x) = 4x: the forward call and the transpose call
    jax.effects_barrier()
    assert [r.shape for r in effect_rows] == [X.shape, X.shape], [r.shape for r in effect_rows]


def case_grad_of_an_effectful_op_on_a_sharded_input_runs_each_role_once():
    for op in EFFECT_OPS.values():
        _partitioners(lambda: _grad_once(op))
    return "grad of an effectful op on a sharded input: the forward and the transpose once each"


def _mark(tag):
    def mark(x):
        with lock:
            marks.append(tag)
        return x

    return mark


def _io_callbacks_run_here(xs) -> bool:
    """Whether JAX itself runs an ordered io_callback on `xs` (jax 0.7 cannot under Shardy:
    it puts the callback's token on every device, which XLA refuses)."""
    from jax.experimental import io_callback

    try:
        shape = jax.ShapeDtypeStruct(xs.shape, xs.dtype)
        jax.jit(lambda x: io_callback(lambda x: x, shape, x, ordered=True))(xs)
        jax.effects_barrier()
        return True
    except Exception:
        return False


def _in_order():
    from jax.experimental import io_callback

    xs = jax.device_put(X, batch_sharded)
    io = _io_callbacks_run_here(xs)
    marks.clear()
    effect_rows.clear()

    def mark(tag, x):
        if not io:
            return x
        return io_callback(_mark(tag), jax.ShapeDtypeStruct(x.shape, x.dtype), x, ordered=True)

    def f(x):
        x = logged_in_order(mark("io 1", x))[0]
        x = logged_native_in_order(mark("io 2", x))
        x = mark("io 3", x)
        # a callback's result lives on one device; JAX (0.10) cannot take it into the next
        # program under Shardy, for io_callback as for jaxbind: spread it out again
        return jax.lax.with_sharding_constraint(x, batch_sharded)

    step = jax.jit(f)
    for _ in range(3):
        xs = step(xs)
        _ = logged_in_order(xs)  # an eager call between programs, in order too
    jax.effects_barrier()
    _close(xs, 64 * X)
    want = ["io 1", "jaxbind", "io 2", "native", "io 3", "jaxbind"] * 3
    assert marks == [m for m in want if io or not m.startswith("io")], marks
    assert len(effect_rows) == 3 * 3, len(effect_rows)


def case_ordered_ops_keep_program_order_with_io_callbacks_on_sharded_inputs():
    _partitioners(_in_order)
    return "ordered jaxbind calls and ordered io_callbacks on a sharded input run in program order"


def _kernel_case():
    import numba  # noqa: F401

    @jaxbind.kernel
    def double(out, x):
        for i in range(x.size):
            out.flat[i] = 2.0 * x.flat[i]

    op = jaxbind.get_linear_call(
        double,
        double,
        same_as_first,
        same_as_first,
        name="sharding.kernel_effect",
        has_side_effect=True,
    )
    for rows in (3, 8):
        x = jnp.arange(rows * 2.0).reshape(rows, 2)
        f = lambda x: jax.vmap(lambda r: op(r)[0])(
            jax.lax.with_sharding_constraint(x, batch_sharded)
        )
        _close(jax.jit(f)(x), 2 * np.asarray(x))
        _close(jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(x), np.full((rows, 2), 2.0))


def case_effectful_kernel_under_shardy():
    if not importable("numba"):
        return "skipped: numba is not installed"
    _partitioners(_kernel_case)
    return "an effectful numba kernel under vmap and grad on a batch sharded over 4 devices"


_AT_EXIT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, numpy as np, jaxbind
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

def log(out, args, kwargs_dump):
    out[0][...] = args[0]
    print("ran", flush=True)

same = lambda x: ((x.shape, x.dtype),)
op = jaxbind.get_linear_call(log, log, same, same, name="exit.log", ordered=True)
mesh = Mesh(np.array(jax.devices()), ("b",))
xs = jax.device_put(np.ones((8, 2)), NamedSharding(mesh, P("b")))
jax.jit(lambda x: op(x)[0])(xs)  # dispatched, never waited for
print("dispatched", flush=True)
"""


def case_effect_dispatched_just_before_exit_runs():
    proc = run_python("-c", _AT_EXIT, timeout=120)
    assert proc.returncode == 0 and "ran" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
    assert "not running" not in proc.stderr, proc.stderr[-2000:]
    return "an effectful call dispatched under Shardy just before exit runs before jaxbind stops"


def case_kernel_under_shard_map_and_batch_sharded_jit():
    if not importable("numba"):
        return "skipped: numba is not installed"

    @jaxbind.kernel
    def triple(out, x):
        for i in range(x.size):
            out.flat[i] = 3.0 * x.flat[i]

    op = jaxbind.get_linear_call(
        triple, triple, same_as_first, same_as_first, name="sharding.kernel_triple"
    )
    xs = np.arange(8 * 5, dtype=np.float64).reshape(8, 5)
    f = shard_map(lambda x: op(x)[0], mesh=mesh, in_specs=P("b"), out_specs=P("b"))
    _close(jax.jit(f)(xs), 3 * xs)
    _close(jax.jit(jax.grad(lambda x: f(x).sum()))(xs), np.full_like(xs, 3.0))
    sharded = jax.device_put(xs, batch_sharded)
    _close(jax.jit(jax.vmap(lambda x: op(x)[0]))(sharded), 3 * xs)
    return "a numba kernel under shard_map (forward, grad) and a batch-sharded vmap"


def case_parallel_kernels_under_shard_map():
    if not importable("numba"):
        return "skipped: numba is not installed"

    def scaled(begin, end, out, x):  # over rows: each range writes its own rows
        for i in range(begin, end):
            for j in range(x.shape[1]):
                out[i, j] = 3.0 * x[i, j]

    def column_sums(begin, end, out, x):  # over rows, summed into one row
        for i in range(begin, end):
            for j in range(x.shape[1]):
                out[0, j] += x[i, j]

    rows = lambda out, x: x.shape[0]
    op = jaxbind.get_linear_call(
        jaxbind.kernel(scaled, ranges=rows, grain=1),
        jaxbind.kernel(scaled, ranges=rows, grain=1),
        same_as_first,
        same_as_first,
        name="sharding.kernel_ranges",
    )
    sums = jaxbind.get_linear_call(
        jaxbind.kernel(column_sums, ranges=rows, grain=1, reduction="sum"),
        None,
        lambda x: (((1, x.shape[1]), x.dtype),),
        name="sharding.kernel_column_sums",
    )
    xs = np.arange(8 * 5, dtype=np.float64).reshape(8, 5)
    f = shard_map(lambda x: op(x)[0], mesh=mesh, in_specs=P("b"), out_specs=P("b"))
    _close(jax.jit(f)(xs), 3 * xs)
    _close(jax.jit(jax.grad(lambda x: f(x).sum()))(xs), np.full_like(xs, 3.0))
    g = shard_map(lambda x: sums(x)[0], mesh=mesh, in_specs=P("b"), out_specs=P("b"))
    _close(jax.jit(g)(xs), xs.reshape(4, 2, 5).sum(axis=1))
    sharded = jax.device_put(xs.reshape(8, 1, 5), batch_sharded)
    _close(jax.jit(jax.vmap(lambda x: sums(x)[0]))(sharded), xs.reshape(8, 1, 5))
    return "kernels over ranges (one with reduction='sum') under shard_map, grad, vmap"


if __name__ == "__main__":
    run_case_functions(globals(), sys.argv[1:])
