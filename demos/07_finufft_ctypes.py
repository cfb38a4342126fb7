# %% [markdown]
# # A C library from Python alone: FINUFFT through ctypes
#
# The `finufft` wheel ships FINUFFT's compiled C library. This demo binds its C API as
# jaxbind kernels without writing any C: ctypes declares the C functions, numba calls them
# from a kernel (numba compiles calls of ctypes functions in nopython mode), and
# `jaxbind.kernel` turns the numba function into a kernel that runs without the GIL and
# without Python. Type 1 (points to modes) and type 2 (modes to points), in 1-D, 2-D and
# 3-D, complex128 and complex64, are two linear ops in the strengths (the points are
# fixed), each the other's transpose. Every result is checked against
# `jaxbind.contrib.jaxducc0.nufft1` and `nufft2` (jax-finufft's calls, run by DUCC) under
# `jit`, `linear_transpose`, `grad` and `vmap`, and the sign and mode order against a dense
# DFT in NumPy. Needs numba and finufft
# (`pip install numba finufft`).

# %%
import ctypes
import pathlib
import time

import finufft  # only for where its wheel put the C library
import jax
import jax.numpy as jnp
import numba
import numpy as np

import jaxbind
from jaxbind.contrib import jaxducc0

jax.config.update("jax_enable_x64", True)


# %% [markdown]
# ## The C functions
#
# The library lies beside the package's Python files (`libfinufft.so`, `.dylib`, or
# `finufft.dll` on Windows). Each C function gets its argument and result types, which
# is what lets numba call it. Pointers are `c_void_p`, so a kernel passes `a.ctypes.data`
# (and 0 for NULL). FINUFFT's guru interface takes the dimension and the type as values:
# make a plan, set the points, execute (as often as wanted), destroy. The
# single-precision functions carry an `f` (`finufftf_makeplan`, ...) and take a float
# tolerance.


# %%
LIBRARY_SUFFIXES = (".so", ".dylib", ".dll")  # Linux, macOS, Windows


def load_finufft() -> ctypes.CDLL:
    """FINUFFT's C library from the installed `finufft` package, in a ctypes handle of our
    own: the package's handle is shared (NumPy's loader caches it), and the argument types
    set below on its functions would break the package's own calls."""
    here = pathlib.Path(finufft.__file__).parent
    for path in sorted(here.iterdir()):
        if path.name.startswith(("libfinufft", "finufft")) and path.suffix in LIBRARY_SUFFIXES:
            return ctypes.CDLL(str(path))
    raise ImportError(f"no FINUFFT C library (libfinufft) in {here}: reinstall finufft")


LIB = load_finufft()
PTR, INT, INT64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64


