"""A call of the partitioned target, split by its rule over 4 CPU devices, finds its
site in XLA's slot, owned by the program (run by test_sites.py in a subprocess; one JSON
line per case, as sharding_cases.py prints them)."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

import gc
import sys

import jax
import jax.numpy as jnp
import jaxlib.version
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support.processes import run_case_functions

import jaxbind

SLOTS = tuple(int(p) for p in jaxlib.version.__version__.split(".")[:2]) >= (0, 8)


def case_partitioned_call_sites():
    def twice(out, args, kwargs_dump):
        out[0][...] = 2 * args[0]

    op = jaxbind.get_linear_call(
        twice,
        twice,
        lambda x: ((x.shape, x.dtype),),
        lambda x: ((x.shape, x.dtype),),
        name="sites_cases.partitioned",
        sharding="n -> n",
    )
    mesh = Mesh(np.array(jax.devices()), ("b",))
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("b")))
    program = jax.jit(lambda x: op(x)[0])
    assert "jaxbind_partitioned" in program.lower(x).as_text()
    np.testing.assert_allclose(program(x), 2 * np.arange(16.0))
    gc.collect()
    owned = op.binding.sites
    owners = owned.owners()
    sites = list(owned.live().values()) + list(owned.loaded)
    found = [(owners.get(id(s)), s.routes) for s in sites]
    route = ["slot"] if SLOTS else ["execute-only"]
    assert found and all(o == ["program"] and r == route for o, r in found), found
    return found


if __name__ == "__main__":
    run_case_functions(globals(), sys.argv[1:])
