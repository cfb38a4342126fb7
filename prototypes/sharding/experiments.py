"""Route A beyond the basic case: python experiments.py [--gspmd]

E1-E4: meshes and shardings (2-D meshes, a permuted device order, replicated points,
       a sharded grid given to the transpose): results equal one device, the replica
       groups of the one all-reduce, what is gathered.
E5:    the Shardy rule's form: factors with reduction and need-replication declared,
       factors only, no rule at all: what the partitioner callback receives.
E6:    vmap over the partitioned op (a batch of weight sets, the points shared).
E7:    explicit sharding mode (AxisType.Explicit): does the op trace?
E8:    timing, one device against 4 (2 shared cores: indicative only).
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
if "--gspmd" in sys.argv:
    jax.config.update("jax_use_shardy_partitioner", False)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jbpart  # noqa: E402
from deposit import G, deposit, deposit_op, interp  # noqa: E402
from run_route_a import collectives  # noqa: E402

rng = np.random.default_rng(1)
M = 4096
x_np = rng.uniform(0, G, (M, 1))
w_np = rng.standard_normal(M)
want = np.zeros(G)
np.add.at(want, np.floor(x_np[:, 0]).astype(int), w_np)


def show(what, **data):
    print(json.dumps({"check": what, **data}, default=str), flush=True)


def run(name, fn, args, expected):
    jbpart.LOG.clear()
    jax.clear_caches()
    try:
        text = jax.jit(fn).lower(*args).compile().as_text()
        out = np.asarray(jax.jit(fn)(*args))
    except Exception as e:  # noqa: BLE001
        show(name, error=f"{type(e).__name__}: {' '.join(str(e).split())[:600]}")
        return None
    groups = re.findall(r"all-reduce\(.*?replica_groups=(\S+?),? ", text)
    gathered = re.findall(r"= (\S+) all-gather\(", text)
    parts = [e for e in jbpart.LOG if e[0] == "partition"]
    show(name, **collectives(text), replica_groups=groups, gathered_shapes=gathered,
         max_abs_err=float(np.max(np.abs(out - expected))),
         partition_received=parts[0][1] if parts else None,
         partition_returned=parts[0][3] if parts else None,
         partition_result_received=parts[0][2] if parts else None,
         out_type=str(jax.typeof(jax.jit(fn)(*args))) if hasattr(jax, "typeof") else None)
    return text


def main():
    print(f"jax {jax.__version__}, shardy={jax.config.jax_use_shardy_partitioner}")
    devs = np.array(jax.devices())

    # E1: 2x2 mesh, points split over "a" only (replicated over "b")
    mesh = jax.sharding.Mesh(devs.reshape(2, 2), ("a", "b"))
    put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))  # noqa: E731
    run("E1 2x2 mesh, m over 'a'", deposit, (put(x_np, "a", None), put(w_np, "a")), want)
    # E2: 2x2 mesh, m over both axes
    run("E2 2x2 mesh, m over ('a','b')", deposit,
        (put(x_np, ("a", "b"), None), put(w_np, ("a", "b"))), want)
    # E3: a permuted device order
    pmesh = jax.sharding.Mesh(devs[[2, 0, 3, 1]].reshape(2, 2), ("a", "b"))
    pput = lambda a, *spec: jax.device_put(a, NamedSharding(pmesh, P(*spec)))  # noqa: E731
    run("E3 permuted 2x2 mesh, m over 'b'", deposit,
        (pput(x_np, "b", None), pput(w_np, "b")), want)
    # E4: points replicated, weights split
    mesh1 = jax.sharding.Mesh(devs, ("p",))
    put1 = lambda a, *spec: jax.device_put(a, NamedSharding(mesh1, P(*spec)))  # noqa: E731
    run("E4 x replicated, w split", deposit, (put1(x_np), put1(w_np, "p")), want)
    # E4b: the transpose given a grid split over g (g must be replicated: gather the grid only)
    h = rng.standard_normal(G)
    run("E4b interp, grid split over g", interp, (put1(x_np, "p", None), put1(h, "p")),
        h[np.floor(x_np[:, 0]).astype(int)])

    # E5: the Shardy rule's form
    if jax.config.jax_use_shardy_partitioner:
        for mode in ("declared", "plain", "none"):
            jbpart.SDY_MODE = mode
            args = (put1(x_np, "p", None), put1(w_np, "p"))
            text = run(f"E5 sdy rule {mode}: deposit", deposit, args, want)
            if text is not None and mode != "declared":
                pass
            run(f"E5 sdy rule {mode}: interp", interp, (put1(x_np, "p", None), put1(h)),
                h[np.floor(x_np[:, 0]).astype(int)])
            run(f"E5 sdy rule {mode}: interp, grid split over g", interp,
                (put1(x_np, "p", None), put1(h, "p")), h[np.floor(x_np[:, 0]).astype(int)])
            # a sharded consumer: does Shardy push a sharding back into the op's result?
            run(f"E5 sdy rule {mode}: deposit then reshard result over p",
                lambda x, w: jax.lax.with_sharding_constraint(
                    deposit(x, w) * 2, NamedSharding(mesh1, P("p"))), args, 2 * want)
        jbpart.SDY_MODE = "declared"

    # E6: vmap over weight sets (points shared); batch split over "a", points over "b"
    B = 4
    ws = rng.standard_normal((B, M))
    wants = np.stack([np.bincount(np.floor(x_np[:, 0]).astype(int), wb, minlength=G)
                      for wb in ws])
    vdep = jax.vmap(deposit, in_axes=(None, 0))
    run("E6 vmap, batch over 'a', m over 'b'", vdep,
        (put(x_np, "b", None), put(ws, "a", "b")), wants)
    run("E6b vmap, batch replicated, m over 4", vdep,
        (put1(x_np, "p", None), put1(ws, None, "p")), wants)
    grads = jax.vmap(jax.grad(lambda w, x: jnp.sum(deposit(x, w) ** 2)), in_axes=(0, None))
    gw = np.stack([2 * wb[np.floor(x_np[:, 0]).astype(int)] for wb in wants])
    run("E6c vmap of grad, batch over 'a', m over 'b'", grads,
        (put(ws, "a", "b"), put(x_np, "b", None)), gw)

    # E7: explicit sharding mode
    try:
        from jax.sharding import AxisType

        emesh = jax.make_mesh((4,), ("p",), axis_types=(AxisType.Explicit,))
        set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
        with set_mesh(emesh):
            xe = jax.device_put(x_np, NamedSharding(emesh, P("p", None)))
            we = jax.device_put(w_np, NamedSharding(emesh, P("p")))
            run("E7 explicit mode: deposit (route A)", deposit, (xe, we), want)
            he = jax.device_put(rng.standard_normal(G), NamedSharding(emesh, P()))
            run("E7 explicit mode: interp (route A)", interp, (xe, he),
                np.asarray(he)[np.floor(x_np[:, 0]).astype(int)])
            run("E7 explicit mode: plain jaxbind op",
                lambda x, w: deposit_op(x, w, g=G)[0], (xe, we), want)
    except Exception as e:  # noqa: BLE001
        show("E7 explicit mode", error=f"{type(e).__name__}: {str(e)[:400]}")

    # E8: timing (indicative: 4 XLA devices on 2 shared cores)
    big = 1 << 21
    xb = rng.uniform(0, G, (big, 1))
    wb = rng.standard_normal(big)
    one = jax.jit(lambda x, w: deposit_op(x, w, g=G)[0])
    four = jax.jit(deposit)
    xs, ws4 = put1(xb, "p", None), put1(wb, "p")
    for name, fn, args in (("1 device, plain op", one, (jnp.asarray(xb), jnp.asarray(wb))),
                           ("4 devices, route A", four, (xs, ws4)),
                           ("4 devices, plain op (all-gather)", one, (xs, ws4))):
        fn(*args).block_until_ready()
        t = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn(*args).block_until_ready()
            t.append(time.perf_counter() - t0)
        show(f"E8 timing {name}", m=big, best_ms=round(1e3 * min(t), 2))


if __name__ == "__main__":
    main()
