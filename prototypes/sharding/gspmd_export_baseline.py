"""Is loading a sharded export under GSPMD broken without jaxbind too? python gspmd_export_baseline.py
Exports jnp.sum(x * 2) (x sharded over 4 devices, nothing of jaxbind) with and without
Shardy, and loads each in a fresh process with and without Shardy."""

import os
import subprocess
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax  # noqa: E402
import jax.export  # noqa: E402  (a submodule in jax 0.7)

if len(sys.argv) > 2:  # child: load
    jax.config.update("jax_use_shardy_partitioner", sys.argv[2] == "shardy")
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    exp = jax.export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("p",))
    x = jax.device_put(np.arange(16.0), NamedSharding(mesh, P("p")))
    try:
        print(f"  loaded under {sys.argv[2]}: {float(jax.jit(exp.call)(x))}")
    except Exception as e:  # noqa: BLE001
        print(f"  loaded under {sys.argv[2]}: {type(e).__name__}: {' '.join(str(e).split())[:160]}")
    sys.exit()

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

print("jax", jax.__version__)
for exporter in ("shardy", "gspmd"):
    jax.config.update("jax_use_shardy_partitioner", exporter == "shardy")
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("p",))
    x = jax.device_put(np.arange(16.0), NamedSharding(mesh, P("p")))
    exp = jax.export.export(jax.jit(lambda x: jax.numpy.sum(x * 2)))(x)
    path = f"/tmp/baseline_{exporter}.jaxexport"
    open(path, "wb").write(exp.serialize())
    print(f"exported under {exporter}")
    for loader in ("shardy", "gspmd"):
        out = subprocess.run([sys.executable, __file__, path, loader], capture_output=True, text=True)
        print(out.stdout or f"  loaded under {loader}: exit {out.returncode}: {out.stderr.strip().splitlines()[-1][:200]}", end="\n" if not out.stdout else "", flush=True)
