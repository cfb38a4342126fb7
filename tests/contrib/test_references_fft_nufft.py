"""The pure-JAX references of the DUCC FFTs and NUFFTs against the native ops.

Each reference (`jaxbind.contrib.ducc.reference`) is called as its op's callable is and
compared with the op on the same inputs: the forward result, and ``jax.grad`` of a
scalar loss with respect to the values (and, where the op is differentiable in them,
the points); then JAX's finite differences check the reference's own derivatives to
second order (reverse mode, which JAX derives by linearizing and transposing: the JVP
and its transpose are both checked). Tolerances (relative, 2-norm): the FFTs 1e-12
(float64) and 2e-5 (float32); the NUFFTs, run at eps 1e-11 and 1e-5, 1e-9 and 2e-4. A
wrong convention (a transposed grid, the other sign or mode order, the period) misses
by O(1): the last test shows that these comparisons see it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from support.arrays import norm_relative_error, normal

pytest.importorskip("ducc0", reason="ducc0 is not installed (in the clone: pip install '.[ducc]')")

from jaxbind.contrib import jaxducc0
from jaxbind.contrib.ducc.reference import fft as ref_fft
from jaxbind.contrib.ducc.reference import nufft as ref_nufft

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

SINGLE = (np.float32, np.complex64)


def _tol(dtype, single, double):
    return single if np.dtype(dtype) in SINGLE else double


def _loss(fn, weights):
    """A real scalar of the first output of `fn`: linear and quadratic parts, so that the
    gradient depends on the result, not only on the map."""

    def loss(*args):
        y = fn(*args)
        return jnp.sum(jnp.real(weights * y)) + 0.5 * jnp.sum(jnp.abs(y) ** 2)

    return loss


def _close(got, want, rtol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.shape(g) == np.shape(w) and np.asarray(g).dtype == np.asarray(w).dtype
        err = norm_relative_error(g, w)
        assert err < rtol, f"relative error {err:.2e} > {rtol:.0e}"


# --- the FFT family ----------------------------------------------------------------------

# the options, and the length of the last axis (odd and even: the real pair's Nyquist mode)
FFT_OPTIONS = [
    ({}, 5),
    ({}, 6),
    (dict(axes=(1,), inorm=1), 5),
    (dict(axes=(-1, 0), forward=False, inorm=2), 6),
    (dict(axes=(-1, 0), forward=False, inorm=2), 5),
    (dict(axes=(2, 0), forward=None), 4),
]


def _fft_case(op, dtype, options, n_last=5):
    """(native call, reference call, input) of one FFT op."""
    rng = np.random.default_rng(1)
    shape = (4, 6, n_last)
    axes = ref_fft.fft_axes(len(shape), options.get("axes"))
    n = shape[axes[-1]]
    real = np.dtype(dtype)
    cplx = np.result_type(real, np.complex64)
    if op == "c2c":
        x = normal(rng, shape, cplx)
        return (lambda x: jaxducc0.c2c(x, **options)[0]), lambda x: ref_fft.c2c(x, **options)[0], x
    if op == "genuine_fht":
        opts = {k: v for k, v in options.items() if k != "forward"}
        return (
            lambda x: jaxducc0.genuine_fht(x, **opts)[0],
            lambda x: ref_fft.genuine_fht(x, **opts)[0],
            normal(rng, shape, real),
        )
    if op == "r2c":
        return (
            lambda x: jaxducc0.r2c(x, **options)[0],
            lambda x: ref_fft.r2c(x, n=n, **options)[0],
            normal(rng, shape, real),
        )
    half = list(shape)
    half[axes[-1]] = n // 2 + 1
    # imaginary parts at the self-conjugate modes too: c2r ignores them, as DUCC does
    return (
        lambda x: jaxducc0.c2r(x, lastsize=n, **options)[0],
        lambda x: ref_fft.c2r(x, n=n, **options)[0],
        normal(rng, tuple(half), cplx),
    )


# every option set in float64; single precision on two of them (odd and even lengths)
FFT_CASES = [(np.float64, *case) for case in FFT_OPTIONS] + [
    (np.float32, *FFT_OPTIONS[0]),
    (np.float32, *FFT_OPTIONS[3]),
]


@pytest.mark.parametrize("dtype,options,n_last", FFT_CASES, ids=str)
@pytest.mark.parametrize("op", ["c2c", "genuine_fht", "r2c", "c2r"])
def test_fft_reference_matches_the_op_forward_and_grad(op, dtype, options, n_last):
    native, ref, x = _fft_case(op, dtype, options, n_last)
    ref = jax.jit(ref)
    rtol = _tol(dtype, 2e-5, 1e-12)
    want = native(x)
    _close(ref(x), want, rtol)
    weights = jnp.asarray(normal(np.random.default_rng(2), want.shape, want.dtype))
    _close(jax.grad(_loss(ref, weights))(x), jax.grad(_loss(native, weights))(x), rtol)


@pytest.mark.parametrize("op", ["c2c", "genuine_fht", "r2c", "c2r"])
def test_fft_reference_derivatives_pass_finite_differences(op):
    _, ref, x = _fft_case(op, np.float64, dict(axes=(0, 2), inorm=1), 4)
    check_grads(jax.jit(ref), (x,), order=2, modes=("rev",))


def test_fft_reference_transforms_more_than_three_axes_and_batch_axes():
    x = normal(np.random.default_rng(3), (2, 3, 2, 3, 2), np.complex128)
    _close(ref_fft.c2c(x)[0], jaxducc0.c2c(x)[0], 1e-12)
    # batch_axes (the op's batching rule's keyword) leave those axes untransformed
    got = ref_fft.c2c(x, axes=(0, -1), batch_axes=((1, 3),))[0]
    _close(got, jnp.fft.fftn(x, axes=(0, 4)), 1e-12)
    xr = np.real(x)
    _close(ref_fft.r2c(xr, n=2)[0], jaxducc0.r2c(xr)[0], 1e-12)


# --- the NUFFTs ----------------------------------------------------------------------------

GRIDS = {1: (9,), 2: (6, 5), 3: (4, 5, 3)}  # unequal lengths: a transposed layout fails
M, K = 11, 7


def _points(rng, d, m, real, low=-np.pi, high=np.pi):
    return jnp.asarray(rng.uniform(low, high, (d, m)).astype(real))


def _nufft_points_case(kind, d, dtype, sign=-1, modeord=0):
    """(native, reference, values, xs[, qs]) of the op beneath jax-finufft's calls."""
    rng = np.random.default_rng(4 + kind + 3 * d)
    real = np.dtype(np.float32 if dtype == np.complex64 else np.float64)
    grid = GRIDS[d]
    xs = _points(rng, d, M, real)
    shape = (2, *grid) if kind == 2 else (2, M)
    args = [jnp.asarray(normal(rng, shape, dtype)), xs]
    if kind == 3:
        args.append(_points(rng, d, K, real, -4, 4))
    eps = _tol(dtype, 1e-5, 1e-11)
    kw = dict(nufft_type=kind, sign=sign, modeord=modeord, grid=grid if kind == 1 else None)
    native = lambda *a: jaxducc0.nufft_points(*a, eps=eps, **kw)[0]
    ref = lambda *a: ref_nufft.nufft_points(*a, eps=eps, **kw)[0]
    return native, ref, args


