"""The pure-JAX references of the wgridder and the HEALPix SHT against the native ops.

Each reference is called as the op's callable is (its arrays and the op's keyword
arguments, read back from the partial `get_wgridder` / `get_healpix_sht` return) and
compared with the native op: forward, transpose (JAX's transpose of the reference against
the op's own), ``grad`` of a scalar loss, and ``jit``/``vmap``. Tolerances are relative, in
the 2-norm: 10 x epsilon for the wgridder (DUCC's epsilon is an L2 error), 1e-12 (float64)
and 1e-5 (float32) for the SHT, which DUCC computes exactly up to rounding. The
``*_notices_*`` tests show that these comparisons catch a wrong convention.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import norm_relative_error, random
from support.dtypes import global_x64

ducc0 = pytest.importorskip(
    "ducc0", reason="ducc0 is not installed (in the clone: pip install '.[ducc]')"
)

from jaxbind.contrib.ducc import reference  # noqa: E402
from jaxbind.contrib.ducc.reference.sht import healpix_rings, healpix_sht  # noqa: E402
from jaxbind.contrib.ducc.reference.wgridder import SPEED_OF_LIGHT, wgridder  # noqa: E402
from jaxbind.contrib.jaxducc0 import get_healpix_sht, get_wgridder, realalm_size  # noqa: E402

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

DTYPES = [np.float32, np.float64]


def _complex(dtype):
    return np.result_type(dtype, np.complex64)


# --- the wgridder ------------------------------------------------------------------

NPIX = (32, 24)
PIXSIZE = (2e-3, 3e-3)  # a wide field (3.7 x 4.1 degrees), so that n - 1 matters
EPSILON = {np.float32: 1e-5, np.float64: 1e-10}
CONVENTIONS = [
    dict(do_wgridding=True),
    dict(do_wgridding=False),
    dict(do_wgridding=True, divide_by_n=False),
    dict(do_wgridding=True, flip_w=True, center_x=0.01, center_y=-0.02),
    dict(do_wgridding=True, flip_u=True, center_x=0.01),
    dict(do_wgridding=False, flip_u=True, flip_v=True, center_x=-0.01, center_y=0.02),
    dict(do_wgridding=True, divide_by_n=True, nthreads=2, sigma_min=1.5, sigma_max=2.2),
]


def _visibilities(nrows=40, seed=0):
    """uvw (metres) reaching the image's highest frequencies, w large enough to matter,
    and three channels given out of order."""
    rng = np.random.default_rng(seed)
    freq = np.array([1.0e9, 1.4e9, 1.2e9])
    uvw = (rng.random((nrows, 3)) - 0.5) / (PIXSIZE[0] * freq.max() / SPEED_OF_LIGHT)
    uvw[:, 2] *= 30
    return uvw, freq


def _wgridder_pair(dtype, uvw, freq, **options):
    """The native op and the reference, both as image -> vis, and the keyword arguments
    the op's callable gets."""
    op = get_wgridder(
        pixsize_x=PIXSIZE[0],
        pixsize_y=PIXSIZE[1],
        npix_x=NPIX[0],
        npix_y=NPIX[1],
        epsilon=EPSILON[dtype],
        **options,
    )
    kwargs = dict(op.keywords)

    def native(image):
        return op(uvw, freq, image)[0]

    @jax.jit  # (JAX's transpose of it then linearizes one program, not op by op)
    def ref(image):
        return wgridder(jnp.asarray(uvw), jnp.asarray(freq), image, **kwargs)[0]

    return native, ref, kwargs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", CONVENTIONS, ids=str)
def test_wgridder_reference_matches_native_forward_transpose_and_grad(dtype, options):
    uvw, freq = _visibilities()
    native, ref, _ = _wgridder_pair(dtype, uvw, freq, **options)
    image = random(NPIX, dtype, 1)
    rtol = 10 * EPSILON[dtype]

    want = native(image)
    got = jax.jit(ref)(image)
    assert got.dtype == want.dtype == _complex(dtype) and got.shape == want.shape
    assert norm_relative_error(got, want) < rtol

    ct = random(want.shape, dtype, 2, complex_=True)
    (t_want,) = jax.linear_transpose(native, image)(ct)
    (t_got,) = jax.linear_transpose(ref, image)(ct)
    assert t_got.dtype == t_want.dtype == np.dtype(dtype)
    assert norm_relative_error(t_got, t_want) < rtol

    def loss(f):
        return lambda image: jnp.sum(jnp.abs(f(image) - ct) ** 2)

    g_want = jax.grad(loss(native))(image)
    g_got = jax.jit(jax.grad(loss(ref)))(image)
    assert norm_relative_error(g_got, g_want) < rtol