def c_function(name, restype, *argtypes):
    fn = getattr(LIB, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


default_opts = c_function("finufft_default_opts", None, PTR)  # fills a finufft_opts


def guru(prefix, real):
    """The guru interface in one precision: makeplan, setpts, execute, destroy."""
    return dict(
        makeplan=c_function(f"{prefix}_makeplan", INT, INT, INT, PTR, INT, INT, real, PTR, PTR),
        setpts=c_function(f"{prefix}_setpts", INT, PTR, INT64, PTR, PTR, PTR, INT64, PTR, PTR, PTR),
        execute=c_function(f"{prefix}_execute", INT, PTR, PTR, PTR),
        destroy=c_function(f"{prefix}_destroy", INT, PTR),
    )


GURU = {np.dtype(np.float64): guru("finufft", ctypes.c_double)}
GURU[np.dtype(np.float32)] = guru("finufftf", ctypes.c_float)
execute_double = GURU[np.dtype(np.float64)]["execute"]
execute_single = GURU[np.dtype(np.float32)]["execute"]


# %% [markdown]
# ## The plans: the op's state
#
# Planning (`makeplan`, then `setpts`, which sorts the points) costs more than a small
# transform. So the plans are the ops' **state** (`jaxbind.state`, see docs/state.md):
# set up when a call first meets its points, kept while the points stay the same, and
# destroyed with the compiled program. The points are a traced input, so the state names
# them in `key=`: it is set up again only when their values change.
#
# One object holds both plans of a set of points, type 1 and type 2 (an op's transpose is
# the other type, with the same state). A kernel gets the address of what the object's
# `jaxbind_address` gives: two words, the two plans. FINUFFT's `setpts` keeps pointers
# to the coordinates, so the object keeps its own copy of them as long as the plans live.


# %%
class Plans:
    """FINUFFT's type-1 and type-2 plans for one set of points (rows of `points`)."""

    def __init__(self, points, n_modes, iflag, eps, nthreads, modeord):
        self.points = np.array(points, order="C")  # FINUFFT reads them at every execute
        self.guru = GURU[self.points.dtype]
        self.handles = np.zeros(2, np.int64)  # finufft_plan pointers: type 1, type 2
        # finufft_opts: room for the struct of any FINUFFT 2.x (about 100 bytes). Its
        # first six fields are ints in all of them: modeord, ..., nthreads.
        opts = np.zeros(128, np.int32)
        default_opts(opts.ctypes.data)
        opts[0], opts[5] = modeord, nthreads
        dim, m = self.points.shape
        sizes = np.ones(3, np.int64)
        sizes[:dim] = n_modes[::-1]  # FINUFFT's grids run fastest along their first axis
        x, y, z = (self.points[dim - 1 - k].ctypes.data if k < dim else None for k in range(3))
        for kind in (1, 2):
            plan = self.handles[kind - 1 :].ctypes.data
            ier = self.guru["makeplan"](
                kind, dim, sizes.ctypes.data, iflag, 1, eps, plan, opts.ctypes.data
            )
            if ier != 0:  # (1: eps is too small; FINUFFT warns, and plans for less)
                self.destroy()
                why = " (eps is too small)" if ier == 1 else ""
                raise RuntimeError(f"FINUFFT's makeplan failed with error code {ier}{why}")
            ier = self.guru["setpts"](int(self.handles[kind - 1]), m, x, y, z, 0, None, None, None)
            if ier != 0:
                self.destroy()
                raise RuntimeError(f"FINUFFT's setpts failed with error code {ier}")

    @property
    def jaxbind_address(self) -> int:
        return self.handles.ctypes.data  # what the kernels get as `state`

    def destroy(self):
        for k, handle in enumerate(self.handles):
            if handle:
                self.guru["destroy"](int(handle))
                self.handles[k] = 0


@jaxbind.state(key=("points",), teardown=Plans.destroy)
def plans(*, points, n_modes, iflag, eps, nthreads, modeord):
    return Plans(points, n_modes, iflag, eps, nthreads, modeord)


# %% [markdown]
# ## The kernels and the ops
#
# Each kernel takes its output first, then the points and its input, then `state`, the
# address of the plans (a numba `voidptr`: `numba.carray` views it). The type-1 op
# `f = A c` (`A[k, j] = exp(i iflag k·x_j)`) has the type-2 kernel as its transpose with
# the **same** `iflag`: JAX's transposes do not conjugate (`c̄ = Aᵀ f̄`). The options
# (`n_modes`, `iflag`, `eps`, `nthreads`, `modeord`) go to the plans' setup only.


# %%
@numba.njit
def execute(kind, state, c, f):
    """Type `kind` between the values `c` and the grid `f`, with the call's plans."""
    plan = numba.carray(state, (2,), np.int64)[kind - 1]
    if c.itemsize == 16:  # complex128
        ier = execute_double(plan, c.ctypes.data, f.ctypes.data)
    else:
        ier = execute_single(plan, c.ctypes.data, f.ctypes.data)
    if ier != 0:  # the kernel fails: the call raises an error naming the op
        raise RuntimeError("FINUFFT failed with error code", ier)


@jaxbind.kernel
def type1(f, points, c, state):
    execute(1, state, c, f)


@jaxbind.kernel
def type2(c, points, f, state):
    execute(2, state, c, f)


def grid_shape(points, c, *, n_modes, **kwargs):
    return jax.ShapeDtypeStruct(tuple(int(n) for n in n_modes), c.dtype)


def points_shape(points, f, **kwargs):
    return jax.ShapeDtypeStruct((points.shape[1],), f.dtype)


nufft1_op = jaxbind.linear_op(shape=grid_shape, fixed=1, state=plans, name="demo.finufft1")(type1)
nufft1_op.def_transpose(type2)
nufft2_op = jaxbind.linear_op(shape=points_shape, fixed=1, state=plans, name="demo.finufft2")(type2)
nufft2_op.def_transpose(type1)

# %% [markdown]
# The calls of jax-finufft (and jaxducc0): values `(M,)`, points `x, y, z` each `(M,)`.
# Bad inputs are refused here, before they reach C, with errors naming the call.

# %%
REAL = {np.dtype(np.complex64): np.float32, np.dtype(np.complex128): np.float64}


def _option(fn, name, value, ok, want):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"demo.{fn}: {name} must be {want}, got {value!r}")


