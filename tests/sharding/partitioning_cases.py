"""Ops that partition by a declared rule, on 4 CPU devices (see test_partitioning.py).

``python partitioning_cases.py shardy|gspmd [case ...]`` runs the cases under that
partitioner and prints one JSON line per case: {"case", "ok", "detail"}.
``python partitioning_cases.py load DIR [--without-ops]`` is the fresh process of the
export cases: it loads the artifacts in DIR, compiles and runs them on the same shardings
(only its own definitions of the ops make them runnable) and prints one JSON line per
artifact. The device-count flag is set here, before JAX is imported.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support.ops import sine, sine_derivative
from support.processes import run_case_functions, run_python

import jaxbind
from jaxbind.testing import collectives

jax.config.update("jax_enable_x64", True)
if sys.argv[1:2] == ["gspmd"]:
    jax.config.update("jax_use_shardy_partitioner", False)

G = 64  # grid cells
M = 4096  # points
mesh = Mesh(np.array(jax.devices()), ("p",))
mesh2 = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
try:
    shard_map = jax.shard_map  # jax >= 0.7 (public)
except AttributeError:  # pragma: no cover
    from jax.experimental.shard_map import shard_map


def _cells(x):
    return np.floor(x[:, 0]).astype(np.int64) % G


# --- ops ---------------------------------------------------------------------------------


def _deposit(out, args, kwargs_dump):  # points (m) to grid (g): grid[cell(x)] += w
    x, w = args
    out[0][...] = 0
    np.add.at(out[0], _cells(x), w)


def _interp(out, args, kwargs_dump):  # its transpose: w = grid[cell(x)]
    x, grid = args
    out[0][...] = grid[_cells(x)]


def define_ops():
    """The ops, the same in every process (programs find them by name)."""
    ops = {}
    ops["deposit"] = jaxbind.get_linear_call(
        _deposit,
        _interp,
        lambda x, w: (((G,), w.dtype),),
        lambda x, grid: (((x.shape[0],), grid.dtype),),
        first_n_args_fixed=1,
        name="partitioning.deposit",
        sharding="m d, m -> g",
        reduction=("m",),
    )

    @jaxbind.linear_op(
        shape=lambda x, w: jax.ShapeDtypeStruct((G,), w.dtype),
        fixed=1,
        name="partitioning.deposit_native",
        sharding="m d, m -> g",
        reduction=("m",),
    )
    def deposit_native(x, w):
        grid = np.zeros(G, w.dtype)
        np.add.at(grid, _cells(x), w)
        return grid

    @deposit_native.def_transpose
    def _(x, grid):
        return grid[_cells(x)]

    ops["deposit_native"] = deposit_native

    def _two(out, args, kwargs_dump):  # two grids: the weights and twice them
        x, w = args
        _deposit(out[:1], args, kwargs_dump)
        out[1][...] = 0
        np.add.at(out[1], _cells(x), 2 * w)

    def _two_T(out, args, kwargs_dump):
        x, g1, g2 = args
        out[0][...] = g1[_cells(x)] + 2 * g2[_cells(x)]

    ops["two"] = jaxbind.get_linear_call(
        _two,
        _two_T,
        lambda x, w: (((G,), w.dtype), ((G,), w.dtype)),
        lambda x, g1, g2: (((x.shape[0],), g1.dtype),),
        first_n_args_fixed=1,
        name="partitioning.two",
        sharding="m d, m -> g, g",
        reduction=("m",),
    )

    def _energy(out, args, kwargs_dump):  # nonlinear: sum(sin(x) * x) over the points
        (x,) = args
        out[0][...] = np.sum(np.sin(x) * x)

    def _energy_jvp(out, args, kwargs_dump):
        x, dx = args
        out[0][...] = np.sum((np.cos(x) * x + np.sin(x)) * dx)

    def _energy_vjp(out, args, kwargs_dump):
        x, ct = args
        out[0][...] = (np.cos(x) * x + np.sin(x)) * ct

    ops["energy"] = jaxbind.get_nonlinear_call(
        _energy,
        (_energy_jvp, _energy_vjp),
        lambda x: (((), x.dtype),),
        name="partitioning.energy",
        sharding="m -> ",
        reduction=("m",),
    )

    ops["sine"] = jaxbind.get_nonlinear_call(
        sine,
        (sine_derivative, sine_derivative),
        lambda x: ((x.shape, x.dtype),),
        name="partitioning.sine",
        sharding="m k -> m k",
    )

    def _matvec(out, args, kwargs_dump):  # nonlinear in (A, x) jointly: A @ x
        a, x = args
        out[0][...] = a @ x

    def _matvec_jvp(out, args, kwargs_dump):
        a, x, da, dx = args
        out[0][...] = da @ x + a @ dx

    def _matvec_vjp(out, args, kwargs_dump):
        a, x, ct = args
        out[0][...] = np.outer(ct, x)
        out[1][...] = a.T @ ct

    ops["matvec"] = jaxbind.get_nonlinear_call(
        _matvec,
        (_matvec_jvp, _matvec_vjp),
        lambda a, x: (((a.shape[0],), x.dtype),),
        lambda a, x, ct: ((a.shape, a.dtype), (x.shape, x.dtype)),
        name="partitioning.matvec",
        sharding="n k, k -> n",
        reduction=("k",),
    )

    def _product(out, args, kwargs_dump):  # multilinear: elementwise a * b
        a, b = args
        out[0][...] = a * b

    def _product_T(out, args, kwargs_dump):  # either transpose: the other times ct
        other, ct = args
        out[0][...] = other * ct

    ops["product"] = jaxbind.get_linear_call(
        _product,
        (_product_T, _product_T),
        lambda a, b: ((a.shape, a.dtype),),
        name="partitioning.product",
        sharding="n, n -> n",
    )

    def _deposit_batches(out, args, kwargs_dump):  # is vectorized: w's batch axis anywhere
        x, w = args
        axes = jaxbind.load_kwargs(kwargs_dump).get("batch_axes")
        if not (axes and axes[1]):
            return _deposit(out, args, kwargs_dump)
        w = np.moveaxis(w, axes[1][0], 0)
        out[0][...] = 0
        for row, weights in zip(out[0], w):
            np.add.at(row, _cells(x), weights)

    def _batches_abstract(x, w, batch_axes=None):
        if batch_axes and batch_axes[1]:
            return (((w.shape[batch_axes[1][0]], G), w.dtype, 0),)
        return (((G,), w.dtype, None),)

    ops["vectorized"] = jaxbind.get_linear_call(
        _deposit_batches,
        None,
        _batches_abstract,
        first_n_args_fixed=1,
        func_can_batch=True,
        name="partitioning.vectorized",
        sharding="m d, m -> g",
        reduction=("m",),
    )
    ops["interp"] = jaxbind.get_linear_call(  # the interpolation as an op of its own
        _interp,
        _deposit,
        lambda x, grid: (((x.shape[0],), grid.dtype),),
        lambda x, w: (((G,), w.dtype),),
        first_n_args_fixed=1,
        name="partitioning.interp",
        sharding="m d, g -> m",
    )
    ops["plain"] = jaxbind.get_linear_call(  # the deposit without a rule
        _deposit,
        _interp,
        lambda x, w: (((G,), w.dtype),),
        lambda x, grid: (((x.shape[0],), grid.dtype),),
        first_n_args_fixed=1,
        name="partitioning.plain",
    )
    return ops


OPS = define_ops()


def _points(seed=0, m=M):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, G, (m, 1)), rng.normal(size=m)


def _put(array, spec, on=mesh):
    return jax.device_put(array, NamedSharding(on, spec))


def _close(a, b, tol=1e-10):
    error = float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    assert error <= tol, f"error {error} > {tol}"
    return error


def _expect(compiled, all_gather=0, all_reduce=None, total=None):
    found = collectives(compiled)
    assert found["all-gather"] == all_gather, (found.counts, found.groups)
    if all_reduce is not None:
        assert found["all-reduce"] == all_reduce, (found.counts, found.groups)
    if total is not None:
        assert found.total == total, (found.counts, found.groups)
    assert "jaxbind_partitioned" not in found.custom_calls, found.custom_calls
    return found


def _summary(found, error=None) -> str:
    counts = {k: v for k, v in found.counts.items() if v}
    groups = {k: v for k, v in found.groups.items() if v}
    return f"collectives {counts or 'none'} {groups or ''}" + (
        f", max error vs one device {error:.2g}" if error is not None else ""
    )


# --- cases -------------------------------------------------------------------------------


def _deposit_case(op):
    x, w = _points()
    xs, ws = _put(x, P("p")), _put(w, P("p"))
    f = jax.jit(lambda x, w: op(x, w)[0] if isinstance(op, jaxbind.Op) else op(x, w))
    compiled = f.lower(xs, ws).compile()
    found = _expect(compiled, all_gather=0, all_reduce=1)
    assert found.custom_calls.count("jaxbind_cpu") == 1, found.custom_calls
    error = _close(compiled(xs, ws), f(x, w))
    return _summary(found, error) + f"; local call {found.custom_calls}"


def case_deposit_has_one_all_reduce_and_no_all_gather():
    return _deposit_case(OPS["deposit"])


def case_native_deposit_has_one_all_reduce_and_no_all_gather():
    return _deposit_case(OPS["deposit_native"])


def case_transpose_runs_split_without_collectives():
    x, _ = _points()
    grid = np.random.default_rng(1).normal(size=G)
    xs = _put(x, P("p"))
    dep = OPS["deposit"]
    w_like = jax.ShapeDtypeStruct((M,), grid.dtype)

    def interp(x, grid):
        return jax.linear_transpose(lambda w: dep(x, w)[0], w_like)(grid)[0]

    f = jax.jit(interp)
    compiled = f.lower(xs, grid).compile()
    found = _expect(compiled, total=0)
    out = compiled(xs, grid)
    assert out.sharding.spec[0] == "p", out.sharding  # split on m, as the points
    error = _close(out, f(x, grid))
    return _summary(found, error)


def case_grad_matches_one_device():
    x, w = _points()
    h = np.random.default_rng(2).normal(size=G)
    xs, ws = _put(x, P("p")), _put(w, P("p"))
    out = {}
    for name in ("deposit", "deposit_native"):
        op = OPS[name]

        def loss(x, w, op=op):
            grid = op(x, w)[0] if isinstance(op, jaxbind.Op) else op(x, w)
            return jnp.sum(grid * h) + 0.5 * jnp.sum(grid**2)

        g = jax.jit(jax.grad(loss, argnums=1))
        compiled = g.lower(xs, ws).compile()
        found = _expect(compiled, all_gather=0, all_reduce=1)
        out[name] = _summary(found, _close(compiled(xs, ws), g(x, w)))
    return "; ".join(f"{k}: {v}" for k, v in out.items())


def case_one_device_and_shard_map_lower_as_today():
    x, w = _points()
    dep = OPS["deposit"]
    text = jax.jit(lambda x, w: dep(x, w)[0]).lower(x, w).as_text()
    assert "jaxbind_partitioned" not in text and "jaxbind_cpu" in text
    f = shard_map(
        lambda x, w: jax.lax.psum(dep(x, w)[0], "p"),
        mesh=mesh,
        in_specs=(P("p"), P("p")),
        out_specs=P(),
    )
    xs, ws = _put(x, P("p")), _put(w, P("p"))
    lowered = jax.jit(f).lower(xs, ws)
    assert "jaxbind_partitioned" not in lowered.as_text()
    error = _close(jax.jit(f)(xs, ws), jax.jit(lambda x, w: dep(x, w)[0])(x, w))
    return f"one device and shard_map: jaxbind_cpu as before (shard_map + psum error {error:.2g})"


def case_shardy_rule_declares_reduction_where_jax_can():
    """jax 0.10 and newer take reduction and need-replication factors; jax 0.7 gets the
    factors alone (the partitioner decides the same splits: the other cases pass)."""
    if not jax.config.jax_use_shardy_partitioner:
        return "GSPMD: no Shardy rule (the partitioner's infer callback gives the shardings)"
    x, w = _points()
    dep = OPS["deposit"]
    text = jax.jit(lambda x, w: dep(x, w)[0]).lower(_put(x, P("p")), _put(w, P("p"))).as_text()
    line = next(s for s in text.splitlines() if "@jaxbind_partitioned" in s)
    rule = line[line.index("#sdy.op_sharding_rule") :].split(", custom>")[0]
    assert rule.startswith("#sdy.op_sharding_rule<([i, j], [i])->([k])"), rule
    newer = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)
    assert ("reduction={i}" in rule) == newer, rule
    assert ("need_replication={j, k}" in rule) == newer, rule
    return rule


def case_ops_without_a_rule_are_unchanged():
    x, w = _points()
    xs, ws = _put(x, P("p")), _put(w, P("p"))
    plain = OPS["plain"]
    f = jax.jit(lambda x, w: plain(x, w)[0])
    assert "jaxbind_partitioned" not in f.lower(xs, ws).as_text()
    found = collectives(f.lower(xs, ws).compile())
    assert found["all-gather"] >= 1 and found["all-reduce"] == 0, found.counts  # gathered
    _close(f(xs, ws), f(x, w))
    return "plain op: " + _summary(found)


def case_mesh_2x2_reduces_over_the_split_axis_only():
    x, w = _points()
    dep = OPS["deposit"]
    f = jax.jit(lambda x, w: dep(x, w)[0])
    results = []
    for spec in (P("a"), P(("a", "b"))):
        xs, ws = _put(x, spec, mesh2), _put(w, spec, mesh2)
        compiled = f.lower(xs, ws).compile()
        found = _expect(compiled, all_gather=0, all_reduce=1)
        results.append(f"m over {spec}: " + _summary(found, _close(compiled(xs, ws), f(x, w))))
    return "; ".join(results)


def case_vmap_composes_with_the_rule():
    x, _ = _points()
    ws = np.random.default_rng(3).normal(size=(4, M))
    dep = OPS["deposit"]
    f = jax.jit(jax.vmap(lambda x, w: dep(x, w)[0], in_axes=(None, 0)))
    xs = _put(x, P("b"), mesh2)
    wss = _put(ws, P("a", "b"), mesh2)
    compiled = f.lower(xs, wss).compile()
    found = _expect(compiled, all_gather=0, all_reduce=1)
    error = _close(compiled(xs, wss), f(x, ws))
    out = compiled(xs, wss)
    assert out.sharding.spec[0] == "a", out.sharding  # the batch stays split
    g = jax.jit(
        jax.vmap(jax.grad(lambda x, w: jnp.sum(dep(x, w)[0] ** 2), argnums=1), in_axes=(None, 0))
    )
    compiled_g = g.lower(xs, wss).compile()
    found_g = _expect(compiled_g, all_gather=0, all_reduce=1)
    error_g = _close(compiled_g(xs, wss), g(x, ws))
    return f"vmap: {_summary(found, error)}; vmap(grad): {_summary(found_g, error_g)}"


def case_vmap_of_natively_batching_op_and_nested_vmap():
    x, _ = _points()
    ws = np.random.default_rng(3).normal(size=(M, 4))  # the batch axis last
    f = jax.jit(jax.vmap(lambda x, w: OPS["vectorized"](x, w)[0], in_axes=(None, 1)))
    xs, wss = _put(x, P("b"), mesh2), _put(ws, P("b", "a"), mesh2)
    compiled = f.lower(xs, wss).compile()
    found = _expect(compiled, all_gather=0, all_reduce=1)
    error = _close(compiled(xs, wss), f(x, ws))
    dep = OPS["deposit"]
    w3 = np.random.default_rng(4).normal(size=(2, 2, M))
    g = jax.jit(jax.vmap(jax.vmap(lambda x, w: dep(x, w)[0], in_axes=(None, 0)), in_axes=(None, 0)))
    w3s = _put(w3, P("a", None, "b"), mesh2)
    compiled_g = g.lower(xs, w3s).compile()
    found_g = _expect(compiled_g, all_gather=0, all_reduce=1)
    error_g = _close(compiled_g(xs, w3s), g(x, w3))
    return (
        f"vectorized batching: {_summary(found, error)}; vmap(vmap): {_summary(found_g, error_g)}"
    )


def case_two_outputs_are_both_summed():
    x, w = _points()
    xs, ws = _put(x, P("p")), _put(w, P("p"))
    two = OPS["two"]
    f = jax.jit(lambda x, w: two(x, w))
    compiled = f.lower(xs, ws).compile()
    found = _expect(compiled, all_gather=0)
    assert 1 <= found["all-reduce"] <= 2, found.counts  # XLA may combine the two
    error = max(_close(a, b) for a, b in zip(compiled(xs, ws), f(x, w)))
    h = np.random.default_rng(4).normal(size=G)
    g = jax.jit(jax.grad(lambda x, w: jnp.sum(two(x, w)[0] * h + two(x, w)[1] ** 2), argnums=1))
    compiled_g = g.lower(xs, ws).compile()
    found_g = _expect(compiled_g, all_gather=0)
    error_g = _close(compiled_g(xs, ws), g(x, w))
    return f"two outputs: {_summary(found, error)}; grad: {_summary(found_g, error_g)}"


def case_nonlinear_jvp_and_vjp_follow_the_rule():
    x = np.random.default_rng(5).normal(size=M)
    t = np.random.default_rng(6).normal(size=M)
    xs, ts = _put(x, P("p")), _put(t, P("p"))
    energy = OPS["energy"]
    f = jax.jit(lambda x: energy(x)[0])
    found_f = _expect(f.lower(xs).compile(), all_gather=0, all_reduce=1)
    error_f = _close(f(xs), f(x))
    jvp = jax.jit(lambda x, t: jax.jvp(lambda x: energy(x)[0], (x,), (t,)))
    compiled = jvp.lower(xs, ts).compile()
    found_jvp = _expect(compiled, all_gather=0)
    assert found_jvp["all-reduce"] in (1, 2), found_jvp.counts  # f's and the JVP's sums
    error_jvp = max(_close(a, b) for a, b in zip(compiled(xs, ts), jvp(x, t)))
    grad = jax.jit(jax.grad(lambda x: energy(x)[0]))
    compiled = grad.lower(xs).compile()
    found_vjp = _expect(compiled, all_gather=0, all_reduce=0)  # the VJP splits over m
    out = compiled(xs)
    assert out.sharding.spec[0] == "p", out.sharding
    error_vjp = _close(out, grad(x))
    sine = OPS["sine"]
    y = np.random.default_rng(7).normal(size=(M, 3))
    ys = _put(y, P("p"))
    g2 = jax.jit(jax.grad(lambda y: jnp.sum(sine(y)[0] ** 2)))
    found_sine = _expect(g2.lower(ys).compile(), all_gather=0)
    error_sine = _close(g2(ys), g2(y))
    return (
        f"f: {_summary(found_f, error_f)}; jvp: {_summary(found_jvp, error_jvp)}; "
        f"grad (vjp): {_summary(found_vjp, error_vjp)}; elementwise grad: "
        f"{_summary(found_sine, error_sine)}"
    )


def case_vjp_sums_only_the_cotangents_that_lack_the_split_factor():
    rng = np.random.default_rng(8)
    a, x = rng.normal(size=(64, 8)), rng.normal(size=8)
    matvec = OPS["matvec"]
    loss = jax.jit(jax.grad(lambda a, x: jnp.sum(jnp.sin(matvec(a, x)[0])), argnums=(0, 1)))
    out = []
    for spec_a, spec_x in ((P("p"), P()), (P(None, "p"), P("p"))):
        az, xz = _put(a, spec_a), _put(x, spec_x)
        compiled = loss.lower(az, xz).compile()
        found = _expect(compiled, all_gather=0)
        got = compiled(az, xz)
        error = max(_close(g, e) for g, e in zip(got, loss(a, x)))
        out.append(f"A {spec_a}, x {spec_x}: {_summary(found, error)}")
    return "; ".join(out)


def case_multilinear_transposes_follow_the_rule():
    rng = np.random.default_rng(9)
    a, b = rng.normal(size=M), rng.normal(size=M)
    product = OPS["product"]
    grad = jax.jit(jax.grad(lambda a, b: jnp.sum(product(a, b)[0] ** 2), argnums=(0, 1)))
    az, bz = _put(a, P("p")), _put(b, P("p"))
    compiled = grad.lower(az, bz).compile()
    found = _expect(compiled, total=0)
    error = max(_close(g, e) for g, e in zip(compiled(az, bz), grad(a, b)))
    return _summary(found, error)


def case_explicit_mode_types_results_by_the_rule():
    """AxisType.Explicit: the rule partitions as in auto mode, and types a forward call's
    results at trace time (the interpolation's split on m like the points), so that the
    next op keeps them split; grads work on any layout (a transpose's results stay
    untyped: JAX checks cotangent types against the primals')."""
    from jax.sharding import AxisType

    x, w = _points()
    grid = np.random.default_rng(1).normal(size=G)
    dep, interp = OPS["deposit"], OPS["interp"]
    explicit = jax.make_mesh((4,), ("p",), axis_types=(AxisType.Explicit,))
    set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh  # 0.7: use_mesh
    types = {}

    def both(x, w, grid):
        g, y = dep(x, w)[0], interp(x, grid)[0]
        types["deposit"], types["interp"] = str(jax.typeof(g)), str(jax.typeof(y))
        return g, y + 1.0

    def loss(x, w):
        return jnp.sum(dep(x, w)[0] ** 2)

    grads = []
    with set_mesh(explicit):
        xs = jax.device_put(x, NamedSharding(explicit, P("p", None)))
        ws = jax.device_put(w, NamedSharding(explicit, P("p")))
        gs = jax.device_put(grid, NamedSharding(explicit, P()))
        f = jax.jit(both)
        compiled = f.lower(xs, ws, gs).compile()
        found = _expect(compiled, all_gather=0, all_reduce=1)
        g, y = compiled(xs, ws, gs)
        for xa, wa in ((xs, ws), (jax.device_put(x, NamedSharding(explicit, P())), ws)):
            grads.append(jax.jit(jax.grad(loss, argnums=1))(xa, wa))
    assert types == {"deposit": "float64[64]", "interp": "float64[4096@p]"}, types
    error = max(_close(g, dep(x, w)[0]), _close(y, interp(x, grid)[0] + 1.0))
    error_grad = max(_close(gr, jax.grad(loss, argnums=1)(x, w)) for gr in grads)
    return (
        f"explicit mode: types {types}; {_summary(found, error)}; grad on two layouts: "
        f"error {error_grad:.2g}"
    )


def case_uneven_split_is_not_summed_with_padding():
    x, w = _points(m=10)
    dep = OPS["deposit"]

    def f(x, w):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("p")))
        w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P("p")))
        return dep(x, w)[0]

    error = _close(jax.jit(f)(x, w), jax.jit(lambda x, w: dep(x, w)[0])(x, w))
    return f"10 points on 4 devices: error {error:.2g}"


