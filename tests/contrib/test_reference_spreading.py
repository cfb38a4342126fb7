"""The NUFFT references' fast paths (`reference.spreading`: types 1 and 2 by spreading, FFT
and deconvolution; `reference.type3`: type 3 by rescaling) against the direct sum (exact)
at small sizes: accuracies paired with dimensions and precisions, signs, mode orders and
periods; non-finite points; the transposes in the values (the other type, by the dot
product and by what JAX traces); derivatives in the values and the points (against the
direct sum's, and JAX's finite differences); vmap; type 3 against DUCC. The entry
points' comparison with DUCC is in test_references_fft_nufft.py and
test_reference_tolerances.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from support.arrays import normal

from jaxbind.contrib.ducc.reference import nufft as ref_nufft
from jaxbind.contrib.ducc.reference import spreading, type3

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

GRIDS = {1: (13,), 2: (8, 7), 3: (5, 6, 4)}  # odd and even, unequal: a transposed axis fails
M, K = 40, 30
# type 3's grids allowed at these sizes (the direct sum would cost less): two or three
# sizes where the points are traced
FORCED = {1: 256, 2: 128**2, 3: 128**3}
# (dtype, eps, d): each accuracy in one dimension; the finest in two
ACCURACIES = [
    (np.complex128, 1e-3, 3),
    (np.complex128, 1e-6, 2),
    (np.complex128, 1e-9, 1),
    (np.complex128, 1e-12, 2),
    (np.complex128, 1e-12, 3),
    (np.complex64, 1e-3, 1),
    (np.complex64, 1e-5, 2),
]


def _max_error(got, want):
    got, want = np.asarray(got), np.asarray(want)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _case(kind, d, dtype, seed=0, low=-np.pi, high=np.pi):
    """values, xs[, qs] of a transform of `kind` (type 3's targets in [-5, 3)^d)."""
    rng = np.random.default_rng(seed + 10 * kind + d)
    real = np.float32 if dtype == np.complex64 else np.float64
    xs = jnp.asarray(rng.uniform(low, high, (d, M)).astype(real))
    shape = (2, *GRIDS[d]) if kind == 2 else (2, M)
    args = [jnp.asarray(normal(rng, shape, dtype)), xs]
    if kind == 3:
        args.append(jnp.asarray(rng.uniform(-5, 3, (d, K)).astype(real)))
    return args


def _fast(kind, d, eps, **kw):
    """The fast path of `kind` as a function of (values, xs[, qs])."""
    if kind == 3:
        return lambda v, x, q: type3.type3(v, x, q, eps=eps, max_cells=FORCED[d], **kw)
    return lambda v, x: ref_nufft.transform(v, x, nufft_type=kind, grid=GRIDS[d], eps=eps, **kw)


def _exact(kind, d, **kw):
    kw.pop("max_cells", None)
    return lambda *a: ref_nufft.direct_sum(*a, nufft_type=kind, grid=GRIDS[d], **kw)


@pytest.mark.parametrize("dtype,eps,d", ACCURACIES)
@pytest.mark.parametrize("kind", [1, 2, 3])
def test_fast_paths_are_within_epsilon_of_the_direct_sum(kind, d, dtype, eps):
    args = _case(kind, d, dtype)
    for sign, modeord in ((-1, 0), (1, 1))[: 1 if kind == 3 else 2]:  # type 3: no modes
        kw = dict(sign=sign) if kind == 3 else dict(sign=sign, modeord=modeord)
        fast, exact = _fast(kind, d, eps, **kw)(*args), _exact(kind, d, **kw)(*args)
        assert fast.dtype == exact.dtype and fast.shape == exact.shape
        # below eps (DUCC's own error is up to 0.83 eps, and the checker allows 3 eps)
        assert _max_error(fast, exact) < max(eps, 2e-6 if dtype == np.complex64 else 0)


@pytest.mark.parametrize("d", [1, 2, 3])
def test_type3_picks_its_grid_when_the_points_are_traced(d):
    """Under jit the points' extents are unknown when the program is built: one of a
    ladder of grids is picked when it runs, and points no grid fits take the direct sum."""
    values, xs, qs = _case(3, d, np.complex128, seed=1)
    fn = jax.jit(_fast(3, d, 1e-9, sign=-1))
    exact = _exact(3, d, sign=-1)
    assert _max_error(fn(values, xs, qs), exact(values, xs, qs)) < 1e-9
    far = qs * 100  # beyond the largest grid (but in 1-D): the direct sum
    assert _max_error(fn(values, xs, far), exact(values, xs, far)) < 1e-9


@pytest.mark.parametrize("kind", [1, 2])
def test_points_anywhere_and_any_period_are_wrapped(kind):
    values, xs = _case(kind, 2, np.complex128, low=-40.0, high=55.0)
    scale = 2 * np.pi / 5.0  # get_nufft's periodicity 5
    fast = _fast(kind, 2, 1e-9, sign=1, scale=scale)(values, xs)
    assert _max_error(fast, _exact(kind, 2, sign=1, scale=scale)(values, xs)) < 1e-9
    shifted = _fast(kind, 2, 1e-9, sign=1, scale=scale)(values, xs + 5.0 * 3)
    assert _max_error(shifted, fast) < 1e-9


def test_non_finite_points_give_nan_where_they_enter():
    f, xs = _case(2, 2, np.complex128)
    c, _, qs = _case(3, 2, np.complex128)
    bad = xs.at[0, 3].set(jnp.nan).at[1, 5].set(jnp.inf)
    out2 = np.asarray(spreading.type2(f, bad, sign=-1, eps=1e-6))
    assert np.isnan(out2[:, [3, 5]]).all() and np.isfinite(np.delete(out2, [3, 5], axis=1)).all()
    assert np.isnan(np.asarray(spreading.type1(c, bad, GRIDS[2], sign=-1, eps=1e-6))).all()
    fn3 = jax.jit(_fast(3, 2, 1e-6, sign=1))
    assert np.isnan(np.asarray(fn3(c, bad, qs))).all()  # a source enters every target
    out3 = np.asarray(fn3(c, xs, qs.at[1, 4].set(jnp.nan)))
    assert np.isnan(out3[:, 4]).all() and np.isfinite(np.delete(out3, 4, axis=1)).all()


# --- transposes in the values ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize("kind", [1, 2, 3])
def test_transpose_in_the_values_is_the_other_type(kind, dtype):
    """<A x, y> = <x, A^T y> (JAX's transpose: no conjugation), and what JAX runs for the
    transpose is the other type's transform: no scatter, scan or gather of its own."""
    args = _case(kind, 2, dtype, seed=2)
    fast = _fast(kind, 2, 1e-6 if dtype == np.complex64 else 1e-12, sign=-1, modeord=1)
    if kind == 3:
        fast = _fast(3, 2, 1e-6 if dtype == np.complex64 else 1e-12, sign=-1)
    x, rest = args[0], args[1:]
    apply = lambda v: fast(v, *rest)
    y_like = jax.eval_shape(apply, x)
    y = jnp.asarray(normal(np.random.default_rng(3), y_like.shape, y_like.dtype))
    transpose = jax.linear_transpose(apply, x)
    (xt,) = transpose(y)
    lhs, rhs = jnp.sum(apply(x) * y), jnp.sum(x * xt)
    assert abs(lhs - rhs) / abs(lhs) < (1e-4 if dtype == np.complex64 else 1e-11)
    jaxpr = str(jax.make_jaxpr(transpose)(y))
    assert "scatter" not in jaxpr and "scan" not in jaxpr and "while" not in jaxpr
    if kind == 3:
        assert "nufft3_reference" in jaxpr
    else:
        assert f"kind={3 - kind}" in jaxpr


ENTRY_POINTS = {
    "nufft": (1, lambda v, x: ref_nufft.nufft(x.T, v[0], grid_shape=GRIDS[2], nufft_type=1)[0]),
    "nufft_points": (
        2,
        lambda v, x: ref_nufft.nufft_points(v, x, nufft_type=2, sign=1, eps=1e-9)[0],
    ),
    "nufft1": (1, lambda v, x: ref_nufft.nufft1(GRIDS[2], v, x[0], x[1], eps=1e-9)),
    "nufft2": (2, lambda v, x: ref_nufft.nufft2(v, x[0], x[1], eps=1e-9)),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_entry_point_differentiates_by_transforms_alone(name):
    """grad in the values and the points of every entry point runs the transposes and
    derivative rules above: NUFFTs, no scatter or loop of JAX's own."""
    kind, call = ENTRY_POINTS[name]
    values, xs = _case(kind, 2, np.complex128, seed=4)
    loss = lambda v, x: jnp.sum(jnp.abs(call(v, x)) ** 2)
    jaxpr = str(jax.make_jaxpr(jax.grad(loss, (0, 1)))(values, xs))
    assert f"kind={3 - kind}" in jaxpr and "scatter" not in jaxpr and "scan" not in jaxpr


def test_nufft_plan_transposes_by_the_other_type():
    rng = np.random.default_rng(5)
    coord = rng.uniform(-np.pi, np.pi, (M, 2))
    target = rng.uniform(-5, 5, (K, 2))
    values = jnp.asarray(normal(rng, (2, M), np.complex128))
    for kind, kw in ((1, dict(grid=GRIDS[2])), (3, dict(target=target))):
        plan = lambda v: ref_nufft.nufft_plan(v, nufft_type=kind, sign=1, coord=coord, **kw)[0]
        jaxpr = str(jax.make_jaxpr(jax.linear_transpose(plan, values))(plan(values)))
        assert ("nufft3_reference" if kind == 3 else "kind=2") in jaxpr and "scan" not in jaxpr


# --- derivatives -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,d", [(1, 1), (1, 3), (2, 2), (2, 3), (3, 1), (3, 2)])
def test_gradients_in_values_and_points_match_the_direct_sums(kind, d):
    args = _case(kind, d, np.complex128, seed=3)
    kw = dict(sign=-1) if kind == 3 else dict(sign=-1, modeord=1)
    out = jax.eval_shape(_exact(kind, d, **kw), *args)
    weights = jnp.asarray(normal(np.random.default_rng(9), out.shape, out.dtype))

    def loss(fn):
        def scalar(*a):
            y = fn(*a)
            return jnp.sum(jnp.real(weights * y)) + 0.5 * jnp.sum(jnp.abs(y) ** 2)

        return scalar

    argnums = tuple(range(len(args)))
    got = jax.grad(loss(_fast(kind, d, 1e-11, **kw)), argnums)(*args)
    want = jax.grad(loss(_exact(kind, d, **kw)), argnums)(*args)
    for g, w in zip(got, want):
        assert _max_error(g, w) < 1e-9


@pytest.mark.parametrize("kind", [1, 2, 3])
def test_fast_derivatives_pass_finite_differences_to_second_order(kind):
    args = _case(kind, 1, np.complex128, seed=5)
    fn = _fast(kind, 1, 1e-12, sign=1)
    modes = ("rev",) if kind == 3 else ("fwd", "rev")  # (type 3's rules are type 1's form)
    check_grads(jax.jit(fn), args, order=2, modes=modes, rtol=1e-5)


def test_fast_paths_vmap_over_points_and_values_like_a_loop():
    f, xs = _case(2, 2, np.complex128)
    stacked_x = jnp.stack([xs, xs[:, ::-1] * 0.5])
    stacked_f = jnp.stack([f, 2 * f])
    fn = lambda v, x: spreading.type2(v, x, sign=-1, eps=1e-9)
    got = jax.jit(jax.vmap(fn))(stacked_f, stacked_x)
    for i in range(2):
        assert _max_error(got[i], fn(stacked_f[i], stacked_x[i])) < 1e-13
    c, _, qs = _case(3, 2, np.complex128)
    fn1 = lambda v, x: spreading.type1(v, x, GRIDS[2], sign=1, eps=1e-9)
    got1 = jax.vmap(fn1, in_axes=(None, 0))(c, stacked_x)
    for i in range(2):
        assert _max_error(got1[i], fn1(c, stacked_x[i])) < 1e-13
    fn3 = _fast(3, 2, 1e-9, sign=1)
    got3 = jax.jit(jax.vmap(fn3, in_axes=(0, None, 0)))(
        jnp.stack([c, -c]), xs, jnp.stack([qs, qs / 2])
    )
    assert _max_error(got3[1], _exact(3, 2, sign=1)(-c, xs, qs / 2)) < 1e-9
    shared = jax.vmap(fn3, in_axes=(0, None, None))(jnp.stack([c, 3 * c]), xs, qs)
    assert _max_error(shared[1], _exact(3, 2, sign=1)(3 * c, xs, qs)) < 1e-9


# --- type 3 against DUCC ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype,eps,d", [(np.complex128, 1e-10, 3), (np.complex64, 1e-5, 1)])
def test_type3_agrees_with_ducc(d, dtype, eps):
    pytest.importorskip("ducc0", reason="ducc0 is not installed")
    from jaxbind.contrib import jaxducc0

    values, xs, qs = _case(3, d, dtype, seed=6)
    native = jaxducc0.nufft_points(values, xs, qs, nufft_type=3, sign=-1, eps=eps)[0]
    fast = _fast(3, d, eps, sign=-1)(values, xs, qs)
    assert _max_error(fast, native) < 3 * eps
