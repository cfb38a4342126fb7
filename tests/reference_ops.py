"""Small jaxbind ops with pure-JAX twins, shared by the tests: each twin (``*_ref``) is its
op's ``reference=``, so every test of the op checks it (jaxbind.testing.check compares
the two) and may call it as the oracle."""

import jax
import jax.numpy as jnp
import numpy as np
from support.ops import same_as_first, same_as_last

import jaxbind


# --- linear: y = A @ x, A fixed (first_n_args_fixed=1) -----------------------
def _matvec(out, args, kwargs_dump):
    a, x = args
    out[0][...] = a @ x


def _matvec_T(out, args, kwargs_dump):
    a, ct = args
    out[0][...] = a.T @ ct


def _matvec_abstract(a, x, **kwargs):
    return (((a.shape[0],), x.dtype),)


def _matvec_abstract_T(a, ct, **kwargs):
    return (((a.shape[1],), ct.dtype),)


def matvec_ref(a, x):
    return a @ x


matvec = jaxbind.get_linear_call(
    _matvec,
    _matvec_T,
    _matvec_abstract,
    _matvec_abstract_T,
    first_n_args_fixed=1,
    reference=matvec_ref,
)


# --- linear, two inputs, scale from kwargs: y = s * (x + 2 y) -------------------
def _axpy(out, args, kwargs_dump):
    s = jaxbind.load_kwargs(kwargs_dump).get("scale", 1.0)
    x, y = args
    out[0][...] = s * (x + 2 * y)


def _axpy_T(out, args, kwargs_dump):
    s = jaxbind.load_kwargs(kwargs_dump).get("scale", 1.0)
    (ct,) = args
    out[0][...] = s * ct
    out[1][...] = 2 * s * ct


def _axpy_abstract(x, y, **kwargs):
    return ((x.shape, x.dtype),)


def _axpy_abstract_T(ct, **kwargs):
    return ((ct.shape, ct.dtype), (ct.shape, ct.dtype))


def axpy_ref(x, y, scale=1.0):
    return scale * (x + 2 * y)


axpy = jaxbind.get_linear_call(_axpy, _axpy_T, _axpy_abstract, _axpy_abstract_T, reference=axpy_ref)


# --- multilinear: z = x * y (elementwise) ---------------------------------------
def _mul(out, args, kwargs_dump):
    out[0][...] = args[0] * args[1]


def _mul_T0(out, args, kwargs_dump):
    y, ct = args
    out[0][...] = ct * y


def _mul_T1(out, args, kwargs_dump):
    x, ct = args
    out[0][...] = ct * x


def bilinear_ref(x, y):
    return x * y


bilinear = jaxbind.get_linear_call(
    _mul, (_mul_T0, _mul_T1), same_as_last, (same_as_last, same_as_last), reference=bilinear_ref
)


# --- nonlinear: f(x1, x2) = x1 * x2**2 -------------------------------------------
def _nl(out, args, kwargs_dump):
    x1, x2 = args
    out[0][...] = x1 * x2**2


def _nl_jvp(out, args, kwargs_dump):
    x1, x2, dx1, dx2 = args
    out[0][...] = x2**2 * dx1 + 2 * x1 * x2 * dx2


def _nl_vjp(out, args, kwargs_dump):
    x1, x2, ct = args
    out[0][...] = x2**2 * ct
    out[1][...] = 2 * x1 * x2 * ct


def _nl_abstract(x1, x2, **kwargs):
    return ((x1.shape, x1.dtype),)


def _nl_abstract_T(x1, x2, ct, **kwargs):
    return ((x1.shape, x1.dtype), (x2.shape, x2.dtype))


def nonlinear_ref(x1, x2):
    return x1 * x2**2


nonlinear = jaxbind.get_nonlinear_call(
    _nl, (_nl_jvp, _nl_vjp), _nl_abstract, _nl_abstract_T, reference=nonlinear_ref
)
# the same without its twin as reference: differentiable to first order only
nonlinear_without_reference = jaxbind.get_nonlinear_call(
    _nl, (_nl_jvp, _nl_vjp), _nl_abstract, _nl_abstract_T, name="reference_ops.nonlinear_noref"
)