def case_handler_runs_the_call_where_nothing_partitions_it():
    """The attributes of a partitioned call, run by jaxbind's handler under the name
    jaxbind_partitioned in a one-device program (as an artifact compiled unpartitioned)."""
    from jaxbind._compat import parse_attribute_dict

    x, w = _points()
    dep = OPS["deposit"]
    xs, ws = _put(x, P("p")), _put(w, P("p"))
    text = jax.jit(lambda x, w: dep(x, w)[0]).lower(xs, ws).as_text(debug_info=False)
    line = next(s for s in text.splitlines() if "@jaxbind_partitioned" in s)
    start = line.index("mhlo.backend_config = ") + len("mhlo.backend_config = ")
    depth = 0
    for end in range(start, len(line)):  # the dictionary's closing brace
        depth += {"{": 1, "}": -1}.get(line[end], 0)
        if depth == 0:
            break
    found = parse_attribute_dict(line[start : end + 1])
    assert "partitioning" in found and "site" in found, sorted(found)
    attrs = {
        k: (np.frombuffer(v, np.uint8) if isinstance(v, bytes) else v) for k, v in found.items()
    }
    for k in ("jaxbind_format", "loop_levels", "n_fixed"):
        attrs[k] = np.int32(attrs[k])
    attrs["site"] = np.int64(attrs["site"])
    call = jax.ffi.ffi_call("jaxbind_partitioned", jax.ShapeDtypeStruct((G,), w.dtype))
    error = _close(jax.jit(lambda x, w: call(x, w, **attrs))(x, w), dep(x, w)[0])
    return f"jaxbind_partitioned run whole by the handler: error {error:.2g}"


