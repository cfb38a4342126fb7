"""jaxbind.contrib.jaxducc0 against ducc0 and numpy.fft: values, adjointness, grads, vmap.

Tolerances (relative, max-norm): float32 2e-5 for the FFTs, 1e-4 for the SHT,
wgridder and NUFFT (their own accuracy epsilon is 1e-5 there); float64 1e-12 for
the FFTs and ~10x epsilon otherwise.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from support.arrays import assert_close, random, tol

ducc0 = pytest.importorskip(
    "ducc0", reason="ducc0 is not installed (in the clone: pip install '.[ducc]')"
)

from jaxbind.contrib import jaxducc0  # noqa: E402

DTYPES = [np.float32, np.float64]


pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py


def _adjoint_error(f, x, y):
    """|Re<f(x), y> - Re<x, f^T(y)>| / scale, with JAX's (unconjugated) pairing."""
    fx = f(x)
    (ty,) = jax.linear_transpose(f, x)(y)
    lhs = np.real(np.sum(np.asarray(fx) * np.asarray(y)))
    rhs = np.real(np.sum(np.asarray(x) * np.asarray(ty)))
    scale = np.linalg.norm(np.asarray(fx)) * np.linalg.norm(np.asarray(y))
    return abs(lhs - rhs) / scale


def _vmap_vs_loop(f, x, axis, rtol, out_axis=None):
    out_axis = axis if out_axis is None else out_axis
    got = jax.vmap(f, in_axes=axis, out_axes=out_axis)(x)
    want = np.stack(
        [np.asarray(f(np.take(x, b, axis=axis))) for b in range(x.shape[axis])], axis=out_axis
    )
    assert_close(got, want, rtol)