def _arguments(fn, values, coords, *, grid, iflag, eps, nthreads, modeord):
    """Check a call; -> (values, points stacked (dim, M), keyword arguments of the op)."""
    values = jnp.asarray(values)
    real = REAL.get(np.dtype(values.dtype))
    if real is None:
        raise TypeError(f"demo.{fn}: values must be complex64 or complex128, not {values.dtype}")
    coords = [jnp.asarray(p) for p in coords if p is not None]
    if not 1 <= len(coords) <= 3:
        raise ValueError(f"demo.{fn}: takes 1 to 3 coordinate arrays, got {len(coords)}")
    if any(p.dtype != real or p.ndim != 1 or p.shape != coords[0].shape for p in coords):
        raise ValueError(
            f"demo.{fn}: the coordinates must be {np.dtype(real)} arrays of one shape (M,) "
            f"for {values.dtype} values, got {[(p.dtype.name, p.shape) for p in coords]}"
        )
    want = f"a {len(coords)}-D grid" if grid else f"({coords[0].shape[0]},), one per point"
    if (values.ndim != len(coords)) if grid else (values.shape != coords[0].shape):
        raise ValueError(f"demo.{fn}: values must be {want}, got shape {values.shape}")
    _option(fn, "iflag", iflag, lambda v: v == int(v), "an int")
    _option(fn, "eps", eps, lambda v: v > 0, "> 0")
    _option(fn, "nthreads", nthreads, lambda v: v == int(v) >= 0, "an int >= 0")
    _option(fn, "modeord", modeord, lambda v: v in (0, 1), "0 or 1")
    options = dict(iflag=1 if iflag >= 0 else -1, eps=float(eps), nthreads=int(nthreads))
    options["modeord"] = int(modeord)
    return values, jnp.stack(coords), options


def nufft1(n_modes, c, x, y=None, z=None, *, iflag=1, eps=1e-6, nthreads=0, modeord=0):
    """f[k] = sum_j c[j] exp(i sign(iflag) k·x_j), on a grid of shape `n_modes`.

    nthreads: FINUFFT's threads (0: all of OpenMP's); modeord: 0 from the most negative
    mode, 1 in FFT order."""
    options = dict(iflag=iflag, eps=eps, nthreads=nthreads, modeord=modeord)
    c, points, options = _arguments("nufft1", c, (x, y, z), grid=False, **options)
    n_modes = np.atleast_1d(n_modes)
    if n_modes.dtype.kind not in "iu" or n_modes.shape != (len(points),) or min(n_modes) < 1:
        raise ValueError(
            f"demo.nufft1: n_modes must be {len(points)} positive ints for "
            f"{len(points)}-D points, got {n_modes.tolist()}"
        )
    return nufft1_op(points, c, n_modes=n_modes.astype(np.int64), **options)


def nufft2(f, x, y=None, z=None, *, iflag=-1, eps=1e-6, nthreads=0, modeord=0):
    """c[j] = sum_k f[k] exp(i sign(iflag) k·x_j), the options as for `nufft1`."""
    options = dict(iflag=iflag, eps=eps, nthreads=nthreads, modeord=modeord)
    f, points, options = _arguments("nufft2", f, (x, y, z), grid=True, **options)
    return nufft2_op(points, f, n_modes=np.array(f.shape, np.int64), **options)


# %% [markdown]
# ## Checked against jaxducc0
#
# Both libraries reach a relative error of about `eps`, so they agree to a few `eps`.

# %%
rng = np.random.default_rng(0)
M = 2000


def problem(dim, dtype, n=(24, 16, 8)):
    real = REAL[np.dtype(dtype)]
    points = [jnp.asarray(rng.uniform(-np.pi, np.pi, M), real) for _ in range(dim)]
    c = jnp.asarray(rng.normal(size=M) + 1j * rng.normal(size=M), dtype)
    shape = n[:dim]
    f = jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(size=shape), dtype)
    return shape, points, c, f


def check(label, got, want, eps):
    err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
    assert got.shape == want.shape and got.dtype == want.dtype, (label, got.shape, want.shape)
    assert err < 10 * eps, f"{label}: relative error {err:.1e} for eps={eps}"
    print(f"{label:<40} ok  rel. error {err:.1e}")


# Each case compiles its two kernels, in about half a second; the tests run more cases.
CASES = [(1, jnp.complex128, 1e-9), (2, jnp.complex128, 1e-9), (3, jnp.complex128, 1e-9)]
for dim, dtype, eps in CASES + [(2, jnp.complex64, 1e-5)]:
    shape, points, c, f = problem(dim, dtype)
    name = f"{dim}-D {np.dtype(dtype).name}"
    got, want = nufft1(shape, c, *points, eps=eps), jaxducc0.nufft1(shape, c, *points, eps=eps)
    check(f"type 1 {name}", got, want, eps)
    got, want = nufft2(f, *points, eps=eps), jaxducc0.nufft2(f, *points, eps=eps)
    check(f"type 2 {name}", got, want, eps)

