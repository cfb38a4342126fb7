"""An installed jaxbind runs an op under jit and grad (the sdist's and the wheels' check)."""

import jax
import jax.numpy as jnp
import numpy as np

import jaxbind


def double(out, args, kwargs_dump):
    out[0][...] = 2 * args[0]


op = jaxbind.get_linear_call(double, double, lambda x: ((x.shape, x.dtype),), name="smoke")
x = jnp.arange(4.0)
np.testing.assert_allclose(jax.jit(lambda x: op(x)[0])(x), 2 * x)
np.testing.assert_allclose(jax.grad(lambda x: op(x)[0].sum())(x), np.full(4, 2.0))
print(f"smoke: jaxbind {jaxbind.__version__} ({jaxbind._ext.__file__.rsplit('/', 1)[-1]}) ok")