def case_export_loads_in_a_fresh_process():
    import tempfile

    x, w = _points()
    h = np.random.default_rng(2).normal(size=G)
    xs, ws = _put(x, P("p")), _put(w, P("p"))
    dep = OPS["deposit"]
    programs = {
        "deposit": lambda x, w: dep(x, w)[0],
        "grad": jax.grad(
            lambda x, w: jnp.sum(dep(x, w)[0] * h) + 0.5 * jnp.sum(dep(x, w)[0] ** 2), 1
        ),
    }
    directory = pathlib.Path(tempfile.mkdtemp(prefix="jaxbind-partitioning-"))
    for name, fn in programs.items():
        exported = jaxbind.export(jax.jit(fn))(xs, ws)
        assert "jaxbind_partitioned" in exported.mlir_module()
        (directory / f"{name}.bin").write_bytes(exported.serialize())
        np.save(directory / f"{name}.npy", np.asarray(jax.jit(fn)(x, w)))
    np.save(directory / "x.npy", x)
    np.save(directory / "w.npy", w)
    loads = {}
    for mode in ((), ("--without-ops",)):
        proc = run_python(pathlib.Path(__file__), "load", directory, *mode, timeout=300)
        lines = [json.loads(s) for s in proc.stdout.splitlines() if s.startswith("{")]
        assert lines, proc.stderr[-3000:]
        loads[mode] = lines
    for entry in loads[()]:
        assert entry["ok"], entry
    for entry in loads[("--without-ops",)]:
        assert not entry["ok"], entry
        assert "no binding named 'partitioning.deposit'" in entry["detail"], entry["detail"]
        assert "Import (or run) the module" in entry["detail"], entry["detail"]
    return "fresh process: " + "; ".join(f"{e['name']}: {e['detail']}" for e in loads[()])