# --- nonlinear with a fixed exponent: f(p, x) = x ** p ---------------------------
def _pow(out, args, kwargs_dump):
    p, x = args
    out[0][...] = x**p


def _pow_jvp(out, args, kwargs_dump):
    p, x, dx = args
    out[0][...] = p * x ** (p - 1) * dx


def _pow_vjp(out, args, kwargs_dump):
    p, x, ct = args
    out[0][...] = p * x ** (p - 1) * ct


def _pow_abstract_T(p, x, ct, **kwargs):
    return ((x.shape, x.dtype),)


power = jaxbind.get_nonlinear_call(
    _pow, (_pow_jvp, _pow_vjp), same_as_last, _pow_abstract_T, first_n_args_fixed=1
)


# --- vectorized linear op: flip the core axes, times 2 ---------------------
def _core_axes(ndim, batch_axes):
    return tuple(a for a in range(ndim) if a not in batch_axes)


def _flip2(out, args, kwargs_dump):
    kwargs = jaxbind.load_kwargs(kwargs_dump)
    (x,) = args
    batch = kwargs["batch_axes"][0] if kwargs["batch_axes"] else ()
    out[0][...] = 2 * np.flip(x, axis=_core_axes(x.ndim, batch))


def _flip2_abstract(x, batch_axes=None, **kwargs):
    axis = batch_axes[0][-1] if batch_axes else None
    return ((x.shape, x.dtype, axis),)


def flip2_ref(x):
    return 2 * jnp.flip(x)


flip2 = jaxbind.get_linear_call(
    _flip2, _flip2, _flip2_abstract, _flip2_abstract, func_can_batch=True, reference=flip2_ref
)


# --- vectorized, two inputs: z = flip(x) + 2 flip(y), batch axis 0 out ----
# jaxbind aligns batched inputs level by level, so moving each input's batch
# axes to the front (outermost first) lines them up.
def _to_front(x, axes):
    return np.moveaxis(x, list(reversed(axes)), list(range(len(axes))))


def _flip_core(x, nbatch):
    return np.flip(x, axis=tuple(range(nbatch, x.ndim)))


def _flipsum(out, args, kwargs_dump):
    ba = jaxbind.load_kwargs(kwargs_dump)["batch_axes"] or ((), ())
    x, y = (_flip_core(_to_front(a, axes), len(axes)) for a, axes in zip(args, ba))
    out[0][...] = x + 2 * y


def _flipsum_T(out, args, kwargs_dump):
    (ct,) = args
    ba = jaxbind.load_kwargs(kwargs_dump)["batch_axes"] or ((),)
    c = _flip_core(_to_front(ct, ba[0]), len(ba[0]))
    out[0][...] = c
    out[1][...] = 2 * c


def _flipsum_abstract(x, y, batch_axes=None, **kwargs):
    if not batch_axes:
        return ((x.shape, x.dtype, None),)
    axes = batch_axes[0]
    shape = tuple(x.shape[a] for a in reversed(axes)) + tuple(
        n for i, n in enumerate(x.shape) if i not in axes
    )
    return ((shape, x.dtype, 0),)


def _flipsum_abstract_T(ct, batch_axes=None, **kwargs):
    # cotangents of x and y, with the cotangent's batch levels at the front
    (out,) = _flipsum_abstract(ct, ct, batch_axes=batch_axes and batch_axes * 2)
    return (out, out)


def flipsum_ref(x, y):
    return jnp.flip(x) + 2 * jnp.flip(y)


flipsum = jaxbind.get_linear_call(
    _flipsum,
    _flipsum_T,
    _flipsum_abstract,
    _flipsum_abstract_T,
    func_can_batch=True,
    reference=flipsum_ref,
)


