"""Route A, end to end: python run_route_a.py [--gspmd]

Points x[m, 1], weights w[m] sharded over 4 CPU devices (NamedSharding, mesh axis "p");
deposit onto a grid of 64 cells under plain jax.jit; grad through it (the transpose,
an interpolation); jax.export, then load and run in a fresh process. Prints one JSON line
per check.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
if "--gspmd" in sys.argv:
    jax.config.update("jax_use_shardy_partitioner", False)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxbind  # noqa: E402
import jbpart  # noqa: E402
from deposit import G, deposit, deposit_op, interp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def collectives(text: str) -> dict:
    names = ["all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter"]
    found = {n: len(re.findall(rf"= \S+ {n}(-start)?\(", text)) for n in names}
    found["custom-calls"] = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
    return found


def show(what, **data):
    print(json.dumps({"check": what, **data}, default=str), flush=True)


def main():
    print(f"jax {jax.__version__}, shardy={jax.config.jax_use_shardy_partitioner}")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("p",))
    rng = np.random.default_rng(0)
    m = 4096
    x_np = rng.uniform(0, G, (m, 1))
    w_np = rng.standard_normal(m)
    ps = NamedSharding(mesh, P("p"))
    x = jax.device_put(x_np, NamedSharding(mesh, P("p", None)))
    w = jax.device_put(w_np, ps)

    # one device, the plain op: the reference
    ref = np.asarray(jax.jit(lambda x, w: deposit_op(x, w, g=G)[0])(x_np, w_np))
    want = np.zeros(G)
    np.add.at(want, np.floor(x_np[:, 0]).astype(int), w_np)
    assert np.allclose(ref, want)

    # 1. forward: deposit under plain jit
    f = jax.jit(deposit)
    jbpart.LOG.clear()
    t0 = time.perf_counter()
    compiled = f.lower(x, w).compile()
    show("compile_s", seconds=round(time.perf_counter() - t0, 3))
    text = compiled.as_text()
    open(os.path.join(HERE, "results", f"fwd_{jax.__version__}_{mode()}.hlo.txt"), "w").write(text)
    show("forward collectives", **collectives(text))
    show("partitioner calls", log=jbpart.LOG[:4])
    out = f(x, w)
    show("forward result", max_abs_err=float(np.max(np.abs(np.asarray(out) - ref))),
         sharding=str(out.sharding))

    # the plain jaxbind op under the same jit, for contrast
    plain = jax.jit(lambda x, w: deposit_op(x, w, g=G)[0]).lower(x, w).compile().as_text()
    show("plain op collectives (today)", **collectives(plain))

    # 2. gradient: d/dw of a loss through the deposit (its transpose, an interpolation)
    h = jnp.asarray(rng.standard_normal(G))

    def loss(x, w, h):
        grid = deposit(x, w)
        return jnp.sum(grid * h) + 0.5 * jnp.sum(grid**2)

    def loss_plain(x, w, h):
        grid = deposit_op(x, w, g=G)[0]
        return jnp.sum(grid * h) + 0.5 * jnp.sum(grid**2)

    grad = jax.jit(jax.grad(loss, argnums=1))
    gtext = grad.lower(x, w, h).compile().as_text()
    open(os.path.join(HERE, "results", f"grad_{jax.__version__}_{mode()}.hlo.txt"), "w").write(gtext)
    show("grad collectives", **collectives(gtext))
    gs = grad(x, w, h)
    g1 = jax.jit(jax.grad(loss_plain, argnums=1))(x_np, w_np, np.asarray(h))
    show("grad result", max_abs_err=float(np.max(np.abs(np.asarray(gs) - np.asarray(g1)))),
         sharding=str(gs.sharding))

    # the transpose alone: interpolation grid (replicated) -> points (sharded on m)
    grid = jax.device_put(np.asarray(h), NamedSharding(mesh, P()))
    itext = jax.jit(interp).lower(x, grid).compile().as_text()
    open(os.path.join(HERE, "results", f"interp_{jax.__version__}_{mode()}.hlo.txt"), "w").write(itext)
    show("interp collectives", **collectives(itext))
    iv = jax.jit(interp)(x, grid)
    show("interp result", max_abs_err=float(np.max(np.abs(
        np.asarray(iv) - np.asarray(h)[np.floor(x_np[:, 0]).astype(int)]))),
        sharding=str(iv.sharding))

    # 3. export (with the new target allowed), serialize, load in a fresh process
    checks = [*jaxbind.export_safety_checks(),
              jax.export.DisabledSafetyCheck.custom_call(jbpart.TARGET)]
    try:
        jaxbind.export(jax.jit(deposit))(x, w)
        show("jaxbind.export without the new target", ok=True)
    except Exception as e:  # noqa: BLE001
        show("jaxbind.export without the new target", error=f"{type(e).__name__}: {str(e)[:200]}")
    rep = NamedSharding(mesh, P())
    programs = {
        "deposit": (jax.jit(deposit), (x, w), ref),
        "deposit_explicit_shardings": (
            jax.jit(deposit, in_shardings=(x.sharding, w.sharding), out_shardings=rep),
            (x, w), ref),
        "grad": (grad, (x, w, h), np.asarray(g1)),
    }
    base = os.path.join(HERE, "exported", f"{jax.__version__}_{mode()}")
    os.makedirs(base, exist_ok=True)
    for name, (fn, args, want_out) in programs.items():
        try:
            exp = jax.export.export(fn, disabled_checks=checks)(*args)
        except Exception as e:  # noqa: BLE001
            show(f"export {name}", error=f"{type(e).__name__}: {e}"[:2000])
            continue
        mlir_text = exp.mlir_module()
        show(f"export {name}",
             targets=sorted(set(re.findall(r"custom_call @(\w+)", mlir_text))),
             has_sdy_rule="sdy.sharding_rule" in mlir_text, nr_devices=exp.nr_devices,
             in_shardings=[str(s) for s in exp.in_shardings_hlo],
             bytes=len(exp.serialize()))
        open(os.path.join(base, name + ".jaxexport"), "wb").write(exp.serialize())
        np.savez(os.path.join(base, name + ".npz"), *[np.asarray(a) for a in args], want=want_out)
    cmd = [sys.executable, os.path.join(HERE, "load_exported.py"), base]
    if "--gspmd" in sys.argv:
        cmd.append("--gspmd")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(run.stdout, end="")
    if run.returncode:
        print(run.stderr[-3000:])


def mode():
    return "shardy" if jax.config.jax_use_shardy_partitioner else "gspmd"


if __name__ == "__main__":
    main()
