"""jaxducc0 off the happy path: single precision, non-finite and empty inputs, bad parameters.

- Single precision is compared with the same transform in double precision at
  eps=1e-13: every NUFFT entry point, types 1-3, 1-3 dimensions, at the default eps
  and at an eps finer than the precision allows, forward and gradients with respect
  to the values and the points, with batched values.
- A non-finite point gives NaN where it enters the sum, and nothing else changes.
- Empty inputs give empty or zero results.
- Every bad parameter is refused when the program is traced, by an error naming
  the op; none reaches DUCC.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import norm_relative_error, random_complex

pytest.importorskip("ducc0")

from jaxbind.contrib import jaxducc0
from jaxbind.contrib.ducc._accuracy import finest_epsilon

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

GRIDS = {1: (12,), 2: (6, 5), 3: (4, 5, 4)}
FINE = {np.complex64: 1e-9, np.complex128: 1e-16}  # finer than either precision reaches


def _real(dtype):
    return np.float32 if dtype == np.complex64 else np.float64


def _call(kind, d, eps):
    """jax-finufft's call of this type: (values, *coordinates) -> result."""
    if kind == 1:
        return lambda v, *p: jaxducc0.nufft1(GRIDS[d], v, *p, eps=eps)
    if kind == 2:
        return lambda v, *p: jaxducc0.nufft2(v, *p, eps=eps)
    return lambda v, *p: jaxducc0.nufft3(v, *p, eps=eps)


def _inputs(kind, d, dtype, rng, m=23, k=17):
    """Values (2, 3, ...) over points (2, M): batched transforms sharing points."""
    real = _real(dtype)
    pts = [jnp.asarray(rng.uniform(-np.pi, np.pi, (2, m)).astype(real)) for _ in range(d)]
    if kind == 3:
        pts += [jnp.asarray(rng.uniform(-4, 4, (2, k)).astype(real)) for _ in range(d)]
    shape = (2, 3) + (GRIDS[d] if kind == 2 else (m,))
    return random_complex(rng, shape, dtype), pts


def _loss(fn, weights):
    return lambda v, *p: jnp.sum(jnp.real(weights * fn(v, *p)))


def _double(args):
    return [a.astype(jnp.complex128 if jnp.iscomplexobj(a) else jnp.float64) for a in args]


PRECISION_CASES = list(
    itertools.product((1, 2, 3), (1, 2, 3), (np.complex64, np.complex128), ("default", "fine"))
)


def _precision_case(seed, kind, d, dtype, eps):
    """(rng, eps, tolerance against double precision) for one case of PRECISION_CASES."""
    rng = np.random.default_rng(
        seed + 100 * kind + 10 * d + (dtype == np.complex64) * 5 + (eps == "fine")
    )
    eps = 1e-6 if eps == "default" else FINE[dtype]
    tol = 1e-4 if dtype == np.complex64 else (1e-5 if eps == 1e-6 else 1e-12)
    return rng, eps, tol


@pytest.mark.parametrize("kind,d,dtype,eps", PRECISION_CASES)
def test_every_precision_and_eps_matches_the_double_precision_transform(kind, d, dtype, eps):
    rng, eps, tol = _precision_case(1000, kind, d, dtype, eps)
    v, pts = _inputs(kind, d, dtype, rng)
    fn, ref = _call(kind, d, eps), _call(kind, d, 1e-13)
    got, want = fn(v, *pts), ref(*_double([v, *pts]))
    assert got.dtype == dtype and got.shape == want.shape
    assert jnp.all(jnp.isfinite(got))
    assert norm_relative_error(got, want) < tol

    weights = random_complex(rng, want.shape, dtype)
    grads = jax.grad(_loss(fn, weights), argnums=tuple(range(1 + len(pts))))(v, *pts)
    wants = jax.grad(
        _loss(ref, weights.astype(jnp.complex128)), argnums=tuple(range(1 + len(pts)))
    )(*_double([v, *pts]))
    for i, (g, w) in enumerate(zip(grads, wants)):
        assert g.dtype == (v if i == 0 else pts[0]).dtype
        assert norm_relative_error(g, w) < tol, f"gradient {i}"


