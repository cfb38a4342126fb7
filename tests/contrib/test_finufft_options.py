"""The jax-finufft drop-in (jaxducc0.nufft1/2/3) as jax-finufft behaves: a point's value
does not depend on which other points share the call, the oversampling factor is FINUFFT's
(``upsampfac``), and every option of jax-finufft's ``Opts`` is honoured, accepted without
effect (those that only tune FINUFFT's speed or messages) or refused (those that would
change the map).
"""

from __future__ import annotations

import warnings

import ducc0
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random_complex
from support.finufft_opts import (
    DebugLevel,
    FftwFlags,
    FinufftStyleOpts,
    GpuMethod,
    SpreadSort,
    SpreadThread,
)
from test_nufft import dense1, dense2, dense3

from jaxbind.contrib import jaxducc0

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

EPSILONS = (1e-4, 1e-6, 1e-8, 1e-12)


def _rel(a, b):
    """Largest difference relative to the largest magnitude."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _points(rng, d, m, lo=-np.pi, hi=np.pi):
    return [jnp.asarray(rng.uniform(lo, hi, m)) for _ in range(d)]


def _with_extremes(pts, first):
    """Indices of the first `first` points plus the extreme ones along every axis, so the
    subset spans the same box as all the points (type 3's grid depends on the box)."""
    idx = set(range(first))
    for p in pts:
        idx |= {int(jnp.argmin(p)), int(jnp.argmax(p))}
    return np.array(sorted(idx))


# --- a point's value does not depend on the other points -----------------------------


@pytest.mark.parametrize("eps", EPSILONS)
def test_nufft2_point_value_independent_of_other_points(eps):
    rng = np.random.default_rng(1)
    f = random_complex(rng, (32, 32))
    x, y = _points(rng, 2, 400)
    full = jaxducc0.nufft2(f, x, y, eps=eps)[:50]
    alone = jaxducc0.nufft2(f, x[:50], y[:50], eps=eps)
    assert _rel(alone, full) < 1e-12


@pytest.mark.parametrize("eps", EPSILONS)
def test_nufft1_sum_over_split_points_equals_one_call(eps):
    rng = np.random.default_rng(2)
    c = random_complex(rng, (400,))
    x, y = _points(rng, 2, 400)
    full = jaxducc0.nufft1((32, 32), c, x, y, eps=eps)
    parts = sum(
        jaxducc0.nufft1((32, 32), c[s], x[s], y[s], eps=eps)
        for s in (slice(0, 50), slice(50, None))
    )
    assert _rel(parts, full) < 1e-12


@pytest.mark.parametrize("eps", EPSILONS)
def test_nufft3_point_value_depends_on_other_points_only_through_their_extent(eps):
    rng = np.random.default_rng(3)
    c = random_complex(rng, (400,))
    x, y = _points(rng, 2, 400)
    s, t = _points(rng, 2, 300, -16, 16)
    full = jaxducc0.nufft3(c, x, y, s, t, eps=eps)
    # targets: a subset spanning the same box gets the same values
    keep = _with_extremes((s, t), 50)
    assert _rel(jaxducc0.nufft3(c, x, y, s[keep], t[keep], eps=eps), full[keep]) < 1e-12
    # sources: a part spanning the same box gives what the same values give among all
    # the points (the others with weight 0)
    idx = np.union1d(np.arange(200), _with_extremes((x, y), 0))
    alone = jaxducc0.nufft3(c[idx], x[idx], y[idx], s, t, eps=eps)
    among = jaxducc0.nufft3(jnp.zeros_like(c).at[idx].set(c[idx]), x, y, s, t, eps=eps)
    assert _rel(alone, among) < 1e-12


@pytest.mark.parametrize("eps", (1e-4, 1e-8))
def test_nufft2_derivatives_at_a_point_independent_of_other_points(eps):
    rng = np.random.default_rng(4)
    f = random_complex(rng, (32, 32))
    x, y = _points(rng, 2, 400)
    dx, dy = _points(rng, 2, 400)
    call = lambda f, x, y: jaxducc0.nufft2(f, x, y, eps=eps)
    # JVP in the points
    _, full = jax.jvp(call, (f, x, y), (jnp.zeros_like(f), dx, dy))
    _, alone = jax.jvp(call, (f, x[:50], y[:50]), (jnp.zeros_like(f), dx[:50], dy[:50]))
    assert _rel(alone, full[:50]) < 1e-12
    # VJP: the adjoint (a type 1) of cotangents at the first 50 points, and their gradients
    ct = random_complex(rng, (400,)).at[50:].set(0)
    _, vjp_full = jax.vjp(call, f, x, y)
    _, vjp_alone = jax.vjp(call, f, x[:50], y[:50])
    for got, want in zip(vjp_alone(ct[:50]), vjp_full(ct)):
        assert _rel(got, want[: got.shape[0]] if got.ndim == 1 else want) < 1e-12


# --- upsampfac: FINUFFT's oversampling factor ----------------------------------------


def _ducc_u2nu(f, x, y, eps, sigma):
    coord = np.stack([np.asarray(x), np.asarray(y)], axis=1)
    return ducc0.nufft.u2nu(
        grid=np.asarray(f), coord=coord, forward=True, epsilon=eps, sigma_min=sigma, sigma_max=sigma
    )


@pytest.mark.parametrize(
    "upsampfac,grid,eps,sigma",
    [
        (2.0, 32, 1e-6, 2.0),
        (1.25, 32, 1e-6, 1.25),
        (0.0, 32, 1e-6, 2.0),  # FINUFFT's default: 2.0 for a small grid,
        (None, 600, 1e-6, 1.25),  # 1.25 for a 2-D grid of more than 300000 modes,
        (0.0, 600, 1e-10, 2.0),  # but 2.0 where eps < 1e-9
    ],
)
def test_upsampfac_is_the_oversampling_factor_ducc_uses(upsampfac, grid, eps, sigma):
    rng = np.random.default_rng(5)
    f = random_complex(rng, (grid, grid))
    x, y = _points(rng, 2, 60)
    got = jaxducc0.nufft2(f, x, y, eps=eps, opts=jaxducc0.Opts(upsampfac=upsampfac))
    assert _rel(got, _ducc_u2nu(f, x, y, eps, sigma)) < 1e-12  # DUCC's plan rounds apart
    other = 2.0 if sigma != 2.0 else 1.25
    if eps >= 1e-8:  # where DUCC has kernels for both factors
        assert _rel(got, _ducc_u2nu(f, x, y, eps, other)) > 1e-3 * eps  # the factor matters


def test_nufft3_default_upsampfac_is_finuffts():
    rng = np.random.default_rng(6)
    c = random_complex(rng, (50,))
    x, s = _points(rng, 1, 50), _points(rng, 1, 40, -10, 10)
    auto = jaxducc0.nufft3(c, *x, *s, eps=1e-6)
    given = jaxducc0.nufft3(c, *x, *s, eps=1e-6, opts=jaxducc0.Opts(upsampfac=1.25))
    assert _rel(auto, given) == 0


@pytest.mark.parametrize("upsampfac", (1.25, 2.0, 0.0))
@pytest.mark.parametrize("kind", (1, 2, 3))
@pytest.mark.parametrize("eps", (1e-4, 1e-8))
def test_every_upsampfac_stays_within_eps_of_the_direct_sum(kind, upsampfac, eps):
    rng = np.random.default_rng(7 + kind)
    opts = jaxducc0.Opts(upsampfac=upsampfac)
    x, y = _points(rng, 2, 200)
    if kind == 1:
        c = random_complex(rng, (200,))
        got, want = (
            jaxducc0.nufft1((20, 18), c, x, y, eps=eps, opts=opts),
            dense1((20, 18), c, x, y),
        )
    elif kind == 2:
        f = random_complex(rng, (20, 18))
        got, want = jaxducc0.nufft2(f, x, y, eps=eps, opts=opts), dense2(f, x, y)
    else:
        c = random_complex(rng, (200,))
        s, t = _points(rng, 2, 100, -10, 10)
        got, want = jaxducc0.nufft3(c, x, y, s, t, eps=eps, opts=opts), dense3(c, x, y, s, t)
    err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
    assert err < 10 * eps


def test_nufft_plan_honours_upsampfac():
    rng = np.random.default_rng(8)
    f = random_complex(rng, (32, 32))
    x, y = _points(rng, 2, 100)
    for u in (1.25, 2.0):
        opts = jaxducc0.Opts(upsampfac=u)
        plan = jaxducc0.NufftPlan(2, (32, 32), np.asarray(x), np.asarray(y), eps=1e-6, opts=opts)
        assert _rel(plan(f), jaxducc0.nufft2(f, x, y, eps=1e-6, opts=opts)) < 1e-14


# --- every option: honoured, accepted without effect, or refused ----------------------


@pytest.mark.parametrize(
    "name,value,match",
    [
        ("upsampfac", 1.33, "no DUCC kernel"),
        ("upsampfac", 0.9, "must be > 1"),
        ("gpu_spreadinterponly", True, "spread or interpolate only"),
        ("gpu_spreadinterponly", 1, "spread or interpolate only"),
    ],
)
def test_option_that_changes_the_map_refused_naming_op_and_option(name, value, match):
    opts = jaxducc0.Opts(**{name: value})
    f = jnp.ones((8, 8), complex)
    with pytest.raises(ValueError, match=match) as info:
        jaxducc0.nufft2(f, jnp.zeros(3), jnp.zeros(3), opts=opts)
    assert "jaxducc0.nufft2" in str(info.value) and f"opts.{name}" in str(info.value)
    x = np.zeros(3)
    with pytest.raises(ValueError, match=match):
        jaxducc0.NufftPlan(2, (8, 8), x, x, opts=opts)


# FINUFFT's speed and message options at values published code gives them (jax-finufft's
# enums are ints: FftwFlags.Measure is FFTW_MEASURE, 0; SpreadSort.NoSort 0; SpreadThread
# .Sequential 1; GpuMethod.Shared 2; DebugLevel.Verbose 1)
SPEED_ONLY = [
    ("fftw", FftwFlags.Measure),
    ("fftw", FftwFlags.Patient),
    ("spread_sort", SpreadSort.NoSort),
    ("spread_sort", SpreadSort.Sort),
    ("spread_kerevalmeth", 0),
    ("spread_kerevalmeth", False),
    ("spread_kerpad", False),
    ("spread_thread", SpreadThread.Sequential),
    ("maxbatchsize", 4),
    ("spread_nthr_atomic", 2),
    ("spread_max_sp_size", 100),
    ("debug", DebugLevel.Verbose),
    ("spread_debug", 2),
    ("showwarn", True),
    ("gpu_upsampfac", 1.25),
    ("gpu_method", GpuMethod.Shared),
    ("gpu_sort", False),
    ("gpu_binsizex", 8),
    ("gpu_binsizey", 8),
    ("gpu_binsizez", 8),
    ("gpu_obinsizex", 8),
    ("gpu_obinsizey", 8),
    ("gpu_obinsizez", 8),
    ("gpu_maxsubprobsize", 64),
    ("gpu_kerevalmeth", False),
    ("gpu_maxbatchsize", 2),
    ("gpu_debug", 1),
]


def test_every_option_is_honoured_refused_or_listed_as_speed_only():
    from jaxbind.contrib.ducc.finufft import _HONOURED, _NO_EFFECT, _REFUSED, FINUFFT_DEFAULTS

    assert sorted(FINUFFT_DEFAULTS) == sorted(FinufftStyleOpts.__dataclass_fields__)
    assert sorted(_NO_EFFECT) == sorted({name for name, _ in SPEED_ONLY})
    assert sorted([*_HONOURED, *_REFUSED, *_NO_EFFECT]) == sorted(FINUFFT_DEFAULTS)


@pytest.mark.parametrize("name,value", SPEED_ONLY, ids=[f"{n}={v!r}" for n, v in SPEED_ONLY])
@pytest.mark.parametrize("opts_class", [FinufftStyleOpts, jaxducc0.Opts], ids=["like", "own"])
def test_speed_only_option_accepted_without_effect_or_warning(opts_class, name, value):
    rng = np.random.default_rng(9)
    f, c = random_complex(rng, (8, 6)), random_complex(rng, (40,))
    x, y = _points(rng, 2, 40)
    opts = opts_class(**{name: value}, modeord=True)
    plain = opts_class(modeord=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # clients run with warnings as errors
        for call in (
            lambda o: jaxducc0.nufft2(f, x, y, eps=1e-8, opts=o),
            lambda o: jaxducc0.nufft1((8, 6), c, x, y, eps=1e-8, opts=o),
            lambda o: jaxducc0.nufft3(c, x, y, 2 * x, y / 3, eps=1e-8, opts=o),
            lambda o: jaxducc0.NufftPlan(1, (8, 6), np.asarray(x), np.asarray(y), opts=o)(c),
        ):
            assert jnp.array_equal(call(opts), call(plain))


def test_options_at_their_jax_finufft_defaults_are_accepted():
    from jaxbind.contrib.ducc.finufft import FINUFFT_DEFAULTS

    f = jnp.ones((8, 8), complex)
    for opts in (jaxducc0.Opts(**FINUFFT_DEFAULTS), FinufftStyleOpts(), None):
        got = jaxducc0.nufft2(f, jnp.zeros(3), jnp.zeros(3), opts=opts)
        assert jnp.allclose(got, 64)


def test_unknown_option_name_refused():
    with pytest.raises(TypeError, match="spread_srot"):
        jaxducc0.Opts(spread_srot=1)


def test_jax_finufft_opts_checked_the_same_way():
    pytest.importorskip("jax_finufft")
    from jax_finufft.options import FftwFlags, NestedOpts, Opts

    f = jnp.ones((8, 8), complex)
    x = jnp.zeros(3)
    with pytest.raises(ValueError, match="NestedOpts"):
        jaxducc0.nufft2(f, x, x, opts=NestedOpts(type2=Opts(modeord=True)))
    with pytest.raises(ValueError, match="opts.gpu_spreadinterponly"):
        jaxducc0.nufft2(f, x, x, opts=Opts(gpu_spreadinterponly=True))
    a = jaxducc0.nufft2(f, x, x, opts=Opts(upsampfac=1.25, modeord=True, nthreads=1))
    b = jaxducc0.nufft2(f, x, x, opts=jaxducc0.Opts(upsampfac=1.25, modeord=True, nthreads=1))
    c = jaxducc0.nufft2(
        f, x, x, opts=Opts(fftw=FftwFlags.Measure, spread_sort=0, upsampfac=1.25, modeord=True)
    )
    assert jnp.array_equal(a, b) and jnp.array_equal(a, c)


def test_eps_finer_than_the_given_upsampfac_reaches_is_refused():
    f = jnp.ones((8, 8), complex)
    with pytest.raises(ValueError, match="upsampfac=1.25") as info:
        jaxducc0.nufft2(
            f, jnp.zeros(3), jnp.zeros(3), eps=1e-13, opts=jaxducc0.Opts(upsampfac=1.25)
        )
    assert "jaxducc0.nufft2" in str(info.value) and "upsampfac=2.0" in str(info.value)
