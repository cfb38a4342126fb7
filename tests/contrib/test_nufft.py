"""jaxducc0.nufft1/2/3 (jax-finufft's calls on DUCC) and nufft_points, against a dense NUDFT.

The reference is the non-uniform DFT written out as a dense matrix in jax.numpy,
so JAX's own autodiff of it gives the reference derivatives with respect to the
values and the points.
"""

from __future__ import annotations

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import norm_relative_error, random_complex

pytest.importorskip("ducc0")

from jaxbind.contrib import jaxducc0
from jaxbind.contrib.ducc.nufft_points import mode_numbers, nufft_points
from jaxbind.testing import check

pytestmark = pytest.mark.usefixtures("enable_x64")  # from tests/conftest.py

GRIDS = {1: (9,), 2: (6, 5), 3: (4, 5, 4)}


def _modes(grid, modeord):
    ks = jnp.meshgrid(
        *[jnp.asarray(mode_numbers(n, modeord), jnp.float64) for n in grid], indexing="ij"
    )
    return jnp.stack([k.ravel() for k in ks])  # (d, prod(grid))


def dense1(grid, c, *xs, iflag=1, modeord=0):
    """f[..., k] = sum_j c[..., j] exp(i sign k.x_j), coordinates (..., M)."""
    k = _modes(grid, modeord)
    phase = sum(k[a][:, None] * x[..., None, :] for a, x in enumerate(xs))  # (..., N, M)
    out = jnp.sum(c[..., None, :] * jnp.exp(1j * np.sign(iflag) * phase), axis=-1)
    return out.reshape(out.shape[:-1] + tuple(grid))


def dense2(f, *xs, iflag=-1, modeord=0):
    d = len(xs)
    grid = f.shape[-d:]
    k = _modes(grid, modeord)
    phase = sum(k[a][:, None] * x[..., None, :] for a, x in enumerate(xs))  # (..., N, M)
    flat = f.reshape(f.shape[:-d] + (-1,))
    return jnp.sum(flat[..., :, None] * jnp.exp(1j * np.sign(iflag) * phase), axis=-2)


def dense3(c, *pts, iflag=-1):
    d = len(pts) // 2
    xs, qs = pts[:d], pts[d:]
    phase = sum(q[..., :, None] * x[..., None, :] for x, q in zip(xs, qs))  # (..., K, M)
    return jnp.sum(c[..., None, :] * jnp.exp(1j * np.sign(iflag) * phase), axis=-1)


def _problem(kind, d, iflag, modeord, rng, batch=(2, 3), pbatch=(2,), m=11, k=7):
    """Fast and dense versions of one transform, with batched values sharing points.

    The values have one leading dimension more than the points (`batch` is
    `pbatch` plus one): jax-finufft's convention for transforms sharing points.
    """
    grid = GRIDS[d]
    xs = [jnp.asarray(rng.uniform(-np.pi, np.pi, pbatch + (m,))) for _ in range(d)]
    opts = jaxducc0.Opts(modeord=modeord)
    kw = dict(iflag=iflag, eps=1e-12, opts=opts)
    if kind == 1:
        fast = lambda v, *p: jaxducc0.nufft1(grid, v, *p, **kw)
        ref = lambda v, *p: dense1(grid, v, *p, iflag=iflag, modeord=modeord)
        v = random_complex(rng, batch + (m,))
    elif kind == 2:
        fast = lambda v, *p: jaxducc0.nufft2(v, *p, **kw)
        ref = lambda v, *p: dense2(v, *p, iflag=iflag, modeord=modeord)
        v = random_complex(rng, batch + grid)
    else:
        xs += [jnp.asarray(rng.uniform(-6, 6, pbatch + (k,))) for _ in range(d)]
        fast = lambda v, *p: jaxducc0.nufft3(v, *p, **kw)
        ref = lambda v, *p: dense3(v, *p, iflag=iflag)
        v = random_complex(rng, batch + (m,))
    # the values have one leading dimension more than the points: shared points
    return fast, jax.jit(lambda v, *p: ref(v, *(q[..., None, :] for q in p))), v, xs