# both signs and mode orders, each in one precision (the other precision in the tests below)
@pytest.mark.parametrize("sign,modeord,dtype", [(-1, 0, np.complex64), (1, 1, np.complex128)])
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("kind", [1, 2, 3])
def test_nufft_points_reference_matches_forward_and_grads(kind, d, sign, modeord, dtype):
    native, ref, args = _nufft_points_case(kind, d, dtype, sign, modeord)
    ref = jax.jit(ref)
    rtol = _tol(dtype, 2e-4, 1e-9)
    want = native(*args)
    _close(ref(*args), want, rtol)
    weights = jnp.asarray(normal(np.random.default_rng(5), want.shape, want.dtype))
    argnums = tuple(range(len(args)))  # the values and every point set
    _close(
        jax.grad(_loss(ref, weights), argnums)(*args),
        jax.grad(_loss(native, weights), argnums)(*args),
        rtol,
    )


@pytest.mark.parametrize("kind", [1, 2, 3])
def test_nufft_reference_derivatives_pass_finite_differences(kind):
    _, ref, args = _nufft_points_case(kind, 2, np.complex128)
    check_grads(jax.jit(ref), args, order=2, modes=("rev",))


@pytest.mark.parametrize("fft_order", [False, True])
@pytest.mark.parametrize("forward", [True, False])
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("kind", [1, 2])
def test_get_nufft_reference_matches_with_periodicity(kind, d, forward, fft_order):
    rng = np.random.default_rng(6 + d)
    grid = GRIDS[d]
    period = 5.0
    coord = jnp.asarray(rng.uniform(0, period, (M, d)))  # (M, d): a row per point
    values = jnp.asarray(normal(rng, grid if kind == 2 else (M,), np.complex128))
    kw = dict(nufft_type=kind, forward=forward, periodicity=period, fft_order=fft_order)
    op = jaxducc0.get_nufft(coord, grid, epsilon=1e-11, **kw)
    native = lambda v: op(v)[0]
    ref = lambda v: ref_nufft.nufft(coord, v, grid_shape=grid, epsilon=1e-11, **kw)[0]
    want = native(values)
    _close(ref(values), want, 1e-9)
    weights = jnp.asarray(normal(rng, want.shape, want.dtype))
    _close(jax.grad(_loss(ref, weights))(values), jax.grad(_loss(native, weights))(values), 1e-9)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("kind", [1, 2, 3])