def _flipsum_plain(out, args, kwargs_dump):
    x, y = args
    out[0][...] = np.flip(x) + 2 * np.flip(y)


def _flipsum_plain_T(out, args, kwargs_dump):
    c = np.flip(args[0])
    out[0][...] = c
    out[1][...] = 2 * c


flipsum_loop = jaxbind.get_linear_call(
    _flipsum_plain,
    _flipsum_plain_T,
    same_as_first,
    lambda ct: ((ct.shape, ct.dtype),) * 2,
    reference=flipsum_ref,
)


# --- linear, output twice as long: y = [x, 3 x] along axis 0 (shape 2 n) ---------
def _stack3(out, args, kwargs_dump):
    (x,) = args
    n = x.shape[0]
    out[0][:n] = x
    out[0][n:] = 3 * x


def _stack3_T(out, args, kwargs_dump):
    (ct,) = args
    n = ct.shape[0] // 2
    out[0][...] = ct[:n] + 3 * ct[n:]


def _stack3_abstract(x, **kwargs):
    return (((2 * x.shape[0],) + x.shape[1:], x.dtype),)


def _stack3_abstract_T(ct, **kwargs):
    return (((ct.shape[0] // 2,) + ct.shape[1:], ct.dtype),)


def stack3_ref(x):
    return jnp.concatenate([x, 3 * x], axis=0)


stack3 = jaxbind.get_linear_call(
    _stack3, _stack3_T, _stack3_abstract, _stack3_abstract_T, reference=stack3_ref
)


# --- linear, drops the first `k` entries along axis 0 (shape n - k) --------------
def _trim(out, args, kwargs_dump):
    k = jaxbind.load_kwargs(kwargs_dump)["k"]
    out[0][...] = args[0][k:]


def _trim_T(out, args, kwargs_dump):
    k = jaxbind.load_kwargs(kwargs_dump)["k"]
    out[0][:k] = 0
    out[0][k:] = args[0]


def _trim_abstract(x, *, k, **kwargs):
    return (((x.shape[0] - k,) + x.shape[1:], x.dtype),)


def _trim_abstract_T(ct, *, k, **kwargs):
    return (((ct.shape[0] + k,) + ct.shape[1:], ct.dtype),)


def trim_ref(x, k):
    return x[k:]


trim = jaxbind.get_linear_call(_trim, _trim_T, _trim_abstract, _trim_abstract_T, reference=trim_ref)


# --- pytree API: a dict in, a tuple out (the call's pytree structure is exported) ---
def _pair_shape(d, *, k=1.0):
    return (jax.ShapeDtypeStruct(d["a"].shape, d["a"].dtype),) * 2


def native_pair_ref(d, k=1.0):
    return (k * d["a"], 2 * k * d["b"])


@jaxbind.linear_op(shape=_pair_shape, reference=native_pair_ref, name="reference_ops.native_pair")
def native_pair(d, *, k=1.0):
    return (k * d["a"], 2 * k * d["b"])


@native_pair.def_transpose
def _native_pair_T(ct, *, k=1.0):
    return {"a": k * ct[0], "b": 2 * k * ct[1]}


# --- integer and boolean outputs: a sort with its int32 permutation and a bool mask ------
# sort_with_order(x) = (x sorted, the int32 permutation that sorts it, sorted x > 0); the
# last two have float0 tangents. Declared rules, rules derived from the reference, and
# the same in the pytree API.
def sort_with_order_ref(x):
    p = jnp.argsort(x, stable=True).astype(jnp.int32)
    return x[p], p, x[p] > 0


def _order(x):
    return np.argsort(x, kind="stable")


def _sort_with_order(out, args, kwargs_dump):
    (x,) = args
    p = _order(x)
    out[0][...], out[1][...], out[2][...] = x[p], p, x[p] > 0


def _sort_with_order_jvp(out, args, kwargs_dump):
    x, dx = args
    out[0][...], out[1][...], out[2][...] = dx[_order(x)], 0, False


def _sort_with_order_vjp(out, args, kwargs_dump):
    x, ct, ct_order, ct_mask = args  # zeros of int32 and bool: those outputs have no tangents
    assert ct_order.dtype == np.int32 and ct_mask.dtype == np.bool_
    out[0][...] = 0
    out[0][_order(x)] = ct


def _sort_with_order_abstract(x, **kwargs):
    return ((x.shape, x.dtype), (x.shape, np.int32), (x.shape, np.bool_))


def _sort_with_order_op(rules, name):
    return jaxbind.get_nonlinear_call(
        _sort_with_order,
        rules,
        _sort_with_order_abstract,
        reference=sort_with_order_ref,
        name=f"reference_ops.{name}",
    )


sort_with_order = _sort_with_order_op(
    (_sort_with_order_jvp, _sort_with_order_vjp), "sort_with_order"
)
sort_with_order_derived = _sort_with_order_op((None, None), "sort_with_order_derived")


def _sort_with_order_shape(x):
    return (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(x.shape, np.int32),
        jax.ShapeDtypeStruct(x.shape, np.bool_),
    )


def _native_sort(x):
    p = _order(x)
    return x[p], p.astype(np.int32), x[p] > 0


native_sort_with_order = jaxbind.nonlinear_op(
    shape=_sort_with_order_shape,
    reference=sort_with_order_ref,
    name="reference_ops.native_sort_with_order",
)(_native_sort)


@native_sort_with_order.def_jvp
def _native_sort_jvp(primals, tangents):
    ((x,), (dx,)) = primals, tangents
    return dx[_order(x)], np.zeros(x.shape, np.int32), np.zeros(x.shape, bool)


@native_sort_with_order.def_vjp
def _native_sort_vjp(primals, cotangents):
    (x,), (ct, ct_order, ct_mask) = primals, cotangents
    assert ct_order.dtype == np.int32 and ct_mask.dtype == np.bool_
    out = np.zeros_like(x)
    out[_order(x)] = ct
    return (out,)


native_sort_with_order_derived = jaxbind.nonlinear_op(
    shape=_sort_with_order_shape,
    reference=sort_with_order_ref,
    name="reference_ops.native_sort_with_order_derived",
)(_native_sort)


# --- a boolean input that is not fixed, an int32 output: f(x, m) = (where(m, x^2, 0), sum m)
def masked_square_ref(x, m):
    return jnp.where(m, x**2, 0), m.sum().astype(jnp.int32)


def _masked_square(out, args, kwargs_dump):
    x, m = args
    out[0][...], out[1][...] = np.where(m, x**2, 0), m.sum()


@jaxbind.jax_function
def _masked_square_jvp(x, m, dx, dm):
    return [jnp.where(m, 2 * x * dx, 0), jnp.zeros((), jnp.int32)]


@jaxbind.jax_function
def _masked_square_vjp(x, m, ct, ct_count):
    return [jnp.where(m, 2 * x * ct, 0), jnp.zeros(m.shape, bool)]


masked_square = jaxbind.get_nonlinear_call(
    _masked_square,
    (_masked_square_jvp, _masked_square_vjp),
    lambda x, m, **kwargs: ((x.shape, x.dtype), ((), np.int32)),
    reference=masked_square_ref,
    name="reference_ops.masked_square",
)


# --- linear in x, with fixed int32 indices: y = x[idx] --------------------------------------
def _gather(out, args, kwargs_dump):
    idx, x = args
    out[0][...] = x[idx]


def _gather_T(out, args, kwargs_dump):
    idx, ct = args
    out[0][...] = 0
    np.add.at(out[0], idx, ct)


gather = jaxbind.get_linear_call(
    _gather,
    _gather_T,
    lambda idx, x, **kwargs: ((idx.shape, x.dtype),),
    lambda idx, ct, n, **kwargs: (((n,), ct.dtype),),
    first_n_args_fixed=1,
    reference=lambda idx, x, n: x[idx],
    name="reference_ops.gather",
)
