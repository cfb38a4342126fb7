"""What JAXbind 1.3.1 took, jaxbind takes, with the same meaning, where no 1.3.1 venv is at
hand to compare with (tests/differential runs the full table against 1.3.1 itself): the
spellings of integers and flags real code passes, the gridder's options that only one of
DUCC's directions knows, and one of sigma_min/sigma_max alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import norm_relative_error, random_complex

pytest.importorskip("ducc0")

import ducc0

from jaxbind.contrib import jaxducc0

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

RNG = np.random.default_rng(46)
UVW = RNG.uniform(-300, 300, (30, 3))
FREQ = np.array([1.0e9, 1.1e9])
IMAGE = RNG.normal(size=(32, 32))
GRIDDER = dict(pixsize_x=2e-5, pixsize_y=2e-5, npix_x=32, npix_y=32, epsilon=1e-7)


def _ducc_vis(**extra):
    kw = {k: v for k, v in GRIDDER.items() if not k.startswith("npix")}
    return ducc0.wgridder.experimental.dirty2vis(
        uvw=UVW, freq=FREQ, dirty=IMAGE, do_wgridding=True, **kw, **extra
    )


@pytest.mark.parametrize(
    "spelled",
    [
        dict(verbosity=False),  # a real client's configuration
        dict(verbosity=np.False_, nthreads=np.int64(1)),
        dict(nthreads=True, flip_v=np.False_),
        dict(nthreads=2.0, npix_x=32.0, npix_y=np.int32(32), do_wgridding=np.True_),
        dict(flip_v=None, divide_by_n=np.True_, center_x=np.float64(0.0)),
    ],
    ids=str,
)
def test_the_gridder_takes_what_1_3_took(spelled):
    op = jaxducc0.get_wgridder(**{**GRIDDER, "do_wgridding": True, **spelled})
    vis = op(UVW, FREQ, jnp.asarray(IMAGE))[0]
    assert norm_relative_error(vis, _ducc_vis()) < 1e-6


def test_one_of_sigma_min_and_sigma_max_takes_duccs_default_for_the_other():
    for extra in (dict(sigma_min=1.3), dict(sigma_max=2.2)):
        op = jaxducc0.get_wgridder(**GRIDDER, do_wgridding=True, **extra)
        assert norm_relative_error(op(UVW, FREQ, jnp.asarray(IMAGE))[0], _ducc_vis(**extra)) < 1e-6
    with pytest.raises(ValueError, match="1 < sigma_min < sigma_max"):
        jaxducc0.get_wgridder(**GRIDDER, do_wgridding=True, sigma_min=3.0)


def test_double_precision_accumulation_goes_to_the_transpose_only():
    op = jaxducc0.get_wgridder(**GRIDDER, do_wgridding=True, double_precision_accumulation=True)
    image = jnp.asarray(IMAGE)
    assert norm_relative_error(op(UVW, FREQ, image)[0], _ducc_vis()) < 1e-6
    vis = np.asarray(random_complex(RNG, (30, 2), np.complex128))
    back = jax.linear_transpose(lambda im: op(UVW, FREQ, im)[0], image)(vis)[0]
    kw = {k: v for k, v in GRIDDER.items()}
    want = ducc0.wgridder.experimental.vis2dirty(
        uvw=UVW,
        freq=FREQ,
        vis=vis.conj(),
        do_wgridding=True,
        double_precision_accumulation=True,
        **kw,
    )
    assert norm_relative_error(back, want) < 1e-6


def test_integer_spellings_of_the_sht_and_the_ffts():
    sht = jaxducc0.get_healpix_sht(np.int64(2), 4, np.int32(4), np.False_, nthreads=True)
    plain = jaxducc0.get_healpix_sht(2, 4, 4, 0)
    alm = jnp.asarray(RNG.normal(size=(1, 2 * jaxducc0.nalm(4, 4) - 5)))
    assert jnp.array_equal(sht(alm)[0], plain(alm)[0])
    x = jnp.asarray(random_complex(RNG, (4, 6), np.complex128))
    assert jnp.array_equal(
        jaxducc0.c2c(x, nthreads=True, inorm=2.0)[0], jaxducc0.c2c(x, inorm=2)[0]
    )
    # forward=None is DUCC's False
    assert jnp.array_equal(jaxducc0.c2c(x, forward=None)[0], jaxducc0.c2c(x, forward=False)[0])


def test_a_repeated_axis_is_refused_saying_what_1_3_did():
    x = jnp.ones((4, 6), jnp.complex128)
    with pytest.raises(ValueError, match=r"name an axis twice; ducc0 refuses.*JAXbind 1\.3"):
        jaxducc0.c2c(x, axes=(0, 0))


def test_an_image_of_another_shape_than_npix_is_refused_saying_why():
    op = jaxducc0.get_wgridder(**{**GRIDDER, "npix_x": 64}, do_wgridding=False)
    with pytest.raises(ValueError, match=r"image must be \(64, 32\).*transpose"):
        op(UVW, FREQ, jnp.asarray(IMAGE))
