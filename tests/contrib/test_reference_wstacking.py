"""The wgridder reference's fast path (`reference.wstacking`: w-stacking on the spreading
kernel) against the direct sum (`reference.wgridder.direct_sum`, exact) at small sizes:
every convention (w-term, flips, pixel sizes, centre offsets, divide_by_n, flip_w), a few
accuracies, both precisions; its transpose as the adjoint, its gradient, vmap; many w
planes, and the direct sum it falls back to beyond its schedule. The comparison with DUCC
itself (forward, transpose, grad) is in test_references_wgridder_sht.py and
test_reference_tolerances.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random

from jaxbind._compat import TRANSPOSES_SCANS_OF_CONDITIONALS
from jaxbind.contrib.ducc.reference import wstacking
from jaxbind.contrib.ducc.reference.wgridder import SPEED_OF_LIGHT, direct_sum, wgridder

pytestmark = [
    pytest.mark.usefixtures("enable_x64"),  # from tests/conftest.py
    pytest.mark.skipif(
        not TRANSPOSES_SCANS_OF_CONDITIONALS,
        reason="this JAX cannot transpose w-stacking's scan: the reference sums directly",
    ),
]

NPIX = (32, 24)  # unequal: a transposed axis fails
PIXSIZE = (2e-3, 3e-3)  # a wide field (3.7 x 4.1 degrees), so that n - 1 matters


def _max_error(got, want):
    got, want = np.asarray(got), np.asarray(want)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _visibilities(nrows=40, wscale=30.0, seed=0):
    """uvw (metres) reaching the image's highest frequencies, w `wscale` times larger;
    three channels out of order."""
    rng = np.random.default_rng(seed)
    freq = np.array([1.0e9, 1.4e9, 1.2e9])
    uvw = (rng.random((nrows, 3)) - 0.5) / (PIXSIZE[0] * freq.max() / SPEED_OF_LIGHT)
    uvw[:, 2] *= wscale
    return jnp.asarray(uvw), jnp.asarray(freq)


def _options(**options):
    return dict(
        pixsize_x=PIXSIZE[0], pixsize_y=PIXSIZE[1], npix_x=NPIX[0], npix_y=NPIX[1], **options
    )


def _pair(uvw, freq, epsilon, **options):
    """The reference (w-stacking) and the direct sum, as image -> vis."""
    kwargs = _options(**options)

    def fast(image):
        return wgridder(uvw, freq, image, epsilon=epsilon, **kwargs)[0]

    def exact(image):
        return direct_sum(uvw, freq, image, **kwargs)

    return fast, exact


CASES = [
    (1e-3, dict(do_wgridding=True)),
    (1e-6, dict(do_wgridding=True)),
    (1e-12, dict(do_wgridding=True)),
    (1e-6, dict(do_wgridding=False, flip_u=True, flip_v=True, center_x=-0.01, center_y=0.02)),
    (1e-9, dict(do_wgridding=True, flip_u=True, flip_w=True, center_x=0.01, center_y=-0.02)),
    (1e-9, dict(do_wgridding=True, flip_v=True, divide_by_n=False, center_y=0.03)),
]


@pytest.mark.parametrize("epsilon,options", CASES, ids=str)
def test_wstacking_is_within_epsilon_of_the_direct_sum(epsilon, options):
    uvw, freq = _visibilities()
    fast, exact = _pair(uvw, freq, epsilon, **options)
    image = random(NPIX, np.float64, 1)
    got, want = jax.jit(fast)(image), jax.jit(exact)(image)
    assert got.dtype == want.dtype == np.complex128 and got.shape == want.shape == (40, 3)
    # below epsilon: DUCC's own error is up to 0.83 epsilon, and the checker allows 3
    assert _max_error(got, want) < epsilon


@pytest.mark.parametrize("x64", [True, False])
def test_wstacking_in_single_precision(x64):
    """A float32 image: with x64 the phases are double (uvw is), without it everything is
    single, the kernel capped at single precision's width."""
    from support.dtypes import global_x64

    with global_x64(x64):
        uvw, freq = _visibilities()
        if not x64:
            uvw, freq = uvw.astype(np.float32), freq.astype(np.float32)
        fast, exact = _pair(uvw, freq, 1e-5, do_wgridding=True)
        image = random(NPIX, np.float32, 1)
        got = jax.jit(fast)(image)
        assert got.dtype == np.complex64
        want = exact(image.astype(np.float64) if x64 else image)
        assert _max_error(got, want) < (1e-5 if x64 else 2e-4)