@pytest.mark.parametrize("kind,d,dtype,eps", PRECISION_CASES)
def test_plans_in_every_precision_match_the_double_precision_transform(kind, d, dtype, eps):
    rng, eps, tol = _precision_case(2000, kind, d, dtype, eps)
    v, pts = _inputs(kind, d, dtype, rng)
    pts = [np.asarray(p[0]) for p in pts]  # a plan's points are concrete and unbatched
    v = v[0]  # (3, ...): three transforms through one plan
    plan = jaxducc0.NufftPlan(
        kind, GRIDS[d] if kind != 3 else None, *pts, eps=eps, iflag=1 if kind == 1 else -1
    )
    ref = _call(kind, d, 1e-13)
    got, want = plan(v), ref(*_double([v, *(jnp.asarray(p) for p in pts)]))
    assert got.dtype == dtype
    assert norm_relative_error(got, want) < tol
    weights = random_complex(rng, want.shape, dtype)
    g = jax.grad(lambda v: jnp.sum(jnp.real(weights * plan(v))))(v)
    w = jax.grad(
        lambda v: jnp.sum(jnp.real(weights * ref(v, *_double([jnp.asarray(p) for p in pts]))))
    )(v.astype(jnp.complex128))
    assert g.dtype == dtype and norm_relative_error(g, w) < tol


def test_type3_limits_come_from_ducc_and_are_coarser_than_types_1_and_2():
    for d, single in itertools.product((1, 2, 3), (True, False)):
        assert finest_epsilon("nufft3", d, single) > finest_epsilon("nufft", d, single)
    # the 3-D single-precision default of jax-finufft (1e-6) is finer than type 3 reaches
    assert finest_epsilon("nufft3", 3, True) > 1e-6


# --- non-finite points ---------------------------------------------------------------


def _bad(x, i, value=np.nan):
    return jnp.asarray(x).at[..., i].set(value)


@pytest.mark.parametrize("value", (np.nan, np.inf))
def test_a_non_finite_point_gives_nan_where_it_enters(value):
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.uniform(-3, 3, 50))
    c = random_complex(rng, (50,), np.complex128)
    f = random_complex(rng, (16,), np.complex128)
    s = jnp.asarray(rng.uniform(-3, 3, 20))
    xb = _bad(x, 7, value)

    # type 1 and type 3 with a bad source: the point enters every output
    assert jnp.all(jnp.isnan(jaxducc0.nufft1(16, c, xb)))
    assert jnp.all(jnp.isnan(jaxducc0.nufft3(c, xb, s)))
    # type 2 and type 3 with a bad target: only the outputs at that point
    # (type 3's internal grid depends on the targets' extent: equal to its accuracy)
    sb = _bad(s, 3, value)
    for got, clean, i in (
        (jaxducc0.nufft2(f, xb), jaxducc0.nufft2(f, x), 7),
        (jaxducc0.nufft3(c, x, sb, eps=1e-12), jaxducc0.nufft3(c, x, s), 3),
    ):
        assert jnp.isnan(got[i]) and jnp.isnan(got[i].imag)
        keep = np.arange(got.shape[0]) != i
        assert norm_relative_error(got[keep], clean[keep]) < 1e-5
    # the same in a batch: only the transforms whose points are bad
    both = jaxducc0.nufft1(16, jnp.stack([c, c]), jnp.stack([x, xb]))
    assert jnp.all(jnp.isfinite(both[0])) and jnp.all(jnp.isnan(both[1]))

    # get_nufft (fixed points) and its transpose
    coord = np.asarray(xb)[:, None]
    t1 = jaxducc0.get_nufft(coord, (16,), nufft_type=1)
    t2 = jaxducc0.get_nufft(coord, (16,), nufft_type=2)
    assert jnp.all(jnp.isnan(t1(c)[0]))
    got2 = t2(f)[0]
    assert jnp.isnan(got2[7]) and jnp.all(jnp.isfinite(jnp.delete(got2, 7)))
    transposed = jax.linear_transpose(lambda g: t2(g)[0], f)(c)[0]
    assert jnp.all(jnp.isnan(transposed))  # type 2's transpose is a type 1


