"""nufft1/nufft2 plan their points once (the op's state, keyed on the points): one DUCC
plan for traced loop-invariant points in a loop, a new one when they change, results
equal to the unplanned path, derivatives unchanged."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import norm_relative_error, random_complex

pytest.importorskip("ducc0")

from jaxbind.contrib import jaxducc0
from jaxbind.contrib.ducc import _common
from jaxbind.contrib.ducc.nufft_points import _transform, nufft_points

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py


@pytest.fixture
def plans(monkeypatch):
    """Every DUCC plan the op's setup makes (the points it was made for)."""
    made = []
    real = _common.ducc0.nufft.plan

    def counting(**kw):
        made.append(np.array(kw["coord"]))
        return real(**kw)

    monkeypatch.setattr(_common.ducc0.nufft, "plan", counting)
    return made


def _points(seed, m=40, d=2):
    rng = np.random.default_rng(seed)
    return rng, [jnp.asarray(rng.uniform(-np.pi, np.pi, m)) for _ in range(d)]


def test_traced_loop_invariant_points_plan_once_in_a_fori_loop(plans):
    rng, (x, y) = _points(101)
    grid = (16, 12)
    f0 = random_complex(rng, grid)

    @jax.jit
    def run(f, x, y):
        def step(i, f):  # the type-2 NUFFT and its adjoint (type 1) on the same points
            c = jaxducc0.nufft2(f, x, y, eps=1e-9)
            return 0.5 * f + 1e-3 * jaxducc0.nufft1(grid, c, x, y, iflag=1, eps=1e-9)

        return jax.lax.fori_loop(0, 20, step, f)

    got = run(f0, x, y)
    assert len(plans) == 1  # one plan for 40 calls of both types
    np.testing.assert_array_equal(plans[0], np.stack([x, y], axis=1))
    want = f0
    for _ in range(20):  # the same steps, each call planned anew
        c = jaxducc0.nufft2(want, x + 0, y, eps=1e-9)
        want = 0.5 * want + 1e-3 * jaxducc0.nufft1(grid, c, x, y, iflag=1, eps=1e-9)
    assert norm_relative_error(got, want) < 1e-12
    run(f0, x, y)
    assert len(plans) == 1  # every call above shared it: equal points, equal settings
    run(f0, x + 0.5, y)  # new points: planned again, once
    assert len(plans) == 2


@pytest.mark.parametrize(
    "kind,iflag,modeord,dtype",
    list(itertools.product((1, 2), (1, -1), (0, 1), (np.complex128, np.complex64))),
)
def test_the_planned_path_equals_the_unplanned_one(kind, iflag, modeord, dtype):
    rng = np.random.default_rng(200 + kind + 3 * modeord)
    real = np.float64 if dtype == np.complex128 else np.float32
    grid, m = (10, 9), 30
    xs = rng.uniform(-np.pi, np.pi, (2, m)).astype(real)
    if kind == 2:
        xs[1, 3] = np.nan  # NaN at that point's output; planned at 0
    values = random_complex(rng, (2, *grid) if kind == 2 else (2, m), dtype)
    kw = dict(nufft_type=kind, sign=iflag, eps=1e-12 if real == np.float64 else 1e-5)
    kw.update(modeord=modeord, nthreads=1)
    got = jax.jit(lambda v, x: nufft_points(v, x, **kw, grid=grid if kind == 1 else None)[0])(
        values, xs
    )
    out = np.empty(got.shape, dtype)
    _transform(out, np.asarray(values), xs, None, dict(kw, grid=grid if kind == 1 else None))
    assert got.dtype == dtype
    assert np.array_equal(np.isnan(got), np.isnan(out))
    ok = ~np.isnan(out)
    tol = 1e-12 if dtype == np.complex128 else 1e-5
    assert norm_relative_error(np.asarray(got)[ok], out[ok]) < tol


def test_grads_through_plans_match_finite_differences(plans):
    rng, (x,) = _points(303, m=12, d=1)
    f = random_complex(rng, (9,))
    weights = random_complex(rng, (12,))

    def loss(f, x):
        return jnp.sum(jnp.real(weights * jaxducc0.nufft2(f, x, eps=1e-13)))

    gf, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(f, x)
    h = 1e-6
    for i in range(3):
        e = jnp.zeros(12).at[i].set(h)
        fd = (loss(f, x + e) - loss(f, x - e)) / (2 * h)
        assert abs(gx[i] - fd) < 1e-6 * (1 + abs(fd))
        e = jnp.zeros(9, complex).at[i].set(h)
        fd = (loss(f + e, x) - loss(f - e, x)) / (2 * h)
        assert abs(jnp.real(gf[i]) - fd) < 1e-6 * (1 + abs(fd))


def test_vmap_over_values_plans_once_and_over_points_once_each(plans):
    rng, (x,) = _points(404, m=20, d=1)
    fs = random_complex(rng, (4, 16))
    got = jax.jit(jax.vmap(lambda f: jaxducc0.nufft2(f, x, eps=1e-12)))(fs)
    assert len(plans) == 1
    want = jnp.stack([jaxducc0.nufft2(f, x, eps=1e-12) for f in fs])
    assert norm_relative_error(got, want) < 1e-12
    xs = jnp.stack([x + k for k in (1.0, 2.0, 3.0)])
    before = len(plans)
    got = jax.jit(jax.vmap(lambda x: jaxducc0.nufft2(fs[0], x, eps=1e-12)))(xs)
    assert len(plans) == before + 3  # one per element's points, each its own
    for k in range(3):
        assert norm_relative_error(got[k], jaxducc0.nufft2(fs[0], xs[k], eps=1e-12)) < 1e-12


def test_a_type_2_grid_that_is_not_the_values_is_refused():
    x = jnp.zeros((1, 5))
    with pytest.raises(ValueError, match=r"grid \(7,\) is not the values' grid \(8,\)"):
        nufft_points.op(
            jnp.ones((1, 8), complex),
            x,
            nufft_type=2,
            sign=-1,
            eps=1e-6,
            modeord=0,
            nthreads=1,
            grid=(7,),
        )


def test_an_exported_program_plans_its_points_when_loaded(plans):
    import jaxbind

    rng, (x, y) = _points(505)
    f = random_complex(rng, (8, 8))
    program = jax.jit(lambda f, x, y: jaxducc0.nufft2(f, x, y, eps=1e-12))
    exp = jax.export.deserialize(jaxbind.export(program)(f, x, y).serialize())
    assert not plans  # exporting plans nothing
    got = exp.call(f, x, y)
    assert len(plans) == 1
    assert norm_relative_error(got, program(f, x, y)) < 1e-14
