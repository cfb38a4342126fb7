"""Functions with jaxbind ops to export with symbolic shapes (jax.export shape polymorphism).

Shared by test_symbolic.py and data/make_golden.py. Each case is exported once
with the symbolic argument shapes of `specs` and then called at every entry of
`sizes` (two or more values of its symbols); `ref` is a pure-JAX or NumPy twin
that gives the expected results. The bindings come from reference_ops (and, for
DUCC_CASES, jaxbind.contrib.jaxducc0), which a loading process imports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.export
import jax.numpy as jnp
import numpy as np
from reference_ops import (
    axpy,
    axpy_ref,
    bilinear,
    bilinear_ref,
    flip2,
    flip2_ref,
    matvec,
    nonlinear,
    nonlinear_ref,
    stack3,
    stack3_ref,
    trim,
    trim_ref,
)
from support.arrays import normal


@dataclass(frozen=True)
class SymbolicCase:
    fn: Callable
    specs: tuple  # per argument: (shape spec such as "b, 8", dtype)
    sizes: tuple  # dicts of symbol values, two or more
    ref: Callable  # pure-JAX/NumPy twin of fn
    constraints: tuple = ()  # jax.export symbolic constraints, such as "b >= 2"

    def arg_specs(self):
        """ShapeDtypeStructs with symbolic dimensions (one scope for all arguments)."""
        scope = jax.export.SymbolicScope(self.constraints)
        return [
            jax.ShapeDtypeStruct(jax.export.symbolic_shape(s, scope=scope), dt)
            for s, dt in self.specs
        ]

    def args(self, size, seed=0):
        """Concrete arguments for one entry of `sizes`."""
        rng = np.random.default_rng(seed)
        out = []
        for spec, dtype in self.specs:
            shape = tuple(
                int(d) if d.strip().isdigit() else size[d.strip()]
                for d in spec.split(",")
                if d.strip()
            )
            out.append(normal(rng, shape, dtype))
        return out


F32 = np.float32


def _sum_sq(f):
    return lambda *a: jnp.sum(f(*a) ** 2)


def _grad_ref(ref, argnums):
    return jax.grad(_sum_sq(ref), argnums=argnums)


CASES = {
    # linear op with keyword arguments, symbolic batch
    "sym_kwargs": SymbolicCase(
        lambda x, y: axpy(x, y, scale=2.5)[0],
        (("b, 3", F32), ("b, 3", F32)),
        ({"b": 1}, {"b": 4}),
        lambda x, y: axpy_ref(x, y, scale=2.5),
    ),
    # two symbols; a fixed argument
    "sym_two_dims": SymbolicCase(
        lambda a, x: matvec(a, x)[0],
        (("m, n", F32), ("n", F32)),
        ({"m": 2, "n": 3}, {"m": 5, "n": 1}),
        lambda a, x: a @ x,
    ),
    # linear_transpose inside the export
    "sym_linear_transpose": SymbolicCase(
        lambda a, c: jax.linear_transpose(
            lambda x: matvec(a, x)[0], jnp.zeros(a.shape[1], a.dtype)
        )(c)[0],
        (("m, n", F32), ("m", F32)),
        ({"m": 2, "n": 3}, {"m": 4, "n": 6}),
        lambda a, c: a.T @ c,
    ),
    # multilinear op, grad with respect to both arguments
    "sym_multilinear_grad": SymbolicCase(
        jax.grad(_sum_sq(lambda x, y: bilinear(x, y)[0]), argnums=(0, 1)),
        (("b, 2", F32), ("b, 2", F32)),
        ({"b": 1}, {"b": 3}),
        _grad_ref(bilinear_ref, (0, 1)),
    ),
    # nonlinear op, its grad and its jvp
    "sym_nonlinear": SymbolicCase(
        lambda a, b: nonlinear(a, b)[0],
        (("n", F32), ("n", F32)),
        ({"n": 2}, {"n": 7}),
        nonlinear_ref,
    ),
    "sym_nonlinear_grad": SymbolicCase(
        jax.grad(_sum_sq(lambda a, b: nonlinear(a, b)[0]), argnums=(0, 1)),
        (("n", F32), ("n", F32)),
        ({"n": 2}, {"n": 5}),
        _grad_ref(nonlinear_ref, (0, 1)),
    ),
    "sym_nonlinear_jvp": SymbolicCase(
        lambda a, b, ta, tb: jax.jvp(lambda a, b: nonlinear(a, b)[0], (a, b), (ta, tb)),
        (("n", F32),) * 4,
        ({"n": 1}, {"n": 6}),
        lambda a, b, ta, tb: jax.jvp(nonlinear_ref, (a, b), (ta, tb)),
    ),
    # vmap: jaxbind's own loop over a symbolic batch (core shape symbolic too) ...
    "sym_vmap_loop": SymbolicCase(
        jax.vmap(lambda a, b: nonlinear(a, b)[0], in_axes=(1, None)),
        (("n, b", F32), ("n", F32)),
        ({"n": 2, "b": 3}, {"n": 4, "b": 1}),
        jax.vmap(nonlinear_ref, in_axes=(1, None)),
    ),
    # ... and of a grad (the VJP runs in the loop)
    "sym_vmap_loop_grad": SymbolicCase(
        jax.vmap(jax.grad(_sum_sq(lambda a, b: nonlinear(a, b)[0]))),
        (("b, n", F32), ("b, n", F32)),
        ({"b": 2, "n": 3}, {"b": 5, "n": 2}),
        jax.vmap(_grad_ref(nonlinear_ref, 0)),
    ),
    # vectorized batching (func_can_batch=True) over a symbolic batch
    "sym_vmap_native": SymbolicCase(
        jax.vmap(lambda x: flip2(x)[0], in_axes=1),
        (("3, b", F32),),
        ({"b": 1}, {"b": 4}),
        jax.vmap(flip2_ref, in_axes=1),
    ),
    # outputs whose shapes are expressions of the inputs': 2 * b, and b - k
    "sym_twice_as_long": SymbolicCase(
        lambda x: stack3(x)[0], (("b, 2", F32),), ({"b": 1}, {"b": 3}), stack3_ref
    ),
    "sym_twice_as_long_grad": SymbolicCase(
        jax.grad(_sum_sq(lambda x: stack3(x)[0])),
        (("b, 2", F32),),
        ({"b": 2}, {"b": 4}),
        _grad_ref(stack3_ref, 0),
    ),
    "sym_trim_grad": SymbolicCase(
        jax.value_and_grad(_sum_sq(lambda x: trim(x, k=2)[0])),
        (("b", F32),),
        ({"b": 2}, {"b": 6}),
        jax.value_and_grad(_sum_sq(lambda x: trim_ref(x, 2))),
        constraints=("b >= 2",),
    ),
}

# The cases written as golden artifacts (tests/data/<name>-format<N>-jax<V>.bin).
GOLDEN = (
    "sym_kwargs",
    "sym_two_dims",
    "sym_nonlinear_grad",
    "sym_vmap_loop",
    "sym_vmap_native",
    "sym_twice_as_long_grad",
)


def ducc_cases():
    """DUCC ops with symbolic batch dimensions (needs ducc0)."""
    from jaxbind.contrib import jaxducc0 as jd

    C64, C128, F64 = np.complex64, np.complex128, np.float64
    sht = jd.get_healpix_sht(nside=2, lmax=3, mmax=3, spin=0)
    nalm_real = jd.realalm_size(3, 3)
    gridder = jd.get_wgridder(
        pixsize_x=2e-5, pixsize_y=2e-5, npix_x=32, npix_y=32, epsilon=1e-6, do_wgridding=False
    )
    freq = np.array([1e9, 1.2e9])
    uvw_scale = 300.0

    def vis(uvw, image):
        return gridder(uvw * uvw_scale, jnp.asarray(freq), image)[0]

    def vis_direct(uvw, image):  # ducc0 itself, row block by row block
        import ducc0

        return ducc0.wgridder.experimental.dirty2vis(
            uvw=np.asarray(uvw, F64) * uvw_scale,
            freq=freq,
            dirty=np.asarray(image),
            pixsize_x=2e-5,
            pixsize_y=2e-5,
            epsilon=1e-6,
            do_wgridding=False,
        )

    def sht_direct(alm):  # ducc0 itself, one batch element at a time
        import ducc0

        geometry = jd._healpix_geometry(2)
        return np.stack(
            [
                ducc0.sht.synthesis(
                    alm=jd.realalm_to_alm(np.asarray(a), 3), spin=0, lmax=3, mmax=3, **geometry
                )
                for a in alm
            ]
        )

    return {
        "ducc_c2c": SymbolicCase(
            lambda x: jd.c2c(x, axes=(1,))[0],
            (("b, 8", C128),),
            ({"b": 1}, {"b": 3}),
            lambda x: np.fft.fft(x, axis=1),
        ),
        "ducc_c2c_vmap": SymbolicCase(
            jax.vmap(lambda x: jd.c2c(x)[0]),
            (("b, 4, 4", C64),),
            ({"b": 2}, {"b": 5}),
            lambda x: np.fft.fft2(x).astype(C64),
        ),
        "ducc_r2c_grad": SymbolicCase(
            jax.grad(lambda x: jnp.sum(jnp.abs(jd.r2c(x, axes=(1,))[0]) ** 2)),
            (("b, 16", F64),),
            ({"b": 1}, {"b": 4}),
            jax.grad(lambda x: jnp.sum(jnp.abs(jnp.fft.rfft(x, axis=1)) ** 2)),
        ),
        "ducc_c2r": SymbolicCase(
            lambda x: jd.c2r(x, lastsize=16, axes=(1,), forward=False)[0],
            (("b, 9", C128),),
            ({"b": 2}, {"b": 3}),
            lambda x: np.fft.irfft(x, n=16, axis=1) * 16,
        ),
        "ducc_fht_vmap": SymbolicCase(
            jax.vmap(lambda x: jd.genuine_fht(x)[0]),
            (("b, 8", F64),),
            ({"b": 1}, {"b": 3}),
            lambda x: np.real(np.fft.fft(x, axis=1)) - np.imag(np.fft.fft(x, axis=1)),
        ),
        "ducc_wgridder_rows": SymbolicCase(
            vis, (("r, 3", F64), ("32, 32", F64)), ({"r": 3}, {"r": 10}), vis_direct
        ),
        "ducc_sht_vmap": SymbolicCase(
            jax.vmap(sht), ((f"b, 1, {nalm_real}", F64),), ({"b": 1}, {"b": 3}), sht_direct
        ),
    }
