"""The HEALPix SHT reference's recurrences and ring transforms (reference/sht_rings.py),
against the dense matrices of tests/support/dense_sht.py and the native op: forward and
adjoint in both precisions and every spin the tests reach (0 to 3, lmax above 2 nside,
mmax below lmax), the adjoint as the transpose (dot products), JAX's transpose, VJP, JVP
and vmap of the reference computed by its own passes, memory that never holds lmax maps,
and the rescaled recurrences where their seeds underflow. (The op-level comparisons of
forward, transpose and grad with DUCC are in test_references_wgridder_sht.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random
from support.dense_sht import synthesis_matrix
from support.dtypes import global_x64

pytest.importorskip("ducc0", reason="ducc0 is not installed (in the clone: pip install '.[ducc]')")

from jaxbind.contrib.ducc.reference import sht_rings
from jaxbind.contrib.ducc.reference.sht import healpix_sht
from jaxbind.contrib.jaxducc0 import get_healpix_sht, realalm_size

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

# (nside, lmax, mmax, spin): lmax > 2 nside, mmax < lmax, nside 1 (no polar rings), a
# spin above mmax, spin = lmax
CASES = [
    (1, 3, 3, 0),
    (2, 9, 9, 0),
    (4, 10, 5, 0),
    (3, 8, 8, 1),
    (2, 7, 3, 2),
    (4, 12, 12, 2),
    (2, 7, 1, 3),
    (1, 3, 3, 3),
]
IDS = ["nside{}-lmax{}-mmax{}-spin{}".format(*c) for c in CASES]
# relative to the largest element: DUCC and the dense matrices are exact to rounding
RTOL = {np.float32: 2e-6, np.float64: 1e-13}


def _shapes(nside, lmax, mmax, spin):
    ncomp = 1 if spin == 0 else 2
    return (ncomp, realalm_size(lmax, mmax)), (ncomp, 12 * nside**2)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / np.abs(b).max()


def _reference(case):
    nside, lmax, mmax, spin = case
    return lambda alm: healpix_sht(alm, nside=nside, lmax=lmax, mmax=mmax, spin=spin)[0]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_synthesis_and_adjoint_equal_the_dense_matrices(case):
    """S x and S^T y, S the dense matrix of the synthesis (float64)."""
    alm_shape, map_shape = _shapes(*case)
    x, y = random(alm_shape, np.float64, 1), random(map_shape, np.float64, 2)
    s = synthesis_matrix(*case)
    got = jax.jit(lambda x: sht_rings.synthesis(x, *case))(x)
    assert _rel(got, (s @ x.ravel()).reshape(map_shape)) < RTOL[np.float64]
    back = jax.jit(lambda y: sht_rings.adjoint_synthesis(y, *case))(y)
    assert _rel(back, (s.T @ y.ravel()).reshape(alm_shape)) < RTOL[np.float64]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_reference_and_its_transpose_match_ducc_and_are_adjoint(case, dtype):
    """Forward against DUCC's synthesis, jax.linear_transpose of the reference against
    DUCC's adjoint synthesis, and <A x, y> = <x, A^T y>, in the dtype's precision."""
    alm_shape, map_shape = _shapes(*case)
    x, y = random(alm_shape, dtype, 3), random(map_shape, dtype, 4)
    op = get_healpix_sht(*case)
    ref = _reference(case)
    got = jax.jit(ref)(x)
    assert got.dtype == dtype and got.shape == map_shape
    assert _rel(got, op(x)[0]) < RTOL[dtype]
    (back,) = jax.jit(jax.linear_transpose(ref, x))(y)
    assert back.dtype == dtype and back.shape == alm_shape
    (want,) = jax.linear_transpose(lambda a: op(a)[0], x)(y)
    assert _rel(back, want) < RTOL[dtype]
    lhs = np.vdot(np.asarray(got, np.float64), y)
    rhs = np.vdot(x, np.asarray(back, np.float64))
    assert abs(lhs - rhs) <= RTOL[dtype] * np.abs(got).sum() * np.abs(y).max()


def _largest(jaxpr) -> int:
    """The most elements of any value in `jaxpr` and the programs inside it."""
    biggest = max((int(np.prod(v.aval.shape)) for v in jaxpr.invars + jaxpr.outvars), default=0)
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            biggest = max(biggest, int(np.prod(getattr(v.aval, "shape", ()))))
        for param in eqn.params.values():
            for p in param if isinstance(param, tuple) else (param,):
                inner = getattr(p, "jaxpr", p)  # a ClosedJaxpr's, or a Jaxpr
                if hasattr(inner, "eqns"):
                    biggest = max(biggest, _largest(inner))
    return biggest


def test_transpose_grad_and_jvp_run_their_own_passes_in_map_sized_memory():
    """JAX's transpose and VJP of the reference are its adjoint pass, its JVP the synthesis
    itself: no program holds a value of lmax x npix elements (what transposing the
    recurrence's scan would store), the largest are the map, the alm and the tiles' sums."""
    case = (8, 16, 16, 2)
    alm_shape, map_shape = _shapes(*case)
    x, y = random(alm_shape, np.float64, 5), random(map_shape, np.float64, 6)
    ref = _reference(case)
    programs = {
        "transpose": jax.make_jaxpr(jax.linear_transpose(ref, x))(y),
        "vjp": jax.make_jaxpr(lambda x, y: jax.vjp(ref, x)[1](y))(x, y),
        "jvp": jax.make_jaxpr(lambda x, t: jax.jvp(ref, (x,), (t,)))(x, x),
    }
    for name, program in programs.items():  # (a scan's residuals: 17 maps, 26112 numbers)
        assert _largest(program.jaxpr) <= 2 * np.prod(map_shape), name
    (t,) = jax.linear_transpose(ref, x)(y)
    (v,) = jax.vjp(ref, x)[1](y)
    np.testing.assert_allclose(v, t, rtol=1e-14, atol=1e-14 * np.abs(t).max())
    _, tangent = jax.jvp(ref, (x,), (2 * x,))
    np.testing.assert_allclose(tangent, 2 * ref(x), rtol=1e-13, atol=1e-13)


def test_second_derivatives_match_the_dense_matrices():
    """The Hessian of sum(sin(S x)) is S^T diag(-sin(S x)) S: forward over reverse through
    the tied synthesis and its adjoint."""
    case = (2, 5, 5, 1)
    alm_shape, _ = _shapes(*case)
    x = random(alm_shape, np.float64, 7)
    ref = _reference(case)
    s = synthesis_matrix(*case)
    hessian = jax.jit(jax.jacfwd(jax.grad(lambda a: jnp.sum(jnp.sin(ref(a))))))(x)
    want = s.T @ (-np.sin(s @ x.ravel())[:, None] * s)
    n = x.size
    np.testing.assert_allclose(np.asarray(hessian).reshape(n, n), want, atol=1e-12)


def test_reference_vmaps_forward_and_transpose():
    case = (2, 7, 5, 2)
    alm_shape, map_shape = _shapes(*case)
    xs, ys = random((3, *alm_shape), np.float64, 8), random((3, *map_shape), np.float64, 9)
    ref = _reference(case)
    op = get_healpix_sht(*case)
    got = jax.jit(jax.vmap(ref))(xs)
    assert _rel(got, np.stack([op(x)[0] for x in xs])) < 1e-13
    transpose = jax.vmap(lambda y: jax.linear_transpose(ref, xs[0])(y)[0])
    want = np.stack([jax.linear_transpose(lambda a: op(a)[0], xs[0])(y)[0] for y in ys])
    assert _rel(jax.jit(transpose)(ys), want) < 1e-13


@pytest.mark.parametrize("spin", [0, 2])
def test_recurrences_hold_where_their_seeds_underflow(spin):
    """At nside 8 the polar ring has sin(theta) = 0.1: the seeds of m > 310 are below the
    double range (and those of m > 40 below float32's), kept as mantissa and exponent
    until the recurrence has grown them; DUCC agrees to rounding, also without x64 (the
    recurrences in float32)."""
    nside, lmax = 8, 400
    case = (nside, lmax, lmax, spin)
    alm_shape, _ = _shapes(*case)
    x = random(alm_shape, np.float64, 10) / np.sqrt(np.arange(alm_shape[1]) + 1.0)
    want = get_healpix_sht(*case)(x)[0]
    assert _rel(jax.jit(_reference(case))(x), want) < 1e-12
    small = (nside, 120, 120, spin)
    alm_shape, _ = _shapes(*small)
    x = random(alm_shape, np.float32, 11)
    want = get_healpix_sht(*small)(x.astype(np.float64))[0]
    with global_x64(False):
        got = jax.jit(_reference(small))(x)
        assert got.dtype == np.float32
    assert _rel(got, want) < 2e-4  # float32 recurrences: up to l^2 units near the poles


def test_jaxbind_check_passes_for_spin_2_in_single_precision():
    """jaxbind.testing.check of the native op against this reference (forward, transpose,
    batching, derivatives), float32 maps with the reference computing in double."""
    from jaxbind.testing import check

    case = (2, 6, 4, 2)
    alm_shape, _ = _shapes(*case)
    check(get_healpix_sht(*case), random(alm_shape, np.float32, 12), verbose=False)


def test_portable_export_of_synthesis_and_gradient_holds_no_custom_call():
    """jaxbind.export(..., portable=True) inlines the reference (recurrences, ring FFTs and
    the adjoint pass of the gradient): no custom call, and the artifact computes what DUCC
    does."""
    import jaxbind

    case = (4, 12, 10, 2)
    alm_shape, _ = _shapes(*case)
    x = random(alm_shape, np.float64, 13)
    op = get_healpix_sht(*case)

    def program(alm):
        return op(alm)[0], jax.grad(lambda a: jnp.sum(jnp.sin(op(a)[0])))(alm)

    exported = jaxbind.export(program, portable=True)(x)
    assert "stablehlo.custom_call" not in exported.mlir_module()
    loaded = jax.export.deserialize(exported.serialize())
    for got, want in zip(loaded.call(x), jax.jit(program)(x)):
        assert _rel(got, want) < 1e-12