CASES = list(itertools.product((1, 2, 3), (1, 2, 3), (1, -1), (0, 1)))


@pytest.mark.parametrize("kind,d,iflag,modeord", CASES)
def test_transform_and_derivatives_match_the_dense_nudft(kind, d, iflag, modeord):
    rng = np.random.default_rng(100 * kind + 10 * d + (iflag > 0) * 2 + modeord)
    fast, ref, v, xs = _problem(kind, d, iflag, modeord, rng)
    want = ref(v, *xs)
    got = fast(v, *xs)
    assert got.shape == want.shape
    assert norm_relative_error(got, want) < 1e-10
    if (iflag > 0) != (modeord == 0):  # derivatives: both signs and both orders, not all pairs
        return

    # JVP along the values and all coordinates at once, and along the coordinates only
    tv = random_complex(rng, v.shape)
    txs = [jnp.asarray(rng.normal(size=x.shape)) for x in xs]
    for tangents in ((tv, *txs), (jnp.zeros_like(v), *txs)):
        _, jf = jax.jvp(fast, (v, *xs), tangents)
        _, jr = jax.jvp(ref, (v, *xs), tangents)
        assert norm_relative_error(jf, jr) < 1e-9

    # VJP: cotangents of the values and of every coordinate array
    ct = random_complex(rng, want.shape)
    _, vf = jax.vjp(fast, v, *xs)
    _, vr = jax.vjp(ref, v, *xs)
    for a, b in zip(vf(ct), vr(ct)):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert norm_relative_error(a, b) < 1e-9


@pytest.mark.parametrize("kind", (1, 2, 3))
def test_hessian_with_respect_to_the_points(kind):
    rng = np.random.default_rng(7 + kind)
    fast, ref, v, xs = _problem(kind, 2, 1, 0, rng, batch=(2,), pbatch=(), m=5, k=4)
    w = jnp.asarray(rng.normal(size=fast(v, *xs).shape))

    def loss(fn):
        return lambda *p: jnp.sum(w * jnp.abs(fn(v, *p)) ** 2)

    hf = jax.jit(jax.hessian(loss(fast), argnums=(0, 1)))(*xs)
    hr = jax.jit(jax.hessian(loss(ref), argnums=(0, 1)))(*xs)
    for a, b in zip(jax.tree.leaves(hf), jax.tree.leaves(hr)):
        assert norm_relative_error(a, b) < 1e-8
    jf = jax.jacfwd(jax.jacrev(lambda x0: loss(fast)(x0, *xs[1:])))(xs[0])
    assert norm_relative_error(jf, hr[0][0]) < 1e-8


@pytest.mark.parametrize("kind", (1, 2, 3))
def test_vmap_over_points_and_values(kind):
    rng = np.random.default_rng(20 + kind)
    fast, ref, v, xs = _problem(kind, 2, -1, 1, rng, batch=(3,), pbatch=())
    vs = jnp.stack([v, 2 * v, v * 1j])
    pts = [jnp.stack([x, x + 0.5, -x]) for x in xs]
    got = jax.jit(jax.vmap(fast))(vs, *pts)
    want = jnp.stack([ref(vs[i], *(p[i] for p in pts)) for i in range(3)])
    assert norm_relative_error(got, want) < 1e-10
    # only the points batched, and gradients of a batched call
    got = jax.vmap(fast, in_axes=(None,) + (0,) * len(pts))(v, *pts)
    want = jnp.stack([ref(v, *(p[i] for p in pts)) for i in range(3)])
    assert norm_relative_error(got, want) < 1e-10
    gx = jax.vmap(jax.grad(lambda x, vv: jnp.sum(jnp.abs(fast(vv, x, *xs[1:])) ** 2)))(pts[0], vs)
    gr = jax.vmap(jax.grad(lambda x, vv: jnp.sum(jnp.abs(ref(vv, x, *xs[1:])) ** 2)))(pts[0], vs)
    assert norm_relative_error(gx, gr) < 1e-9