def _centered(out, args, kwargs_dump):  # w - mean(w): every value depends on every point
    (w,) = args
    out[0][...] = w - w.mean()


def case_check_on_a_mesh_compares_each_split_with_one_device():
    x, w = _points(m=256)
    report = jaxbind.testing.check(OPS["deposit"], x, w, mesh=mesh, verbose=False)
    rows = {(r.check, r.target): r for r in report}
    for target in ("m over 'p': output 0", "m over 'p': argument 1"):
        kind = "mesh vs one device" if "output" in target else "mesh gradient vs one device"
        assert rows[kind, target].ok, rows[kind, target]
    split = rows["collectives on a mesh", "m over 'p'"]
    assert (
        split.ok
        and "f: 1 all-reduce" in split.detail
        and "gather" not in split.detail.split("(")[0]
    ), split
    whole = rows["collectives on a mesh", "d over 'p'"]
    assert not whole.checked and "does not split evenly" in whole.detail, whole
    report2 = jaxbind.testing.check(OPS["deposit"], x, w, mesh=mesh2, verbose=False)
    on2 = {r.target for r in report2 if r.check == "collectives on a mesh" and r.ok}
    assert on2 == {"m over 'a'", "m over 'b'"}, on2
    return split.detail


def case_check_on_a_mesh_fails_a_wrong_rule():
    wrong = jaxbind.get_linear_call(
        _centered,
        _centered,
        lambda w: (((w.shape[0],), w.dtype),),
        lambda w: (((w.shape[0],), w.dtype),),
        name="partitioning.centered_wrong_rule",
        sharding="m -> m",  # wrong: each value sums over every m
    )
    _, w = _points(m=256)
    try:
        jaxbind.testing.check(wrong, w, mesh=mesh, verbose=False)
    except AssertionError as exc:
        text = str(exc)
    else:
        raise AssertionError("check passed an op whose rule is wrong")
    assert "mesh vs one device [m over 'p': output 0" in text, text
    return text.splitlines()[1]


