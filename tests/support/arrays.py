"""Random inputs, tolerances and error measures."""

import jax.numpy as jnp
import numpy as np


def normal(rng, shape, dtype=np.float64):
    """Standard normal values of `dtype` drawn from `rng`, with a random imaginary part (drawn
    after the real part) for a complex dtype."""
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def random(shape, dtype=np.float64, seed=0, complex_=False):
    """normal() from a generator of its own seeded with `seed`; `complex_=True` makes the
    dtype the complex dtype of `dtype`'s precision."""
    if complex_:
        dtype = np.result_type(dtype, np.complex64)
    return normal(np.random.default_rng(seed), shape, dtype)


def random_complex(rng, shape, dtype=np.complex128):
    """normal() of a complex `dtype` as a JAX array."""
    return jnp.asarray(normal(rng, shape, dtype))


def batched_inputs(core_shape, in_axes, size, seed=0, dtype=np.float32):
    """One random array per entry of `in_axes`: of shape `core_shape`, with a batch axis of
    `size` inserted where the entry says (None: unbatched); seeds seed, seed + 1, ..."""
    arrays = []
    for k, axis in enumerate(in_axes):
        shape = list(core_shape)
        if axis is not None:
            shape.insert(axis, size)
        arrays.append(random(tuple(shape), dtype, seed + k))
    return arrays


def tol(dtype):
    """A relative tolerance for results computed in `dtype`'s precision."""
    return 2e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-12


def max_relative_error(got, want) -> float:
    """max |got - want| over max |want|: the error in the max norm, relative to the largest
    reference value."""
    got, want = np.asarray(got), np.asarray(want)
    scale = max(float(np.max(np.abs(want), initial=0)), 1e-30)
    return float(np.max(np.abs(got - want), initial=0)) / scale


def norm_relative_error(got, want) -> float:
    """|got - want| / |want| in the 2-norm of the flattened arrays, computed in double
    precision."""
    got = np.asarray(got, np.complex128).ravel()
    want = np.asarray(want, np.complex128).ravel()
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def assert_close(got, want, rtol, check_dtype=True):
    """`got` has the shape (and the dtype) of `want`, and a max_relative_error within
    `rtol`."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if check_dtype:
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
    err = max_relative_error(got, want)
    assert err <= rtol, f"relative error {err:.2e} > {rtol:.0e}"
