"""A fresh process: load exported programs and run them on 4 CPU devices.

python load_exported.py DIR [--gspmd]. Imports only the op definitions (deposit.py,
which imports jbpart: that registers the partitioner of jaxbind_partitioned by name).
Arguments whose leading axis is the points' (4096) are sharded over the mesh, as in
the exporting process; the others are replicated.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import glob  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
if "--gspmd" in sys.argv:
    jax.config.update("jax_use_shardy_partitioner", False)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import deposit  # noqa: E402,F401  (defines the binding, registers the partitioner)
import jbpart  # noqa: E402
from run_route_a import collectives  # noqa: E402


def main():
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("p",))
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.jaxexport"))):
        name = os.path.basename(path).split(".")[0]
        exp = jax.export.deserialize(bytearray(open(path, "rb").read()))
        data = np.load(path.replace(".jaxexport", ".npz"))
        args = []
        for k in range(len(data.files) - 1):
            a = data[f"arr_{k}"]
            spec = P("p", *[None] * (a.ndim - 1)) if a.shape[0] == 4096 else P()
            args.append(jax.device_put(a, NamedSharding(mesh, spec)))
        jbpart.LOG.clear()
        try:
            text = jax.jit(exp.call).lower(*args).compile().as_text()
            out = jax.jit(exp.call)(*args)
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"check": f"fresh process: {name}",
                              "error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)
            continue
        print(json.dumps({
            "check": f"fresh process: {name}",
            "pid": os.getpid(),
            **collectives(text),
            "partitioner_called": [e[0] for e in jbpart.LOG],
            "max_abs_err": float(np.max(np.abs(np.asarray(out) - data["want"]))),
            "sharding": str(out.sharding),
        }), flush=True)


if __name__ == "__main__":
    main()