def _wgridder_problem(rows=64, chans=4, npix=32):
    from jaxbind.contrib.jaxducc0 import get_wgridder

    rng = np.random.default_rng(1)
    uvw = rng.uniform(-100, 100, (rows, 3)) * np.array([1, 1, 0.1])
    freq = np.linspace(1e8, 1.2e8, chans)
    image = rng.normal(size=(npix, npix))
    vis = rng.normal(size=(rows, chans)) + 1j * rng.normal(size=(rows, chans))
    op = get_wgridder(
        pixsize_x=1e-4,
        pixsize_y=1e-4,
        npix_x=npix,
        npix_y=npix,
        epsilon=1e-12,
        do_wgridding=True,
    )
    return op, uvw, freq, image, vis


def case_wgridder_splits_visibilities_and_sums_the_image():
    op, uvw, freq, image, vis = _wgridder_problem()
    report = jaxbind.testing.check(op, uvw, freq, image, mesh=mesh, verbose=False)
    rows = {(r.check, r.target): r for r in report}
    for check in ("mesh vs one device", "mesh gradient vs one device", "collectives on a mesh"):
        assert all(r.ok for (c, t), r in rows.items() if c == check and t.startswith("r ")), rows
    # the image from visibilities (ms2dirty): rows split, one all-reduce of the image
    dirty = jax.jit(
        lambda uvw, freq, vis: jax.linear_transpose(
            lambda im: op(uvw, freq, im)[0], jnp.zeros(image.shape)
        )(vis)[0]
    )
    compiled = dirty.lower(_put(uvw, P("p")), freq, _put(vis, P("p"))).compile()
    found = _expect(compiled, all_gather=0, all_reduce=1)
    error = _close(
        compiled(_put(uvw, P("p")), freq, _put(vis, P("p"))),
        dirty(uvw, freq, vis),
        1e-10 * np.abs(dirty(uvw, freq, vis)).max(),
    )
    return _summary(found, error) + "; check: " + rows["collectives on a mesh", "r over 'p'"].detail