def test_wgridder_reference_agrees_in_float32_without_x64():
    """With x64 off, uvw and freq are float32 too and the phases are float32: still
    within the op's float32 accuracy at these sizes."""
    uvw, freq = _visibilities()
    with global_x64(False):
        native, ref, _ = _wgridder_pair(np.float32, uvw, freq, do_wgridding=True)
        image = random(NPIX, np.float32, 1)
        want = native(image)
        got = jax.jit(ref)(image)
        assert got.dtype == np.complex64
        assert norm_relative_error(got, want) < 1e-4


@pytest.mark.parametrize("do_wgridding", [True, False])
def test_wgridder_direct_sum_sums_in_blocks_as_in_one(monkeypatch, do_wgridding):
    """The direct sum (the reference without epsilon, and its fallback) sums rows in
    blocks (lax.map) once they exceed the block budget; padding and reassembly change
    nothing, also for the transpose."""
    from jaxbind.contrib.ducc.reference import wgridder as module

    uvw, freq = _visibilities(nrows=37)
    _, _, kwargs = _wgridder_pair(np.float64, uvw, freq, do_wgridding=do_wgridding)
    kwargs.pop("epsilon")

    def ref(image):
        return wgridder(jnp.asarray(uvw), jnp.asarray(freq), image, **kwargs)[0]

    image = random(NPIX, np.float64, 1)
    ct = random((37, 3), np.float64, 2, complex_=True)
    whole = ref(image), jax.linear_transpose(ref, image)(ct)[0]
    monkeypatch.setattr(module, "_BLOCK_ELEMENTS", 5 * 3 * NPIX[0] * NPIX[1])  # 5 rows
    blocked = jax.jit(ref)(image), jax.linear_transpose(ref, image)(ct)[0]
    for a, b in zip(whole, blocked):
        assert norm_relative_error(a, b) < 1e-13


def test_wgridder_reference_vmaps_over_images():
    uvw, freq = _visibilities()
    native, ref, _ = _wgridder_pair(np.float64, uvw, freq, do_wgridding=True)
    images = random((3, *NPIX), np.float64, 4)
    got = jax.vmap(ref)(images)
    want = np.stack([native(im) for im in images])
    assert norm_relative_error(got, want) < 1e-9


def test_wgridder_reference_gives_nan_where_a_coordinate_is_not_finite():
    uvw, freq = _visibilities(nrows=6)
    uvw[2, 1] = np.nan
    native, ref, _ = _wgridder_pair(np.float64, uvw, freq, do_wgridding=True)
    image = random(NPIX, np.float64, 1)
    got, want = np.asarray(ref(image)), np.asarray(native(image))
    assert np.isnan(got[2]).all() and np.isnan(want[2]).all()
    keep = np.arange(6) != 2
    assert norm_relative_error(got[keep], want[keep]) < 1e-9


def test_wgridder_comparison_notices_a_wrong_convention():
    """A transposed image, the opposite sign of the phase, or flip_u taken as "negate u"
    (DUCC's docstring) with the image off-centre: each is O(1) off."""
    uvw, freq = _visibilities()
    native, ref, kwargs = _wgridder_pair(np.float64, uvw, freq, do_wgridding=True, center_x=0.02)
    image = random(NPIX, np.float64, 1)
    want = native(image)
    assert norm_relative_error(ref(image), want) < 1e-9

    square = dict(kwargs, npix_y=NPIX[0], pixsize_y=PIXSIZE[0])
    op = get_wgridder(**square)
    img = random((NPIX[0], NPIX[0]), np.float64, 3)
    good = wgridder(jnp.asarray(uvw), jnp.asarray(freq), img, **square)[0]
    transposed = wgridder(jnp.asarray(uvw), jnp.asarray(freq), img.T, **square)[0]
    assert norm_relative_error(good, op(uvw, freq, img)[0]) < 1e-9
    assert norm_relative_error(transposed, op(uvw, freq, img)[0]) > 0.3

    assert norm_relative_error(jnp.conj(ref(image)), want) > 0.3

    flipped = dict(kwargs, flip_u=True)
    negated_u = uvw * np.array([-1.0, 1.0, 1.0])
    naive = wgridder(jnp.asarray(negated_u), jnp.asarray(freq), image, **kwargs)[0]
    right = wgridder(jnp.asarray(uvw), jnp.asarray(freq), image, **flipped)[0]
    truth = get_wgridder(**flipped)(uvw, freq, image)[0]
    assert norm_relative_error(right, truth) < 1e-9
    assert norm_relative_error(naive, truth) > 0.3


def test_wgridder_reference_refuses_an_unknown_option():
    uvw, freq = _visibilities(nrows=2)
    with pytest.raises(TypeError, match=r"jaxducc0\.wgridder reference.*\['wgt'\]"):
        wgridder(
            jnp.asarray(uvw),
            jnp.asarray(freq),
            jnp.zeros(NPIX),
            pixsize_x=1e-3,
            pixsize_y=1e-3,
            npix_x=NPIX[0],
            npix_y=NPIX[1],
            do_wgridding=False,
            wgt=None,
        )