def test_leading_dimensions_broadcast_as_in_jax_finufft():
    rng = np.random.default_rng(3)
    grid = (6, 4)
    x, y = (jnp.asarray(rng.uniform(-3, 3, (2, 1, 9))) for _ in range(2))  # shared along axis 1
    c = random_complex(rng, (2, 5, 9))
    got = jaxducc0.nufft1(grid, c, x, y, eps=1e-12)
    assert got.shape == (2, 5) + grid
    assert norm_relative_error(got, dense1(grid, c, x, y)) < 1e-10
    # values with one leading dimension more than the points
    f = random_complex(rng, (4,) + grid)
    x1, y1 = x[0, 0], y[0, 0]
    got = jaxducc0.nufft2(f, x1, y1, eps=1e-12)
    assert got.shape == (4, 9) and norm_relative_error(got, dense2(f, x1, y1)) < 1e-10
    # the y=None, z=None style, and a scalar output shape in 1-D
    assert (
        norm_relative_error(
            jaxducc0.nufft1(7, c[0, 0], x1, None, None, eps=1e-12), dense1((7,), c[0, 0], x1)
        )
        < 1e-10
    )


def test_single_precision_and_eps_clamped():
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.uniform(-3, 3, 40).astype(np.float32))
    c = random_complex(rng, (40,), np.complex64)
    got = jaxducc0.nufft1(16, c, x, eps=1e-12)  # finer than single precision allows
    assert got.dtype == jnp.complex64
    want = dense1((16,), c.astype(jnp.complex128), x.astype(jnp.float64))
    assert norm_relative_error(got, want) < 1e-5
    x64, f = x.astype(jnp.float64), random_complex(rng, (8, 8))
    got = jaxducc0.nufft2(f, x64, x64, eps=1e-30)  # double precision: clamped too
    assert norm_relative_error(got, dense2(f, x64, x64)) < 1e-12
    assert jnp.all(jnp.isfinite(got))


@pytest.mark.parametrize("kind", (1, 2, 3))
def test_check_passes_on_the_core_op(kind):
    rng = np.random.default_rng(30 + kind)
    d = 2
    xs = rng.uniform(-np.pi, np.pi, (d, 6))
    kw = dict(nufft_type=kind, sign=1, eps=1e-12, modeord=0, nthreads=1, grid=None)
    if kind == 1:
        args, kw["grid"] = (random_complex(rng, (2, 6)), xs), (4, 3)
    elif kind == 2:
        args = (random_complex(rng, (2, 4, 3)), xs)
    else:
        args = (random_complex(rng, (2, 6)), xs, rng.uniform(-3, 3, (d, 5)))
    report = check(partial(nufft_points.op, **kw), *args, verbose=False)
    assert not report.failures()


