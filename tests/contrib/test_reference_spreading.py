"""The NUFFT references' fast path (`reference.spreading`: spreading, FFT, deconvolution)
against the direct sum (exact) at small sizes: every accuracy, dimension, precision,
sign, mode order and period; non-finite points; derivatives in the values and the
points (against the direct sum's, and JAX's finite differences); vmap. The comparison
with DUCC itself is in test_references_fft_nufft.py and test_reference_tolerances.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from support.arrays import normal

from jaxbind.contrib.ducc.reference import nufft as ref_nufft
from jaxbind.contrib.ducc.reference import spreading

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

GRIDS = {1: (13,), 2: (8, 7), 3: (5, 6, 4)}  # odd and even, unequal: a transposed axis fails
M = 40


def _max_error(got, want):
    got, want = np.asarray(got), np.asarray(want)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _case(kind, d, dtype, seed=0, low=-np.pi, high=np.pi):
    rng = np.random.default_rng(seed + 10 * kind + d)
    real = np.float32 if dtype == np.complex64 else np.float64
    xs = jnp.asarray(rng.uniform(low, high, (d, M)).astype(real))
    shape = (2, *GRIDS[d]) if kind == 2 else (2, M)
    return jnp.asarray(normal(rng, shape, dtype)), xs


def _both(kind, values, xs, d, eps, **kw):
    grid = GRIDS[d]
    fast = ref_nufft.transform(values, xs, nufft_type=kind, grid=grid, eps=eps, **kw)
    exact = ref_nufft.direct_sum(values, xs, nufft_type=kind, grid=grid, **kw)
    return fast, exact


@pytest.mark.parametrize(
    "dtype,eps",
    [(np.complex128, e) for e in (1e-3, 1e-6, 1e-9, 1e-12)]
    + [(np.complex64, e) for e in (1e-3, 1e-5)],
)
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("kind", [1, 2])
def test_spreading_is_within_epsilon_of_the_direct_sum(kind, d, dtype, eps):
    values, xs = _case(kind, d, dtype)
    for sign, modeord in ((-1, 0), (1, 1)):
        fast, exact = _both(kind, values, xs, d, eps, sign=sign, modeord=modeord)
        assert fast.dtype == exact.dtype and fast.shape == exact.shape
        # below eps (DUCC's own error is up to 0.83 eps, and the checker allows 3 eps)
        assert _max_error(fast, exact) < max(eps, 2e-6 if dtype == np.complex64 else 0)


@pytest.mark.parametrize("kind", [1, 2])
def test_points_anywhere_and_any_period_are_wrapped(kind):
    values, xs = _case(kind, 2, np.complex128, low=-40.0, high=55.0)
    scale = 2 * np.pi / 5.0  # get_nufft's periodicity 5
    fast, exact = _both(kind, values, xs, 2, 1e-9, sign=1, scale=scale)
    assert _max_error(fast, exact) < 1e-9
    shifted = ref_nufft.transform(
        values, xs + 5.0 * 3, nufft_type=kind, grid=GRIDS[2], sign=1, scale=scale, eps=1e-9
    )
    assert _max_error(shifted, fast) < 1e-9


def test_non_finite_points_give_nan_where_they_enter():
    f, xs = _case(2, 2, np.complex128)
    c, _ = _case(1, 2, np.complex128)
    bad = xs.at[0, 3].set(jnp.nan).at[1, 5].set(jnp.inf)
    out2 = np.asarray(spreading.type2(f, bad, sign=-1, eps=1e-6))
    assert np.isnan(out2[:, [3, 5]]).all() and np.isfinite(np.delete(out2, [3, 5], axis=1)).all()
    assert np.isnan(np.asarray(spreading.type1(c, bad, GRIDS[2], sign=-1, eps=1e-6))).all()


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("kind", [1, 2])
def test_gradients_in_values_and_points_match_the_direct_sums(kind, d):
    values, xs = _case(kind, d, np.complex128, seed=3)
    grid = GRIDS[d]
    kw = dict(nufft_type=kind, grid=grid, sign=-1, modeord=1)
    weights = jnp.asarray(normal(np.random.default_rng(9), (2, *grid) if kind == 1 else (2, M)))

    def loss(fn):
        def scalar(v, x):
            y = fn(v, x)
            return jnp.sum(jnp.real(weights * y)) + 0.5 * jnp.sum(jnp.abs(y) ** 2)

        return scalar

    fast = loss(lambda v, x: ref_nufft.transform(v, x, eps=1e-11, **kw))
    exact = loss(lambda v, x: ref_nufft.direct_sum(v, x, **kw))
    for got, want in zip(jax.grad(fast, (0, 1))(values, xs), jax.grad(exact, (0, 1))(values, xs)):
        assert _max_error(got, want) < 1e-9


@pytest.mark.parametrize("kind", [1, 2])
def test_spreading_derivatives_pass_finite_differences_to_second_order(kind):
    values, xs = _case(kind, 2, np.complex128, seed=5)
    fn = lambda v, x: ref_nufft.transform(v, x, nufft_type=kind, grid=GRIDS[2], sign=1, eps=1e-12)
    check_grads(jax.jit(fn), (values, xs), order=2, modes=("fwd", "rev"), rtol=1e-5)


def test_spreading_vmaps_over_points_and_values_like_a_loop():
    f, xs = _case(2, 2, np.complex128)
    stacked_x = jnp.stack([xs, xs[:, ::-1] * 0.5])
    stacked_f = jnp.stack([f, 2 * f])
    fn = lambda v, x: spreading.type2(v, x, sign=-1, eps=1e-9)
    got = jax.jit(jax.vmap(fn))(stacked_f, stacked_x)
    for i in range(2):
        assert _max_error(got[i], fn(stacked_f[i], stacked_x[i])) < 1e-13
    c, _ = _case(1, 2, np.complex128)
    fn1 = lambda v, x: spreading.type1(v, x, GRIDS[2], sign=1, eps=1e-9)
    got1 = jax.vmap(fn1, in_axes=(None, 0))(c, stacked_x)
    for i in range(2):
        assert _max_error(got1[i], fn1(c, stacked_x[i])) < 1e-13
