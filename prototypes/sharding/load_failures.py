"""How a loaded program fails when the loading process lacks a piece (each case in its
own fresh process): python load_failures.py DIR

  no-partitioner: the binding is defined, but nothing registered jaxbind_partitioned
                  (an older jaxbind loading a newer artifact)
  no-binding:     the partitioner is registered, the binding is not defined
"""

import os
import subprocess
import sys
import types

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if len(sys.argv) == 2:
    for case in ("no-partitioner", "no-binding"):
        out = subprocess.run([sys.executable, __file__, sys.argv[1], case],
                             capture_output=True, text=True, timeout=300)
        text = (out.stdout.strip() or out.stderr.strip().splitlines()[-1])
        print(f"{case}: exit {out.returncode}: {' '.join(text.split())[:700]}", flush=True)
    sys.exit()

import jax  # noqa: E402
import jax.export  # noqa: E402

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

case = sys.argv[2]
if case == "no-partitioner":  # deposit.py's binding without jbpart (which registers)
    stub = types.ModuleType("jbpart")
    stub.Rule = lambda *a, **k: None
    sys.modules["jbpart"] = stub
    import deposit  # noqa: F401
else:
    import jbpart  # noqa: F401

path = os.path.join(sys.argv[1], "deposit.jaxexport")
exp = jax.export.deserialize(bytearray(open(path, "rb").read()))
data = np.load(path.replace(".jaxexport", ".npz"))
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("p",))
x = jax.device_put(data["arr_0"], NamedSharding(mesh, P("p", None)))
w = jax.device_put(data["arr_1"], NamedSharding(mesh, P("p")))
try:
    out = jax.jit(exp.call)(x, w)
    print(f"ran: max_abs_err {float(np.max(np.abs(np.asarray(out) - data['want'])))}")
except Exception as e:  # noqa: BLE001
    print(f"{type(e).__name__}: {e}")
