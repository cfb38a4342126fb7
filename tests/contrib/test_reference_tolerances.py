"""testing.check's tolerance for approximate DUCC bodies: the references allow a small
factor of the call's epsilon (EPSILON_FACTOR, above rounding), so that a native body that
loses a factor of 10 of its accuracy fails, while DUCC's own ops pass at every epsilon from
1e-3 to 1e-12, in single and double precision.

(DUCC's largest error measured relative to the largest element, over that sweep, types 1-3,
get_nufft and the gridder: 0.83 epsilon; see contrib/ducc/reference/__init__.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ducc0", reason='ducc0 is not installed (pip install ".[ducc]" in the clone)')

import ducc0

import jaxbind
import jaxbind.testing
from jaxbind.contrib import jaxducc0
from jaxbind.contrib.ducc.nufft_points import nufft_points
from jaxbind.contrib.ducc.reference import EPSILON_FACTOR, by_epsilon
from jaxbind.contrib.ducc.reference import nufft as ref_nufft

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

EPSILONS = (1e-3, 1e-6, 1e-9, 1e-12)
PRECISIONS = {"single": (np.float32, np.complex64), "double": (np.float64, np.complex128)}
GRID = (16, 12)
# the rows these tests read (the whole check of each case, its finite differences and vmaps
# included, would take minutes: tests/testing covers those families)
REFERENCE_ROWS = ("native vs reference",)


def _points_and_values(precision, m=200, seed=0):
    real, cplx = PRECISIONS[precision]
    rng = np.random.default_rng(seed)
    coord = rng.uniform(-np.pi, np.pi, (m, 2)).astype(real)
    values = (rng.standard_normal(m) + 1j * rng.standard_normal(m)).astype(cplx)
    return coord, values


def _type1_op(name, body, periodicity=2 * np.pi, noise=0.0):
    """A type-1 NUFFT op (points fixed) computed by `body(coord, values, epsilon, shape)`,
    its transpose (not its adjoint: no conjugation) by DUCC's type 2 with `periodicity`
    (modes scaled by 1 + `noise`), with jaxducc0's reference (a direct sum, period 2 pi)
    and its tolerance."""

    def call(out, args, kwargs_dump):
        kw = jaxbind.load_kwargs(kwargs_dump)
        out[0][...] = body(*args, kw["epsilon"], tuple(kw["grid_shape"]))

    def call_T(out, args, kwargs_dump):
        coord, grid = args
        kw = jaxbind.load_kwargs(kwargs_dump)
        out[0][...] = ducc0.nufft.u2nu(
            grid=(grid * (1 + noise)).astype(grid.dtype),
            coord=coord,
            forward=True,
            epsilon=kw["epsilon"],
            periodicity=periodicity,
        )

    def reference(coord, values, *, grid_shape, epsilon):
        return ref_nufft.nufft(coord, values, grid_shape=grid_shape, nufft_type=1)

    return jaxbind.get_linear_call(
        call,
        call_T,
        lambda coord, values, grid_shape, **kw: ((tuple(grid_shape), values.dtype),),
        lambda coord, grid, **kw: (((coord.shape[0],), grid.dtype),),
        first_n_args_fixed=1,
        reference=jaxbind.Reference(reference, tolerance=by_epsilon),  # as jaxducc0's ops
        name=name,
    )


def _ducc_type1(coord, values, epsilon, shape, periodicity=2 * np.pi):
    out = np.empty(shape, values.dtype)
    return ducc0.nufft.nu2u(
        points=values,
        coord=coord,
        forward=True,
        epsilon=epsilon,
        out=out,
        periodicity=periodicity,
    )


def _forward_error(op, coord, values, eps):
    report = jaxbind.testing.check(
        op, coord, values, grid_shape=GRID, epsilon=eps, verbose=False, families=REFERENCE_ROWS
    )
    (row,) = [r for r in report if r.check == "native vs reference: forward"]
    return row


def test_check_passes_ducc_at_its_epsilon_in_a_user_op():
    coord, values = _points_and_values("double")
    op = _type1_op("test.ducc_type1", _ducc_type1)
    row = _forward_error(op, coord, values, 1e-6)
    assert row.ok and row.tol == EPSILON_FACTOR * 1e-6


def test_check_fails_a_nufft_whose_period_is_written_2_times_3_14159():
    """The period 2 * 3.14159 costs 70 times DUCC's accuracy at epsilon 1e-6 (100 times
    epsilon, the tolerance before, let it through)."""
    coord, values = _points_and_values("double")
    period = 2 * 3.14159
    op = _type1_op("test.period_3_14159", lambda *a: _ducc_type1(*a, period), period)
    with pytest.raises(AssertionError, match="differs from its reference in output 0"):
        jaxbind.testing.check(
            op, coord, values, grid_shape=GRID, epsilon=1e-6, verbose=False,
            families=REFERENCE_ROWS,
        )  # fmt: skip


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_check_fails_a_nufft_ten_times_less_accurate_than_its_epsilon(precision):
    """DUCC's result with each mode off by 10 epsilon (a fixed random sign per mode: still
    linear, and transposed alike)."""
    coord, values = _points_and_values(precision)
    eps = 1e-6
    signs = np.random.default_rng(7).choice([-1.0, 1.0], GRID)

    def noisy(coord, values, epsilon, shape):
        exact = _ducc_type1(coord, values, epsilon, shape)
        return (exact * (1 + 10 * epsilon * signs)).astype(exact.dtype)

    op = _type1_op(f"test.noisy_{precision}", noisy, noise=10 * eps * signs)
    with pytest.raises(AssertionError) as failed:
        _forward_error(op, coord, values, eps)
    assert "native vs reference: forward [output 0" in str(failed.value)


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("nufft_type", (1, 2))
def test_check_passes_get_nufft_at_every_epsilon(nufft_type, eps, precision):
    coord, values = _points_and_values(precision)
    op = jaxducc0.get_nufft(coord, GRID, nufft_type=nufft_type, epsilon=eps)
    if nufft_type == 2:
        rng = np.random.default_rng(1)
        values = (rng.standard_normal(GRID) + 1j * rng.standard_normal(GRID)).astype(values.dtype)
    report = jaxbind.testing.check(op, values, verbose=False, families=REFERENCE_ROWS)
    rows = [r for r in report if r.check.startswith("native vs reference") and r.checked]
    # below epsilon only rounding: in single precision 5 times the reference's own error on
    # this case (1.1e-6 to 1.3e-6: the spreading reference's float32 kernel, grid and FFT)
    assert rows and all(r.tol <= max(EPSILON_FACTOR * eps, 8e-6) for r in rows), rows


@pytest.mark.slow
@pytest.mark.parametrize(
    "nufft_type, eps, precision", [(1, 1e-12, "double"), (2, 1e-6, "single"), (3, 1e-9, "double")]
)
def test_check_passes_the_drop_ins_nufft(nufft_type, eps, precision):
    """The op beneath nufft1/2/3, with its derivatives in the points (one epsilon and
    precision per type; get_nufft's sweep above covers every epsilon in both precisions)."""
    coord, values = _points_and_values(precision)
    xs, values = np.ascontiguousarray(coord.T), values[None]
    kwargs = dict(nufft_type=nufft_type, eps=eps, modeord=0, nthreads=1)
    if nufft_type == 1:
        args, kwargs = (values, xs), dict(kwargs, sign=1, grid=GRID, upsampfac=2.0)
    elif nufft_type == 2:
        rng = np.random.default_rng(1)
        grid = (rng.standard_normal((1, *GRID)) + 1j * rng.standard_normal((1, *GRID))).astype(
            values.dtype
        )
        args, kwargs = (grid, xs), dict(kwargs, sign=-1, grid=GRID, upsampfac=2.0)
    else:
        targets = np.random.default_rng(2).uniform(-8, 8, (2, 100)).astype(xs.dtype)
        # (upsampfac 2.0: 1.25 reaches only about 2e-9, and a finer eps is clamped to that)
        args, kwargs = (values, xs, targets), dict(kwargs, sign=-1, grid=None, upsampfac=2.0)
    _assert_reference_rows_pass(nufft_points.op, *args, **kwargs)


def _assert_reference_rows_pass(op, *args, **kwargs):
    """The native vs reference rows pass (the other families' tolerances are not the
    references': finite differences and adjointness at a coarse epsilon fail there)."""
    try:
        report = jaxbind.testing.check(op, *args, verbose=False, families=REFERENCE_ROWS, **kwargs)
    except AssertionError as failed:
        report = failed.report
    rows = [r for r in report if r.check.startswith("native vs reference") and r.checked]
    assert rows and all(r.ok for r in rows), [r for r in rows if not r.ok]


@pytest.mark.slow
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("eps", EPSILONS)
def test_check_passes_the_gridder_at_every_epsilon(eps, precision):
    real, _ = PRECISIONS[precision]
    rng = np.random.default_rng(3)
    uvw, freq = rng.uniform(-50, 50, (100, 3)), np.array([1e9, 1.1e9])
    op = jaxducc0.get_wgridder(
        pixsize_x=1e-3, pixsize_y=1.2e-3, npix_x=16, npix_y=20, epsilon=eps, do_wgridding=True
    )
    _assert_reference_rows_pass(op, uvw, freq, rng.standard_normal((16, 20)).astype(real))