def test_a_non_finite_point_is_refused_by_a_plan():
    x = np.linspace(-3, 3, 10)
    x[4] = np.nan
    with pytest.raises(ValueError, match="jaxducc0.nufft_plan: the points must be finite"):
        jaxducc0.NufftPlan(2, (8,), x)


def test_non_finite_uvw_or_frequencies_give_nan_visibilities():
    rng = np.random.default_rng(8)
    uvw = rng.uniform(-100, 100, (20, 3))
    freq = np.array([1e9, 1.1e9])
    kw = dict(pixsize_x=1e-5, pixsize_y=1e-5, npix_x=32, npix_y=32, epsilon=1e-7, do_wgridding=True)
    op = jaxducc0.get_wgridder(**kw)
    image = jnp.asarray(rng.normal(size=(32, 32)))
    clean = op(uvw, freq, image)[0]
    bad = uvw.copy()
    bad[3, 1] = np.nan
    vis = op(bad, freq, image)[0]
    assert jnp.all(jnp.isnan(vis[3]))
    assert norm_relative_error(jnp.delete(vis, 3, axis=0), jnp.delete(clean, 3, axis=0)) < 1e-6
    vis = op(uvw, np.array([1e9, np.inf]), image)[0]
    assert jnp.all(jnp.isnan(vis[:, 1])) and norm_relative_error(vis[:, 0], clean[:, 0]) < 1e-6
    # the transpose: every visibility reaches every pixel
    ct = jax.linear_transpose(lambda im: op(bad, freq, im)[0], image)(clean)[0]
    assert jnp.all(jnp.isnan(ct))


def test_channels_in_any_order_match_the_sorted_ones_and_bad_frequencies_are_named():
    rng = np.random.default_rng(9)
    uvw = rng.uniform(-100, 100, (20, 3))
    freq = np.array([1e9, 1.2e9, 1.1e9])
    op = jaxducc0.get_wgridder(
        pixsize_x=1e-5, pixsize_y=1e-5, npix_x=32, npix_y=32, epsilon=1e-7, do_wgridding=True
    )
    image = jnp.asarray(rng.normal(size=(32, 32)))
    got = op(uvw, freq, image)[0]
    for c in range(3):
        # (the gridder's grid depends on the frequencies it sees: equal to its accuracy)
        assert norm_relative_error(got[:, c], op(uvw, freq[c : c + 1], image)[0][:, 0]) < 1e-6
    vis = random_complex(rng, got.shape, np.complex128)
    back = jax.linear_transpose(lambda im: op(uvw, freq, im)[0], image)(vis)[0]
    order = np.argsort(freq)
    want = jax.linear_transpose(lambda im: op(uvw, freq[order], im)[0], image)(vis[:, order])[0]
    assert norm_relative_error(back, want) < 1e-12
    with pytest.raises(
        Exception,
        match=r"jaxducc0.get_wgridder: channel frequencies must be "
        r"> 0, got -1000000000.0 for channel 1",
    ):
        op(uvw, np.array([1e9, -1e9]), image)[0].block_until_ready()


# --- empty inputs ---------------------------------------------------------------------