def case_nufft_types_1_and_2_split_the_points():
    from jaxbind.contrib.jaxducc0 import get_nufft

    rng = np.random.default_rng(2)
    coord = rng.uniform(0, 2 * np.pi, (256, 2))
    details = []
    for kind, n_reduce in ((1, 1), (2, 0)):
        op = get_nufft(coord, (16, 12), nufft_type=kind, epsilon=1e-12)
        shape = (256,) if kind == 1 else (16, 12)
        values = rng.normal(size=shape) + 1j * rng.normal(size=shape)
        report = jaxbind.testing.check(op, values, mesh=mesh, verbose=False)
        rows = {(r.check, r.target): r for r in report}
        for check in ("mesh vs one device", "mesh gradient vs one device"):
            assert rows[check, f"m over 'p': {'output 0' if check[5] == 'v' else 'argument 1'}"].ok
        split = rows["collectives on a mesh", "m over 'p'"]
        assert split.ok, split
        # the points split: no all-gather of them; type 1 sums its grid by one all-reduce
        f = jax.jit(lambda c, v: get_nufft(c, (16, 12), nufft_type=kind, epsilon=1e-12)(v)[0])
        placed = (_put(coord, P("p")), _put(values, P("p")) if kind == 1 else values)
        compiled = f.lower(*placed).compile()
        found = _expect(compiled, all_gather=0, all_reduce=n_reduce)
        error = _close(compiled(*placed), f(coord, values), 1e-10 * np.abs(f(coord, values)).max())
        details.append(f"type {kind}: {_summary(found, error)}")
    return "; ".join(details)


