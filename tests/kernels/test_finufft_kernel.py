"""A C library bound from Python alone: FINUFFT's simple interface (finufft2d1, ...),
called through ctypes from numba kernels, as two linear ops (type 1 and type 2, each the
other's transpose); opts NULL, or a finufft_opts with the number of threads.

Checked against a dense non-uniform DFT and against jaxducc0's nufft1 and nufft2, under
jit, linear_transpose, grad and vmap, and by jaxbind.testing.check. The demo
demos/07_finufft_ctypes.py binds the guru interface (with options) the same way.
"""

import ctypes
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random

import jaxbind

numba = pytest.importorskip("numba", reason="numba is not installed")
finufft = pytest.importorskip("finufft", reason="finufft is not installed (pip install finufft)")
pytest.importorskip("ducc0", reason="ducc0 is not installed (the reference)")

from jaxbind.contrib import jaxducc0  # noqa: E402

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

PTR, INT, INT64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
HERE = pathlib.Path(finufft.__file__).parent
_found = [
    p
    for p in sorted(HERE.iterdir())
    if p.name.startswith(("libfinufft", "finufft")) and p.suffix in (".so", ".dylib", ".dll")
]
if not _found:
    pytest.skip(
        f"no FINUFFT C library beside the finufft package ({HERE})", allow_module_level=True
    )
# a handle of our own: the argtypes set below would change the package's calls on its handle
LIB = ctypes.CDLL(str(_found[0]))


def _simple_interface(prefix, real):
    """finufft{1,2,3}d{1,2} (or the finufftf ones), with opts NULL: FINUFFT's defaults."""

    def c_function(dim, kind):
        fn = getattr(LIB, f"{prefix}{dim}d{kind}")
        # M, the coordinates, c, iflag, eps, the grid sizes, f, opts
        fn.argtypes = [INT64, *[PTR] * dim, PTR, INT, real, *[INT64] * dim, PTR, PTR]
        fn.restype = INT
        return fn

    a1, a2, b1, b2, c1, c2 = (c_function(d, k) for d in (1, 2, 3) for k in (1, 2))

    @numba.njit
    def run(kind, c, f, n, points, iflag, eps, opts):
        dim, m = points.shape
        x = points[dim - 1].ctypes.data  # FINUFFT's x runs fastest: our last axis
        y = points[dim - 2].ctypes.data if dim > 1 else x
        z = points[0].ctypes.data  # used in 3-D only
        if dim == 1:
            if kind == 1:
                return a1(m, x, c, iflag, eps, n[0], f, opts)
            return a2(m, x, c, iflag, eps, n[0], f, opts)
        if dim == 2:
            if kind == 1:
                return b1(m, x, y, c, iflag, eps, n[0], n[1], f, opts)
            return b2(m, x, y, c, iflag, eps, n[0], n[1], f, opts)
        if kind == 1:
            return c1(m, x, y, z, c, iflag, eps, n[0], n[1], n[2], f, opts)
        return c2(m, x, y, z, c, iflag, eps, n[0], n[1], n[2], f, opts)

    return run


_double = _simple_interface("finufft", ctypes.c_double)
_single = _simple_interface("finufftf", ctypes.c_float)


default_opts = LIB.finufft_default_opts
default_opts.argtypes, default_opts.restype = [PTR], None


@numba.njit
def transform(kind, c, f, n, points, iflag, eps, nthreads):
    """The transform between the values at address `c` and the grid at `f` (sizes `n`,
    FINUFFT's order); raises on a nonzero code from FINUFFT. nthreads=0 passes opts NULL
    (FINUFFT's defaults: all threads); others set the threads in a finufft_opts."""
    opts = np.zeros(128, np.int32)  # room for any FINUFFT 2.x's finufft_opts
    default_opts(opts.ctypes.data)
    opts[5] = nthreads  # its sixth int field
    address = opts.ctypes.data if nthreads > 0 else np.uintp(0)
    if points.itemsize == 8:
        ier = _double(kind, c, f, n, points, iflag, eps, address)
    else:
        ier = _single(kind, c, f, n, points, iflag, eps, address)
    if ier != 0:
        raise RuntimeError("FINUFFT returned error code", ier)


@numba.njit
def _sizes(f):
    n = np.ones(3, np.int64)
    for k in range(f.ndim):  # reversed: FINUFFT's grids run fastest along their first axis
        n[k] = f.shape[f.ndim - 1 - k]
    return n


@jaxbind.kernel
def type1(f, points, c, iflag, eps, nthreads):
    transform(1, c.ctypes.data, f.ctypes.data, _sizes(f), points, iflag, eps, nthreads)


@jaxbind.kernel
def type2(c, points, f, iflag, eps, nthreads):
    transform(2, c.ctypes.data, f.ctypes.data, _sizes(f), points, iflag, eps, nthreads)