def test_check_passes_on_the_jax_finufft_form():
    rng = np.random.default_rng(5)
    x, y = rng.uniform(-3, 3, (2, 8))
    report = check(
        partial(
            jaxducc0.nufft_points.op,
            nufft_type=2,
            sign=-1,
            eps=1e-12,
            modeord=1,
            nthreads=1,
            grid=None,
        ),
        random_complex(rng, (1, 5, 4)),
        np.stack([x, y]),
        verbose=False,
    )
    assert not report.failures()


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: jaxducc0.nufft1(8, jnp.ones(5), jnp.zeros(5)), "complex64 or complex128"),
        (lambda: jaxducc0.nufft1((8, 8), jnp.ones(5, complex), jnp.zeros(5)), "output_shape"),
        (lambda: jaxducc0.nufft2(jnp.ones((8,), complex), jnp.zeros(5, jnp.float32)), "float64"),
        (lambda: jaxducc0.nufft2(jnp.ones((2, 3, 8), complex), jnp.zeros(5)), "leading dim"),
        (lambda: jaxducc0.nufft1(8, jnp.ones(4, complex), jnp.zeros(5)), "number of points"),
        (
            lambda: jaxducc0.nufft3(jnp.ones(5, complex), jnp.zeros(5), jnp.zeros(5), jnp.zeros(3)),
            "as many target",
        ),
        (
            lambda: jaxducc0.nufft2(
                jnp.ones((8,), complex), jnp.zeros(5), opts=jaxducc0.Opts(modeord=2)
            ),
            "modeord",
        ),
        (lambda: jaxducc0.nufft2(jnp.ones((8,), complex)), "coordinate arrays"),
        (
            lambda: jaxducc0.nufft_points(
                jnp.ones((1, 8), complex), jnp.zeros((1, 5)), nufft_type=4, sign=1, eps=1e-6
            ),
            "nufft_type",
        ),
    ],
)
def test_bad_inputs_name_the_function(call, match):
    with pytest.raises((TypeError, ValueError), match=match) as info:
        call()
    assert "jaxducc0.nufft" in str(info.value)


def test_same_results_as_jax_finufft_when_installed():
    jf = pytest.importorskip("jax_finufft")
    from jax_finufft.options import Opts

    rng = np.random.default_rng(6)
    x, y = (jnp.asarray(rng.uniform(-np.pi, np.pi, (2, 30))) for _ in range(2))
    s, t = (jnp.asarray(rng.uniform(-8, 8, (2, 20))) for _ in range(2))
    c = random_complex(rng, (2, 30))
    f = random_complex(rng, (2, 3, 8, 6))
    for modeord in (False, True):
        pairs = [
            (lambda m, o: m.nufft1((8, 6), c, x, y, eps=1e-9, opts=o)),
            (lambda m, o: m.nufft2(f, x, y, eps=1e-9, opts=o)),
            (lambda m, o: m.nufft3(c, x, y, s, t, eps=1e-9, iflag=1, opts=o)),
            (
                lambda m, o: jax.grad(
                    lambda p: jnp.sum(jnp.abs(m.nufft2(f, p, y, eps=1e-9, opts=o)) ** 2)
                )(x)
            ),
        ]
        for fn in pairs:
            a = fn(jaxducc0, jaxducc0.Opts(modeord=modeord))
            b = fn(jf, Opts(modeord=modeord))
            assert norm_relative_error(a, b) < 1e-7


@pytest.mark.parametrize("kind", (1, 2, 3))
def test_linear_transpose_in_the_values(kind):
    rng = np.random.default_rng(40 + kind)
    fast, ref, v, xs = _problem(kind, 2, 1, 1, rng)
    ct = random_complex(rng, ref(v, *xs).shape)
    (got,) = jax.linear_transpose(lambda v: fast(v, *xs), v)(ct)
    (want,) = jax.linear_transpose(lambda v: ref(v, *xs), v)(ct)
    assert norm_relative_error(got, want) < 1e-10


# --- plans ---------------------------------------------------------------------------


def _planned(kind, iflag, modeord, rng, d=2, m=13, k=9):
    grid = GRIDS[d]
    pts = [rng.uniform(-np.pi, np.pi, m) for _ in range(d)]
    if kind == 3:
        pts += [rng.uniform(-6, 6, k) for _ in range(d)]
    opts = jaxducc0.Opts(modeord=modeord)
    plan = jaxducc0.NufftPlan(
        kind, None if kind == 3 else grid, *pts, iflag=iflag, eps=1e-12, opts=opts
    )
    jpts = [jnp.asarray(p) for p in pts]
    kw = dict(iflag=iflag, eps=1e-12, opts=opts)
    fast = {
        1: lambda v: jaxducc0.nufft1(grid, v, *jpts, **kw),
        2: lambda v: jaxducc0.nufft2(v, *jpts, **kw),
        3: lambda v: jaxducc0.nufft3(v, *jpts, **kw),
    }[kind]
    v = random_complex(rng, (3,) + (grid if kind == 2 else (m,)))
    return plan, fast, v