def case_finufft_nufft1_and_nufft2_split_the_points():
    from jaxbind.contrib.ducc.nufft_points import nufft_points
    from jaxbind.contrib.jaxducc0 import nufft1, nufft2

    rng = np.random.default_rng(3)
    m, grid = 256, (16, 12)
    x, y = rng.uniform(-np.pi, np.pi, (2, m))
    c = rng.normal(size=m) + 1j * rng.normal(size=m)
    f = rng.normal(size=grid) + 1j * rng.normal(size=grid)
    details = []
    for kind, fn, values, n_reduce in (
        (1, lambda c, x, y: nufft1(grid, c, x, y, eps=1e-12), c, 1),
        (2, lambda f, x, y: nufft2(f, x, y, eps=1e-12), f, 0),
    ):
        kw = dict(nufft_type=kind, sign=1 if kind == 1 else -1, eps=1e-12, modeord=0)
        kw.update(nthreads=1, grid=grid if kind == 1 else None)
        report = jaxbind.testing.check(
            nufft_points.op, values[None], np.stack([x, y]), mesh=mesh, verbose=False, **kw
        )
        split = [r for r in report if r.target.startswith("m over")]
        assert split and all(r.ok for r in split), [str(r) for r in split]
        put_v = _put(values, P("p")) if kind == 1 else values
        placed = (put_v, _put(x, P("p")), _put(y, P("p")))
        compiled = jax.jit(fn).lower(*placed).compile()
        found = _expect(compiled, all_gather=0, all_reduce=n_reduce)
        one = fn(values, x, y)
        error = _close(compiled(*placed), one, 1e-10 * np.abs(one).max())
        loss = lambda v, x, y: jnp.sum(jnp.abs(fn(v, x, y)) ** 2)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*placed).compile()
        _expect(grads, all_gather=0)
        for a, b in zip(grads(*placed), jax.grad(loss, argnums=(0, 1, 2))(values, x, y)):
            _close(a, b, 1e-10 * np.abs(b).max())
        details.append(f"nufft{kind}: {_summary(found, error)}")
    return "; ".join(details)


