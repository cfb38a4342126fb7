"""One process of the 2-process test in test_distributed.py.

    python distributed_worker.py PROCESS_ID PORT

Each process has 2 CPU devices; together they form a 4-device global mesh. The
worker runs a batch-sharded, vmapped jaxbind op over that mesh, checks its own
shards and a global reduction, and prints one JSON line with the outcome.
"""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
)

import json
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support.ops import same_as_first
from support.processes import join_cpu_processes

import jaxbind

calls = []


def _cube(out, args, kwargs_dump):
    calls.append(args[0].shape)
    out[0][...] = args[0] ** 3


cube = jaxbind.get_nonlinear_call(_cube, (None, None), same_as_first, None, name="distributed.cube")


def main(process_id: int, port: int):
    join_cpu_processes(process_id, port)
    try:
        assert jax.device_count() == 4 and jax.local_device_count() == 2, jax.devices()
        mesh = Mesh(np.array(jax.devices()), ("b",))
        sharding = NamedSharding(mesh, P("b"))
        data = np.arange(8 * 5, dtype=np.float32).reshape(8, 5) / 10
        x = jax.make_array_from_callback(data.shape, sharding, lambda index: data[index])
        f = jax.jit(jax.vmap(lambda v: cube(v)[0]))
        hlo = f.lower(x).compile().as_text()
        y = jax.block_until_ready(f(x))
        n_forward = len(calls)  # rows of this process's 2 devices: 2 x 2
        for shard in y.addressable_shards:
            np.testing.assert_allclose(np.asarray(shard.data), data[shard.index] ** 3, rtol=1e-6)
        total = jax.jit(lambda v: jnp.sum(jax.vmap(lambda w: cube(w)[0])(v)))(x)
        np.testing.assert_allclose(float(total), float(np.sum(data**3)), rtol=1e-5)
        result = dict(
            ok=True,
            process=process_id,
            calls=n_forward,
            gathers="all-gather" in hlo,
            sharding=str(y.sharding.spec),
        )
    except Exception:
        result = dict(ok=False, process=process_id, detail=traceback.format_exc(limit=8))
    print(json.dumps(result), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