shape, (x,), c, f = problem(1, jnp.complex128)  # the sign and the mode order: a dense DFT
dense = np.exp(1j * np.outer(np.arange(-(shape[0] // 2), (shape[0] + 1) // 2), x))
check("type 1 1-D against a dense DFT", nufft1(shape, c, x, eps=1e-9), jnp.asarray(dense @ c), 1e-9)

shape, (x, y), c, f = problem(2, jnp.complex128)
EPS = 1e-9
opts = jaxducc0.Opts(modeord=1)
check(
    "type 1, FFT mode order (modeord=1)",
    nufft1(shape, c, x, y, eps=EPS, modeord=1),
    jaxducc0.nufft1(shape, c, x, y, eps=EPS, opts=opts),
    EPS,
)
check(
    "type 2, iflag=+1",
    nufft2(f, x, y, iflag=1, eps=EPS),
    jaxducc0.nufft2(f, x, y, iflag=1, eps=EPS),
    EPS,
)

# %% jit, linear_transpose, grad and vmap
t1 = lambda c, x, y: nufft1(shape, c, x, y, eps=EPS)
t1_ref = lambda c, x, y: jaxducc0.nufft1(shape, c, x, y, eps=EPS)
check("jit(type 1)", jax.jit(t1)(c, x, y), t1_ref(c, x, y), EPS)
(c_T,) = jax.linear_transpose(lambda c: t1(c, x, y), c)(f)  # by the type-2 kernel
(c_T_ref,) = jax.linear_transpose(lambda c: t1_ref(c, x, y), c)(f)
check("linear_transpose(type 1)", c_T, c_T_ref, EPS)
check("... is type 2 with the same iflag", c_T, nufft2(f, x, y, iflag=1, eps=EPS), EPS)

target = t1_ref(jnp.asarray(rng.normal(size=M) + 0j), x, y)
loss = lambda t1: lambda c: jnp.sum(jnp.abs(t1(c, x, y) - target) ** 2)
check(
    "jit(grad) of |type 1 - target|²",
    jax.jit(jax.grad(loss(t1)))(c),
    jax.grad(loss(t1_ref))(c),
    EPS,
)
t2 = lambda f: jnp.sum(jnp.abs(nufft2(f, x, y, eps=EPS)) ** 2)
t2_ref = lambda f: jnp.sum(jnp.abs(jaxducc0.nufft2(f, x, y, eps=EPS)) ** 2)
check("grad of |type 2|²", jax.grad(t2)(f), jax.grad(t2_ref)(f), EPS)

cs = jnp.stack([c, 2j * c, c**2])
check(
    "vmap over the values",
    jax.vmap(t1, (0, None, None))(cs, x, y),
    jax.vmap(t1_ref, (0, None, None))(cs, x, y),
    EPS,
)
xs, ys = jnp.stack([x, -x, y]), jnp.stack([y, x, -y])
check(
    "vmap over values and points",
    jax.vmap(t1)(cs, xs, ys),
    jnp.stack([t1_ref(*a) for a in zip(cs, xs, ys)]),
    EPS,
)

# %% [markdown]
# ## A failing call
#
# A nonzero code from FINUFFT makes the kernel raise, and the call fails with an error
# that names the op and the role. (numba's compiled code loses the exception's text: the
# numba function, called in Python on the same arrays, shows it.)

# %%
try:
    jax.block_until_ready(nufft1(shape, c, x, y, eps=1e-30))  # finer than double precision
    raise AssertionError("eps=1e-30 did not fail")
except Exception as exc:  # XLA's runtime error
    assert "demo.finufft1" in str(exc), exc
    print("eps=1e-30:", str(exc).splitlines()[0][:110])
try:
    nufft1(shape, c, x, y[:10])
    raise AssertionError("points of two lengths were taken")
except ValueError as exc:
    print("points of two lengths:", str(exc)[:80])

# %% [markdown]
# ## Timed beside jaxducc0
#
# 2-D, 128 x 128 modes, 10⁵ points, `eps=1e-6`, complex128, all threads for both (each
# library's default). `benchmarks/finufft_ctypes.py` measures more.

# %%
shape = (128, 128)
x, y = (jnp.asarray(rng.uniform(-np.pi, np.pi, 10**5)) for _ in range(2))
c = jnp.asarray(rng.normal(size=10**5) + 1j * rng.normal(size=10**5))
ours = jax.jit(lambda c: nufft1(shape, c, x, y))
theirs = jax.jit(lambda c: jaxducc0.nufft1(shape, c, x, y))
check("type 1, 128², 1e5 points, eps=1e-6", ours(c), theirs(c), 1e-6)
times = {"ctypes FINUFFT": [], "jaxducc0": []}
for _ in range(5):
    for label, fn in (("ctypes FINUFFT", ours), ("jaxducc0", theirs)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(c))
        times[label].append(time.perf_counter() - t0)
for label, ts in times.items():
    print(f"{label:<16} type 1: {np.median(ts) * 1e3:7.2f} ms (median of 5)")
print("All FINUFFT checks passed.")
