"""The deposit op (points -> 1-D grid) and its transpose (grid -> points), in NumPy,
as a jaxbind linear op; and its partitioned form (route A): both directions carry a rule.

deposit(x[m, d], w[m]) -> grid[g]: grid[floor(x[:, 0])] += w   (x is fixed: first_n_args_fixed=1)
transpose(x[m, d], grid[g]) -> w[m]: w = grid[floor(x[:, 0])]

Imported by every process that runs the programs (the bindings are found by name).
"""

from __future__ import annotations

import jax
import numpy as np

import jaxbind
import jbpart

G = 64  # grid size


def _deposit(out, args, kwargs_dump):
    x, w = args
    kw = jaxbind.load_kwargs(kwargs_dump)
    out[0][...] = 0
    np.add.at(out[0], np.floor(x[:, 0]).astype(np.int64) % kw["g"], w)


def _interp(out, args, kwargs_dump):
    x, grid = args
    out[0][...] = grid[np.floor(x[:, 0]).astype(np.int64) % grid.shape[0]]


def _abstract(x, w, *, g):
    return ((g,), w.dtype),


def _abstract_T(x, grid, *, g):
    return ((x.shape[0],), grid.dtype),


deposit_op = jaxbind.get_linear_call(
    _deposit, _interp, _abstract, _abstract_T, first_n_args_fixed=1, name="proto_deposit"
)

DEPOSIT_RULE = jbpart.Rule("m d, m -> g", reduction=("m",))
INTERP_RULE = jbpart.Rule("m d, g -> m")


def _specs(x, w):
    """The jaxbind CallSpecs of the op's f and T roles for these shapes (read off jaxprs)."""
    jaxpr = jax.make_jaxpr(lambda x, w: deposit_op(x, w, g=G)[0])(x, w)
    (f_eqn,) = [e for e in jaxpr.eqns if "spec" in e.params]
    grid = jax.ShapeDtypeStruct((G,), w.dtype)
    jaxpr_t = jax.make_jaxpr(
        lambda x, c: jax.linear_transpose(lambda w: deposit_op(x, w, g=G)[0], w)(c)
    )(x, grid)
    (t_eqn,) = [e for e in jaxpr_t.eqns if "spec" in e.params]
    return f_eqn.params["spec"], t_eqn.params["spec"]


@jax.custom_vjp
def deposit(x, w):
    f, _ = _specs(x, w)
    return jbpart.partitioned(f, DEPOSIT_RULE, x, w)[0]


def _fwd(x, w):
    return deposit(x, w), x


def _bwd(x, ct):
    w_like = jax.ShapeDtypeStruct(x.shape[:1], ct.dtype)
    _, t = _specs(x, w_like)
    (wbar,) = jbpart.partitioned(t, INTERP_RULE, x, ct)
    return None, wbar


deposit.defvjp(_fwd, _bwd)


def interp(x, grid):
    w_like = jax.ShapeDtypeStruct(x.shape[:1], grid.dtype)
    _, t = _specs(x, w_like)
    return jbpart.partitioned(t, INTERP_RULE, x, grid)[0]