def test_nufft_plan_reference_matches_forward_and_grad(kind, dtype):
    rng = np.random.default_rng(8 + kind)
    d = 2
    grid = GRIDS[d]
    real = np.float32 if dtype == np.complex64 else np.float64
    points = [rng.uniform(-np.pi, np.pi, M).astype(real) for _ in range(d)]
    if kind == 3:
        points += [rng.uniform(-4, 4, K).astype(real) for _ in range(d)]
    eps = _tol(dtype, 1e-5, 1e-11)
    plan = jaxducc0.NufftPlan(
        kind, None if kind == 3 else grid, *points, eps=eps, opts=jaxducc0.Opts(modeord=1)
    )
    values = jnp.asarray(normal(rng, (2, *plan.in_core), dtype))
    ref = lambda v: ref_nufft.nufft_plan(v, **plan._kw)[0]  # the op's keywords
    rtol = _tol(dtype, 2e-4, 1e-9)
    want = plan(values)
    _close(ref(values), want, rtol)
    weights = jnp.asarray(normal(rng, want.shape, want.dtype))
    _close(jax.grad(_loss(ref, weights))(values), jax.grad(_loss(plan, weights))(values), rtol)


@pytest.mark.parametrize("kind", [1, 2, 3])
def test_jax_finufft_calls_in_pure_jax_match_the_drop_in(kind):
    """Leading dimensions as jax-finufft broadcasts them: values (2, 3, ...) with points
    (2, M), one leading dimension more, so the points are shared along the last one."""
    rng = np.random.default_rng(10 + kind)
    d = 2
    grid = GRIDS[d]
    points = [jnp.asarray(rng.uniform(-np.pi, np.pi, (2, M))) for _ in range(d)]
    if kind == 3:
        points += [jnp.asarray(rng.uniform(-4, 4, (2, K))) for _ in range(d)]
    values = jnp.asarray(normal(rng, (2, 3, *grid) if kind == 2 else (2, 3, M), np.complex128))
    kw = dict(eps=1e-11, opts=jaxducc0.Opts(modeord=1))
    if kind == 1:
        native = lambda v, *p: jaxducc0.nufft1(grid, v, *p, **kw)
        ref = lambda v, *p: ref_nufft.nufft1(grid, v, *p, **kw)
    else:
        fast, pure = getattr(jaxducc0, f"nufft{kind}"), getattr(ref_nufft, f"nufft{kind}")
        native = lambda v, *p: fast(v, *p, **kw)
        ref = lambda v, *p: pure(v, *p, **kw)
    ref = jax.jit(ref)
    want = native(values, *points)
    _close(ref(values, *points), want, 1e-9)
    weights = jnp.asarray(normal(rng, want.shape, want.dtype))
    argnums = tuple(range(1 + len(points)))
    _close(
        jax.grad(_loss(ref, weights), argnums)(values, *points),
        jax.grad(_loss(native, weights), argnums)(values, *points),
        1e-9,
    )