# --- the HEALPix SHT ---------------------------------------------------------------

SHT_CASES = [(4, 8, 8, 0), (4, 10, 5, 0), (2, 6, 6, 1), (4, 8, 8, 2), (2, 7, 4, 3)]
SHT_RTOL = {np.float32: 1e-5, np.float64: 1e-12}


def _sht_pair(nside, lmax, mmax, spin):
    op = get_healpix_sht(nside, lmax, mmax, spin)
    kwargs = dict(op.keywords)

    def native(alm):
        return op(alm)[0]

    def ref(alm):
        return healpix_sht(alm, **kwargs)[0]

    return native, ref


@pytest.mark.parametrize("nside", [1, 2, 3, 8])
def test_healpix_rings_match_ducc(nside):
    z, phi0, nphi, ringstart = healpix_rings(nside)
    info = ducc0.healpix.Healpix_Base(nside, "RING").sht_info()
    np.testing.assert_allclose(np.arccos(z), info["theta"], rtol=0, atol=1e-14)
    np.testing.assert_allclose(phi0, info["phi0"], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(nphi, info["nphi"])
    np.testing.assert_array_equal(ringstart, info["ringstart"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SHT_CASES, ids=lambda c: "nside{}-lmax{}-mmax{}-spin{}".format(*c))
def test_healpix_sht_reference_matches_native_forward_transpose_and_grad(dtype, case):
    nside, lmax, mmax, spin = case
    native, ref = _sht_pair(*case)
    ncomp = 1 if spin == 0 else 2
    alm = random((ncomp, realalm_size(lmax, mmax)), dtype, 1)
    rtol = SHT_RTOL[dtype]

    want = native(alm)
    got = jax.jit(ref)(alm)
    assert got.dtype == want.dtype == np.dtype(dtype) and got.shape == (ncomp, 12 * nside**2)
    assert norm_relative_error(got, want) < rtol

    ct = random(want.shape, dtype, 2)
    (t_want,) = jax.linear_transpose(native, alm)(ct)
    (t_got,) = jax.linear_transpose(ref, alm)(ct)
    assert norm_relative_error(t_got, t_want) < rtol

    def loss(f):
        return lambda alm: jnp.sum(jnp.sin(f(alm)))

    g_want = jax.grad(loss(native))(alm)
    g_got = jax.jit(jax.grad(loss(ref)))(alm)
    assert norm_relative_error(g_got, g_want) < 10 * rtol


def test_healpix_sht_reference_vmaps_and_holds_at_lmax_64():
    native, ref = _sht_pair(16, 64, 64, 0)
    alm = random((2, 1, realalm_size(64, 64)), np.float64, 5)
    got = jax.vmap(ref)(alm)
    want = np.stack([native(a) for a in alm])
    assert norm_relative_error(got, want) < 1e-12


def test_healpix_sht_comparison_notices_a_wrong_convention():
    """Without the Condon-Shortley phase ((-1)^m), with E and B swapped, or with the
    sign of the odd spins: each is O(1) off."""
    lmax = mmax = 8
    native, ref = _sht_pair(4, lmax, mmax, 0)
    alm = random((1, realalm_size(lmax, mmax)), np.float64, 1)
    m = np.concatenate(
        [np.zeros(lmax + 1, int)] + [[mm] * 2 * (lmax + 1 - mm) for mm in range(1, mmax + 1)]
    )
    no_cs = alm * np.where(m % 2 == 1, -1.0, 1.0)
    assert norm_relative_error(ref(no_cs), native(alm)) > 0.3

    native, ref = _sht_pair(4, lmax, mmax, 2)
    alm = random((2, realalm_size(lmax, mmax)), np.float64, 2)
    assert norm_relative_error(ref(alm[::-1]), native(alm)) > 0.3

    native, ref = _sht_pair(4, lmax, mmax, 1)
    alm = random((2, realalm_size(lmax, mmax)), np.float64, 3)
    assert norm_relative_error(-ref(alm), native(alm)) > 1.0


def test_healpix_sht_reference_refuses_a_wrong_shape_and_an_unknown_option():
    with pytest.raises(ValueError, match=r"jaxducc0\.healpix_sht reference.*\(1, 9\)"):
        healpix_sht(jnp.zeros((1, 8)), nside=1, lmax=2, mmax=2, spin=0)
    with pytest.raises(TypeError, match=r"jaxducc0\.healpix_sht reference.*\['mode'\]"):
        healpix_sht(jnp.zeros((1, 9)), nside=1, lmax=2, mmax=2, spin=0, mode="GRAD_ONLY")


def test_reference_package_imports_no_ducc():
    """The references are what runs where DUCC is not: their modules do not import it."""
    import sys

    for name in ("wgridder", "sht"):
        module = sys.modules[f"{reference.__name__}.{name}"]
        assert "ducc0" not in vars(module)