def test_no_points_give_zeros_or_empty_results():
    c0 = jnp.zeros((0,), jnp.complex128)
    x0 = jnp.zeros((0,))
    f = jnp.ones((8,), jnp.complex128)
    s = jnp.linspace(-1, 1, 5)
    assert jnp.array_equal(jaxducc0.nufft1(8, c0, x0), jnp.zeros(8))
    assert jaxducc0.nufft2(f, x0).shape == (0,)
    assert jnp.array_equal(jaxducc0.nufft3(c0, x0, s), jnp.zeros(5))
    assert jaxducc0.nufft3(jnp.ones(3, complex), jnp.zeros(3), x0).shape == (0,)
    # gradients with no points: zero-size or zero cotangents, no DUCC call
    g = jax.grad(lambda f: jnp.sum(jnp.abs(jaxducc0.nufft2(f, x0)) ** 2))(f)
    assert jnp.array_equal(g, jnp.zeros_like(f))

    coord = np.zeros((0, 1))
    t1 = jaxducc0.get_nufft(coord, (8,), nufft_type=1)
    t2 = jaxducc0.get_nufft(coord, (8,), nufft_type=2)
    assert jnp.array_equal(t1(c0)[0], jnp.zeros(8))
    assert t2(f)[0].shape == (0,)
    assert jnp.array_equal(jax.linear_transpose(lambda g: t2(g)[0], f)(c0)[0], jnp.zeros(8))

    for kind, n_modes, pts in (
        (1, (8,), (np.zeros(0),)),
        (2, (8,), (np.zeros(0),)),
        (3, None, (np.zeros(0), np.ones(4))),
    ):
        plan = jaxducc0.NufftPlan(kind, n_modes, *pts, dtype=np.complex128)
        values = c0 if kind != 2 else f
        out = plan(values)
        assert out.shape == ((8,) if kind == 1 else (0,) if kind == 2 else (4,))
        assert jnp.all(out == 0)


def test_an_empty_grid_or_batch_gives_empty_or_zero_results():
    x = jnp.linspace(-1, 1, 5)
    c = jnp.ones(5, jnp.complex128)
    assert jaxducc0.nufft1((0,), c, x).shape == (0,)
    assert jnp.array_equal(jaxducc0.nufft2(jnp.zeros((0,), complex), x), jnp.zeros(5))
    assert jaxducc0.nufft1(8, jnp.zeros((0, 5), complex), x).shape == (0, 8)


def test_empty_arrays_through_the_ffts_and_the_gridder():
    for op, x in (
        (jaxducc0.c2c, jnp.zeros((0, 4), jnp.complex64)),
        (jaxducc0.genuine_fht, jnp.zeros((3, 0))),
        (jaxducc0.r2c, jnp.zeros((0, 6))),
    ):
        y = op(x)[0]
        assert y.size == 0
        assert jax.jit(lambda x: op(x)[0])(x).shape == y.shape
    assert jaxducc0.c2r(jnp.zeros((0, 4), complex), lastsize=6)[0].shape == (0, 6)

    op = jaxducc0.get_wgridder(
        pixsize_x=1e-5, pixsize_y=1e-5, npix_x=16, npix_y=16, epsilon=1e-6, do_wgridding=False
    )
    image = jnp.ones((16, 16))
    for nrows, nchan in ((0, 2), (4, 0)):
        uvw, freq = np.ones((nrows, 3)), np.full(nchan, 1e9)
        assert op(uvw, freq, image)[0].shape == (nrows, nchan)
        back = jax.linear_transpose(lambda im: op(uvw, freq, im)[0], image)(
            jnp.zeros((nrows, nchan), complex)
        )[0]
        assert jnp.array_equal(back, jnp.zeros((16, 16)))


# --- bad parameters: refused at trace time, naming the op --------------------------------

C = jax.ShapeDtypeStruct((8,), jnp.complex128)
R = jax.ShapeDtypeStruct((8,), jnp.float64)
PTS = np.zeros((5, 1))


def _wg(**kw):
    base = dict(
        pixsize_x=1e-5, pixsize_y=1e-5, npix_x=32, npix_y=32, epsilon=1e-6, do_wgridding=False
    )
    return lambda: jaxducc0.get_wgridder(**{**base, **kw})


def _traced(fn, *avals):
    return lambda: jax.eval_shape(fn, *avals)