def _grid(points, c, *, n_modes, **kwargs):
    return ((tuple(int(n) for n in n_modes), c.dtype),)


def _values(points, f, **kwargs):
    return (((points.shape[1],), f.dtype),)


op1 = jaxbind.get_linear_call(type1, type2, _grid, _values, first_n_args_fixed=1, name="t.fi1")
op2 = jaxbind.get_linear_call(type2, type1, _values, _grid, first_n_args_fixed=1, name="t.fi2")
REAL = {np.dtype(np.complex64): np.float32, np.dtype(np.complex128): np.float64}


def _points(values, coords, fn):
    real = REAL.get(np.dtype(values.dtype))
    if real is None:
        raise TypeError(f"t.{fn}: values must be complex64 or complex128, got {values.dtype}")
    coords = [jnp.asarray(p) for p in coords]
    if any(p.dtype != real or p.shape != coords[0].shape or p.ndim != 1 for p in coords):
        raise ValueError(f"t.{fn}: coordinates must be {np.dtype(real)} arrays of one shape (M,)")
    return jnp.stack(coords)


def nufft1(n_modes, c, *coords, iflag=1, eps=1e-6, nthreads=0):
    c = jnp.asarray(c)
    points = _points(c, coords, "nufft1")
    if c.shape != points.shape[1:] or len(n_modes) != len(coords):
        raise ValueError(f"t.nufft1: values {c.shape}, n_modes {n_modes}, points {points.shape}")
    return op1(points, c, n_modes=np.array(n_modes), iflag=iflag, eps=eps, nthreads=nthreads)[0]


def nufft2(f, *coords, iflag=-1, eps=1e-6, nthreads=0):
    f = jnp.asarray(f)
    points = _points(f, coords, "nufft2")
    if f.ndim != len(coords):
        raise ValueError(f"t.nufft2: a {f.ndim}-D grid for {len(coords)}-D points")
    return op2(points, f, n_modes=np.array(f.shape), iflag=iflag, eps=eps, nthreads=nthreads)[0]


# --- the tests --------------------------------------------------------------------------

EPS = {np.complex64: 1e-5, np.complex128: 1e-10}
SHAPES = {1: (20,), 2: (12, 9), 3: (6, 5, 4)}


def _problem(dim, dtype, m=300, seed=0):
    rng = np.random.default_rng(seed)
    coords = [jnp.asarray(rng.uniform(-np.pi, np.pi, m), REAL[np.dtype(dtype)]) for _ in range(dim)]
    return coords, random((m,), dtype, seed + 1), random(SHAPES[dim], dtype, seed + 2)


def _rel(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    return float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))


