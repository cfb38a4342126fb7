"""An op that partitions by declaration (``sharding=``) on 4 CPU devices, against today.

    python benchmarks/sharding.py          # writes benchmarks/results/sharding.{json,md}
    python benchmarks/sharding.py --quick  # 10^4 points, a 32x32 grid (CI smoke test)
    .venv313/bin/python benchmarks/sharding.py --stem sharding-jax0.12  # another JAX

DUCC's NUFFT type 1 (``jaxducc0.get_nufft``, points to a 256x256 grid, float64, eps 1e-9)
with 10^6 points sharded over 4 CPU devices under plain ``jax.jit``, each part in a
process of its own (the device-count flag is set before JAX is imported):

- **mesh**: the compiled program's collectives and its time, against the same op without
  a rule (a binding of the same callables without ``sharding=``, as every op was before:
  XLA gathers the points to every device) and against one device; values and gradients
  (reverse mode, in the values) against one device.
- **export**: the sharded program exported, then loaded in a fresh process on the same
  mesh: its collectives and results.
- **two processes**: ``jax.distributed.initialize`` on localhost, 2 processes x 2 CPU
  devices, one 4-device mesh: the same op, its collectives and results against one
  device.

A part that a JAX version cannot run is recorded with its error.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).parent
EPS = 1e-9


def _jax(devices: int):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    )
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def _problem(m: int, n: int):
    import numpy as np

    rng = np.random.default_rng(0)
    coord = rng.uniform(0, 2 * np.pi, (m, 2))
    values = rng.normal(size=m) + 1j * rng.normal(size=m)
    cot = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    return coord, values, cot


def _ops(n: int):
    """The NUFFT type 1 with its rule, and the same callables without one (today)."""
    import numpy as np

    import jaxbind
    from jaxbind.contrib.ducc import nufft as ducc_nufft
    from jaxbind.contrib.jaxducc0 import get_nufft

    gathered = jaxbind.get_linear_call(
        ducc_nufft._nufft,
        ducc_nufft._nufft_T,
        ducc_nufft._nufft_abstract,
        ducc_nufft._nufft_abstract_T,
        first_n_args_fixed=1,
        name="bench_sharding.nufft_without_rule",
    )
    kw = dict(grid_shape=(n, n), nufft_type=1, forward=True, epsilon=EPS, nthreads=1)
    kw.update(periodicity=2 * np.pi, fft_order=False)

    def with_rule(c, v):
        return get_nufft(c, (n, n), nufft_type=1, epsilon=EPS)(v)[0]

    def without_rule(c, v):
        return gathered(c, v, **kw)[0]

    return with_rule, without_rule


def _grad(f, cot):
    import jax
    import jax.numpy as jnp

    def g(c, v):
        _, vjp = jax.vjp(lambda v: f(c, v), v)
        return vjp(jnp.asarray(cot))[0]

    return g


def _rel(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _counts(compiled) -> dict:
    from jaxbind.testing import collectives

    found = collectives(compiled)
    return {k: v for k, v in found.counts.items() if v}


def _best(fn, *args, rounds: int) -> float:
    from _harness import time_it

    return time_it(lambda: fn(*args), warmup=1, rounds=rounds).min


def part_mesh(m: int, n: int, rounds: int, directory: pathlib.Path) -> dict:
    jax = _jax(4)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4,), ("p",))
    coord, values, cot = _problem(m, n)
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("p")))
    cs, vs = put(coord), put(values)
    with_rule, without_rule = _ops(n)
    one = jax.devices()[0]
    c1, v1 = jax.device_put(coord, one), jax.device_put(values, one)
    out: dict = {"points": m, "grid": [n, n], "devices": 4}
    f_one = jax.jit(with_rule)
    ref = np.asarray(f_one(c1, v1))
    ref_grad = np.asarray(jax.jit(_grad(with_rule, cot))(c1, v1))
    out["one device"] = {"seconds": _best(f_one, c1, v1, rounds=rounds)}
    for name, f in (("declared rule", with_rule), ("no rule (today)", without_rule)):
        compiled = jax.jit(f).lower(cs, vs).compile()
        grad = jax.jit(_grad(f, cot)).lower(cs, vs).compile()
        out[name] = {
            "collectives": _counts(compiled),
            "gradient collectives": _counts(grad),
            "seconds": _best(compiled, cs, vs, rounds=rounds),
            "error vs one device": _rel(compiled(cs, vs), ref),
            "gradient error vs one device": _rel(grad(cs, vs), ref_grad),
        }
    np.save(directory / "coord.npy", coord)
    np.save(directory / "values.npy", values)
    np.save(directory / "ref.npy", ref)
    try:
        import jaxbind

        exported = jaxbind.export(jax.jit(with_rule))(cs, vs)  # allows jaxbind's targets
        (directory / "nufft1.bin").write_bytes(exported.serialize())
        out["export"] = {"written": True}
    except Exception as exc:  # recorded: what this version cannot do
        out["export"] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    return out


def part_load(n: int, directory: pathlib.Path) -> dict:
    jax = _jax(4)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _ops(n)  # this process defines the op, as every process that loads the program must
    mesh = jax.make_mesh((4,), ("p",))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("p")))
    cs, vs = put(np.load(directory / "coord.npy")), put(np.load(directory / "values.npy"))
    exported = jax.export.deserialize((directory / "nufft1.bin").read_bytes())
    compiled = jax.jit(exported.call).lower(cs, vs).compile()
    return {
        "collectives": _counts(compiled),
        "error vs one device": _rel(compiled(cs, vs), np.load(directory / "ref.npy")),
    }


def part_worker(process_id: int, port: int, n: int, directory: pathlib.Path) -> dict:
    jax = _jax(2)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    sys.path.insert(0, str(HERE.parent / "tests"))  # the tests' process helpers
    from support.processes import join_cpu_processes

    join_cpu_processes(process_id, port)
    with_rule, _ = _ops(n)
    mesh = jax.make_mesh((4,), ("p",))
    sharding = NamedSharding(mesh, P("p"))
    coord, values = np.load(directory / "coord.npy"), np.load(directory / "values.npy")
    cs = jax.make_array_from_callback(coord.shape, sharding, lambda i: coord[i])
    vs = jax.make_array_from_callback(values.shape, sharding, lambda i: values[i])
    compiled = jax.jit(with_rule).lower(cs, vs).compile()
    grid = compiled(cs, vs)
    local = np.asarray(grid.addressable_shards[0].data)  # the grid is whole on every device
    return {
        "process": process_id,
        "local devices": jax.local_device_count(),
        "collectives": _counts(compiled),
        "error vs one device": _rel(local, np.load(directory / "ref.npy")),
    }


def _child(*args, timeout=900) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=HERE,
    )
    for line in proc.stdout.splitlines()[::-1]:
        if line.startswith("{"):
            return json.loads(line)
    return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(n: int, directory: pathlib.Path) -> list:
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(i), str(port), str(n), str(directory)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=HERE,
        )
        for i in range(2)
    ]
    results = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        results.append(
            json.loads(lines[-1])
            if lines
            else {"error": f"exit {proc.returncode}: {stderr.strip()[-800:]}"}
        )
    return results


def _table(meta: dict, r: dict) -> str:
    from _harness import run_line

    mesh = r["mesh"]
    if "error" in mesh:
        return f"{run_line(meta)}.\n\nThe mesh part failed: {mesh['error']}\n"
    lines = [
        f"{run_line(meta)}. DUCC NUFFT type 1, {mesh['points']} points (float64) onto a "
        f"{mesh['grid'][0]}x{mesh['grid'][1]} grid, eps {EPS:g}, points sharded over 4 CPU "
        "devices, plain `jax.jit`; best of the rounds.",
        "",
        "| program | collectives | gradient's collectives | time | vs one device | "
        "gradient vs one device |",
        "|---|---|---|---|---|---|",
        f"| one device | - | - | {mesh['one device']['seconds'] * 1e3:.1f} ms | - | - |",
    ]
    for name in ("declared rule", "no rule (today)"):
        e = mesh[name]
        lines.append(
            f"| {name} | {e['collectives'] or 'none'} | {e['gradient collectives'] or 'none'} "
            f"| {e['seconds'] * 1e3:.1f} ms | {e['error vs one device']:.1e} "
            f"| {e['gradient error vs one device']:.1e} |"
        )
    load = r["export"]
    lines += ["", "Exported, loaded in a fresh process on the same mesh: "]
    lines[-1] += (
        f"error: {load['error']}"
        if "error" in load
        else f"collectives {load['collectives']}, error vs one device "
        f"{load['error vs one device']:.1e}."
    )
    lines += ["", "Two processes x 2 CPU devices (`jax.distributed`, gloo), one 4-device mesh:"]
    for p in r["two processes"]:
        lines.append(
            f"- process {p.get('process', '?')}: "
            + (
                f"error: {p['error']}"
                if "error" in p
                else f"collectives {p['collectives']}, error vs one device "
                f"{p['error vs one device']:.1e}"
            )
        )
    return "\n".join(lines) + "\n"


def main():
    if sys.argv[1:2] == ["part"]:
        what, m, n, rounds, directory = sys.argv[2:7]
        d = pathlib.Path(directory)
        try:
            if what == "mesh":
                result = part_mesh(int(m), int(n), int(rounds), d)
            else:
                result = part_load(int(n), d)
        except Exception as exc:
            result = {"error": f"{type(exc).__name__}: {str(exc)[:800]}"}
        print(json.dumps(result), flush=True)
        return
    if sys.argv[1:2] == ["worker"]:
        pid, port, n, directory = sys.argv[2:6]
        try:
            result = part_worker(int(pid), int(port), int(n), pathlib.Path(directory))
        except Exception as exc:
            result = {"process": int(pid), "error": f"{type(exc).__name__}: {str(exc)[:800]}"}
        print(json.dumps(result), flush=True)
        return
    from _harness import arguments, flag, run_meta, save

    args = arguments(  # --quick: 10^4 points, a 32x32 grid
        __doc__, flag("--stem", default=None, help="file stem (default sharding[-quick])")
    )
    m, n, rounds = (10_000, 32, 2) if args.quick else (1_000_000, 256, 5)
    rounds = args.rounds or rounds

    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["mesh"] = _child("part", "mesh", m, n, rounds, tmp)
        if (pathlib.Path(tmp) / "nufft1.bin").exists():
            results["export"] = _child("part", "load", m, n, rounds, tmp)
        else:
            results["export"] = {"error": results["mesh"].get("export", {}).get("error", "none")}
        results["two processes"] = _two_processes(n, pathlib.Path(tmp))
    meta = run_meta(points=m, grid=n, rounds=rounds)
    text = _table(meta, results)
    print(text)
    save(
        args.out,
        args.stem or ("sharding-quick" if args.quick else "sharding"),
        dict(meta=meta, results=results),
        text,
    )


if __name__ == "__main__":
    main()
