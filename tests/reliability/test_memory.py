"""Memory is released once no program uses it.

Keyword arguments, call sites and eager programs belong to the programs that use
them: ``jax.clear_caches()`` and the garbage collector free them. Large keyword
arguments are named by digest in programs that stay in this process, not copied
into them.
"""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import same_as_first

import jaxbind
from jaxbind import _ext
from jaxbind._kwargs import KwargsDump


def _adds(out, args, kw):
    out[0][...] = args[0] + jaxbind.load_kwargs(kw)["a"][0]


SIZE = 256 * 1024 + 7  # the arrays of this test (no other test uses this size)


def _big_dumps():
    gc.collect()
    return [
        d
        for d in gc.get_objects()
        # type(), not isinstance(): isinstance reads __class__, which a dead
        # weakref.proxy left by another test raises ReferenceError for
        if type(d) is KwargsDump
        and any(isinstance(v, np.ndarray) and v.size == SIZE for v in d._values.values())
    ]


@pytest.mark.parametrize("how", ["eager", "jit", "grad"])
def test_array_kwargs_are_released_after_clear_caches(how):
    op = jaxbind.get_linear_call(
        _adds, _adds, same_as_first, same_as_first, name=f"reliability.mem_{how}"
    )
    x = jnp.ones(4)
    sites = _ext.site_count()
    fns = []  # the programs, alive until the check
    for i in range(10):
        a = np.full(SIZE, float(i))  # 2 MB each
        if how == "eager":
            got = op(x, a=a)[0]
        elif how == "jit":
            fns.append(jax.jit(lambda x, a=a: op(x, a=a)[0]))
            got = fns[-1](x)
        else:
            fns.append(jax.jit(jax.grad(lambda x, a=a: op(x, a=a)[0].sum())))
            got = fns[-1](x)
        assert float(got[0]) == 1.0 + i  # (the transpose adds a[0] to the cotangent)
    assert _ext.site_count() >= sites + 10
    del a, got, fns
    jax.clear_caches()
    assert not _big_dumps()
    assert not op.binding.sites.live()
    assert _ext.site_count() <= sites  # (other tests' programs may go too)


def test_a_large_kwarg_is_not_copied_into_the_program():
    op = jaxbind.get_linear_call(
        _adds, _adds, same_as_first, same_as_first, name="reliability.mem_program"
    )
    a = np.arange(512 * 1024, dtype=np.float64)  # 4 MB
    lowered = jax.jit(lambda x: op(x, a=a)[0]).lower(jnp.ones(4))
    assert len(lowered.as_text()) < 100_000
    assert float(lowered.compile()(jnp.ones(4))[0]) == 1.0
    # exporting carries the data itself, so that another process can run it
    exported = jaxbind.export(jax.jit(lambda x: op(x, a=a)[0]))(jnp.ones(4))
    assert len(exported.mlir_module()) > a.nbytes


def test_an_eager_call_names_a_large_array_kwarg_by_its_digest(monkeypatch):
    """An eager call hashes a large array keyword argument instead of encoding it (JSON and
    base64 of 8 MB took 130 ms per call, and 100 MB peaked at 1.75 GB): equal contents
    find the call site made before, new contents give a new one, and the data itself is
    encoded only for an export."""
    import base64
    import tracemalloc

    op = jaxbind.get_linear_call(
        _adds, _adds, same_as_first, same_as_first, name="reliability.mem_digest"
    )
    x = jnp.ones(4)
    a = np.zeros(4 * 1024 * 1024 + 3)  # 32 MB
    encoded = []
    real = base64.b64encode
    monkeypatch.setattr(base64, "b64encode", lambda b: encoded.append(len(b)) or real(b))
    tracemalloc.start()
    try:
        assert float(op(x, a=a)[0][0]) == 1.0
        _, peak = tracemalloc.get_traced_memory()
        sites = _ext.site_count()
        for i in range(3):  # the same contents, as the same or another array
            assert float(op(x, a=a if i % 2 else a.copy())[0][0]) == 1.0
        assert _ext.site_count() == sites
        a[0] = 5.0  # changed in place: new contents, a new call site
        assert float(op(x, a=a)[0][0]) == 6.0
    finally:
        tracemalloc.stop()
    assert max(encoded, default=0) < 1024  # nothing large was encoded
    assert peak < 2.5 * a.nbytes  # one read-only copy of the array, not its encodings
    exported = jaxbind.export(jax.jit(lambda x: op(x, a=a)[0]))(x)
    assert max(encoded) >= a.nbytes  # the export carries the data
    assert len(exported.mlir_module()) > a.nbytes