def test_direct_sum_blocks_empty_inputs_and_non_finite_points():
    _, _, (c, xs) = _nufft_points_case(1, 2, np.complex128)
    f = jnp.asarray(normal(np.random.default_rng(12), (2, 6, 5), np.complex128))
    whole = ref_nufft.direct_sum(f, xs, nufft_type=2, sign=-1)
    for block in (1, 4):  # blocks that do not divide the 11 points: padding
        _close(ref_nufft.direct_sum(f, xs, nufft_type=2, sign=-1, block=block), whole, 1e-13)
        _close(
            ref_nufft.direct_sum(c, xs, nufft_type=1, sign=1, grid=(6, 5), block=block),
            ref_nufft.direct_sum(c, xs, nufft_type=1, sign=1, grid=(6, 5)),
            1e-13,
        )
    assert ref_nufft.direct_sum(c[:, :0], xs[:, :0], nufft_type=1, sign=1, grid=(6, 5)).shape == (
        2,
        6,
        5,
    )
    assert not np.any(ref_nufft.direct_sum(f[:, :0], xs, nufft_type=2, sign=1))
    # a non-finite point: type 2 marks its own output, type 1 every output (as the ops)
    bad = xs.at[1, 3].set(jnp.inf)
    out2 = np.asarray(ref_nufft.direct_sum(f, bad, nufft_type=2, sign=-1))
    assert np.isnan(out2[:, 3]).all() and np.isfinite(np.delete(out2, 3, axis=1)).all()
    native2 = np.asarray(jaxducc0.nufft_points(f, bad, nufft_type=2, sign=-1, eps=1e-9)[0])
    assert (np.isnan(native2) == np.isnan(out2)).all()
    assert np.isnan(ref_nufft.direct_sum(c, bad, nufft_type=1, sign=1, grid=(6, 5))).all()


def test_reference_is_jittable_and_vmappable():
    native, ref, (f, xs) = _nufft_points_case(2, 2, np.complex128)
    stacked = jnp.stack([xs, xs[:, ::-1]])
    got = jax.jit(jax.vmap(ref, in_axes=(None, 0)))(f, stacked)
    _close(got, jnp.stack([native(f, xs), native(f, xs[:, ::-1])]), 1e-9)


# --- the comparisons see a wrong convention --------------------------------------------------


def test_a_transposed_grid_or_wrong_convention_misses_by_order_one():
    """What the checks above would see of a reference with another convention: a 2-D
    grid taken transposed (nufftax's layout), the other sign, the other mode order, the
    period 2 pi for get_nufft's 5, Re(F) + Im(F) for the Hartley transform."""
    rng = np.random.default_rng(13)
    xs = _points(rng, 2, M, np.float64)
    f = jnp.asarray(normal(rng, (1, 6, 6), np.complex128))  # square: transposing fits
    native = jaxducc0.nufft_points(f, xs, nufft_type=2, sign=-1, eps=1e-11)[0]
    wrong = {
        "transposed grid": ref_nufft.nufft_points(jnp.swapaxes(f, 1, 2), xs, nufft_type=2, sign=-1),
        "sign": ref_nufft.nufft_points(f, xs, nufft_type=2, sign=1),
        "mode order": ref_nufft.nufft_points(f, xs, nufft_type=2, sign=-1, modeord=1),
    }
    for what, (got,) in wrong.items():
        assert norm_relative_error(got, native) > 0.3, what
    coord = xs.T * (5 / (2 * np.pi))
    op = jaxducc0.get_nufft(coord, (6, 6), nufft_type=2, periodicity=5.0, epsilon=1e-11)
    (got,) = ref_nufft.nufft(coord, f[0], grid_shape=(6, 6), nufft_type=2)
    assert norm_relative_error(got, op(f[0])[0]) > 0.3
    x = normal(rng, (4, 6), np.float64)
    spectrum = jnp.fft.fftn(x)
    assert norm_relative_error(spectrum.real + spectrum.imag, jaxducc0.genuine_fht(x)[0]) > 0.3