@pytest.mark.parametrize("kind,iflag,modeord", list(itertools.product((1, 2, 3), (1, -1), (0, 1))))
def test_plan_matches_the_unplanned_transform(kind, iflag, modeord):
    rng = np.random.default_rng(50 + kind)
    plan, fast, v = _planned(kind, iflag, modeord, rng)
    assert norm_relative_error(plan(v), fast(v)) < 1e-11
    assert norm_relative_error(jax.jit(plan)(v[0]), fast(v[0])) < 1e-11
    ct = random_complex(rng, plan(v).shape)
    (a,) = jax.linear_transpose(plan, v)(ct)
    (b,) = jax.linear_transpose(fast, v)(ct)
    assert norm_relative_error(a, b) < 1e-11
    loss = lambda f: lambda v: jnp.sum(jnp.abs(f(v)) ** 2)
    assert norm_relative_error(jax.jit(jax.grad(loss(plan)))(v), jax.grad(loss(fast))(v)) < 1e-10
    vs = jnp.stack([v, 1j * v])
    assert norm_relative_error(jax.vmap(plan)(vs), jnp.stack([fast(v), fast(1j * v)])) < 1e-11


def test_plan_under_threads_and_errors():
    import concurrent.futures

    rng = np.random.default_rng(60)
    plan, fast, v = _planned(2, -1, 0, rng)
    f = jax.jit(plan).lower(v).compile()
    want = np.asarray(fast(v))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # one DUCC plan, used at once
        for got in pool.map(lambda _: np.asarray(f(v)), range(16)):
            assert norm_relative_error(got, want) < 1e-11
    with pytest.raises(ValueError, match="jaxducc0.nufft_plan: this type-2 plan takes values"):
        plan(jnp.ones((3, 4), jnp.complex128))
    with pytest.raises(TypeError, match="must be concrete"):
        jax.jit(lambda x: jaxducc0.NufftPlan(2, 8, x)(jnp.ones(8, complex)))(jnp.ones(5))
    with pytest.raises(ValueError, match="n_modes"):
        jaxducc0.NufftPlan(1, (8, 8), np.zeros(5))


@pytest.mark.slow
@pytest.mark.parametrize("kind", (2, 3))
def test_an_exported_plan_runs_in_a_fresh_process(kind, tmp_path):
    """The points travel in the program: the loading process plans from them."""
    import jaxbind

    rng = np.random.default_rng(70 + kind)
    plan, _, v = _planned(kind, -1, 1, rng)
    program = jax.jit(lambda v: (plan(v), jax.grad(lambda v: jnp.sum(jnp.abs(plan(v)) ** 2))(v)))
    exp = jaxbind.export(program)(v)
    (tmp_path / "plan.bin").write_bytes(exp.serialize())
    np.save(tmp_path / "v.npy", np.asarray(v))
    for name, want in zip(("c", "g"), program(v)):
        np.save(tmp_path / f"want_{name}.npy", np.asarray(want))
    code = """
    import sys, pathlib
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from jax import export
    import jaxbind.contrib.jaxducc0  # registers the op (nothing is planned in this process)
    from jaxbind._runtime.state import live_states
    d = pathlib.Path(sys.argv[1])
    exp = export.deserialize(bytearray((d / "plan.bin").read_bytes()))
    v = np.load(d / "v.npy")
    assert live_states() == 0
    got = exp.call(v)
    assert live_states() == 1, live_states()  # f and its transpose: one DUCC plan
    for name, got in zip(("c", "g"), got):
        want = np.load(d / f"want_{name}.npy")
        err = np.linalg.norm(np.asarray(got) - want) / np.linalg.norm(want)
        assert err < 1e-13, (name, err)
    print("ok")
    """
    from support.processes import run_isolated

    done = run_isolated(tmp_path, code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
