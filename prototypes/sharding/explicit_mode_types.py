"""Explicit sharding mode (AxisType.Explicit): what type the partitioned op's results get
at trace time, and what that costs. python explicit_mode_types.py

The partitioner splits the interpolation on m (its result is split like the points), but
jaxbind's abstract evaluation gives results without a sharding, so JAX types them as
replicated: a later op then needs them whole (one all-gather).
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

from deposit import G, deposit, interp  # noqa: E402
from run_route_a import collectives  # noqa: E402

print("jax", jax.__version__)
emesh = jax.make_mesh((4,), ("p",), axis_types=(AxisType.Explicit,))
set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
with set_mesh(emesh):
    x = jax.device_put(np.random.uniform(0, G, (4096, 1)), NamedSharding(emesh, P("p", None)))
    h = jax.device_put(np.random.randn(G), NamedSharding(emesh, P()))
    w = jax.device_put(np.random.randn(4096), NamedSharding(emesh, P("p")))

    def f(x, h, w):
        y, g = interp(x, h), deposit(x, w)
        print("trace-time types: interp", jax.typeof(y), " deposit", jax.typeof(g))
        return y + 1.0

    print("result type of interp + 1:", jax.typeof(jax.jit(f)(x, h, w)))
    print("result type of interp * w:", jax.typeof(jax.jit(lambda x, h, w: interp(x, h) * w)(x, h, w)))
    print("interp + 1 collectives:", collectives(
        jax.jit(lambda x, h: interp(x, h) + 1.0).lower(x, h).compile().as_text()))
    print("interp alone collectives:", collectives(jax.jit(interp).lower(x, h).compile().as_text()))