@pytest.mark.parametrize("do_wgridding", [True, False])
def test_wstacking_transpose_is_its_adjoint_and_the_direct_sums(do_wgridding):
    """sum(x A^T(y)) = Re sum(A(x) y) (JAX's transpose of a real-to-complex map), and A^T
    is the direct sum's transpose within epsilon."""
    uvw, freq = _visibilities()
    epsilon = 1e-9
    fast, exact = _pair(uvw, freq, epsilon, do_wgridding=do_wgridding)
    image = random(NPIX, np.float64, 1)
    y = random((40, 3), np.float64, 2, complex_=True)

    @jax.jit
    def transposes(y):  # inside jit: JAX's linearization runs traced, not op by op
        return jax.linear_transpose(fast, image)(y)[0], jax.linear_transpose(exact, image)(y)[0]

    t_fast, t_exact = transposes(y)
    left = float(jnp.sum(image * t_fast))
    right = float(jnp.real(jnp.sum(jax.jit(fast)(image) * y)))
    assert abs(left - right) < 1e-9 * abs(right)
    assert _max_error(t_fast, t_exact) < epsilon


def test_wstacking_gradient_and_vmap_match_the_direct_sum():
    uvw, freq = _visibilities()
    fast, exact = _pair(uvw, freq, 1e-9, do_wgridding=True)
    data = random((40, 3), np.float64, 2, complex_=True)

    def loss(f):
        return lambda image: jnp.sum(jnp.abs(f(image) - data) ** 2)

    image = random(NPIX, np.float64, 1)
    g_fast = jax.jit(jax.grad(loss(fast)))(image)
    g_exact = jax.jit(jax.grad(loss(exact)))(image)
    assert _max_error(g_fast, g_exact) < 1e-8

    images = random((3, *NPIX), np.float64, 4)
    batched = jax.jit(jax.vmap(fast))(images)
    looped = np.stack([jax.jit(exact)(im) for im in images])
    assert _max_error(batched, looped) < 1e-9


def test_wstacking_holds_many_w_planes_and_falls_back_beyond_its_schedule(monkeypatch):
    """w 300 times the image's frequencies: many groups of planes, the visibilities
    sorted into them; with no spare steps (monkeypatched) the groups no longer fit the
    schedule and the direct sum computes the call instead, so it is still right."""
    uvw, freq = _visibilities(nrows=60, wscale=300.0)
    fast, exact = _pair(uvw, freq, 1e-6, do_wgridding=True)
    image = random(NPIX, np.float64, 1)
    want = jax.jit(exact)(image)
    assert _max_error(jax.jit(fast)(image), want) < 1e-6

    monkeypatch.setattr(wstacking, "SPARE_STEPS", 0)
    fast, _ = _pair(uvw, freq, 1e-6, do_wgridding=True)  # traced anew
    # exact: the direct sum's result, not w-stacking's (within 1e-6, not 1e-12)
    assert _max_error(jax.jit(fast)(image), want) < 1e-12


def test_wstacking_gives_nan_where_a_coordinate_is_not_finite_and_a_nan_transpose():
    """As the op: NaN visibilities in a row with a non-finite coordinate (the others
    right), and a NaN image from the transpose (every visibility reaches every pixel)."""
    uvw, freq = _visibilities(nrows=6)
    uvw = uvw.at[2, 1].set(np.nan)
    fast, exact = _pair(uvw, freq, 1e-9, do_wgridding=True)
    image = random(NPIX, np.float64, 1)
    got = np.asarray(jax.jit(fast)(image))
    assert np.isnan(got[2]).all() and np.isfinite(np.delete(got, 2, axis=0)).all()
    keep = np.arange(6) != 2
    assert _max_error(got[keep], np.asarray(jax.jit(exact)(image))[keep]) < 1e-9
    y = random((6, 3), np.float64, 2, complex_=True)
    back = jax.jit(lambda y: jax.linear_transpose(fast, image)(y)[0])(y)
    assert np.isnan(np.asarray(back)).all()