def load(directory: pathlib.Path) -> None:
    """The fresh process: every artifact compiled on the same shardings, its collectives
    and its results against one device's (saved by the exporting process)."""
    jax.config.update("jax_use_shardy_partitioner", True)  # GSPMD artifacts load here too
    x, w = np.load(directory / "x.npy"), np.load(directory / "w.npy")
    xs, ws = _put(x, P("p")), _put(w, P("p"))
    for name in ("deposit", "grad"):
        try:
            exported = jax.export.deserialize((directory / f"{name}.bin").read_bytes())
            compiled = jax.jit(exported.call).lower(xs, ws).compile()
            found = _expect(compiled, all_gather=0, all_reduce=1)
            error = _close(compiled(xs, ws), np.load(directory / f"{name}.npy"))
            entry = {"name": name, "ok": True, "detail": _summary(found, error)}
        except Exception as exc:
            entry = {"name": name, "ok": False, "detail": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(entry), flush=True)


def main():
    if sys.argv[1] == "load":
        if "--without-ops" in sys.argv:
            from jaxbind._binding import _registry

            _registry.clear()
        load(pathlib.Path(sys.argv[2]))
        return
    run_case_functions(globals(), sys.argv[2:], limit=8, jax=jax.__version__)


if __name__ == "__main__":
    main()
