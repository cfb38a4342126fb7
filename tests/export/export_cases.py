"""Functions with jaxbind ops to export, shared by test_export.py and make_golden.py.

Each case: name -> (function, example arguments). The bindings come from
reference_ops, which a loading process imports to register them.
"""

import jax
import jax.numpy as jnp
import numpy as np
from reference_ops import axpy, flip2, matvec, native_pair, nonlinear
from support.arrays import normal


def _args(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(normal(rng, s, np.float32) for s in shapes)


CASES = {
    "nonlinear": (lambda a, b: nonlinear(a, b)[0], _args((5,), (5,), seed=1)),
    "nonlinear_grad": (
        jax.grad(lambda a, b: jnp.sum(nonlinear(a, b)[0] ** 2), argnums=(0, 1)),
        _args((5,), (5,), seed=2),
    ),
    "nonlinear_vmap": (
        jax.vmap(lambda a, b: nonlinear(a, b)[0], in_axes=(1, None)),
        _args((4, 3), (4,), seed=3),
    ),
    "linear_transpose": (
        lambda a, c: jax.linear_transpose(lambda x: matvec(a, x)[0], jnp.zeros(3, jnp.float32))(c)[
            0
        ],
        _args((4, 3), (4,), seed=4),
    ),
    "kwargs": (lambda x, y: axpy(x, y, scale=2.5)[0], _args((6,), (6,), seed=5)),
    "native_vmap": (jax.vmap(lambda x: flip2(x)[0], in_axes=1), _args((3, 4), seed=6)),
    # the pytree API: pytrees in and out, and the gradient through the transpose
    "native_pytree": (
        lambda a, b: (
            native_pair({"a": a, "b": b}, k=1.5)[1],
            jax.grad(lambda a: native_pair({"a": a, "b": b}, k=1.5)[0].sum())(a),
        ),
        _args((4,), (4,), seed=7),
    ),
}