def _dense(shape, coords, iflag):
    """The matrix of the type-1 transform: exp(i iflag k·x_j), modes from -n//2."""
    modes = np.meshgrid(*(np.arange(-(n // 2), (n + 1) // 2) for n in shape), indexing="ij")
    phase = sum(k.reshape(-1, 1) * np.asarray(x, np.float64) for k, x in zip(modes, coords))
    return np.exp(1j * np.sign(iflag) * phase)


@pytest.mark.parametrize("n", [7, 8])
@pytest.mark.parametrize("iflag", [1, -1])
def test_both_types_match_a_dense_dft_in_mode_order_and_sign(n, iflag):
    coords, c, _ = _problem(2, np.complex128, m=50)
    shape = (n, n + 3)  # odd and even sizes: the most negative mode is -n//2
    a = _dense(shape, coords, iflag)
    got1 = nufft1(shape, c, *coords, iflag=iflag, eps=1e-12)
    np.testing.assert_allclose(got1, (a @ np.asarray(c)).reshape(shape), atol=1e-9)
    f = random(shape, np.complex128, 4)
    got2 = nufft2(f, *coords, iflag=iflag, eps=1e-12)
    np.testing.assert_allclose(got2, np.asarray(f).ravel() @ a, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_both_types_match_jaxducc0(dim, dtype):
    coords, c, f = _problem(dim, dtype)
    eps = EPS[dtype]
    shape = SHAPES[dim]
    got, want = nufft1(shape, c, *coords, eps=eps), jaxducc0.nufft1(shape, c, *coords, eps=eps)
    assert _rel(got, want) < 10 * eps
    got, want = nufft2(f, *coords, eps=eps), jaxducc0.nufft2(f, *coords, eps=eps)
    assert _rel(got, want) < 10 * eps
    got = jax.jit(lambda c, *x: nufft1(shape, c, *x, eps=eps))(c, *coords)
    assert _rel(got, jaxducc0.nufft1(shape, c, *coords, eps=eps)) < 10 * eps


def test_transpose_of_each_type_is_the_other_with_the_same_sign():
    coords, c, f = _problem(2, np.complex128)
    eps, shape = EPS[np.complex128], SHAPES[2]
    for iflag in (1, -1):
        (c_T,) = jax.linear_transpose(lambda c: nufft1(shape, c, *coords, iflag=iflag, eps=eps), c)(
            f
        )
        assert _rel(c_T, nufft2(f, *coords, iflag=iflag, eps=eps)) < 1e-14  # the same kernel
        (c_ref,) = jax.linear_transpose(
            lambda c: jaxducc0.nufft1(shape, c, *coords, iflag=iflag, eps=eps), c
        )(f)
        assert _rel(c_T, c_ref) < 10 * eps
        (f_T,) = jax.linear_transpose(lambda f: nufft2(f, *coords, iflag=iflag, eps=eps), f)(c)
        # (< 1e-14, not equal: FINUFFT's threads add into the grid in no fixed order)
        assert _rel(f_T, nufft1(shape, c, *coords, iflag=iflag, eps=eps)) < 1e-14
        # <A c, f> == <c, A^T f>, JAX's unconjugated pairing
        lhs = jnp.sum(nufft1(shape, c, *coords, iflag=iflag, eps=eps) * f)
        assert abs(lhs - jnp.sum(c * c_T)) < 10 * eps * abs(lhs)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_jaxbind_testing_check_passes_for_both_ops(dtype):
    coords, c, f = _problem(2, dtype, m=60)
    points = jnp.stack(coords)
    eps = EPS[dtype]
    # the op's own `eps` would be check's finite-difference step: bind it with partial.
    # One thread: check asks two runs to agree bit for bit, which FINUFFT's threads (adding
    # into the grid in no fixed order) do not promise.
    kwargs = dict(n_modes=np.array(SHAPES[2]), iflag=1, nthreads=1)
    for op, values in ((op1, c), (op2, f)):
        report = jaxbind.testing.check(
            functools.partial(op, eps=eps), points, values, verbose=False, **kwargs
        )
        assert not report.failures() and len(report) > 10


def test_grad_with_respect_to_the_values_matches_jaxducc0():
    coords, c, f = _problem(2, np.complex128)
    eps, shape = EPS[np.complex128], SHAPES[2]
    target = random(shape, np.complex128, 9)

    def loss(t1):
        return lambda c: jnp.sum(jnp.abs(t1(shape, c, *coords, eps=eps) - target) ** 2)

    got = jax.jit(jax.grad(loss(nufft1)))(c)
    assert _rel(got, jax.grad(loss(jaxducc0.nufft1))(c)) < 10 * eps
    # a directional derivative by central differences (exact for a quadratic loss), against
    # the gradient in JAX's unconjugated pairing, Re sum(g v)
    v = random(c.shape, np.complex128, 10)
    h = 1e-4
    fd = (loss(nufft1)(c + h * v) - loss(nufft1)(c - h * v)) / (2 * h)
    assert abs(fd - jnp.real(jnp.sum(got * v))) < 1e-6 * abs(fd)
    got2 = jax.grad(lambda f: jnp.sum(jnp.abs(nufft2(f, *coords, eps=eps)) ** 2))(f)
    want2 = jax.grad(lambda f: jnp.sum(jnp.abs(jaxducc0.nufft2(f, *coords, eps=eps)) ** 2))(f)
    assert _rel(got2, want2) < 10 * eps


def test_vmap_calls_the_kernel_per_batch_element():
    coords, c, f = _problem(2, np.complex128, m=200)
    eps, shape = EPS[np.complex128], SHAPES[2]
    cs = jnp.stack([c, 2j * c, c**2])
    xs = [jnp.stack([x, -x, x[::-1]]) for x in coords]
    t1 = lambda c, x, y: nufft1(shape, c, x, y, eps=eps)
    loop = jnp.stack([t1(cs[b], *coords) for b in range(3)])
    assert _rel(jax.vmap(t1, (0, None, None))(cs, *coords), loop) < 1e-14
    loop = jnp.stack([t1(cs[b], xs[0][b], xs[1][b]) for b in range(3)])
    assert _rel(jax.jit(jax.vmap(t1))(cs, *xs), loop) < 1e-14
    fs = jnp.stack([f, f.T.reshape(f.shape), 1j * f], axis=-1)  # batched along the last axis
    t2 = lambda f: nufft2(f, *coords, eps=eps)
    want = jnp.stack([jaxducc0.nufft2(fs[..., b], *coords, eps=eps) for b in range(3)])
    assert _rel(jax.vmap(t2, in_axes=-1)(fs), want) < 10 * eps


def test_finufft_error_code_fails_the_call_naming_the_binding():
    coords, c, _ = _problem(1, np.complex128, m=20)
    with pytest.raises(Exception, match=r"kernel of 't\.fi1' \(the function\) failed"):
        jax.block_until_ready(nufft1((8,), c, *coords, eps=1e-30))  # finer than reachable
    # the numba function, called in Python, shows FINUFFT's code
    f = np.zeros(8, np.complex128)
    points = np.stack([np.asarray(x) for x in coords])
    n = np.array([8, 1, 1])
    with pytest.raises(RuntimeError, match="FINUFFT returned error code.*1"):
        transform(1, np.asarray(c).ctypes.data, f.ctypes.data, n, points, 1, 1e-30, 0)


def test_finufft_python_wrapper_still_works_beside_our_declarations():
    """Our argtypes live on our own handle: finufft's wrapper (the same library, loaded by
    NumPy's caching loader) keeps its own."""
    coords, c, _ = _problem(1, np.complex128, m=20)
    x = np.asarray(coords[0])
    got = finufft.nufft1d1(x, np.asarray(c), 8, eps=1e-12)
    np.testing.assert_allclose(got, _dense((8,), [x], 1) @ np.asarray(c), atol=1e-9)


def test_bad_inputs_are_refused_naming_the_call():
    coords, c, f = _problem(2, np.complex128, m=20)
    with pytest.raises(TypeError, match=r"t\.nufft1: values must be complex"):
        nufft1((8, 8), c.real, *coords)
    with pytest.raises(ValueError, match=r"t\.nufft1: coordinates must be float64"):
        nufft1((8, 8), c, coords[0], coords[1].astype(np.float32))
    with pytest.raises(ValueError, match=r"t\.nufft2: a 2-D grid for 1-D points"):
        nufft2(f, coords[0])


# --- a guru plan in the op's state (kernel ABI version 3) -------------------------------

_GURU = dict(
    makeplan=(LIB.finufft_makeplan, [INT, INT, PTR, INT, INT, ctypes.c_double, PTR, PTR]),
    setpts=(LIB.finufft_setpts, [PTR, INT64, PTR, PTR, PTR, INT64, PTR, PTR, PTR]),
    execute=(LIB.finufft_execute, [PTR, PTR, PTR]),
    destroy=(LIB.finufft_destroy, [PTR]),
)
for _fn, _types in _GURU.values():
    _fn.argtypes, _fn.restype = _types, INT
_execute = LIB.finufft_execute


class _Plan:
    """A 1-D type-1 guru plan for one set of points (kept: FINUFFT reads them later)."""

    made: list = []
    destroyed = 0

    def __init__(self, x, n):
        self.x = np.array(x, np.float64)
        self.handle = ctypes.c_void_p()
        sizes = np.array([n, 1, 1], np.int64)
        assert (
            LIB.finufft_makeplan(
                1, 1, sizes.ctypes.data, 1, 1, 1e-12, ctypes.byref(self.handle), None
            )
            == 0
        )
        assert (
            LIB.finufft_setpts(
                self.handle, self.x.size, self.x.ctypes.data, None, None, 0, None, None, None
            )
            == 0
        )
        _Plan.made.append(self)

    @property
    def jaxbind_address(self):
        return self.handle.value

    def destroy(self):
        LIB.finufft_destroy(self.handle)
        _Plan.destroyed += 1


def test_a_guru_plan_in_state_is_made_once_per_points_and_destroyed_with_the_program():
    @jaxbind.state(key=("x",), teardown=_Plan.destroy)
    def plan(*, x, n):
        return _Plan(x, n)

    @jaxbind.kernel
    def execute(f, x, c, state):
        if _execute(state, c.ctypes.data, f.ctypes.data) != 0:
            raise RuntimeError("finufft_execute failed")

    op = jaxbind.linear_op(
        shape=lambda x, c, *, n: jax.ShapeDtypeStruct((n,), c.dtype),
        fixed=1,
        state=plan,
        name="t.fi1_plan",
    )(execute)
    coords, c, _ = _problem(1, np.complex128, m=30)
    (x,) = coords
    before = len(_Plan.made)
    f = jax.jit(lambda x, c: op(x, c, n=8))
    for k in range(3):
        np.testing.assert_allclose(
            f(x, c * k), k * (_dense((8,), [x], 1) @ np.asarray(c)), atol=1e-9
        )
    assert len(_Plan.made) - before == 1  # one plan, its points set once, for every call
    np.testing.assert_allclose(f(-x, c), _dense((8,), [-x], 1) @ np.asarray(c), atol=1e-9)
    assert len(_Plan.made) - before == 2  # new points: a new plan
    del f
    jax.clear_caches()
    import gc

    gc.collect()
    assert _Plan.destroyed == len(_Plan.made)
