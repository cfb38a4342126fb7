"""Every jaxducc0 op against its own JAX reference, through the op: the same program traced
natively and under jaxbind.use_reference(), forward and gradient (with respect to the values,
and for the NUFFTs of the jax-finufft drop-in, the points), within the op's epsilon; and a
portable artifact of DUCC ops, run where ducc0 and jaxbind cannot be imported.

(The references' own conventions are tested function by function in
test_references_fft_nufft.py and test_references_wgridder_sht.py.)
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.dtypes import global_x64
from support.processes import refusing_imports, run_python

import jaxbind
from jaxbind.contrib import jaxducc0

EPS = 1e-10
RNG = np.random.default_rng(0)


def _relative(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(_relative(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _native_and_reference(fn, *args):
    native = jax.jit(fn)(*args)
    with jaxbind.use_reference(strict=True):  # (strict: every op in fn has a reference)
        reference = jax.jit(fn)(*args)
    return native, reference


def _complex(*shape):
    return jnp.asarray(RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape))


def _cases():
    """name -> (function, arguments, tolerance): a forward and a gradient per op."""
    x, xr = _complex(16, 12), jnp.asarray(RNG.standard_normal((16, 12)))
    half = jaxducc0.r2c(xr)[0]
    points = jnp.asarray(RNG.uniform(-np.pi, np.pi, (2, 300)))
    values, grid = _complex(300), _complex(16, 12)
    coord = jnp.asarray(RNG.uniform(-np.pi, np.pi, (300, 2)))
    nufft = jaxducc0.get_nufft(coord, (16, 12), nufft_type=2, epsilon=EPS)
    plan = jaxducc0.NufftPlan(1, (16, 12), np.asarray(points[0]), np.asarray(points[1]), eps=EPS)
    uvw, freq = jnp.asarray(RNG.uniform(-50, 50, (200, 3))), jnp.asarray([1e9, 1.1e9])
    wgridder = jaxducc0.get_wgridder(
        pixsize_x=1e-3, pixsize_y=1.2e-3, npix_x=16, npix_y=20, epsilon=EPS, do_wgridding=True
    )
    dirty = jnp.asarray(RNG.standard_normal((16, 20)))
    sht = jaxducc0.get_healpix_sht(8, 16, 16, 0)
    alm = jnp.asarray(RNG.standard_normal((1, jaxducc0.realalm_size(16, 16))))
    norm = lambda y: jnp.sum(jnp.abs(y) ** 2)
    fft_tol = 1e-12
    return {
        "c2c": (lambda x: jaxducc0.c2c(x, axes=(0, 1))[0], (x,), fft_tol),
        "c2c-grad": (jax.grad(lambda x: norm(jaxducc0.c2c(x, axes=(0,))[0] ** 2)), (x,), fft_tol),
        "c2c-vmap": (jax.vmap(lambda x: jaxducc0.c2c(x, inorm=2)[0]), (x,), fft_tol),
        "genuine_fht": (lambda x: jaxducc0.genuine_fht(x)[0], (xr,), fft_tol),
        "genuine_fht-grad": (
            jax.grad(lambda x: norm(jaxducc0.genuine_fht(x)[0] ** 2)),
            (xr,),
            fft_tol,
        ),
        "r2c": (lambda x: jaxducc0.r2c(x, inorm=1)[0], (xr,), fft_tol),
        "r2c-grad": (jax.grad(lambda x: norm(jaxducc0.r2c(x)[0] ** 2)), (xr,), fft_tol),
        "c2r": (lambda c: jaxducc0.c2r(c, lastsize=12, forward=False)[0], (half,), fft_tol),
        "c2r-grad": (
            jax.grad(lambda c: norm(jaxducc0.c2r(c, lastsize=12)[0] ** 2)),
            (half,),
            fft_tol,
        ),
        "get_nufft": (lambda f: nufft(f)[0], (grid,), 10 * EPS),
        "get_nufft-grad": (jax.grad(lambda f: norm(nufft(f)[0])), (grid,), 10 * EPS),
        "NufftPlan": (plan, (values,), 10 * EPS),
        "NufftPlan-grad": (jax.grad(lambda v: norm(plan(v))), (values,), 10 * EPS),
        "nufft1": (
            lambda p, v: jaxducc0.nufft1((16, 12), v, p[0], p[1], eps=EPS),
            (points, values),
            10 * EPS,
        ),
        "nufft1-grad-points-values": (
            jax.grad(lambda p, v: norm(jaxducc0.nufft1((16, 12), v, p[0], p[1], eps=EPS)), (0, 1)),
            (points, values),
            10 * EPS,
        ),
        "nufft2-grad-points-values": (
            jax.grad(lambda p, f: norm(jaxducc0.nufft2(f, p[0], p[1], eps=EPS)), (0, 1)),
            (points, grid),
            10 * EPS,
        ),
        "nufft3-grad-points-values": (
            jax.grad(
                lambda p, v: norm(jaxducc0.nufft3(v, p[0], p[1], p[0] / 2, p[1] / 3, eps=EPS)),
                (0, 1),
            ),
            (points, values),
            10 * EPS,
        ),
        "wgridder": (lambda d: wgridder(uvw, freq, d)[0], (dirty,), 10 * EPS),
        "wgridder-grad": (jax.grad(lambda d: norm(wgridder(uvw, freq, d)[0])), (dirty,), 10 * EPS),
        "healpix_sht": (lambda a: sht(a)[0], (alm,), 1e-12),
        "healpix_sht-grad": (jax.grad(lambda a: jnp.sum(sht(a)[0] ** 3)), (alm,), 1e-12),
    }


@pytest.fixture(scope="module")
def cases():
    with global_x64(True):
        yield _cases()


NAMES = [
    "c2c", "c2c-grad", "c2c-vmap", "genuine_fht", "genuine_fht-grad", "r2c", "r2c-grad",
    "c2r", "c2r-grad", "get_nufft", "get_nufft-grad", "NufftPlan", "NufftPlan-grad", "nufft1",
    "nufft1-grad-points-values", "nufft2-grad-points-values", "nufft3-grad-points-values",
    "wgridder", "wgridder-grad", "healpix_sht", "healpix_sht-grad",
]  # fmt: skip


def test_every_case_is_listed():
    with global_x64(True):
        assert sorted(NAMES) == sorted(_cases())


@pytest.mark.parametrize("name", NAMES)
def test_native_op_agrees_with_its_reference_within_its_epsilon(cases, name):
    fn, args, tolerance = cases[name]
    with global_x64(True):
        native, reference = _native_and_reference(fn, *args)
    assert _relative(reference, native) < tolerance


_LOAD = (
    refusing_imports("jaxbind", "ducc0")
    + """