BAD = {
    "c2c float32": (_traced(lambda x: jaxducc0.c2c(x), R), "c2c: x must be complex"),
    "c2c int32": (
        _traced(lambda x: jaxducc0.c2c(x), jax.ShapeDtypeStruct((4,), jnp.int32)),
        "c2c: x must be complex",
    ),
    "c2c nthreads": (_traced(lambda x: jaxducc0.c2c(x, nthreads=-1), C), "c2c: nthreads"),
    "c2c inorm": (_traced(lambda x: jaxducc0.c2c(x, inorm=3), C), "c2c: inorm"),
    "c2c repeated axis": (_traced(lambda x: jaxducc0.c2c(x, axes=(0, -1)), C), "twice"),
    "c2c axis out of range": (_traced(lambda x: jaxducc0.c2c(x, axes=(2,)), C), "out of range"),
    "c2c unknown option": (
        _traced(lambda x: jaxducc0.c2c(x, fast=True), C),
        "c2c: unknown keyword",
    ),
    "c2c overwriting input": (
        _traced(lambda x: jaxducc0.c2c(x, allow_overwriting_input=True), C),
        "c2c: unknown keyword",
    ),
    "genuine_fht complex": (
        _traced(lambda x: jaxducc0.genuine_fht(x), C),
        "genuine_fht: x must be float",
    ),
    "r2c no axes": (_traced(lambda x: jaxducc0.r2c(x, axes=()), R), "r2c: axes is empty"),
    "r2c complex": (_traced(lambda x: jaxducc0.r2c(x), C), "r2c: x must be float"),
    "r2c length 0": (
        _traced(lambda x: jaxducc0.r2c(x), jax.ShapeDtypeStruct((0,), jnp.float32)),
        "r2c: the last transformed axis has length 0",
    ),
    "c2r lastsize 0": (_traced(lambda x: jaxducc0.c2r(x, lastsize=0), C), "c2r: lastsize"),
    "c2r real": (_traced(lambda x: jaxducc0.c2r(x, lastsize=14), R), "c2r: x must be complex"),
    "get_nufft epsilon 0": (
        lambda: jaxducc0.get_nufft(PTS, (8,), nufft_type=1, epsilon=0),
        "get_nufft: epsilon",
    ),
    "get_nufft epsilon nan": (
        lambda: jaxducc0.get_nufft(PTS, (8,), nufft_type=1, epsilon=float("nan")),
        "get_nufft: epsilon",
    ),
    "get_nufft 4-D grid": (
        lambda: jaxducc0.get_nufft(np.zeros((5, 4)), (4, 4, 4, 4), nufft_type=1),
        "get_nufft: grid_shape",
    ),
    "get_nufft nthreads": (
        lambda: jaxducc0.get_nufft(PTS, (8,), nufft_type=1, nthreads=-1),
        "get_nufft: nthreads",
    ),
    "get_nufft periodicity": (
        lambda: jaxducc0.get_nufft(PTS, (8,), nufft_type=1, periodicity=0),
        "get_nufft: periodicity",
    ),
    "get_nufft unknown option": (
        lambda: jaxducc0.get_nufft(PTS, (8,), nufft_type=1, nu=3),
        "get_nufft: unknown keyword",
    ),
    "get_nufft sigma": (
        lambda: jaxducc0.get_nufft(PTS, (8,), nufft_type=1, sigma_min=1.0, sigma_max=2.0),
        "get_nufft: DUCC needs",
    ),
    "get_nufft int coord": (
        _traced(lambda c: jaxducc0.get_nufft(np.zeros((5, 1), np.int32), (8,), nufft_type=1)(c), C),
        "get_nufft: coord must be float",
    ),
    "get_nufft coord shape": (
        _traced(lambda c: jaxducc0.get_nufft(np.zeros((5, 2)), (8,), nufft_type=1)(c), C),
        "get_nufft: coord must be",
    ),
    "sht nside 0": (lambda: jaxducc0.get_healpix_sht(0, 2, 2, 0), "get_healpix_sht: nside"),
    "sht mmax > lmax": (lambda: jaxducc0.get_healpix_sht(2, 2, 3, 0), "mmax must be <= lmax"),
    "sht lmax < spin": (lambda: jaxducc0.get_healpix_sht(2, 1, 1, 2), "lmax must be >= spin"),
    "sht spin": (lambda: jaxducc0.get_healpix_sht(2, 4, 4, -1), "get_healpix_sht: spin"),
    "sht nthreads": (lambda: jaxducc0.get_healpix_sht(2, 4, 4, 0, nthreads=-2), "nthreads"),
    "sht float nside": (lambda: jaxducc0.get_healpix_sht(2.5, 4, 4, 0), "nside must be an int"),
    "wgridder odd npix": (_wg(npix_x=33), "get_wgridder: npix_x must be even"),
    "wgridder npix 0": (_wg(npix_y=0), "get_wgridder: npix_y must be >= 2"),
    "wgridder epsilon 0": (_wg(epsilon=0), "get_wgridder: epsilon"),
    "wgridder pixsize": (_wg(pixsize_x=-1e-5), "get_wgridder: pixsize_x"),
    "wgridder nthreads": (_wg(nthreads=-1), "get_wgridder: nthreads"),
    "wgridder unknown option": (_wg(wgt=np.ones(3)), "get_wgridder: unknown keyword"),
    "wgridder uvw shape": (
        _traced(
            lambda im: _wg()()(np.zeros((4, 2)), np.ones(1), im),
            jax.ShapeDtypeStruct((32, 32), jnp.float64),
        ),
        "get_wgridder: uvw must be",
    ),
    "wgridder complex uvw": (
        _traced(
            lambda im: _wg()()(np.zeros((4, 3), complex), np.ones(1), im),
            jax.ShapeDtypeStruct((32, 32), jnp.float64),
        ),
        "get_wgridder: uvw must be real",
    ),
    "nufft1 eps 0": (
        lambda: jaxducc0.nufft1(8, jnp.ones(5, complex), jnp.zeros(5), eps=0),
        "nufft1: eps",
    ),
    "nufft2 eps nan": (
        lambda: jaxducc0.nufft2(jnp.ones(8, complex), jnp.zeros(5), eps=math.nan),
        "nufft2: eps",
    ),
    "nufft3 eps inf": (
        lambda: jaxducc0.nufft3(jnp.ones(5, complex), jnp.zeros(5), jnp.zeros(3), eps=math.inf),
        "nufft3: eps",
    ),
    "nufft1 nthreads": (
        lambda: jaxducc0.nufft1(
            8, jnp.ones(5, complex), jnp.zeros(5), opts=jaxducc0.Opts(nthreads=-1)
        ),
        "nufft1: opts.nthreads",
    ),
    "nufft1 negative grid": (
        lambda: jaxducc0.nufft1(-8, jnp.ones(5, complex), jnp.zeros(5)),
        "nufft1: each output_shape length",
    ),
    "nufft_points nthreads": (
        lambda: jaxducc0.nufft_points(
            jnp.ones((1, 8), complex),
            jnp.zeros((1, 5)),
            nufft_type=2,
            sign=1,
            eps=1e-6,
            nthreads=-1,
        ),
        "nufft_points: nthreads",
    ),
    "plan eps 0": (lambda: jaxducc0.NufftPlan(2, (8,), np.zeros(5), eps=0), "NufftPlan: eps"),
    "plan real dtype": (
        lambda: jaxducc0.NufftPlan(2, (8,), np.zeros(5), dtype=np.float32),
        "nufft_plan: dtype must be complex",
    ),
    "plan ragged points": (
        lambda: jaxducc0.NufftPlan(2, (8, 8), np.zeros(5), np.zeros(4)),
        "nufft_plan: the coordinate arrays of one point set",
    ),
    "plan negative grid": (
        lambda: jaxducc0.NufftPlan(1, (-8,), np.zeros(5)),
        "NufftPlan: each n_modes length",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_parameter_is_refused_at_trace_time_naming_the_op(case):
    call, match = BAD[case]
    with pytest.raises((TypeError, ValueError), match=match) as info:
        call()
    assert "jaxducc0." in str(info.value)
    assert "Assertion" not in str(info.value)  # DUCC was never reached
