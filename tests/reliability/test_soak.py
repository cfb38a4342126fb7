"""Soak: many calls and many bindings leave resident memory and the registry bounded."""

import gc
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import same_as_first

import jaxbind
from jaxbind import _binding, _ext

pytestmark = pytest.mark.slow  # the 1000 bindings take about 40 s


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _double(out, args, kd):
    np.multiply(args[0], 2, out=out[0])


def test_100k_jitted_calls_keep_memory_flat():
    op = jaxbind.get_linear_call(_double, None, same_as_first, None, name="reliability.soak_double")
    fn = jax.jit(lambda x: op(x)[0])
    x = jnp.ones(16)
    for _ in range(2000):  # warm up caches and allocator
        fn(x)
    before = _rss_mb()
    for _ in range(100_000):
        y = fn(x)
    jax.block_until_ready(y)
    growth = _rss_mb() - before
    print(f"\n100000 jitted calls: resident memory grew by {growth:.1f} MB")
    assert growth < 20
    np.testing.assert_array_equal(y, 2 * np.ones(16))


def _make(k):
    def f(out, args, kd):
        out[0][...] = k * args[0]

    return jaxbind.get_linear_call(f, None, same_as_first, None)


def test_1000_bindings_created_and_dropped_leave_no_trace():
    """Each binding is called eagerly and under jit, with keyword arguments, then dropped."""
    jax.clear_caches()
    gc.collect()
    names, sites = len(_binding.registered_names()), _ext.site_count()
    x = jnp.ones(4)
    for k in range(50):  # warm up
        jax.jit(lambda x, op=_make(k): op(x)[0])(x)
    jax.clear_caches()
    gc.collect()
    before = _rss_mb()
    for k in range(1000):
        op = _make(k)
        assert float(jax.jit(lambda x: op(x, tag=k)[0])(x)[0]) == k
        assert float(op(x, tag=k)[0][0]) == k  # eager, with keyword arguments
        assert float(op(x)[0][0]) == k  # eager, the fast path
        del op
        if k % 100 == 99:
            jax.clear_caches()
    jax.clear_caches()
    gc.collect()
    growth = _rss_mb() - before
    print(
        f"\n1000 bindings created and dropped: resident memory grew by {growth:.1f} MB; "
        f"registry {len(_binding.registered_names())} names, {_ext.site_count()} sites"
    )
    assert growth < 20
    assert len(_binding.registered_names()) == names
    assert _ext.site_count() == sites