import sys, json, numpy as np, jax, jax.export
jax.config.update("jax_enable_x64", True)
out = jax.export.deserialize(open(sys.argv[1], "rb").read()).call(*np.load(sys.argv[2]).values())
print(json.dumps([float(np.abs(np.asarray(o)).sum()) for o in out]))
"""
)


def test_portable_artifact_of_ducc_ops_runs_where_ducc0_cannot_be_imported(tmp_path):
    with global_x64(True):
        x = _complex(8, 6)
        points = jnp.asarray(RNG.uniform(-np.pi, np.pi, (2, 50)))
        values = _complex(50)

        def program(x, points, values):
            modes = jaxducc0.nufft1((8, 6), values, points[0], points[1], eps=EPS)
            return jaxducc0.c2c(x * modes, axes=(0, 1))[0], jax.grad(
                lambda p: jnp.sum(jnp.abs(jaxducc0.nufft2(x, p[0], p[1], eps=EPS)) ** 2)
            )(points)

        exported = jaxbind.export(program, portable=True, platforms=("cpu", "cuda", "tpu"))(
            x, points, values
        )
        assert "stablehlo.custom_call" not in exported.mlir_module()
        native = [float(np.abs(np.asarray(o)).sum()) for o in jax.jit(program)(x, points, values)]
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    np.savez(tmp_path / "args.npz", np.asarray(x), np.asarray(points), np.asarray(values))
    (tmp_path / "load.py").write_text(_LOAD)
    done = run_python(tmp_path / "load.py", tmp_path / "program.bin", tmp_path / "args.npz")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got, native, rtol=1e-8)


def test_check_compares_an_approximate_op_with_its_reference_at_the_op_epsilon():
    """A NUFFT at epsilon 1e-6 checked in float64: the reference rows allow DUCC its
    epsilon (the reference's tolerance), and fail it at a tolerance below."""
    with global_x64(True):
        coord = jnp.asarray(RNG.uniform(-np.pi, np.pi, (300, 2)))
        op = jaxducc0.get_nufft(coord, (16, 12), nufft_type=2, epsilon=1e-6)
        grid = _complex(16, 12)
        rows = [r for r in jaxbind.testing.check(op, grid, verbose=False) if "reference" in r.check]
        assert rows and all(r.ok for r in rows), rows
        with pytest.raises(AssertionError, match="differs from its reference"):
            jaxbind.testing.check(op, grid, rtol=1e-12, verbose=False)


# --- one convention for keyword arguments, one value per reference ----------------------

# every reference function, with the options of its op that only tune DUCC's computation
REFERENCE_TUNING = {
    "fft.c2c": ("nthreads",),
    "fft.genuine_fht": ("nthreads",),
    "fft.r2c": ("nthreads",),
    "fft.c2r": ("nthreads",),
    "nufft.nufft": ("epsilon", "nthreads", "verbosity", "sigma_min", "sigma_max"),
    "nufft.nufft_points": ("eps", "nthreads", "upsampfac"),
    "nufft.nufft_plan": ("epsilon", "nthreads", "sigma", "dtype"),
    "nufft.nufft1": ("eps",),
    "nufft.nufft2": ("eps",),
    "nufft.nufft3": ("eps",),
    "wgridder.wgridder": ("epsilon", "nthreads", "verbosity", "allow_nshift"),
    "sht.healpix_sht": ("nthreads",),
}


def _reference_function(path: str):
    import importlib

    module, name = path.split(".")
    return getattr(importlib.import_module(f"jaxbind.contrib.ducc.reference.{module}"), name)


@pytest.mark.parametrize("path", sorted(REFERENCE_TUNING))
def test_every_reference_refuses_an_unknown_option_naming_its_op_and_what_it_takes(path):
    fn = _reference_function(path)
    op = path.split(".")[1]
    with pytest.raises(TypeError, match=rf"jaxducc0\.{op} reference.*\['colour'\]") as raised:
        fn(jnp.zeros(4), colour="blue")
    assert all(name in str(raised.value) for name in REFERENCE_TUNING[path])


def test_a_tuning_option_is_taken_by_name_and_changes_nothing():
    from jaxbind.contrib.ducc.reference import fft

    x = _complex(4, 6)
    np.testing.assert_array_equal(fft.c2c(x, nthreads=8)[0], fft.c2c(x)[0])


def test_the_approximate_ops_give_their_tolerance_with_their_reference():
    from jaxbind.contrib.ducc import nufft, nufft_plan, nufft_points, wgridder

    for op in (nufft._nufft_op, nufft_plan._op, nufft_points._op, wgridder._wgridder):
        value = op.binding.reference
        assert value.tolerance_for({"epsilon": 1e-6}) == pytest.approx(3e-6), op.name
    assert jaxducc0.c2c.binding.reference.tolerance is None  # an FFT is exact