# --- c2c and genuine_fht -------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "kwargs",
    [{}, dict(axes=(0,)), dict(axes=(-1,), forward=False, inorm=2), dict(inorm=1, nthreads=2)],
    ids=str,
)
def test_c2c_matches_numpy_and_ducc(dtype, kwargs):
    x = random((6, 8), dtype, 1, complex_=True)
    got = jax.jit(lambda x: jaxducc0.c2c(x, **kwargs)[0])(x)
    axes = kwargs.get("axes", (0, 1))
    ref = (
        np.fft.fftn(x, axes=axes)
        if kwargs.get("forward", True)
        else np.fft.ifftn(x, axes=axes) * np.prod([x.shape[a] for a in axes])
    )
    ref = (
        ref
        / {
            0: 1,
            1: np.sqrt(np.prod([x.shape[a] for a in axes])),
            2: np.prod([x.shape[a] for a in axes]),
        }[kwargs.get("inorm", 0)]
    )
    assert_close(got, ref.astype(x.dtype), tol(dtype))
    assert_close(got, ducc0.fft.c2c(x, **kwargs), tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_genuine_fht_matches_ducc(dtype):
    x = random((5, 8), dtype, 2)
    assert_close(jaxducc0.genuine_fht(x)[0], ducc0.fft.genuine_fht(x), tol(dtype))
    assert_close(
        jaxducc0.genuine_fht(x, axes=(1,), inorm=2)[0],
        ducc0.fft.genuine_fht(x, axes=(1,), inorm=2),
        tol(dtype),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_fft_adjointness_and_grads(dtype):
    x = random((4, 6), dtype, 3, complex_=True)
    y = random((4, 6), dtype, 4, complex_=True)
    for kwargs in ({}, dict(axes=(1,), forward=False, inorm=1)):
        f = lambda x: jaxducc0.c2c(x, **kwargs)[0]
        assert _adjoint_error(f, x, y) < 10 * tol(dtype)
    xr, yr = random((4, 6), dtype, 5), random((4, 6), dtype, 6)
    assert _adjoint_error(lambda x: jaxducc0.genuine_fht(x)[0], xr, yr) < 10 * tol(dtype)
    if dtype == np.float64:
        check_grads(lambda x: jaxducc0.c2c(x, inorm=1)[0], (x,), order=2, modes=("fwd", "rev"))
        check_grads(
            lambda x: jaxducc0.genuine_fht(x, inorm=1)[0], (xr,), order=2, modes=("fwd", "rev")
        )


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_fft_vmap_matches_loop_on_any_batch_axis(axis):
    x = random((3, 4, 5), np.float64, 7, complex_=True)
    _vmap_vs_loop(lambda v: jaxducc0.c2c(v, axes=(-1,))[0], x, axis, 1e-12)
    _vmap_vs_loop(lambda v: jaxducc0.genuine_fht(v)[0], np.real(x), axis, 1e-12)
    _vmap_vs_loop(lambda v: jaxducc0.r2c(v)[0], np.real(x), axis, 1e-12)
    # nested vmap and grad through the vectorized op
    f = jax.vmap(jax.vmap(lambda v: jaxducc0.c2c(v)[0]), in_axes=1, out_axes=1)
    assert_close(f(x), np.fft.fft(x, axis=2), 1e-12)
    g = jax.grad(lambda x: jnp.sum(jnp.abs(jax.vmap(lambda v: jaxducc0.c2c(v)[0], axis)(x)) ** 2))(
        x
    )
    g_ref = jax.grad(
        lambda x: jnp.sum(jnp.abs(jnp.fft.fftn(x, axes=[a for a in range(3) if a != axis])) ** 2)
    )(x)
    assert_close(g, g_ref, 1e-12)


# --- r2c / c2r -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [8, 7])
def test_real_fft_pair_matches_numpy(dtype, n):
    x = random((3, n), dtype, 8)
    assert_close(
        jaxducc0.r2c(x)[0],
        np.fft.rfftn(x).astype(np.result_type(dtype, np.complex64)),
        tol(dtype),
    )
    assert_close(
        jaxducc0.r2c(x, axes=(1,), forward=False)[0],
        np.conj(np.fft.rfft(x, axis=1)).astype(np.result_type(dtype, np.complex64)),
        tol(dtype),
    )
    c = np.fft.rfftn(x).astype(np.result_type(dtype, np.complex64))
    back = jaxducc0.c2r(c, lastsize=n, forward=False, inorm=2)[0]
    assert_close(back, x, 10 * tol(dtype))
    assert_close(back, np.fft.irfftn(c, s=x.shape, axes=(0, 1)).astype(dtype), 10 * tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [8, 7])
def test_real_fft_adjoint_is_not_the_inverse(dtype, n):
    x, y = random((3, n), dtype, 9), random((3, n // 2 + 1), dtype, 10, complex_=True)
    for kw in ({}, dict(axes=(1,), forward=False, inorm=1)):
        err = _adjoint_error(lambda x: jaxducc0.r2c(x, **kw)[0], x, y)
        assert err < 10 * tol(dtype), err
        err = _adjoint_error(lambda c: jaxducc0.c2r(c, lastsize=n, **kw)[0], y, x)
        assert err < 10 * tol(dtype), err
    # transpose against JAX's own rfft
    (t,) = jax.linear_transpose(lambda x: jaxducc0.r2c(x)[0], x)(y)
    (t_ref,) = jax.linear_transpose(jnp.fft.rfftn, x)(y)
    assert_close(t, t_ref, 10 * tol(dtype))
    if dtype == np.float64:
        check_grads(lambda x: jaxducc0.r2c(x, inorm=1)[0], (x,), order=2, modes=("fwd", "rev"))
        check_grads(
            lambda c: jaxducc0.c2r(c, lastsize=n, inorm=1)[0], (y,), order=2, modes=("fwd", "rev")
        )


# --- HEALPix SHT -------------------------------------------------------------------------


def _realalm(ncomp, lmax, mmax, dtype, seed):
    x = random((ncomp, 2 * jaxducc0.nalm(lmax, mmax) - lmax - 1), dtype, seed)
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spin", [0, 2])
def test_healpix_sht_matches_ducc(dtype, spin):
    nside, lmax, mmax = 8, 12, 10
    op = jaxducc0.get_healpix_sht(nside, lmax, mmax, spin)
    ncomp = 1 if spin == 0 else 2
    x = _realalm(ncomp, lmax, mmax, dtype, 11)
    if spin:  # spin > 0 has no l < spin modes; leave them zero as DUCC expects
        pass
    got = jax.jit(lambda x: op(x)[0])(x)
    # reference: complex alm built by hand, DUCC called directly
    alm = np.empty((ncomp, jaxducc0.nalm(lmax, mmax)), np.result_type(dtype, np.complex64))
    alm[:, : lmax + 1] = x[:, : lmax + 1]
    alm[:, lmax + 1 :] = (x[:, lmax + 1 :: 2] + 1j * x[:, lmax + 2 :: 2]) / np.sqrt(2.0)
    geom = ducc0.healpix.Healpix_Base(nside, "RING").sht_info()
    ref = ducc0.sht.synthesis(alm=alm, lmax=lmax, mmax=mmax, spin=spin, **geom)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    assert_close(got, ref.astype(dtype), rtol)
    y = random(got.shape, dtype, 12)
    assert _adjoint_error(lambda x: op(x)[0], x, y) < rtol
    if dtype == np.float64:
        check_grads(lambda x: op(x)[0], (x,), order=2, modes=("fwd", "rev"))


def test_healpix_sht_vmap_matches_loop():
    op = jaxducc0.get_healpix_sht(4, 6, 6, 0)
    x = np.stack([_realalm(1, 6, 6, np.float64, s) for s in range(3)], axis=2)  # batch axis 2
    _vmap_vs_loop(lambda v: op(v)[0], x, 2, 1e-12, out_axis=0)


# --- wgridder ------------------------------------------------------------------------------


def _vis_setup(dtype):
    rng = np.random.default_rng(13)
    nrow, nchan, npix = 50, 3, 32
    pixsize = np.pi / 180 / 60  # one arcmin
    freq = 1e9 + 1e7 * np.arange(nchan)
    uvw = (rng.random((nrow, 3)) - 0.5) * np.array([2000, 2000, 100])
    image = rng.random((npix, npix)).astype(dtype)
    eps = 1e-5 if dtype == np.float32 else 1e-10
    kw = dict(
        pixsize_x=pixsize,
        pixsize_y=pixsize,
        npix_x=npix,
        npix_y=npix,
        epsilon=eps,
        do_wgridding=True,
    )
    return uvw, freq, image, kw


@pytest.mark.parametrize("dtype", DTYPES)
def test_wgridder_matches_ducc_and_is_adjoint(dtype):
    uvw, freq, image, kw = _vis_setup(dtype)
    op = jaxducc0.get_wgridder(**kw)
    vis = jax.jit(lambda u, f, x: op(u, f, x)[0])(uvw, freq, image)
    ref = ducc0.wgridder.experimental.dirty2vis(
        uvw=uvw, freq=freq, dirty=image, **{k: v for k, v in kw.items() if "npix" not in k}
    )
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    assert_close(vis, ref, rtol)
    y = random(vis.shape, dtype, 14, complex_=True)
    assert _adjoint_error(lambda x: op(uvw, freq, x)[0], image, y) < rtol
    if dtype == np.float64:
        check_grads(
            lambda x: op(uvw, freq, x)[0],
            (image,),
            order=2,
            modes=("fwd", "rev"),
            atol=1e-6,
            rtol=1e-6,
        )


def test_wgridder_vmap_over_images_matches_loop():
    uvw, freq, image, kw = _vis_setup(np.float64)
    op = jaxducc0.get_wgridder(**kw)
    images = np.stack([image, 2 * image[::-1], image.T], axis=1)  # batch axis 1
    got = jax.vmap(lambda x: op(uvw, freq, x)[0], in_axes=1)(images)
    want = np.stack([np.asarray(op(uvw, freq, images[:, b])[0]) for b in range(3)])
    assert_close(got, want, 1e-12)


# --- NUFFT -------------------------------------------------------------------------------


def _nufft_direct(coord, grid_shape, forward):
    """Dense matrix of the type-2 NUFFT (grid -> points), most negative mode first."""
    ks = np.meshgrid(*[np.arange(-(n // 2), n - n // 2) for n in grid_shape], indexing="ij")
    ks = np.stack([k.ravel() for k in ks], axis=1)
    sign = -1 if forward else 1
    return np.exp(sign * 1j * coord @ ks.T)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("forward", [True, False])
def test_nufft_types_match_direct_sum_and_are_transposes(dtype, forward):
    rng = np.random.default_rng(15)
    grid_shape = (6, 8)
    coord = rng.uniform(-np.pi, np.pi, (40, 2)).astype(dtype)
    eps = 1e-5 if dtype == np.float32 else 1e-11
    t2 = jaxducc0.get_nufft(coord, grid_shape, nufft_type=2, forward=forward, epsilon=eps)
    t1 = jaxducc0.get_nufft(coord, grid_shape, nufft_type=1, forward=forward, epsilon=eps)
    cdt = np.result_type(dtype, np.complex64)
    grid = random(grid_shape, dtype, 16, complex_=True)
    pts = random((40,), dtype, 17, complex_=True)
    a = _nufft_direct(coord.astype(np.float64), grid_shape, forward)
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    assert_close(t2(grid)[0], (a @ grid.ravel()).astype(cdt), rtol)
    assert_close(t1(pts)[0], (a.T @ pts).reshape(grid_shape).astype(cdt), rtol)
    assert _adjoint_error(lambda g: t2(g)[0], grid, pts) < rtol
    assert _adjoint_error(lambda p: t1(p)[0], pts, grid) < rtol
    if dtype == np.float64:
        check_grads(lambda g: t2(g)[0], (grid,), order=2, modes=("fwd", "rev"))
    _vmap_vs_loop(lambda g: t2(g)[0], np.stack([grid, 2 * grid], axis=2), 2, rtol, out_axis=0)


def test_bad_inputs_name_the_op():
    with pytest.raises(TypeError, match="jaxducc0.r2c: x must be float32 or float64"):
        jaxducc0.r2c(jnp.ones(4, jnp.complex64))
    with pytest.raises(ValueError, match="lastsize=9 needs 5 input elements"):
        jaxducc0.c2r(jnp.ones(4, jnp.complex64), lastsize=9)
    with pytest.raises(ValueError, match="get_healpix_sht: expected real alm of shape"):
        jaxducc0.get_healpix_sht(4, 6, 6, 0)(jnp.ones((1, 3)))
    with pytest.raises(ValueError, match="get_nufft: nufft_type must be one of"):
        jaxducc0.get_nufft(np.zeros((3, 1)), (4,), nufft_type=3)


def test_jaxbind_testing_check_passes_for_every_op():
    from jaxbind.testing import check

    x = random((4, 6), np.float64, 20, complex_=True)
    check(jaxducc0.c2c, x, forward=False, inorm=1, verbose=False)
    check(jaxducc0.genuine_fht, np.real(x), verbose=False)
    from jaxbind.contrib.ducc.fft import _r2c_op  # the op behind r2c, which adds n=

    check(_r2c_op, np.real(x), n=6, verbose=False)
    check(jaxducc0.get_healpix_sht(4, 6, 6, 0), _realalm(1, 6, 6, np.float64, 21), verbose=False)
    uvw, freq, image, kw = _vis_setup(np.float64)
    check(jaxducc0.get_wgridder(**kw), uvw, freq, image, batch_size=2, verbose=False)
    coord = np.random.default_rng(22).uniform(-np.pi, np.pi, (30, 1))
    check(
        jaxducc0.get_nufft(coord, (8,), nufft_type=2, epsilon=1e-11),
        random((8,), np.float64, 23, complex_=True),
        verbose=False,
    )


# --- the real alm layout helpers ---------------------------------------------------------


@pytest.mark.parametrize("lmax, mmax", [(5, 5), (12, 10)])
def test_realalm_helpers_round_trip_in_numpy_and_jax(lmax, mmax):
    n = jaxducc0.realalm_size(lmax, mmax)
    x = random((2, n), np.float64, 21)
    alm = jaxducc0.realalm_to_alm(x, lmax)
    assert isinstance(alm, np.ndarray) and alm.shape == (2, jaxducc0.nalm(lmax, mmax))
    by_hand = np.concatenate(
        [x[:, : lmax + 1] + 0j, (x[:, lmax + 1 :: 2] + 1j * x[:, lmax + 2 :: 2]) / np.sqrt(2.0)], 1
    )
    np.testing.assert_allclose(alm, by_hand, rtol=1e-15)
    np.testing.assert_allclose(jaxducc0.alm_to_realalm(alm, lmax), x, rtol=1e-14)
    jitted = jax.jit(lambda v: jaxducc0.alm_to_realalm(jaxducc0.realalm_to_alm(v, lmax), lmax))
    np.testing.assert_allclose(jitted(x), x, rtol=1e-14)
    assert jaxducc0.realalm_ell(lmax, mmax).shape == (n,)
    # traceable: the gradient of |alm|^2 through the conversion is 2 x (it is unitary up to
    # the m = 0 entries, which are real)
    g = jax.grad(lambda v: jnp.sum(jnp.abs(jaxducc0.realalm_to_alm(v, lmax)) ** 2))(x)
    w = np.where(np.arange(n) <= lmax, 2.0, 1.0)
    np.testing.assert_allclose(g, w * x, rtol=1e-14)


def test_sht_of_public_realalm_matches_ducc_with_complex_alm():
    lmax = mmax = 7
    op = jaxducc0.get_healpix_sht(4, lmax, mmax, 0)
    alm = random((1, jaxducc0.nalm(lmax, mmax)), np.float64, 22, complex_=True)
    alm[:, : lmax + 1] = alm[:, : lmax + 1].real  # m = 0: real for a real map
    got = op(jaxducc0.alm_to_realalm(alm, lmax))[0]
    geom = ducc0.healpix.Healpix_Base(4, "RING").sht_info()
    ref = ducc0.sht.synthesis(alm=alm, lmax=lmax, mmax=mmax, spin=0, **geom)
    assert_close(got, ref, 1e-12)
