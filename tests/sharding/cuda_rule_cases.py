"""A CUDA kernel op with a sharding rule, lowered for CUDA (not run) on 4 CPU devices: prints
the custom-call targets and the per-device target its partitioner will emit (see
test_targets.py)."""

import json
import os
import re

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support.ops import SCALE_PTX as PTX

import jaxbind
from jaxbind._rules import spmd

shape = lambda x, **kw: ((x.shape, x.dtype),)
kernel = jaxbind.cuda_kernel(
    PTX, "scale", scalars=lambda y, x, *, a: (np.float32(a), np.int64(x.size))
)
op = jaxbind.get_linear_call(
    kernel, kernel, shape, shape, name="cuda_rule.scale", sharding="n -> n"
)
mesh = Mesh(np.array(jax.devices()), ("p",))
x = jax.ShapeDtypeStruct((16,), jnp.float32, sharding=NamedSharding(mesh, P("p")))
lowered = jax.jit(lambda x: op(x, a=2.0)[0]).trace(x).lower(lowering_platforms=("cuda",))
text = lowered.as_text()
(setting,) = re.findall(r'partitioning = "([^"]*)"', text)
config = json.loads(setting.replace("\\22", '"'))
print(
    json.dumps(
        {"targets": re.findall(r"custom_call @(\w+)", text), "per_device": spmd._per_device(config)}
    )
)
